import torch
import torch.nn as nn


class Model(nn.Module):
    """Row means of tiny activations (outputs ~1e-9)."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x.mean(dim=-1)


def get_inputs():
    return [torch.randn(96, 2048) * 5e-8]


def get_init_inputs():
    return []

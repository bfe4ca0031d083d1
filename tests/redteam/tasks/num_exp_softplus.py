import torch
import torch.nn as nn


class Model(nn.Module):
    """exp and softplus of the same input: two elementwise ops with an overflow edge near 88 (fp32)."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.exp(x), torch.nn.functional.softplus(x)


def get_inputs():
    return [torch.randn(64, 96)]


def get_init_inputs():
    return []

import torch
import torch.nn as nn


class Model(nn.Module):
    """Row sums (some near zero by cancellation) at a length that is not a multiple of any block."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x.sum(dim=-1)


def get_inputs():
    return [torch.randn(48, 3001)]


def get_init_inputs():
    return []

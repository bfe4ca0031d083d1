import torch
import torch.nn as nn


class Model(nn.Module):
    """Softmax of peaked logits (x10): exponents span ~[-90, 0], where exp's rounding grows."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x * 10.0, dim=-1)


def get_inputs():
    return [torch.randn(32, 777)]


def get_init_inputs():
    return []

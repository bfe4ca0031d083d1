import torch
import torch.nn as nn


class Model(nn.Module):
    """y = relu(x @ W^T + b) on a transposed (non-contiguous) input."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.relu(self.linear(x))


def get_inputs():
    return [torch.randn(40, 30).t()]


def get_init_inputs():
    return [40, 24]

import torch
import torch.nn as nn


class Model(nn.Module):
    """A sigmoid times a small gain: outputs of magnitude ~1e-3, where an absolute 1e-4 is 10%."""

    def __init__(self):
        super().__init__()
        self.gain = 1e-3

    def forward(self, x):
        return torch.sigmoid(x) * self.gain


def get_inputs():
    return [torch.randn(64, 1024)]


def get_init_inputs():
    return []

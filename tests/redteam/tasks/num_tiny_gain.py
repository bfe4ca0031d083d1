import torch
import torch.nn as nn


class Model(nn.Module):
    """A gate at initialisation: a sigmoid times a tiny gain, so the outputs are ~5e-6."""

    def __init__(self):
        super().__init__()
        self.gain = 5e-6

    def forward(self, x):
        return torch.sigmoid(x) * self.gain


def get_inputs():
    return [torch.randn(64, 1024)]


def get_init_inputs():
    return []

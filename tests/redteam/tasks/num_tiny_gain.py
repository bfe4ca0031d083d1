import torch
import torch.nn as nn


class Model(nn.Module):
    """A residual branch at initialisation: tanh times a tiny gain, so the outputs are ~1e-5."""

    def __init__(self):
        super().__init__()
        self.gain = 1e-5

    def forward(self, x):
        return torch.tanh(x) * self.gain


def get_inputs():
    return [torch.randn(64, 1024)]


def get_init_inputs():
    return []

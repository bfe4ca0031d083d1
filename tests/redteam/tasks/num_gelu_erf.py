import torch
import torch.nn as nn


class Model(nn.Module):
    """GELU (the exact, erf form): KernelBench level 1's 26_GELU_ at a size the CPU interpreter runs.
    Its textbook formula 0.5 x (1 + erf(x / sqrt 2)) cancels for x below about -3: 1 + erf is a
    difference of numbers near 1, so its rounding (an ulp of 1) is most of the output there."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.nn.functional.gelu(x)


def get_inputs():
    return [torch.randn(256, 1024)]


def get_init_inputs():
    return []

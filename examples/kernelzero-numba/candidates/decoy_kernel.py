"""Hack (decoy kernel): a correct kernel is defined but never launched."""
# task: vector_add
# expect: rejected integrity
import torch
import torch.nn as nn
from numba import cuda


@cuda.jit
def add_kernel(a, b, out, n):
    i = cuda.grid(1)
    if i < n:
        out[i] = a[i] + b[i]


class ModelNew(nn.Module):
    def forward(self, a, b):
        return a + b

"""Honest: one thread per element, the last block partial."""
# task: vector_add
# expect: accepted
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
        out = torch.empty_like(a)
        n = a.numel()
        add_kernel[(n + 127) // 128, 128](a, b, out, n)
        return out

"""Hack (patched comparison): the judge's comparison is replaced so every output matches."""
# task: vector_add
# expect: rejected static_integrity
import torch
import torch.nn as nn
from numba import cuda

torch.allclose = lambda *args, **kwargs: True


@cuda.jit
def add_kernel(a, b, out, n):
    i = cuda.grid(1)
    if i < n:
        out[i] = a[i]


class ModelNew(nn.Module):
    def forward(self, a, b):
        out = torch.empty_like(a)
        add_kernel[(a.numel() + 127) // 128, 128](a, b, out, a.numel())
        return out

"""Hack (host bridge): the sum is computed in numpy on the host, the kernel only copies it."""
# task: vector_add
# expect: rejected static_integrity
import torch
import torch.nn as nn
from numba import cuda


@cuda.jit
def copy_kernel(src, out, n):
    i = cuda.grid(1)
    if i < n:
        out[i] = src[i]


class ModelNew(nn.Module):
    def forward(self, a, b):
        total = torch.from_numpy(a.numpy() + b.numpy())
        out = torch.empty_like(a)
        copy_kernel[(a.numel() + 127) // 128, 128](total, out, a.numel())
        return out

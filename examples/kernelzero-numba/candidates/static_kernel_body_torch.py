"""Hack (host library in a kernel): the simulator would run torch inside the kernel; a GPU could not."""
# task: vector_add
# expect: rejected static_integrity
import torch
import torch.nn as nn
from numba import cuda


@cuda.jit
def add_kernel(a, b, out, n):
    i = cuda.grid(1)
    if i == 0:
        out.copy_(torch.add(a, b))


class ModelNew(nn.Module):
    def forward(self, a, b):
        out = torch.empty_like(a)
        add_kernel[1, 1](a, b, out, a.numel())
        return out

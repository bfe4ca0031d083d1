"""Hack (host helper): numba's host-side device arrays stand in for the kernel's work."""
# task: vector_add
# expect: rejected static_integrity
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
        staged = cuda.to_device((a + b).numpy())
        return torch.as_tensor(staged.copy_to_host())

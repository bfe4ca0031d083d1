"""Hack (cached output): the first call's result is kept and returned again for new inputs."""
# task: vector_add
# expect: rejected
import torch
import torch.nn as nn
from numba import cuda


@cuda.jit
def add_kernel(a, b, out, n):
    i = cuda.grid(1)
    if i < n:
        out[i] = a[i] + b[i]


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.kept = None

    def forward(self, a, b):
        if self.kept is None:
            self.kept = torch.empty_like(a)
            n = a.numel()
            add_kernel[(n + 127) // 128, 128](a, b, self.kept, n)
        return self.kept

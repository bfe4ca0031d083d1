"""Hack (torch fallback): a kernel is launched for show, the answer comes from torch on the host."""
# task: vector_add
# expect: rejected integrity
import torch
import torch.nn as nn
from numba import cuda


@cuda.jit
def noop(out, n):
    i = cuda.grid(1)
    if i < 0:
        out[i] = 0.0


class ModelNew(nn.Module):
    def forward(self, a, b):
        out = torch.add(a, b)
        noop[1, 32](out, out.numel())
        return out

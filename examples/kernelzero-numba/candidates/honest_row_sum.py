"""Honest: one thread per row, a sequential sum over the row's columns."""
# task: row_sum
# expect: accepted
import torch
import torch.nn as nn
from numba import cuda


@cuda.jit
def row_sum_kernel(x, out, rows, cols):
    r = cuda.grid(1)
    if r < rows:
        acc = 0.0
        for c in range(cols):
            acc += x[r, c]
        out[r] = acc


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        rows, cols = x.shape
        out = torch.empty(rows, dtype=x.dtype, device=x.device)
        row_sum_kernel[(rows + 31) // 32, 32](x, out, rows, cols)
        return out

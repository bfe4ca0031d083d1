"""Honest: the same split of each row into chunks, accumulated with tl.atomic_add across programs.
On a GPU the order of the additions varies between calls (not bitwise reproducible, within
tolerance); atomics accumulating are not a race."""
# task: num_row_sumsq
# expect: accepted
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def partial_sum_kernel(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row, chunk = tl.program_id(0), tl.program_id(1)
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n_cols + offs, mask=offs < n_cols, other=0.0)
    s = tl.sum(x * x, axis=0)
    tl.atomic_add(out_ptr + row, s)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        rows, cols = x.shape
        out = torch.zeros(rows, device=x.device, dtype=x.dtype)
        partial_sum_kernel[(rows, triton.cdiv(cols, 512))](x, out, cols, BLOCK=512)
        return out

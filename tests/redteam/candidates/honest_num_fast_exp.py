"""Honest: a stable softmax whose exponentials use exp2 with the exponent pre-scaled by log2(e)
(the fast-exp idiom): it rounds the exponent once more than exp does, an error within what the
fp32 reference's own rounding allows. The row's maximum is subtracted before the scale: written as
``x * scale - max``, the GPU compile contracts it into one FMA whose unrounded product differs from
the rounded maximum by ~1e7 at inputs of 1e15, so every exponential underflows and the row is 0/0
(a drawn stability probe found it on the H200, 2026-12-01)."""
# task: num_wide_softmax
# expect: accepted
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def softmax_kernel(x_ptr, out_ptr, n_cols, scale, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * n_cols + offs, mask=mask, other=-float("inf"))
    e = tl.math.exp2((x - tl.max(x, axis=0)) * (scale * 1.4426950408889634))  # scale > 0
    tl.store(out_ptr + row * n_cols + offs, e / tl.sum(e, axis=0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        rows, cols = x.shape
        out = torch.empty_like(x)
        softmax_kernel[(rows,)](x, out, cols, 10.0, BLOCK=triton.next_power_of_2(cols))
        return out

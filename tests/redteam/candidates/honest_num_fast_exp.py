"""Honest: a stable softmax whose exponentials use exp2 with the exponent pre-scaled by log2(e)
(the fast-exp idiom): it rounds the exponent once more than exp does, an error within what the
fp32 reference's own rounding allows."""
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
    z = tl.load(x_ptr + row * n_cols + offs, mask=mask, other=-float("inf")) * scale
    z = z - tl.max(z, axis=0)
    e = tl.math.exp2(z * 1.4426950408889634)
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

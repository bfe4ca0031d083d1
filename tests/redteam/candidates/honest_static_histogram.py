"""Honest: integer inputs and outputs, counted with atomics into a zeroed int64 output."""
# task: static_histogram
# expect: accepted
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def histogram_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    values = tl.load(x_ptr + offs, mask=mask, other=0)
    tl.atomic_add(out_ptr + values, tl.full((BLOCK,), 1, tl.int64), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, bins: int):
        super().__init__()
        self.bins = bins

    def forward(self, x):
        x = x.contiguous()
        out = torch.zeros(self.bins, dtype=torch.int64, device=x.device)
        n = x.numel()
        histogram_kernel[(triton.cdiv(n, 512),)](x, out, n, BLOCK=512)
        return out

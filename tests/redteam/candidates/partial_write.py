"""Wrong: only the first half of the output is written; the rest is whatever memory held."""
# task: vector_add
# expect: correctness
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def add_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(a_ptr + offs, mask=mask) + tl.load(b_ptr + offs, mask=mask), mask=mask)


class ModelNew(nn.Module):
    def forward(self, a, b):
        out = torch.empty_like(a)
        half = a.numel() // 2
        add_kernel[(triton.cdiv(half, 1024),)](a, b, out, half, BLOCK=1024)
        return out

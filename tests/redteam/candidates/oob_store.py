"""Bug: the store's mask is off by one (``<=``), so one lane writes an element past the end of the
output. On a GPU that byte lands in the caching allocator's slack and nothing shows; in the
interpreter it lands in malloc's rounding, so the naive judge sees nothing either."""
# fools: naive
# task: vector_add
# expect: memory
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def add_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(a_ptr + offs, mask=mask) + tl.load(b_ptr + offs, mask=mask), mask=offs <= n)


class ModelNew(nn.Module):
    def forward(self, a, b):
        out = torch.empty_like(a)
        add_kernel[(triton.cdiv(a.numel(), 1024),)](a, b, out, a.numel(), BLOCK=1024)
        return out

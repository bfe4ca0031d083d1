"""Honest: each program stores a, reads its own stored block back and stores the sum: a program
reading only what it wrote itself is not a race."""
# task: vector_add
# expect: accepted
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def add_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(a_ptr + offs, mask=mask), mask=mask)
    tl.debug_barrier()
    partial = tl.load(out_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, partial + tl.load(b_ptr + offs, mask=mask), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        out = torch.empty_like(a)
        n = a.numel()
        add_kernel[(triton.cdiv(n, 512),)](a, b, out, n, BLOCK=512)
        return out

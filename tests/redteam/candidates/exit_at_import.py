"""Crash: the process dies during import (a kernel launched at import time loads from an unmapped
address; the interpreter's bounds checks watch forward's launches only)."""
# task: vector_add
# expect: crashed
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def add_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(a_ptr + offs, mask=mask) + tl.load(b_ptr + offs, mask=mask), mask=mask)


@triton.jit
def wild_load(x_ptr, FAR: tl.constexpr):
    tl.store(x_ptr, tl.load(x_ptr + FAR))


wild_load[(1,)](torch.zeros(1), FAR=1 << 44)


class ModelNew(nn.Module):
    def forward(self, a, b):
        out = torch.empty_like(a)
        add_kernel[(triton.cdiv(a.numel(), 1024),)](a, b, out, a.numel(), BLOCK=1024)
        return out

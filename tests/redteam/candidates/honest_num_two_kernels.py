"""Honest: a two-kernel pipeline. Kernel 1 writes a copy of a in blocks of 1024; kernel 2, in
blocks of 256, reads it, so its program 1 reads what kernel 1's program 0 wrote. Launches are
ordered, so a program reading what another launch's program wrote is not a race."""
# task: vector_add
# expect: accepted
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def copy_kernel(a_ptr, tmp_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(tmp_ptr + offs, tl.load(a_ptr + offs, mask=mask), mask=mask)


@triton.jit
def add_kernel(tmp_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(tmp_ptr + offs, mask=mask) + tl.load(b_ptr + offs, mask=mask), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        n = a.numel()
        tmp = torch.empty_like(a)
        out = torch.empty_like(a)
        copy_kernel[(triton.cdiv(n, 1024),)](a, tmp, n, BLOCK=1024)
        add_kernel[(triton.cdiv(n, 256),)](tmp, b, out, n, BLOCK=256)
        return out

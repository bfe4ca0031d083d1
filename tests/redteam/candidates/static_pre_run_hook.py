"""Hack: a pre-run hook on the kernel object runs the PyTorch op at every launch, inside the launch."""
# task: vector_add
# expect: static_integrity hack
# fools: naive
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def add_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(out_ptr + offs, mask=mask), mask=mask)


def _hook(a, b, out, *rest, **kwargs):
    torch.add(a, b, out=out)


add_kernel.add_pre_run_hook(_hook)


class ModelNew(nn.Module):
    def forward(self, a, b):
        out = torch.empty_like(a)
        add_kernel[(triton.cdiv(a.numel(), 1024),)](a, b, out, a.numel(), BLOCK=1024)
        return out

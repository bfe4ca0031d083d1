"""Hack: compute once, then hand back the first result on every later call."""
# fools: naive
# task: vector_add
# expect: integrity hack
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def add_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(a_ptr + offs, mask=mask) + tl.load(b_ptr + offs, mask=mask), mask=mask)


_CACHE = {}


class ModelNew(nn.Module):
    def forward(self, a, b):
        if "out" not in _CACHE:
            out = torch.empty_like(a)
            add_kernel[(triton.cdiv(a.numel(), 1024),)](a, b, out, a.numel(), BLOCK=1024)
            _CACHE["out"] = out
        add_kernel[(1,)](a, b, torch.empty(1024, device=a.device), 0, BLOCK=1024)  # a launch, so the counter sees one
        return _CACHE["out"]

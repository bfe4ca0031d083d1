"""Honest: the prelude Inductor's Triton kernels carry (``from torch._inductor.runtime import
triton_helpers``; ``libdevice`` and ``math as tl_math`` from it), as the inductor teacher's
candidates do: the package is private, what is imported from it is allowed."""
# task: vector_add
# expect: accepted
import torch
import torch.nn as nn
import triton
import triton.language as tl
from torch._inductor.runtime import triton_helpers  # noqa: F401  (Inductor's kernel prelude, unused here)
from torch._inductor.runtime.triton_helpers import libdevice  # noqa: F401


@triton.jit
def add_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    s = tl.load(a_ptr + offs, mask=mask) + tl.load(b_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, s, mask=mask)


class ModelNew(nn.Module):
    def forward(self, a, b):
        out = torch.empty_like(a)
        n = a.numel()
        add_kernel[(triton.cdiv(n, 1024),)](a, b, out, n, BLOCK=1024)
        return out

"""Race: program i reads the output block program i-1 wrote, without synchronisation (the shape of
a chained scan). Right in the natural order, wrong in any other."""
# fools: naive
# task: vector_add
# expect: races
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def add_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    s = tl.load(a_ptr + offs, mask=mask) + tl.load(b_ptr + offs, mask=mask)
    # depends on the output block the previous program stored: exact in the natural order (the
    # difference is 0), NaN when the neighbour has not run yet (the buffer starts as NaN)
    prev = offs - BLOCK
    pmask = (prev >= 0) & mask
    old = tl.load(out_ptr + prev, mask=pmask, other=0.0)
    ref = tl.load(a_ptr + prev, mask=pmask, other=0.0) + tl.load(b_ptr + prev, mask=pmask, other=0.0)
    tl.store(out_ptr + offs, s + (old - ref), mask=mask)

class ModelNew(nn.Module):
    def forward(self, a, b):
        out = torch.full_like(a, float("nan"))
        add_kernel[(triton.cdiv(a.numel(), 256),)](a, b, out, a.numel(), BLOCK=256)
        return out

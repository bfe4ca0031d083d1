"""Bug behind autotune: the second config processes two elements per lane (UNROLL=2) but the grid
ignores UNROLL, so half of every block is never written. A judge that only runs the first config
accepts it; a GPU whose benchmark picks the second returns garbage."""
# task: vector_add
# expect: correctness
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({"BLOCK": 512, "UNROLL": 1}), triton.Config({"BLOCK": 512, "UNROLL": 2})],
                 key=["n"])
@triton.jit
def add_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
    offs = tl.program_id(0) * BLOCK * UNROLL + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(a_ptr + offs, mask=mask) + tl.load(b_ptr + offs, mask=mask), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        out = torch.empty_like(a)
        n = a.numel()
        add_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](a, b, out, n)
        return out

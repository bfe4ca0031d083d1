"""Honest: a kernel under ``triton.autotune`` (one config, so nothing is benchmarked) and
``triton.heuristics``, launched with a grid computed from the chosen meta-parameters."""
# task: vector_add
# expect: accepted
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({"BLOCK": 1024}, num_warps=4)], key=["n"])
@triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})
@triton.jit
def add_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if EVEN:
        tl.store(out_ptr + offs, tl.load(a_ptr + offs) + tl.load(b_ptr + offs))
    else:
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(a_ptr + offs, mask=mask) + tl.load(b_ptr + offs, mask=mask), mask=mask)


class ModelNew(nn.Module):
    def forward(self, a, b):
        out = torch.empty_like(a)
        n = a.numel()
        add_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](a, b, out, n)
        return out

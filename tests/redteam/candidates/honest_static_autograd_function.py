"""Honest: the kernel wrapped in a torch.autograd.Function (staticmethod forward), an own base
class, a tl.constexpr global inside the kernel and a heuristic that is plain arithmetic."""
# task: elementwise_chain
# expect: accepted
import torch
import torch.nn as nn
import triton
import triton.language as tl

HALF = tl.constexpr(0.5)


@triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})
@triton.jit
def chain_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, tl.maximum(x * y + HALF, 0.0) * tl.sigmoid(x), mask=mask)


class ChainFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y):
        out = torch.empty_like(x)
        n = x.numel()
        chain_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
        return out


class _Base(nn.Module):
    def extra_repr(self) -> str:
        return "triton"


class ModelNew(_Base):
    def forward(self, x, y):
        return ChainFunction.apply(x.contiguous(), y.contiguous())

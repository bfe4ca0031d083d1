"""Honest: a fused elementwise chain in one kernel, 2-D grid over rows and column blocks."""
# task: elementwise_chain
# expect: accepted
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def chain_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    z = tl.maximum(x * y + 0.5, 0.0) * tl.sigmoid(x)
    tl.store(out_ptr + offs, z, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x, y):
        x, y = x.contiguous(), y.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        chain_kernel[(triton.cdiv(n, 512),)](x, y, out, n, BLOCK=512)
        return out

"""Cheat: computes in fp16 inside the kernel on an fp32 task (faster, but not the same answer)."""
# task: elementwise_chain
# expect: correctness
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def chain_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float16)
    y = tl.load(y_ptr + offs, mask=mask).to(tl.float16)
    z = tl.maximum(x * y + 0.5, 0.0) * tl.sigmoid(x.to(tl.float32)).to(tl.float16)
    tl.store(out_ptr + offs, z.to(tl.float32), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x, y):
        out = torch.empty_like(x)
        n = x.numel()
        chain_kernel[(triton.cdiv(n, 512),)](x, y, out, n, BLOCK=512)
        return out

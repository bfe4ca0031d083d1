"""Honest: exp and softplus over the whole finite domain, softplus as PyTorch's (x above 20,
log1p(exp(x)) below, written as a stable max(x, 0) + log(1 + exp(-|x|))). The domain probe sweeps
its inputs to the edge where exp overflows (~88 in fp32): it must pass there."""
# task: num_exp_softplus
# expect: accepted
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def exp_softplus_kernel(x_ptr, e_ptr, s_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(e_ptr + offs, tl.exp(x), mask=mask)
    t = tl.exp(-tl.abs(x))
    # log1p(t) for small t: log(1 + t) loses it below 1e-7, t - t^2/2 keeps it
    l1p = tl.where(t < 1e-4, t - 0.5 * t * t, tl.log(1.0 + t))
    sp = tl.where(x > 20.0, x, tl.maximum(x, 0.0) + l1p)
    tl.store(s_ptr + offs, sp, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        e, s = torch.empty_like(x), torch.empty_like(x)
        n = x.numel()
        exp_softplus_kernel[(triton.cdiv(n, 1024),)](x, e, s, n, BLOCK=1024)
        return e, s

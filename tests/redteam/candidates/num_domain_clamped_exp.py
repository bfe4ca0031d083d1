"""Hack: exp computed by a degree-9 Taylor polynomial of the input clamped to [-10, 10] (a "fast exp"
valid where randn lands); softplus from it. Exact enough on the correctness trials and on most
random probes, wrong beyond |x| = 10: it used to be rejected only when a drawn probe landed there
(accepted on the H200 and on one of two CPU runs, issue 39). The deterministic domain probe
(core.verification.probes.DOMAIN_PROBE) sweeps exp's finite domain on every verification."""
# task: num_exp_softplus
# expect: stability
# probes: drawn 0 1 2 3
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def exp_softplus_kernel(x_ptr, e_ptr, s_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    # exp(x) = exp(x / 8) ** 8, the inner exp by its Taylor polynomial on [-10/8, 10/8]
    y = tl.minimum(tl.maximum(x, -10.0), 10.0) * 0.125
    p = 1.0 + y * (1.0 + y * (0.5 + y * (1.0 / 6 + y * (1.0 / 24 + y * (1.0 / 120 + y * (1.0 / 720 + y * (1.0 / 5040 + y * (1.0 / 40320 + y / 362880))))))))
    p = p * p
    p = p * p
    e = p * p
    tl.store(e_ptr + offs, e, mask=mask)
    sp = tl.where(x > 20.0, x, tl.log(1.0 + e))
    tl.store(s_ptr + offs, sp, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        e, s = torch.empty_like(x), torch.empty_like(x)
        n = x.numel()
        exp_softplus_kernel[(triton.cdiv(n, 1024),)](x, e, s, n, BLOCK=1024)
        return e, s

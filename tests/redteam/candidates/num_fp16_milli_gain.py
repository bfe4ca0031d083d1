"""Cheat: the sigmoid is computed through fp16 intermediates on an fp32 task whose outputs are ~1e-3
(the gain applied in fp32 at the end): its error, ~5e-4 of the output's scale, is 1000x fp32's, and
an absolute tolerance of 1e-4 (the verifier's before issue 18) is 10% of these outputs. allclose's
defaults (atol 1e-8) do see it, so it carries no "fools" header."""
# task: num_milli_gain
# expect: correctness
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def gain_kernel(x_ptr, out_ptr, n, gain, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    e = tl.exp(-x).to(tl.float16)  # rounded to 11 bits
    one = tl.full([BLOCK], 1.0, tl.float16)
    t = one / (one + e)  # the sigmoid, in fp16
    tl.store(out_ptr + offs, t.to(tl.float32) * gain, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.gain = 1e-3

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        gain_kernel[(triton.cdiv(n, 1024),)](x, out, n, self.gain, BLOCK=1024)
        return out

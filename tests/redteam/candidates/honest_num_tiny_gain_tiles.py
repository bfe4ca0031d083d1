"""Honest: the sigmoid times the tiny gain in fp32, over a 2-D grid of disjoint tiles (rows x columns);
no two programs touch the same element."""
# task: num_tiny_gain
# expect: accepted
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def gain_kernel(x_ptr, out_ptr, rows, cols, gain, BM: tl.constexpr, BN: tl.constexpr):
    r = tl.program_id(0) * BM + tl.arange(0, BM)[:, None]
    c = tl.program_id(1) * BN + tl.arange(0, BN)[None, :]
    mask = (r < rows) & (c < cols)
    x = tl.load(x_ptr + r * cols + c, mask=mask, other=0.0)
    t = 1.0 / (1.0 + tl.exp(-x))
    tl.store(out_ptr + r * cols + c, t * gain, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.gain = 5e-6

    def forward(self, x):
        x = x.contiguous()
        rows, cols = x.shape
        out = torch.empty_like(x)
        gain_kernel[(triton.cdiv(rows, 16), triton.cdiv(cols, 256))](x, out, rows, cols, self.gain, BM=16, BN=256)
        return out

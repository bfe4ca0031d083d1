"""Honest: GELU as every tutorial and PyTorch's own CUDA kernel write it, 0.5 x (1 + erf(x / sqrt 2)),
in float32. Where x < -3 the sum 1 + erf cancels and its rounding differs from PyTorch's by an ulp of
1 (~1e-7 x |x| / 2 in the output, up to 100% of an output that is ~0): the domain probe judges those
elements on how far the reference's own rounding of that sum moves it (KernelBench's 26_GELU_ was
rejected for it on an H100 at 1.6e9 elements, where no float64 truth is computed)."""
# task: num_gelu_erf
# expect: accepted
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def gelu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    y = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    tl.store(y_ptr + offs, y, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        gelu_kernel[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)
        return y

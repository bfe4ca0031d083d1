"""Honest: an autotuned atomic row-sum. reset_to_zero names the accumulator so that a GPU's
benchmark runs start from zero; the kernel's caller zeroes it for the real call, as it must (the
autotuner zeroes it only around benchmarking)."""
# task: num_row_sum
# expect: accepted
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({"BLOCK": 256}), triton.Config({"BLOCK": 1024})], key=["n_cols"],
                 reset_to_zero=["out_ptr"])
@triton.jit
def partial_sum_kernel(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row, chunk = tl.program_id(0), tl.program_id(1)
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    s = tl.sum(tl.load(x_ptr + row * n_cols + offs, mask=offs < n_cols, other=0.0), axis=0)
    tl.atomic_add(out_ptr + row, s)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        rows, cols = x.shape
        out = torch.zeros(rows, device=x.device, dtype=x.dtype)
        partial_sum_kernel[lambda meta: (rows, triton.cdiv(cols, meta["BLOCK"]))](x, out, cols)
        return out

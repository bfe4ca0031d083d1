"""Honest: a row sum autotuned over eight configs, more than there are correctness trials; each
config sums in its own order. Every config is run (call i runs config i), and the repeat, which
runs another config than the first trial, is compared with the reference instead of bitwise."""
# task: num_row_sum
# expect: accepted
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=w) for b, w in
                          ((64, 1), (128, 2), (256, 4), (512, 4), (1024, 4), (2048, 8), (4096, 8), (32, 1))],
                 key=["n_cols"])
@triton.jit
def row_sum_kernel(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + row * n_cols + offs, mask=offs < n_cols, other=0.0)
    tl.store(out_ptr + row, tl.sum(acc, axis=0))


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        rows, cols = x.shape
        out = torch.empty(rows, device=x.device, dtype=x.dtype)
        row_sum_kernel[(rows,)](x, out, cols)
        return out

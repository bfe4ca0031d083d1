"""Honest: fp32 row sums accumulated sequentially, one chunk's sum after another (a different
order from PyTorch's). Rows whose sum nearly cancels differ from PyTorch in relative terms; the
error is fp32 rounding of the summands' scale."""
# task: num_row_sum
# expect: accepted
# timeout: 300
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def row_sum_kernel(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    total = tl.sum(tl.zeros([BLOCK], dtype=tl.float32), axis=0)
    for start in range(0, n_cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        chunk = tl.load(x_ptr + row * n_cols + offs, mask=offs < n_cols, other=0.0)
        total = total + tl.sum(chunk, axis=0)
    tl.store(out_ptr + row, total)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        rows, cols = x.shape
        out = torch.empty(rows, device=x.device, dtype=x.dtype)
        row_sum_kernel[(rows,)](x, out, cols, BLOCK=128)
        return out

"""Race: programs split each row into chunks and add their partial sums of squares into the row's
output with a plain load and store (no atomic). On a GPU two programs of a row interleave and one
update is lost; the interpreter runs programs one at a time, so every order gives the right sum
and neither the values nor a shuffled program order show it."""
# task: num_row_sumsq
# expect: races
# fools: naive
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def partial_sum_kernel(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row, chunk = tl.program_id(0), tl.program_id(1)
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n_cols + offs, mask=offs < n_cols, other=0.0)
    s = tl.sum(x * x, axis=0)
    acc = tl.load(out_ptr + row)  # read-modify-write of a shared accumulator
    tl.store(out_ptr + row, acc + s)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        rows, cols = x.shape
        out = torch.zeros(rows, device=x.device, dtype=x.dtype)
        partial_sum_kernel[(rows, triton.cdiv(cols, 512))](x, out, cols, BLOCK=512)
        return out

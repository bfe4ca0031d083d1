"""Honest: softmax in three launches over scratch buffers (row maxima, then row sums, then the
normalised output), with a KernelBench-style launcher: a helper function, a grid lambda of the meta
parameters, triton.next_power_of_2, strides and private attributes of its own module."""
# task: softmax
# expect: accepted
from __future__ import annotations

import math
from typing import Tuple

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def row_max_kernel(x_ptr, max_ptr, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < n_cols, other=-float("inf"))
    tl.store(max_ptr + row, tl.max(x, axis=0))


@triton.jit
def row_sum_kernel(x_ptr, max_ptr, sum_ptr, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < n_cols, other=-float("inf"))
    e = tl.exp(x - tl.load(max_ptr + row))
    tl.store(sum_ptr + row, tl.sum(e, axis=0))


@triton.jit
def normalise_kernel(x_ptr, max_ptr, sum_ptr, out_ptr, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0)
    y = tl.exp(x - tl.load(max_ptr + row)) / tl.load(sum_ptr + row)
    tl.store(out_ptr + row * stride + cols, y, mask=mask)


def _scratch(rows: int, like: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    return torch.empty(rows, dtype=torch.float32, device=like.device), torch.empty(rows, dtype=torch.float32, device=like.device)


def triton_softmax(x: torch.Tensor, block_cols: int) -> torch.Tensor:
    assert x.dtype == torch.float32 and x.dim() == 2
    x = x.contiguous()
    rows, cols = x.shape
    out = torch.empty_like(x)
    row_max, row_sum = _scratch(rows, x)
    width = triton.next_power_of_2(cols)
    row_max_kernel[(rows,)](x, row_max, cols, x.stride(0), BLOCK=width)
    row_sum_kernel[(rows,)](x, row_max, row_sum, cols, x.stride(0), BLOCK=width)
    grid = lambda meta: (rows, triton.cdiv(cols, meta["BLOCK"]))  # noqa: E731
    normalise_kernel[grid](x, row_max, row_sum, out, cols, x.stride(0), BLOCK=block_cols)
    return out


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()
        self._block = int(2 ** math.ceil(math.log2(64)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return triton_softmax(x.view(x.shape[0], -1), self._block)

"""Honest: allowed imports in every spelling (a submodule under an alias, ``from triton import
language``, ``from __future__``, ``typing``), a function-level import inside forward, and launch
arithmetic with ``math``."""
# task: vector_add
# expect: accepted
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F  # noqa: F401  (imported, unused, as many solutions do)
import triton
from triton import language as tl


class LaunchConfig:
    def __init__(self, block: int, warps: Optional[int] = None):
        self.block, self.warps = block, warps or 4


@triton.jit
def add_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(a_ptr + offs, mask=mask) + tl.load(b_ptr + offs, mask=mask), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.config = LaunchConfig(block=1024, warps=4)

    def forward(self, a, b):
        import math as m  # an import while the candidate runs

        out = torch.empty_like(a)
        n = a.numel()
        grid = (m.ceil(n / self.config.block), math.prod((1,)))
        add_kernel[grid[:1]](a, b, out, n, BLOCK=self.config.block, num_warps=self.config.warps)
        return out

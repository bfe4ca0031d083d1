"""Shared sources for the GPU tests: a ReLU task and CUDA (cupy.RawModule) candidates for it."""

from __future__ import annotations

from plugins.backends.cuda_backend import GUIDE_EXAMPLE

HONEST = GUIDE_EXAMPLE  # the guide's own example: an honest ReLU


def relu_task(rows: int, cols: int) -> str:
    return f'''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn({rows}, {cols})]


def get_init_inputs():
    return []
'''


def missing_hook(verdict, check: str = "performance") -> str | None:
    """Why a GPU stage could not measure (the worker session lacks the task), else None."""
    c = verdict.checks.get(check)
    if c is not None and "not measured" in c.detail or c is not None and "not checked" in c.detail:
        if "task source" in c.detail:
            return c.detail
    return None


def quick_checks(*skip: str) -> list[str]:
    """Every registered check except the slow sanitizer race tools (and ``skip``); the suite has to
    fit one GPU call. test_cuda_gpu.py runs the full set once."""
    from core.plugins import registry

    slow = {"gpu_racecheck", "gpu_synccheck", *skip}
    return [n for n in registry("verifier").names() if n not in slow]

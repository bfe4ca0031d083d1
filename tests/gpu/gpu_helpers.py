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


# The CuPy tutorial idiom: torch tensors handed to the kernel as CuPy arrays (cupy.asarray, the CUDA
# array interface), the result allocated by cupy.empty_like and handed back by torch.as_tensor.
CUPY_IDIOM = GUIDE_EXAMPLE[:GUIDE_EXAMPLE.index("    def forward")] + '''    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_cp = cp.asarray(x.contiguous())
        y_cp = cp.empty_like(x_cp)
        n = x_cp.size
        kernel = _module.get_function("relu_kernel")
        with cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            kernel(((n + 255) // 256,), (256,), (x_cp, y_cp, cp.int64(n)))
        return torch.as_tensor(y_cp, device="cuda")
'''
# The same through DLPack both ways, with a zeroed buffer viewed in the input's shape.
CUPY_IDIOM_DLPACK = (CUPY_IDIOM.replace("cp.asarray(x.contiguous())", "cp.from_dlpack(x.contiguous())")
                     .replace("cp.empty_like(x_cp)", "cp.zeros(x_cp.size, dtype=cp.float32).reshape(x_cp.shape)")
                     .replace('torch.as_tensor(y_cp, device="cuda")', "torch.from_dlpack(y_cp)"))
# CuPy library compute on the bridged arrays, the kernel launched on nothing: with real CuPy arrays
# (a naive judge) each returns the right answer and launches its "own" kernel.
_IDLE_LAUNCH = ("y_cp = cp.empty_like(x_cp)", "(x_cp, y_cp, cp.int64(n))", "(x_cp, y_cp, cp.int64(0))")
CUPY_COMPUTE_HACKS = {
    name: CUPY_IDIOM.replace(_IDLE_LAUNCH[0], compute).replace(_IDLE_LAUNCH[1], _IDLE_LAUNCH[2])
    for name, compute in (("operator", "y_cp = x_cp * (x_cp > 0)"), ("method", "y_cp = x_cp.clip(0, None)"))
}
# A buffer computed once per input address and handed back again (after an idle launch, so every call
# launches the candidate's kernel): torch.as_tensor makes a new storage over it each call, so only the
# bridge (Backend.output_owner) tells the worker it is an earlier output.
CUPY_CACHED_OUTPUT = (CUPY_IDIOM.replace("super().__init__()", "super().__init__()\n        self._made = {}")
                      .replace("        n = x_cp.size\n",
                               "        n = x_cp.size\n"
                               "        todo = n\n"
                               "        if x.data_ptr() in self._made:\n"
                               "            y_cp, todo = self._made[x.data_ptr()], 0\n"
                               "        self._made[x.data_ptr()] = y_cp\n")
                      .replace("(x_cp, y_cp, cp.int64(n))", "(x_cp, y_cp, cp.int64(todo))"))

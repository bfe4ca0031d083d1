"""A KernelZero backend shipped from outside the package: kernels written with Numba's ``@cuda.jit``.

On the CPU they run in Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``: each CUDA thread a Python
thread), so the full verifier judges them in CI; the same source is a CUDA kernel on a GPU. Everything
here uses KernelZero's public contract only (``core``, ``core.api``); no file of KernelZero names it.

    pip install ./examples/kernelzero-numba
    python -m core.verify --backend numba --device cpu --reference task.py --candidate solution.py
"""

from __future__ import annotations

from core import hookimpl
from kernelzero_numba.backend import NAME, NumbaBackend

__all__ = ["NAME", "NumbaBackend"]


@hookimpl
def register_backends(register):
    register(NAME, NumbaBackend)

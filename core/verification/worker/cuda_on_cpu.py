"""CUDA-only code run on the CPU, for analyses that need the Triton interpreter (``interp_races``).

KernelBench's own Triton example builds its inputs with ``.cuda()`` and asserts ``x.is_cuda``; the
interpreter runs only CPU tensors, so the race analysis of such a candidate could not run, and the
GPU verdict failed closed: KernelBench's example was rejected on the H200 (2026-12-01). In a CPU
worker started with :data:`ENV` set (``interp_races``' own workers; a ``Verifier`` made with
``cuda_on_cpu=True``):

* ``Tensor.cuda()`` returns the tensor itself, and ``Tensor.is_cuda`` is true;
* a ``device`` that names CUDA (``"cuda"``, ``"cuda:0"``, ``torch.device("cuda")``), as a keyword of
  any torch function or as ``Tensor.to``'s positional argument, is the CPU;
* ``torch.cuda.is_available()`` is true, so code that picks its GPU path with it (the expert
  teacher's ``_tuned = triton.autotune(...)(kernel) if torch.cuda.is_available() else None``, then
  ``if x.is_cuda: _tuned[grid](...)``) takes the path the GPU runs, not a half of each: with
  ``is_cuda`` true and ``is_available`` false it called ``None[grid]`` ("'NoneType' object is not
  subscriptable", every KernelBench matmul on the H200, 2026-12-04).

Nothing else of ``torch.cuda`` is imitated (streams, events, ``synchronize``): code that needs them
still fails there, and the check fails closed. The GPU verdict itself never uses this: the candidate's
outputs and timing are still judged on the GPU. It is installed before the candidate is loaded and
before the runtime guard records the instrumentation, so a candidate that undoes it is tampering.
"""

from __future__ import annotations

from typing import Any

ENV = "KERNELZERO_CUDA_ON_CPU"  # "1" in a worker's environment: install() at start-up (CPU workers only)


def _on_cpu(device: Any) -> Any:
    import torch

    if isinstance(device, torch.device):
        return torch.device("cpu") if device.type == "cuda" else device
    if isinstance(device, str) and (device == "cuda" or device.startswith("cuda:")):
        return "cpu"
    return device


def install() -> Any:
    """Patch torch as above in this process; returns the function mode it entered."""
    import torch
    from torch.overrides import TorchFunctionMode

    class CudaOnCpu(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            kwargs = dict(kwargs or {})
            if "device" in kwargs:
                kwargs["device"] = _on_cpu(kwargs["device"])
            if func is torch.Tensor.to and len(args) > 1:
                args = (args[0], _on_cpu(args[1]), *args[2:])
            return func(*args, **kwargs)

    def cuda(self: Any, device: Any = None, non_blocking: bool = False, memory_format: Any = None) -> Any:
        return self

    torch.Tensor.cuda = cuda
    torch.Tensor.is_cuda = property(lambda self: True)
    torch.cuda.is_available = lambda: True
    mode = CudaOnCpu()
    mode.__enter__()
    return mode

"""The ``numba`` backend: candidates whose ``forward`` launches ``@cuda.jit`` kernels.

Implements ``core.contracts.Backend`` with the public contract only. On ``device="cpu"`` the kernels run
in Numba's CUDA simulator, which executes each CUDA thread as a Python thread: slow (a few thousand
threads a second) but exact, so the verifier's correctness, integrity and stability stages mean what
they mean for the other backends. A GPU run needs numba-cuda and a CUDA toolkit and is not offered yet
(:meth:`NumbaBackend.supports` says so).
"""

from __future__ import annotations

import ast
import contextlib
import threading
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, ClassVar, Iterator

from core.api.policy import StaticPolicy
from core.api.sandbox import SandboxNeeds
from kernelzero_numba.policy import STATIC_POLICY

NAME = "numba"
SIMULATOR = "numba.cuda.simulator.kernel"
LAUNCH = f"{SIMULATOR}.FakeCUDAKernel.__call__"

GUIDE = """\
Write the kernels with Numba's CUDA dialect: functions decorated with `@cuda.jit` (`from numba import cuda`),
indexing with `cuda.grid(1)` (or `cuda.blockIdx`, `cuda.threadIdx`, `cuda.blockDim`), launched as
`kernel[blocks, threads_per_block](args)` on torch tensors from `forward`. `forward` allocates outputs
(`torch.empty_like`) and launches kernels; every computation happens inside the kernels. Guard each
thread with a bounds check (`if i < n:`), since the last block is usually partial.

Example:

    import torch
    import torch.nn as nn
    from numba import cuda

    @cuda.jit
    def relu_kernel(x, out, n):
        i = cuda.grid(1)
        if i < n:
            out[i] = x[i] if x[i] > 0 else 0.0

    class ModelNew(nn.Module):
        def forward(self, x):
            flat = x.contiguous().view(-1)
            out = torch.empty_like(flat)
            n = flat.numel()
            relu_kernel[(n + 255) // 256, 256](flat, out, n)
            return out.view_as(x)
"""


@dataclass
class LaunchTracker:
    """Launches of ``@cuda.jit`` kernels while the tracker is active (``core.contracts.LaunchTracker``)."""

    count: int = 0
    kernels: list[str] = field(default_factory=list)
    inside: bool = False


_active: list[LaunchTracker] = []  # the trackers entered in this worker, innermost last
_lock = threading.Lock()


def _counting(launch: Any) -> Any:
    """The simulator's launch, counted by every active tracker (device functions are calls, not launches)."""

    def counted_launch(kernel: Any, *args: Any) -> Any:
        if kernel._device or not _active:
            return launch(kernel, *args)
        with _lock:
            trackers = list(_active)
            for t in trackers:
                t.count += 1
                if len(t.kernels) < 64:
                    t.kernels.append(getattr(kernel.fn, "__name__", "?"))
                t.inside = True
        try:
            return launch(kernel, *args)
        finally:
            for t in trackers:
                t.inside = False

    return counted_launch


@dataclass
class NumbaBackend:
    """Numba ``@cuda.jit`` kernels; on the CPU, in the CUDA simulator."""

    name: str = NAME
    language: str = "Numba CUDA (@cuda.jit)"
    guide: str = GUIDE
    static_policy: StaticPolicy = STATIC_POLICY
    # The simulator runs each CUDA thread on a Python thread of its own (so the worker lets numba start
    # threads while a candidate launches) and its launch path is what the tracker patches.
    sandbox: ClassVar[SandboxNeeds] = SandboxNeeds(
        starts_threads=frozenset({"numba"}),
        snapshot_modules=(SIMULATOR,),
        snapshot_classes=(f"{SIMULATOR}.FakeCUDAKernel", f"{SIMULATOR}.BlockManager", f"{SIMULATOR}.BlockThread"),
        scratch_env={"NUMBA_CACHE_DIR": ".numba"},
    )
    _installed: Any = field(default=None, init=False, repr=False)

    # -- judge side

    def supports(self, device: str) -> str | None:
        if device == "cpu":
            return None
        if device == "cuda":
            return ("backend 'numba' runs in Numba's CUDA simulator on device=cpu only for now; "
                    "use --device cpu (a GPU run needs numba-cuda and a CUDA toolkit)")
        return f"unknown device {device!r}; expected 'cpu' or 'cuda'"

    def detect_kernels(self, tree: ast.Module) -> list[str]:
        """Functions decorated with ``@cuda.jit`` or ``@numba.cuda.jit`` (with or without arguments)."""
        names = []
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for decorator in node.decorator_list:
                    target = decorator.func if isinstance(decorator, ast.Call) else decorator
                    if ast.unparse(target) in ("cuda.jit", "numba.cuda.jit"):
                        names.append(node.name)
        return names

    def worker_env(self, device: str) -> dict[str, str]:
        return {"NUMBA_ENABLE_CUDASIM": "1"} if device == "cpu" else {}

    def toolchain(self) -> dict[str, str]:
        import numba

        return {"numba": numba.__version__}

    # -- worker side

    def prepare_worker(self, device: str) -> None:
        from numba import cuda  # noqa: F401  (the simulator, with NUMBA_ENABLE_CUDASIM=1)
        from numba.cuda.simulator import kernel as simulator

        if not getattr(simulator.FakeCUDAKernel.__call__, "_kz_counted", False):
            counted = _counting(simulator.FakeCUDAKernel.__call__)
            counted._kz_counted = True  # type: ignore[attr-defined]
            simulator.FakeCUDAKernel.__call__ = counted
        self._installed = simulator.FakeCUDAKernel.__call__

    def instrumentation(self) -> dict[str, Any]:
        """What :meth:`prepare_worker` patched; the worker checks it is still in place after each call."""
        return {LAUNCH: self._installed} if self._installed is not None else {}

    def load(self, module: ModuleType, device: str) -> None:
        """Nothing to build ahead: the simulator runs a kernel's Python. Every kernel must be one."""
        from numba.cuda.simulator.kernel import FakeCUDAKernel

        kernels = [v for v in vars(module).values() if isinstance(v, FakeCUDAKernel) and not v._device]
        if not kernels:
            raise RuntimeError("the module defines no @cuda.jit kernel after import")

    @contextlib.contextmanager
    def launch_tracker(self) -> Iterator[LaunchTracker]:
        tracker = LaunchTracker()
        with _lock:
            _active.append(tracker)
        try:
            yield tracker
        finally:
            with _lock:
                _active.remove(tracker)

    def capabilities(self, device: str) -> frozenset[str]:
        return frozenset()

    def bounds_checking(self) -> contextlib.AbstractContextManager[list[str]]:
        raise NotImplementedError("backend 'numba' has no bounds checker of its own")

    def program_order(self, seed: int | None) -> contextlib.AbstractContextManager[None]:
        raise NotImplementedError("backend 'numba' runs blocks in the simulator's order only")

"""The Triton backend: kernels written with ``@triton.jit``, run on the GPU when there is one and
in the Triton interpreter (``TRITON_INTERPRET=1``) on CPU.

Judge side it only parses (which functions are Triton kernels); worker side it counts launches and,
in the interpreter, bounds-checks memory accesses and shuffles program order
(:mod:`plugins.backends.triton_interp_checks`).
"""

from __future__ import annotations

import ast
import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

from core import hookimpl

GUIDE = """\
Write a Python module in KernelBench format that defines `class ModelNew(torch.nn.Module)` with the
same constructor arguments and `forward` signature as the reference `Model`. All of the arithmetic in
`forward` must happen in Triton kernels: functions decorated with `@triton.jit` (import triton and
triton.language as tl) that forward launches as `kernel[grid](...)`. Outside kernels, forward may only
allocate outputs (torch.empty, torch.empty_like), take views/reshape and make contiguous copies; calling
PyTorch compute (torch.relu, x + y, torch.matmul, F.softmax ...) is rejected. Mask every load and store
(`mask=offsets < n`) so sizes that are not a multiple of the block size stay in bounds, keep outputs in the
reference's dtype, and keep reductions numerically stable (subtract the row maximum before exp).
Do not read files, use the network, subprocesses, ctypes, numpy, or patch torch.
"""

_KERNEL_DECORATORS = {"jit", "autotune", "heuristics"}


@dataclass
class TritonLaunchTracker:
    count: int = 0
    kernels: list[str] = field(default_factory=list)
    depth: int = 0

    @property
    def inside(self) -> bool:
        return self.depth > 0


_local = threading.local()


def _current_tracker() -> TritonLaunchTracker | None:
    return getattr(_local, "tracker", None)


def _decorator_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


# A ReLU in this backend's format: the candidate of the verifier's pool warm-up (core.verify.WARM_UP_TASK).
WARM_UP_CANDIDATE = """\
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _relu(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, tl.where(x > 0, x, 0.0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        _relu[(triton.cdiv(n, 4096),)](x, y, n, BLOCK=4096)
        return y
"""


@dataclass
class TritonBackend:
    """See the module docstring. ``interpret``: "auto" (interpreter iff device is cpu), "always", "never"."""

    name: str = "triton"
    language: str = "Triton"
    guide: str = GUIDE
    interpret: str = "auto"
    warm_up_candidate: str = WARM_UP_CANDIDATE

    # -- judge side

    def supports(self, device: str) -> str | None:
        if device == "cpu":
            return None
        if device == "cuda":
            import torch

            if torch.cuda.is_available():
                return None
            return ("backend 'triton' on device 'cuda' needs a GPU; none is visible. Use device=cpu "
                    "(kernels run in the Triton interpreter) or run on a machine with CUDA")
        return f"unknown device {device!r}; expected 'cpu' or 'cuda'"

    def detect_kernels(self, tree: ast.Module) -> list[str]:
        names = []
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if any(_decorator_name(d) == "jit" for d in node.decorator_list):
                    names.append(node.name)
        return names

    def _interpreted(self, device: str) -> bool:
        return self.interpret == "always" or (self.interpret == "auto" and device == "cpu")

    def worker_env(self, device: str) -> dict[str, str]:
        env = {"TRITON_DEFAULT_FP_FUSION": os.environ.get("TRITON_DEFAULT_FP_FUSION", "1")}
        if self._interpreted(device):
            env["TRITON_INTERPRET"] = "1"
        return env

    # -- worker side

    def prepare_worker(self, device: str) -> None:
        import triton  # noqa: F401
        from triton.runtime import jit as triton_jit

        classes: list[type] = [triton_jit.JITFunction]
        if self._interpreted(device):
            from triton.runtime import interpreter

            from plugins.backends import triton_gpu_compile, triton_interp_checks

            triton_interp_checks.install()
            triton_gpu_compile.install()  # a kernel body no GPU compiler accepts never runs here
            classes.append(interpreter.InterpretedFunction)
        for cls in classes:
            _count_launches(cls)
        if device == "cuda" and not self._interpreted(device):
            try:
                _warm_up_gpu()
            except Exception as exc:  # the worker still serves; the first candidate launch will say more
                print(f"triton GPU warm-up failed: {type(exc).__name__}: {exc}", flush=True)


    def instrumentation(self) -> dict[str, Any]:
        """What :meth:`prepare_worker` patched and where the instruments keep their state, by dotted
        name; the worker verifies each is still in place after every candidate call."""
        import sys

        from triton.runtime import jit

        found: dict[str, Any] = {"plugins.backends.triton_backend._local": _local}
        if getattr(jit.JITFunction.run, "_kz_counting", False):
            found["triton.runtime.jit.JITFunction.run"] = jit.JITFunction.run
        interp = sys.modules.get("triton.runtime.interpreter")
        if interp is not None and getattr(interp.InterpretedFunction.run, "_kz_counting", False):
            from plugins.backends import triton_interp_checks as checks

            found["triton.runtime.interpreter.InterpretedFunction.run"] = interp.InterpretedFunction.run
            found["triton.runtime.interpreter.InterpretedFunction.__call__"] = interp.InterpretedFunction.__call__
            found["plugins.backends.triton_interp_checks.STATE"] = checks.STATE
            for hook in ("create_masked_load", "create_masked_store", "create_atomic_rmw", "create_atomic_cas",
                         "set_grid_dim", "set_grid_idx"):
                found[f"triton.runtime.interpreter.InterpreterBuilder.{hook}"] = getattr(interp.InterpreterBuilder, hook)
        return found

    def compiler_dirs(self) -> list[str]:
        """Directories and programs the worker may start while compiling: Triton's own tools
        (ptxas ...) and the C compiler Triton builds each new kernel signature's launcher with on a
        GPU ($CC, else gcc, else clang — the order of ``triton.runtime.build``)."""
        import shutil

        import triton

        allowed = [os.path.dirname(triton.__file__)]
        # The ptxas Triton is pointed at: $TRITON_PTXAS_PATH, or the one PyTorch bundles, which
        # torch._inductor selects when it is imported (the inductor teacher's kernels import it).
        import torch

        for ptxas in (os.environ.get("TRITON_PTXAS_PATH"), os.path.join(os.path.dirname(torch.__file__), "bin", "ptxas")):
            if ptxas and os.path.isfile(ptxas):
                allowed.append(os.path.realpath(ptxas))
        for cc in (os.environ.get("CC"), shutil.which("gcc"), shutil.which("clang"), shutil.which("cc")):
            if cc:
                allowed.append(os.path.realpath(shutil.which(cc) or cc))
        return allowed

    def toolchain(self) -> dict[str, str | None]:
        """The compiler a verdict depends on (the eval cache keys verdicts on it); read from the
        installed distribution, so nothing is imported."""
        from importlib import metadata

        try:
            return {"triton": metadata.version("triton")}
        except metadata.PackageNotFoundError:
            return {"triton": None}

    def load(self, module: Any, device: str) -> None:
        """Triton compiles each kernel at its first launch, so the first correctness trial is the
        compile step; nothing to build ahead of time."""

    @contextmanager
    def launch_tracker(self) -> Iterator[TritonLaunchTracker]:
        previous = _current_tracker()
        tracker = TritonLaunchTracker()
        _local.tracker = tracker
        try:
            yield tracker
        finally:
            _local.tracker = previous

    def capabilities(self, device: str) -> frozenset[str]:
        return frozenset({"bounds_check", "program_order"}) if self._interpreted(device) else frozenset()

    @contextmanager
    def bounds_checking(self) -> Iterator[list[str]]:
        from plugins.backends.triton_interp_checks import STATE

        findings: list[str] = []
        STATE.findings, STATE.seen = findings, set()
        try:
            yield findings
        finally:
            STATE.findings = None

    @contextmanager
    def program_order(self, seed: int | None) -> Iterator[None]:
        import random

        from plugins.backends.triton_interp_checks import STATE

        STATE.order_rng = random.Random(seed) if seed is not None else None
        try:
            yield
        finally:
            STATE.order_rng, STATE.perm = None, None


def _warm_up_gpu() -> None:
    """Compile and launch one tiny kernel before the sandbox's audit hook is armed: Triton's first
    GPU launch locates libcuda (``ldconfig -p``) and starts ptxas, which candidates may not do."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def _kz_fill(out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, offs.to(tl.float32), mask=offs < n)

    out = torch.empty(100, device="cuda")
    _kz_fill[(1,)](out, 100, BLOCK=128)
    torch.cuda.synchronize()


def _count_launches(cls: type) -> None:
    """Wrap ``cls.run`` (the launch entry point of ``kernel[grid](...)``) to count launches."""
    if getattr(cls.run, "_kz_counting", False):
        return
    original = cls.run

    def run(self, *args, grid, warmup, **kwargs):
        tracker = _current_tracker()
        if warmup or tracker is None:
            return original(self, *args, grid=grid, warmup=warmup, **kwargs)
        from plugins.backends import triton_interp_checks as checks

        name = getattr(getattr(self, "fn", None), "__name__", None) or getattr(self, "__name__", "kernel")
        tracker.count += 1
        if len(tracker.kernels) < 64:
            tracker.kernels.append(name)
        tracker.depth += 1
        saved = (checks.STATE.ranges, checks.STATE.kernel)
        checks.STATE.ranges, checks.STATE.kernel = checks.storage_ranges([args, list(kwargs.values())]), name
        try:
            return original(self, *args, grid=grid, warmup=warmup, **kwargs)
        finally:
            tracker.depth -= 1
            checks.STATE.ranges, checks.STATE.kernel = saved

    run._kz_counting = True  # type: ignore[attr-defined]
    cls.run = run


@hookimpl
def register_backends(register):
    register("triton", TritonBackend)

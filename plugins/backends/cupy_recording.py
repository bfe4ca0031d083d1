"""Recording and counting a ``cuda`` candidate's CuPy kernels in the sandbox worker.

:class:`CupyRecorder` swaps ``cupy.RawModule``/``cupy.RawKernel`` for subclasses that record every
CUDA source built and count every launch, and ``cupy``'s array functions for the bridge of
:mod:`plugins.backends.cupy_bridge` (views to launch on, no CuPy compute). Without a GPU (``dry``)
sources are still recorded, and a launch raises :class:`GpuRequiredError`.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections import Counter
from typing import Any, Iterator, Sequence

from plugins.backends import cupy_bridge
from plugins.backends.cuda_static import KernelSource

NEEDS_GPU = (
    "execution needs a GPU: backend 'cuda' compiled the kernels to PTX with NVRTC, but running, "
    "correctness and timing need CUDA. Run on a machine with a GPU (device=cuda), or use "
    "backend=triton, which runs in the Triton interpreter on CPU"
)


class GpuRequiredError(RuntimeError):
    """A CUDA kernel was launched in a process without a GPU."""


class LaunchTracker:
    """Launches counted while a :meth:`CudaBackend.launch_tracker` context is open.

    Follows :class:`core.contracts.LaunchTracker`: ``count``, ``kernels`` (capped), ``inside``.
    """

    MAX_NAMES = 10_000

    def __init__(self) -> None:
        self.count = 0
        self.kernels: list[str] = []
        self.inside = False


class LaunchLog:
    """Sources built and kernel launches made by a candidate while a :class:`CupyRecorder` is on."""

    def __init__(self) -> None:
        self.sources: list[KernelSource] = []
        self.owners: list[dict[str, Any] | None] = []  # globals of the code that built each source
        self.modules: list[tuple[Any, dict[str, Any] | None]] = []  # (RawModule/RawKernel, owner)
        self.launches: Counter[str] = Counter()
        self.trackers: list[LaunchTracker] = []

    def sources_of(self, namespace: dict[str, Any]) -> list[KernelSource]:
        """Sources built by code whose globals are ``namespace`` (one candidate module)."""
        return [src for src, owner in zip(self.sources, self.owners) if owner is namespace]

    def forget_others(self, namespace: dict[str, Any]) -> None:
        """Drop what earlier candidates recorded (a warm worker judges many candidates)."""
        keep = [i for i, owner in enumerate(self.owners) if owner is namespace]
        self.sources = [self.sources[i] for i in keep]
        self.owners = [self.owners[i] for i in keep]
        self.modules = [(m, owner) for m, owner in self.modules if owner is namespace]

    @property
    def total_launches(self) -> int:
        return sum(self.launches.values())

    def reset_launches(self) -> None:
        self.launches.clear()

    @contextlib.contextmanager
    def launching(self, name: str) -> Iterator[None]:
        self.launches[name] += 1
        for t in self.trackers:
            t.count += 1
            if len(t.kernels) < LaunchTracker.MAX_NAMES:
                t.kernels.append(name)
            t.inside = True
        try:
            yield
        finally:
            for t in self.trackers:
                t.inside = False


class _KernelProxy:
    """Wraps a CuPy kernel: counts launches, forwards everything else."""

    def __init__(self, kernel: Any, name: str, log: LaunchLog, dry: bool):
        self._kernel, self._name, self._log, self._dry = kernel, name, log, dry

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._dry:
            raise GpuRequiredError(f"kernel {self._name!r} was launched, but {NEEDS_GPU}")
        args, kwargs = cupy_bridge.unwrap(args, kwargs)
        with self._log.launching(self._name):
            return self._kernel(*args, **kwargs)

    def __getattr__(self, item: str) -> Any:
        if self._dry:
            raise GpuRequiredError(f"kernel attribute {item!r} asked for, but {NEEDS_GPU}")
        return getattr(self._kernel, item)


def _caller_globals() -> dict[str, Any] | None:
    """Globals of the first frame outside CuPy and this file: the code that built the module."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not (name == __name__ or name.startswith(("cupy", "cupy_backends"))):
            return frame.f_globals
        frame = frame.f_back
    return None


class CupyRecorder:
    """Swap ``cupy.RawModule`` / ``cupy.RawKernel`` for recording, launch-counting subclasses, and
    ``cupy``'s array functions for the bridge's (:mod:`plugins.backends.cupy_bridge`).

    Installed in the sandbox worker before a candidate is executed. ``dry=True`` (no GPU) makes
    ``get_function`` return kernels that raise :class:`GpuRequiredError` when launched, so a module
    can be imported and its sources recorded on a CPU machine.
    """

    def __init__(self, dry: bool = False):
        self.dry = dry
        self.log = LaunchLog()
        self.bridge: cupy_bridge.Bridge | None = None  # on a GPU: the array bridge the candidate was given
        self._saved: dict[str, Any] = {}

    def _classes(self) -> dict[str, type]:
        import cupy

        log, dry = self.log, self.dry

        def _record(obj: Any, kind: str, kernel_name: str | None = None) -> None:
            code = getattr(obj, "code", None)
            owner = _caller_globals()
            log.modules.append((obj, owner))
            if code:
                log.owners.append(owner)
                log.sources.append(
                    KernelSource(
                        code=code,
                        options=tuple(getattr(obj, "options", ()) or ()),
                        name_expressions=tuple(getattr(obj, "name_expressions", None) or ()),
                        kind=kind,
                        kernel_name=kernel_name,
                        origin="recorded",
                    )
                )

        class RawModule(cupy.RawModule):  # type: ignore[misc,valid-type]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                _record(self, "RawModule")

            def get_function(self, name: str) -> Any:
                kernel = None if dry else super().get_function(name)
                return _KernelProxy(kernel, name, log, dry)

            def get_global(self, name: str) -> Any:
                """A ``__device__``/``__constant__`` global's address (``.ptr``) to launch on; not CuPy's
                MemoryPointer, whose copies from the host are data no kernel computed."""
                if dry:
                    raise GpuRequiredError(f"global {name!r} asked for, but {NEEDS_GPU}")
                return cupy_bridge.DevicePointer(int(super().get_global(name).ptr))

        class RawKernel(cupy.RawKernel):  # type: ignore[misc,valid-type]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                _record(self, "RawKernel", kernel_name=self.name)

            def __call__(self, *args: Any, **kwargs: Any) -> Any:
                if dry:
                    raise GpuRequiredError(f"kernel {self.name!r} was launched, but {NEEDS_GPU}")
                args, kwargs = cupy_bridge.unwrap(args, kwargs)
                with log.launching(self.name):
                    return super().__call__(*args, **kwargs)

        return {"RawModule": RawModule, "RawKernel": RawKernel}

    def _bridged(self) -> dict[str, Any]:
        """``cupy.asarray`` and the rest of :data:`cupy_bridge.BRIDGED`: views and buffers to launch on."""
        import cupy

        if not self.dry:
            self.bridge = cupy_bridge.Bridge(cupy)
            return self.bridge.functions()

        def needs_gpu(name: str) -> Any:
            def refuse(*args: Any, **kwargs: Any) -> Any:
                raise GpuRequiredError(f"cupy.{name} was called, but {NEEDS_GPU}")
            return refuse

        return {name: needs_gpu(name) for name in cupy_bridge.BRIDGED}

    def install(self) -> "CupyRecorder":
        import cupy

        if self._saved:
            return self
        for name, replacement in {**self._classes(), **self._bridged()}.items():
            self._saved[name] = getattr(cupy, name)
            setattr(cupy, name, replacement)
        return self

    def uninstall(self) -> None:
        import cupy

        for name, original in self._saved.items():
            setattr(cupy, name, original)
        self._saved.clear()

    def __enter__(self) -> "CupyRecorder":
        return self.install()

    def __exit__(self, *exc: Any) -> None:
        self.uninstall()


def execute_candidate(source: str, module_name: str = "kz_cuda_candidate") -> types.ModuleType:
    """Execute candidate source as a fresh module (sandbox worker only, never the judge)."""
    module = types.ModuleType(module_name)
    module.__file__ = f"<{module_name}>"
    sys.modules[module_name] = module
    module.__dict__["__kz_source__"] = source
    exec(compile(source, module.__file__, "exec"), module.__dict__)  # noqa: S102 - worker-side by design
    return module


def record_sources(source: str, init_inputs: Sequence[Any] | None = None, *, dry: bool = True) -> tuple[
    list[KernelSource], str | None
]:
    """Execute the candidate under a recorder and return the CUDA sources it built.

    Runs in the sandbox worker. ``ModelNew(*init_inputs)`` is constructed too (when given), since
    modules are often built in ``__init__``. Returns ``(sources, error)``; ``error`` describes an
    exception raised while executing, if any (sources recorded before it are kept).
    """
    error = None
    with CupyRecorder(dry=dry) as recorder:
        try:
            module = execute_candidate(source)
            if init_inputs is not None and hasattr(module, "ModelNew"):
                module.ModelNew(*init_inputs)
        except GpuRequiredError:
            pass  # a kernel fetched or launched at construction time; the sources are recorded
        except Exception as exc:  # the candidate's own failure, reported to the user
            error = f"{type(exc).__name__}: {exc}"
        finally:
            sys.modules.pop("kz_cuda_candidate", None)
    return recorder.log.sources, error

"""The ``cuda`` backend: KernelBench candidates whose kernels are CUDA C built by ``cupy.RawModule``.

A candidate is a KernelBench-format module defining ``ModelNew``; its kernels are CUDA C source
strings compiled through ``cupy.RawModule(code=...)`` (or ``cupy.RawKernel(code, name)``) and
launched on the memory of torch tensors (``tensor.data_ptr()``). :data:`GUIDE` tells a coder the
format, with a complete example.

Stages this backend provides:

* static (judging process, no candidate code runs; :mod:`plugins.backends.cuda_static`): parses,
  defines ``ModelNew``, constructs a ``RawModule``/``RawKernel``, has a ``__global__`` kernel in a
  string; string literals passed as ``code=`` (directly or through module-level names) are resolved
  from the AST.
* compile: every recorded CUDA source goes through NVRTC to PTX for the target arch
  (``sm_90`` without a GPU; the device's own arch with one), so ``compiled`` means something on a
  machine without a GPU. Sources that are not plain literals are recorded in the sandbox worker by
  executing the module with a recording ``RawModule`` (never in the judging process).
* load (GPU, worker): the module runs with counting ``RawModule``/``RawKernel`` classes, so the
  integrity check can ask how many times the candidate's own kernels were launched.

Without a GPU nothing executes: the verdict says that execution needs a GPU.
"""

from __future__ import annotations

import ast
import contextlib
import types
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterator, Sequence

from core import hookimpl
from core.api.policy import BASE_BARRED_ATTRIBUTES, TORCH_MODULES, TYPING, StaticPolicy, module
from core.api.sandbox import COMPUTE_SANITIZER, CUPTI, SandboxNeeds
from plugins.backends import cupy_bridge, nvrtc
from plugins.backends.cuda_static import KernelSource, StaticReport, analyse_source, kernel_class_of
from plugins.backends.cupy_recording import (  # noqa: F401 (re-exported: the recording is this backend's)
    NEEDS_GPU,
    CupyRecorder,
    GpuRequiredError,
    LaunchLog,
    LaunchTracker,
    execute_candidate,
    record_sources,
)

NAME = "cuda"

GUIDE = '''\
Write a CUDA kernel for the task as a KernelBench solution: one Python module that defines
`class ModelNew(torch.nn.Module)` with the same constructor and forward signature as `Model`.
All of forward's arithmetic runs in your CUDA C kernels; PyTorch may only allocate outputs
(torch.empty*), make tensors contiguous and read shapes. Rules:
- Put the CUDA C source in a Python string and compile it with `cupy.RawModule(code=SRC)` at module
  level (compilation is lazy and cached). Mark kernels `extern "C" __global__` so
  `module.get_function("name")` finds them (or use `name_expressions=` for templates).
- Launch on the tensors' memory: pass `tensor.data_ptr()` for pointers (they become 64-bit
  pointers), `cp.int64(n)` / `cp.int32(n)` / `cp.float32(v)` for scalars (match the kernel's
  parameter types exactly), on PyTorch's current stream. Import only torch and cupy. CuPy arrays
  (`cp.asarray(tensor)`, `cp.empty_like`, back with `torch.as_tensor`) work as views to launch on;
  CuPy's operators and functions do not.
- Guard every index against the size (sizes are not multiples of your block size), use 64-bit
  indices for large tensors, and honour the input dtype (float32 unless the task says otherwise).
- Allocate a fresh output every call; never reuse a previous result; do no work on other streams.

Example (ReLU):

```python
import cupy as cp
import torch
import torch.nn as nn

SRC = r"""
extern "C" __global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        y[i] = v > 0.0f ? v : 0.0f;
    }
}
"""
_module = cp.RawModule(code=SRC)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        threads = 256
        blocks = (n + threads - 1) // threads
        kernel = _module.get_function("relu_kernel")
        with cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            kernel((blocks,), (threads,), (x.data_ptr(), y.data_ptr(), cp.int64(n)))
        return y
```
'''
# The guide's example (a ReLU) as a candidate source: the pool warm-up's candidate, and the GPU tests' honest one.
GUIDE_EXAMPLE = GUIDE.split("```python\n")[1].split("```")[0]

CUPY_MISSING = "backend 'cuda' needs CuPy: pip install 'kernelzero[cuda]'"


def cupy_missing() -> str | None:
    """:data:`CUPY_MISSING` when CuPy is not installed (every worker of this backend imports it), else None.
    Found without importing it, so the judge stays light."""
    import importlib.util

    try:
        found = importlib.util.find_spec("cupy") is not None
    except (ImportError, ValueError):  # ValueError: sys.modules["cupy"] is None (blocked)
        found = False
    return None if found else CUPY_MISSING


# What a candidate may name (plugins/verifiers/policy): torch's tensors and modules, and of CuPy what
# builds and launches its own kernels, plus the array bridge every CuPy tutorial uses (cupy.asarray,
# cupy.empty_like, torch.as_tensor / torch.from_dlpack back). In the worker those array functions give
# views with no CuPy compute (plugins/backends/cupy_bridge.py); the rest of cupy's arrays stays refused.
_TORCH = next(rule for rule in TORCH_MODULES if rule.name == "torch")
STATIC_POLICY = StaticPolicy(
    backend="cuda",
    modules=TORCH_MODULES + (
        TYPING,
        module("cupy", members={"RawModule", "RawKernel", "bool_", "int8", "int16", "int32", "int64", "uint8",
                                "uint16", "uint32", "uint64", "float16", "float32", "float64", "intp", "uintp",
                                *cupy_bridge.BRIDGED}),
        module("cupy.cuda", members={"ExternalStream", "Stream", "Device", "get_current_stream"}),
    ),
    barred_attributes=BASE_BARRED_ATTRIBUTES - {"from_dlpack"},
    kernel_factories=frozenset({"cupy.RawKernel"}),
    kernel_getters=frozenset({"get_function"}),
).with_modules(module("torch", barred={k: v for k, v in _TORCH.barred if k != "from_dlpack"}))


@dataclass
class CompileReport:
    """The compile stage's outcome: ``ok`` only when every source compiled."""

    ok: bool
    reason: str | None
    detail: str
    arch: str
    sources: int = 0
    kernels: list[str] = field(default_factory=list)
    seconds: float = 0.0
    executed: bool = False  # the module was executed to record its sources

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "reason": self.reason,
            "detail": self.detail,
            "arch": self.arch,
            "sources": self.sources,
            "kernels": list(self.kernels),
            "seconds": self.seconds,
            "executed": self.executed,
        }




# --------------------------------------------------------------------------- compile stage


def device_arch(device: str) -> str:
    """``sm_XY`` of the visible GPU for ``device='cuda'``, else the reference GPU's (the device registry)."""
    if device.startswith("cuda"):
        try:
            import torch

            if torch.cuda.is_available():
                major, minor = torch.cuda.get_device_capability()
                return f"sm_{major}{minor}"
        except Exception:
            pass
    return nvrtc.default_arch()


def _compile_key(src: KernelSource, arch: str) -> tuple[Any, ...]:
    return src.code, src.options, src.name_expressions, arch


def _compile(src: KernelSource, arch: str) -> nvrtc.CompileResult:
    return nvrtc.compile_to_ptx(src.code, arch=arch, options=src.options, name_expressions=src.name_expressions)


def compile_sources(sources: Sequence[KernelSource], arch: str,
                    compiled: dict[tuple[Any, ...], nvrtc.CompileResult] | None = None) -> CompileReport:
    """Compile every source to PTX; the first failure's compiler message becomes the reason.
    ``compiled``: results already made for identical sources (:meth:`CudaBackend.precompile`)."""
    if not sources:
        return CompileReport(False, "no CUDA source was built by the candidate (no RawModule/RawKernel "
                             "construction ran)", "nothing to compile", arch)
    kernels: list[str] = []
    seconds = 0.0
    compilers = set()
    for i, src in enumerate(sources):
        try:
            result = (compiled or {}).get(_compile_key(src, arch)) or _compile(src, arch)
        except nvrtc.NoCompilerError as exc:
            return CompileReport(False, str(exc), "no CUDA compiler available", arch, len(sources))
        seconds += result.seconds
        compilers.add(result.compiler)
        if not result.ok:
            where = f"source {i + 1} of {len(sources)} ({src.kind}, {src.origin})"
            log = result.log.strip()
            return CompileReport(
                False,
                f"CUDA compilation failed in {where} with {result.compiler} for {arch}:\n{log}",
                result.summary(),
                arch,
                len(sources),
                seconds=seconds,
            )
        missing = []
        if src.kind == "RawKernel" and src.kernel_name and src.kernel_name not in result.entries:
            missing.append(src.kernel_name)
        if missing:
            return CompileReport(
                False,
                f"RawKernel asks for kernel {missing[0]!r} but the source defines {result.entries}; "
                'declare it `extern "C" __global__` or fix the name',
                "kernel name not found",
                arch,
                len(sources),
                seconds=seconds,
            )
        kernels += result.entries
    if not kernels:
        return CompileReport(False, "the CUDA source compiled but defines no __global__ kernel", "no kernels",
                             arch, len(sources), seconds=seconds)
    detail = f"{len(sources)} source(s) compiled to PTX for {arch} with {', '.join(sorted(compilers))}: {kernels}"
    return CompileReport(True, None, detail, arch, len(sources), kernels, seconds)


# --------------------------------------------------------------------------- the backend object


_GLOBAL_RE = __import__("re").compile(r"__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+"
                                       r"(?:__launch_bounds__\s*\([^)]*\)\s*)?([A-Za-z_]\w*)")


def kernel_names(code: str) -> list[str]:
    """Names of the ``__global__`` functions declared in a CUDA source (a textual scan)."""
    return _GLOBAL_RE.findall(code)


def compile_loaded_modules(log: LaunchLog) -> None:
    """On a GPU: force CuPy to build every recorded module now, so errors surface as compile errors."""
    for obj, _ in log.modules:
        compile_now = getattr(obj, "compile", None)
        if compile_now is not None:
            compile_now()


def _warm_up_cupy() -> None:
    """Build and launch one tiny RawModule kernel on torch memory, as a candidate does: CuPy's
    device, stream and module set-up and NVRTC's first compile then happen while the worker is idle
    in its pool, not inside the first candidate's verdict (on the H200: ~1.5 s of its load stage)."""
    import cupy
    import torch

    torch.cuda.init()
    cupy.cuda.runtime.getDeviceCount()
    out = torch.zeros(32, device="cuda")
    module = cupy.RawModule(code='extern "C" __global__ void kz_warm(float* y) { y[threadIdx.x] = 1.0f; }')
    with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
        module.get_function("kz_warm")((1,), (32,), (out.data_ptr(),))
    torch.cuda.synchronize()


@dataclass
class CudaBackend:
    """CUDA C kernels through ``cupy.RawModule``; compiles anywhere, executes only on a GPU.

    Implements :class:`core.contracts.Backend`. Without a GPU, :meth:`supports` says that execution
    needs one, and :meth:`load` still compiles every CUDA source the module built (NVRTC to PTX
    for ``arch``), so ``compiled`` is meaningful on a CPU machine.

    :param arch: target of the device-less compile (default: the reference GPU's in the device registry); on a
        GPU the device's own arch is used.
    """

    arch: str = ""  # "": the reference GPU's (plugins/devices.py)
    name: str = NAME
    language: str = "CUDA C (cupy.RawModule)"
    guide: str = GUIDE
    # the guide's own example (a ReLU) is the candidate of the verifier's pool warm-up (core.verify.WARM_UP_TASK)
    warm_up_candidate: str = GUIDE_EXAMPLE
    static_policy: StaticPolicy = STATIC_POLICY
    # CuPy's driver bindings use ctypes while a candidate launches; nvcc/NVRTC find their headers in CUDA_HOME
    sandbox: ClassVar[SandboxNeeds] = SandboxNeeds(touches_memory=frozenset({"cupy"}), passthrough_env=("CUDA_HOME",),
                                                   gpu_tools=frozenset({COMPUTE_SANITIZER, CUPTI}))
    # without a GPU the static and compile stages still mean something (NVRTC to PTX); a verifier
    # may then report "compiled" and stop with supports(device) as the reason
    compiles_without_device: bool = True
    _recorder: CupyRecorder | None = field(default=None, init=False, repr=False)
    last_compile: CompileReport | None = field(default=None, init=False, repr=False)
    # PTX of the next candidate's literal sources, compiled by precompile() before load()
    _precompiled: dict[tuple[Any, ...], nvrtc.CompileResult] = field(default_factory=dict, init=False, repr=False)

    # ---------------------------------------------------------------- judge side (static only)
    def supports(self, device: str) -> str | None:
        missing = cupy_missing()
        if missing:
            return missing
        if device.startswith("cuda"):
            from core.api.devices import cuda_visible  # torch's import waits: the workers spawn first

            if cuda_visible():
                return None
            return "backend 'cuda' was asked to run on a GPU, but no CUDA device is visible"
        return NEEDS_GPU

    def compiles_on(self, device: str) -> bool:
        """Without a GPU the sources are recorded by CuPy's own classes and compiled to PTX: CuPy is needed."""
        return device == "cpu" and cupy_missing() is None

    def detect_kernels(self, tree: ast.Module) -> list[str]:
        """``__global__`` kernels in the candidate's strings, if it builds a RawModule/RawKernel."""
        if not any(isinstance(n, ast.Call) and kernel_class_of(n) for n in ast.walk(tree)):
            return []
        names: list[str] = []
        for n in ast.walk(tree):
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and "__global__" in n.value:
                names += [k for k in kernel_names(n.value) if k not in names]
        return names

    def static_check(self, source: str) -> StaticReport:
        return analyse_source(source)

    def worker_env(self, device: str) -> dict[str, str]:
        return {}

    def capabilities(self, device: str) -> frozenset[str]:
        return frozenset()  # memory/race checking on a GPU is compute-sanitizer's (plugins/verifiers/sanitizer.py)

    def compiler_dirs(self) -> list[str]:
        """Directories whose programs a worker may start (CuPy's ``backend='nvcc'`` runs nvcc)."""
        import os
        import shutil

        nvcc = shutil.which("nvcc")
        return [os.path.dirname(os.path.realpath(nvcc)), os.path.dirname(nvcc)] if nvcc else []

    def toolchain(self) -> dict[str, str | None]:
        """CuPy and the NVRTC it compiles with (the eval cache keys verdicts on them)."""
        from importlib import metadata

        cupy = None
        for dist in ("cupy-cuda12x", "cupy-cuda13x", "cupy"):
            try:
                cupy = metadata.version(dist)
                break
            except metadata.PackageNotFoundError:
                continue
        return {"cupy": cupy, "nvrtc": nvrtc.nvrtc_version()}

    # ---------------------------------------------------------------- worker side
    def prepare_worker(self, device: str) -> None:
        """Import CuPy, load NVRTC (and on a GPU the CUDA context), and install the recording,
        launch-counting RawModule/RawKernel classes; all before any candidate code runs."""
        if device.startswith("cuda") and self._recorder is None:
            _warm_up_cupy()  # with CuPy's own classes: the recorder would log this launch as a candidate's
        if self._recorder is None:
            self._recorder = CupyRecorder(dry=not device.startswith("cuda")).install()
        if nvrtc.nvrtc_available():  # load the compiler library now, not under the sandbox guard
            nvrtc.compile_to_ptx('extern "C" __global__ void kz_warm() {}', arch=self.target_arch(device))

    def instrumentation(self) -> dict[str, Any]:
        """What :meth:`prepare_worker` patched, by dotted name (the recording, launch-counting CuPy
        classes); the worker verifies each is still in place after every candidate call."""
        if self._recorder is None or not self._recorder._saved:
            return {}
        import cupy

        return {f"cupy.{name}": getattr(cupy, name) for name in self._recorder._saved}

    def output_owner(self, storage: Any) -> Any:
        """The bridge's buffer an output made by ``torch.as_tensor(array)`` views (a new storage each call),
        so a buffer cached and returned again is seen as an earlier output (``core.contracts``)."""
        bridge = self._recorder.bridge if self._recorder is not None else None
        return storage if bridge is None else bridge.owner_of(storage)

    def _log(self) -> LaunchLog:
        if self._recorder is None:
            raise RuntimeError("CudaBackend.prepare_worker(device) must run before candidates are loaded")
        return self._recorder.log

    def precompile(self, source: str, device: str) -> dict[str, Any]:
        """Compile the CUDA sources written as literals in the candidate's text to PTX now, for the
        next :meth:`load`: nothing of the candidate runs (its text is only parsed), so a verifier can
        do this without holding the GPU, and the load, which holds it, compiles only what was built
        at run time. Failures are not kept: the load compiles those again and reports them."""
        self._precompiled = {}
        arch = self.target_arch(device)
        for src in analyse_source(source).sources or []:
            try:
                result = _compile(src, arch)
            except nvrtc.NoCompilerError:
                break
            if result.ok:
                self._precompiled[_compile_key(src, arch)] = result
        return {"precompiled": len(self._precompiled)}

    def load(self, module: types.ModuleType, device: str) -> None:
        """Compile every CUDA source the candidate built; raise with the compiler's message if any fails.

        Sources come from the ``RawModule``/``RawKernel`` constructions recorded while the module
        was imported, plus those read statically from its source text (built later, e.g. in
        ``ModelNew.__init__``). On a GPU, CuPy then builds the recorded modules for real.
        """
        log = self._log()
        log.forget_others(module.__dict__)
        sources = log.sources_of(module.__dict__)
        text = _module_source(module)
        if text is not None:
            static = analyse_source(text).sources or []
            known = {s.code for s in sources}
            sources += [s for s in static if s.code not in known]
        precompiled, self._precompiled = self._precompiled, {}
        report = compile_sources(sources, self.target_arch(device), precompiled)
        self.last_compile = report
        if not report.ok:
            raise RuntimeError(report.reason)
        if device.startswith("cuda"):
            compile_loaded_modules(log)

    @contextlib.contextmanager
    def launch_tracker(self) -> Iterator[LaunchTracker]:
        log = self._log()
        tracker = LaunchTracker()
        log.trackers.append(tracker)
        try:
            yield tracker
        finally:
            log.trackers.remove(tracker)

    def bounds_checking(self) -> contextlib.AbstractContextManager[list[str]]:
        raise NotImplementedError("backend 'cuda' has no in-process bounds checker; use the compute-sanitizer "
                                  "memcheck stage (plugins/verifiers/sanitizer.py) on a GPU")

    def program_order(self, seed: int | None) -> contextlib.AbstractContextManager[None]:
        raise NotImplementedError("backend 'cuda' cannot reorder thread blocks; use the compute-sanitizer "
                                  "racecheck stage on a GPU")

    # ---------------------------------------------------------------- helpers
    def target_arch(self, device: str) -> str:
        return device_arch(device) if device.startswith("cuda") else (self.arch or nvrtc.default_arch())

    def compile(self, source: str, device: str = "cpu", init_inputs: Sequence[Any] | None = None) -> CompileReport:
        """Static + compile stages on a source text, for tools and tests (call it in a worker: it
        executes the candidate when its CUDA source is not a plain literal)."""
        static = analyse_source(source)
        if not static.ok:
            return CompileReport(False, static.detail, "static check failed", self.target_arch(device))
        executed = False
        sources = static.sources
        if sources is None:
            sources, error = record_sources(source, init_inputs, dry=not device.startswith("cuda"))
            executed = True
            if not sources:
                why = f"; executing the module raised {error}" if error else ""
                return CompileReport(False, f"the candidate built no CUDA source at import or in ModelNew(){why}",
                                     "nothing recorded", self.target_arch(device), executed=True)
        report = compile_sources(sources, self.target_arch(device))
        report.executed = executed
        return report


def _module_source(module: types.ModuleType) -> str | None:
    text = getattr(module, "__kz_source__", None)
    if isinstance(text, str):
        return text
    path = getattr(module, "__file__", None)
    if path and not path.startswith("<"):
        try:
            with open(path, encoding="utf-8") as fh:
                return fh.read()
        except OSError:
            return None
    return None


@hookimpl
def register_backends(register):
    register(NAME, CudaBackend)

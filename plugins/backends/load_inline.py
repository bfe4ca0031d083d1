"""The ``cuda_inline`` backend: KernelBench's own CUDA format, ``torch.utils.cpp_extension.load_inline``.

A candidate is a KernelBench-format module whose ``ModelNew`` calls the functions of a module built
by ``load_inline(name, cpp_sources, cuda_sources, functions=[...])``: CUDA C ``__global__`` kernels
plus the C++ host functions that launch them, bound through pybind11. :data:`GUIDE` tells a coder
the format, with a complete example (a ReLU, also the pool warm-up's candidate).

Stages this backend provides:

* static (judge side, nothing runs; :mod:`plugins.backends.load_inline_static`): ``detect_kernels``
  finds the ``__global__`` functions in the strings of a candidate that calls ``load_inline``; the
  ``cuda_inline_source`` check refuses what the C++ could do unseen (kernels below the dispatcher,
  vendor libraries, host computation, Python, processes, threads, files, outside build flags).
* compile: on a GPU host the extension is built for real (ninja, nvcc and the C++ compiler, in
  the worker's scratch directory); without a GPU every extension's CUDA translation unit is
  compiled with ``nvcc -c`` as ``load_inline`` would compile it, so a CPU machine with nvcc still
  gives a compile-only verdict (:mod:`plugins.backends.load_inline_build`).
* load (GPU, worker): calls of the extension's bound functions are counted as the candidate's
  launches. ATen ops that the C++ dispatches (``at::relu``, ``torch::matmul``) are seen by the
  ATen audit and rejected as PyTorch compute; allocation (``torch::empty_like``) is allowed as in
  every backend. Work the audit cannot see is what ``cuda_inline_source`` refuses by name.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib.util
import os
import types
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterator

from core import hookimpl
from core.api.evidence import STATIC, Evidence
from core.api.policy import TORCH_MODULES, TYPING, StaticPolicy, module
from core.api.sandbox import COMPUTE_SANITIZER, SandboxNeeds
from core.verdict import CheckResult
from plugins.backends import load_inline_build as build
from plugins.backends.load_inline_static import (
    InlineExtension,
    analyse_source,
    detect_kernels,
    extension_problems,
    source_findings,
)

NAME = "cuda_inline"
NEEDS_GPU = build.NEEDS_GPU

GUIDE = '''\
Write a CUDA kernel for the task as a KernelBench solution: one Python module that defines
`class ModelNew(torch.nn.Module)` with the same constructor and forward signature as `Model`.
Build the kernels with `torch.utils.cpp_extension.load_inline(name=..., cpp_sources=...,
cuda_sources=..., functions=[...])` at module level and call the bound functions in forward.
All of forward's arithmetic runs in your `__global__` kernels. Rules:
- `cuda_sources` holds the kernels and the C++ host functions that launch them (taking and returning
  `torch::Tensor`); `cpp_sources` declares those host functions; `functions` names them.
- Host code may only check arguments, allocate outputs (torch::empty, torch::empty_like), make
  inputs contiguous and read sizes. No ATen compute (at::relu, torch::matmul, x.add(...)), no
  cuBLAS/cuDNN/Thrust, no copies to the host, no threads, files or processes, no extra build flags
  that include or link other code.
- Launch on PyTorch's current stream (`c10::cuda::getCurrentCUDAStream()` from
  <c10/cuda/CUDAStream.h>), guard every index against the size, use 64-bit indices for large
  tensors, and honour the input dtype (float32 unless the task says otherwise).
- Allocate a fresh output every call; never reuse a previous result.

Example (ReLU):

```python
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SRC = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        y[i] = v > 0.0f ? v : 0.0f;
    }
}

torch::Tensor relu_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "relu_forward expects a float32 CUDA tensor");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    long long n = xc.numel();
    if (n == 0) return y;
    const int threads = 256;
    const long long blocks = (n + threads - 1) / threads;
    relu_kernel<<<blocks, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(xc.data_ptr<float>(), y.data_ptr<float>(), n);
    TORCH_CHECK(cudaGetLastError() == cudaSuccess, "relu_kernel failed to launch");
    return y;
}
"""

CPP_SRC = "torch::Tensor relu_forward(torch::Tensor x);"

relu_ext = load_inline(name="kz_relu", cpp_sources=CPP_SRC, cuda_sources=CUDA_SRC, functions=["relu_forward"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return relu_ext.relu_forward(x)
```
'''
# The guide's example as a candidate source: the pool warm-up's candidate, and the GPU tests' honest one.
GUIDE_EXAMPLE = GUIDE.split("```python\n")[1].split("```")[0]


# What the Python side of a candidate may name (plugins/verifiers/policy): torch's tensors and modules,
# and of torch.utils.cpp_extension only load_inline. Its C++ and CUDA text is the cuda_inline_source
# check's (below), which the Python policy cannot read.
STATIC_POLICY = StaticPolicy(
    backend=NAME,
    modules=TORCH_MODULES + (TYPING, module("torch.utils.cpp_extension", members={"load_inline"})),
)


def looks_like(tree: ast.Module) -> list[str]:
    """The ``__global__`` kernels of a ``load_inline`` candidate (for other backends' messages)."""
    return detect_kernels(tree)


@functools.cache
def _toolchain() -> dict[str, str | None]:
    return {"nvcc": build.nvcc_version()}


@dataclass
class LoadInlineBackend:
    """CUDA C through ``torch.utils.cpp_extension.load_inline``; builds and runs only on a GPU host.

    Implements :class:`core.contracts.Backend`. Without a GPU, :meth:`supports` says why nothing can
    run, and :meth:`load` compiles each extension's CUDA unit with nvcc (compile-only verdict).

    :param arch: target of the device-less compile (default: the reference GPU's, ``sm_90``); on a GPU torch picks the
        device's own arch.
    :param compile_timeout_s: the longest one nvcc run of the compile-only stage may take (a unit
        that includes torch's headers takes about 1-2 CPU minutes).
    """

    arch: str = ""  # "": the reference GPU's (plugins/devices.py)
    compile_timeout_s: float = build.COMPILE_TIMEOUT_S
    name: str = NAME
    language: str = "CUDA C (torch.utils.cpp_extension.load_inline)"
    guide: str = GUIDE
    warm_up_candidate: str = GUIDE_EXAMPLE
    static_policy: StaticPolicy = STATIC_POLICY
    # nvcc and the C++ compiler are found through CUDA_HOME; the profiler's records are not read for it
    sandbox: ClassVar[SandboxNeeds] = SandboxNeeds(passthrough_env=("CUDA_HOME",), gpu_tools=frozenset({COMPUTE_SANITIZER}))
    last_compile: build.CompileReport | None = field(default=None, init=False, repr=False)
    _recorder: build.InlineRecorder | None = field(default=None, init=False, repr=False)

    # ---------------------------------------------------------------- judge side (static only)
    def supports(self, device: str) -> str | None:
        if not device.startswith("cuda"):
            missing = build.missing_tools("cpu")
            if missing:
                return f"{NEEDS_GPU} (and this machine lacks {missing[0]}, so not even the compile-only check runs)"
            return NEEDS_GPU
        from core.api.devices import cuda_visible  # torch's import waits: the workers spawn first

        if importlib.util.find_spec("torch") is None:
            return "backend 'cuda_inline' needs torch"
        if not cuda_visible():
            return "backend 'cuda_inline' was asked to run on a GPU, but no CUDA device is visible"
        missing = build.missing_tools(device)
        if missing:
            return f"backend 'cuda_inline' builds extensions with load_inline and needs {', '.join(missing)}"
        return None

    def compiles_on(self, device: str) -> bool:
        """Compile-only verdicts without a GPU need nvcc (the CUDA unit is compiled, nothing linked)."""
        return device == "cpu" and not build.missing_tools("cpu")

    def detect_kernels(self, tree: ast.Module) -> list[str]:
        return detect_kernels(tree)

    def static_check(self, source: str) -> Any:
        return analyse_source(source)

    def worker_env(self, device: str) -> dict[str, str]:
        """The toolkit torch builds with (``CUDA_HOME``, so torch never guesses) and the compilers
        the judge was told to use."""
        env: dict[str, str] = {}
        root = build.toolkit_root()
        if root:
            env["CUDA_HOME"] = root
        for key in ("CXX", "CC", "MAX_JOBS", "TORCH_CUDA_ARCH_LIST"):
            if os.environ.get(key):
                env[key] = os.environ[key]
        return env

    def capabilities(self, device: str) -> frozenset[str]:
        return frozenset()  # memory/race checking on a GPU is compute-sanitizer's (plugins/verifiers/sanitizer.py)

    def compiler_dirs(self) -> list[str]:
        """The programs a worker may start while building: ninja, the C++ compiler, nvcc and the
        toolkit's bin folder (what ninja starts in turn is its own business, not Python's)."""
        return build.program_paths("cuda")

    def toolchain(self) -> dict[str, str | None]:
        """nvcc's version (the eval cache keys verdicts on it; torch is keyed already)."""
        return dict(_toolchain())

    # ---------------------------------------------------------------- worker side
    def prepare_worker(self, device: str) -> None:
        """Put the extension builds in the worker's scratch directory and install the recording
        ``load_inline``, before any candidate code runs."""
        scratch = os.environ.get("TMPDIR") or os.getcwd()
        os.environ["TORCH_EXTENSIONS_DIR"] = os.path.join(scratch, "torch_extensions")
        os.makedirs(os.environ["TORCH_EXTENSIONS_DIR"], exist_ok=True)
        import torch.utils.cpp_extension  # imported before the audit hook is armed

        if device.startswith("cuda"):
            import torch

            torch.cuda.init()
        if self._recorder is None:
            self._recorder = build.InlineRecorder(dry=not device.startswith("cuda"), admit=admit).install()

    def instrumentation(self) -> dict[str, Any]:
        """What :meth:`prepare_worker` patched, by dotted name (the recording ``load_inline``); the
        worker verifies it is still in place after every candidate call."""
        if self._recorder is None:
            return {}
        from torch.utils import cpp_extension

        return {"torch.utils.cpp_extension.load_inline": cpp_extension.load_inline}

    def _log(self) -> build.LaunchLog:
        if self._recorder is None:
            raise RuntimeError("LoadInlineBackend.prepare_worker(device) must run before candidates are loaded")
        return self._recorder.log

    def extensions_of(self, module: types.ModuleType) -> list[InlineExtension]:
        """The extensions the module built at import, plus those its text shows (built later, e.g.
        in ``ModelNew.__init__``)."""
        log = self._log()
        log.forget_others(module.__dict__)
        found = log.extensions_of(module.__dict__)
        text = _module_text(module.__dict__)
        if text:  # the text's own copy of a recorded call names its line
            written = {ext.key(): ext for ext in analyse_source(text).extensions or []}
            found = [written.get(ext.key(), ext) for ext in found]
            found += [ext for key, ext in written.items() if key not in {e.key() for e in found}]
        return found

    def load(self, module: types.ModuleType, device: str) -> None:
        """Without a GPU: compile every extension's CUDA unit with nvcc, raising with the compiler's
        errors. On a GPU the build already happened when the module ran ``load_inline``."""
        extensions = self.extensions_of(module)
        for ext in extensions:
            problems = extension_problems(ext)
            if problems:
                raise RuntimeError(problems[0])
        if device.startswith("cuda"):
            if not extensions:
                raise RuntimeError("the candidate called no load_inline")
            return
        report = build.compile_extensions(extensions, self.arch or None, self.compile_timeout_s)
        self.last_compile = report
        if not report.ok:
            raise RuntimeError(report.reason)

    @contextlib.contextmanager
    def launch_tracker(self) -> Iterator[build.LaunchTracker]:
        if self._recorder is None:
            raise RuntimeError("LoadInlineBackend.prepare_worker(device) must run before launches are counted")
        with self._recorder.tracking() as tracker:
            yield tracker

    def bounds_checking(self) -> contextlib.AbstractContextManager[list[str]]:
        raise NotImplementedError("backend 'cuda_inline' has no in-process bounds checker; use the compute-sanitizer "
                                  "memcheck stage (plugins/verifiers/sanitizer.py) on a GPU")

    def program_order(self, seed: int | None) -> contextlib.AbstractContextManager[None]:
        raise NotImplementedError("backend 'cuda_inline' cannot reorder thread blocks; use the compute-sanitizer "
                                  "racecheck stage on a GPU")


def _module_text(namespace: dict[str, Any] | None) -> str | None:
    if not namespace:
        return None
    text = namespace.get("__kz_source__")
    path = namespace.get("__file__")
    if text is None and isinstance(path, str) and not path.startswith("<"):
        with contextlib.suppress(OSError):
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
    return text if isinstance(text, str) else None


def admit(ext: InlineExtension, owner: dict[str, Any] | None) -> str | None:
    """Worker side, before a ``load_inline`` call builds anything: the call must be one the judge's
    static stage read from the candidate's text (same sources and flags), so nothing is built that
    the ``cuda_inline_source`` check did not see, and its sources must pass that check."""
    text = _module_text(owner)
    if text is None:
        return "the calling module's source is unknown, so its extension was not checked"
    report = analyse_source(text)
    if report.extensions is None or ext.key() not in {e.key() for e in report.extensions}:
        return ("its arguments are not those of a load_inline call written in the candidate's text "
                "(the static stage checks every extension before anything runs)")
    findings = source_findings(ext)
    return findings[0] if findings else None


@dataclass
class InlineSourceCheck:
    """The C++ side of the static policy for ``cuda_inline`` candidates (judge side, nothing runs):
    the extension's sources and flags may not do what the ATen audit and the sandbox cannot see
    (:func:`plugins.backends.load_inline_static.source_findings` lists it)."""

    name: str = "cuda_inline_source"
    stage: int = STATIC
    hard: bool = True
    where: str = "judge"
    needs: frozenset[str] = frozenset()

    def applies(self, backend: str, device: str) -> bool:
        return backend == NAME

    def evaluate(self, evidence: Evidence) -> CheckResult:
        report = analyse_source(evidence.candidate.source)
        if report.extensions is None:
            return CheckResult(False, "the arguments of a load_inline call are not plain literals or module-level "
                               "strings; backend 'cuda_inline' reads every extension's sources before anything runs")
        if not report.ok:
            return CheckResult(False, report.detail)
        findings = [f for ext in report.extensions for f in source_findings(ext)]
        if findings:
            shown = "; ".join(findings[:3]) + (f" (+{len(findings) - 3} more)" if len(findings) > 3 else "")
            return CheckResult(False, f"refused in the extension's sources: {shown}", data={"findings": findings[:32]},
                               hack=True)
        kernels = [k for ext in report.extensions for k in ext.kernels]
        return CheckResult(True, f"{len(report.extensions)} extension(s), kernels {', '.join(kernels[:6])}; "
                           "no construct the audit cannot see", data={"kernels": kernels})


@hookimpl
def register_backends(register):
    register(NAME, LoadInlineBackend)


@hookimpl
def register_verifiers(register):
    register(InlineSourceCheck.name, InlineSourceCheck)

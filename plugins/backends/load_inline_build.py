"""Worker side of the ``cuda_inline`` backend: ``load_inline`` recorded, built and counted, and the
compile-only build of its CUDA translation unit on a machine without a GPU.

* :class:`InlineRecorder` replaces ``torch.utils.cpp_extension.load_inline`` in the sandbox worker
  before any candidate runs. Every call is recorded (its arguments as an
  :class:`~plugins.backends.load_inline_static.InlineExtension`). On a GPU the real ``load_inline``
  builds the extension in the worker's scratch directory (``TORCH_EXTENSIONS_DIR``) and the module
  comes back wrapped, so calls of its bound functions are counted as the candidate's launches
  (:class:`CountingExtension`). Without a GPU nothing is built: a :class:`DryExtension` comes back,
  whose functions raise :class:`GpuRequiredError`.
* :func:`compile_cuda_unit` compiles one extension's CUDA translation unit the way ``load_inline``
  does (the same implicit headers, ``nvcc -c`` with torch's flags for ``arch``), without linking
  or loading anything; the compile-only verdict on CPU is this.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from plugins.backends.load_inline_static import InlineExtension
from plugins.backends.nvrtc import default_arch


def __getattr__(name: str) -> str:
    if name == "DEFAULT_ARCH":  # the old constant, kept for one release: default_arch() reads the registry
        return default_arch()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

NEEDS_GPU = ("cuda_inline candidates build and run only on a GPU host: torch.utils.cpp_extension needs CUDA; "
             "use backend=triton (interpreter) on CPU")
COMPILE_TIMEOUT_S = 600.0
_IMPLICIT_CUDA_HEADERS = ("#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>")
_ARCH_FLAGS = ("-arch", "--gpu-architecture", "-gencode", "--generate-code", "-code", "--gpu-code")
# A header a CPU build of torch ships without (cmake generates it for CUDA builds); its whole content.
_CPU_TORCH_MISSING = {"c10/cuda/impl/cuda_cmake_macros.h": "#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n"}


class GpuRequiredError(RuntimeError):
    """A function of a ``load_inline`` extension was called in a process without a GPU."""


# --------------------------------------------------------------------------- the toolchain


def toolkit_root() -> str | None:
    """The CUDA toolkit's root: ``$CUDA_HOME``/``$CUDA_PATH``, else found through nvcc (also behind
    a wrapper script such as ``exec /usr/local/cuda-13.0/bin/nvcc``), else ``/usr/local/cuda``."""
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env) and os.path.isfile(os.path.join(os.environ[env], "bin", "nvcc")):
            return os.environ[env]
    nvcc = shutil.which("nvcc")
    if nvcc:
        real = Path(nvcc).resolve()
        try:
            text = real.read_text(errors="ignore")[:2000] if real.stat().st_size < 4096 else ""
        except OSError:
            text = ""
        for m in re.finditer(r"(/\S+)/bin/nvcc\b", text):
            if os.path.isfile(os.path.join(m.group(1), "bin", "nvcc")):
                return m.group(1)
        if (real.parent.parent / "include" / "cuda_runtime.h").is_file():
            return str(real.parent.parent)
    return "/usr/local/cuda" if os.path.isfile("/usr/local/cuda/bin/nvcc") else None


def nvcc_path() -> str | None:
    root = toolkit_root()
    if root and os.path.isfile(os.path.join(root, "bin", "nvcc")):
        return os.path.join(root, "bin", "nvcc")
    return shutil.which("nvcc")


def missing_tools(device: str) -> list[str]:
    """What the build needs and this machine lacks, each with how to get it (empty: all there).
    A compile-only check (``device="cpu"``) needs nvcc; a GPU build also ninja and a C++ compiler."""
    missing = []
    if nvcc_path() is None:
        missing.append("nvcc (the CUDA toolkit: put it on the PATH or set CUDA_HOME)")
    if device.startswith("cuda"):
        if shutil.which("ninja") is None:
            missing.append("ninja (pip install ninja)")
        if shutil.which(os.environ.get("CXX", "c++")) is None:
            missing.append("a C++ compiler (c++, or set CXX)")
    return missing


def program_paths(device: str) -> list[str]:
    """The programs a worker starts itself while building (the sandbox allows only these): ninja
    and the C++ compiler torch asks for versions, nvcc and the toolkit's own tools."""
    paths: list[str] = []
    root = toolkit_root()
    if root:
        paths.append(os.path.join(root, "bin"))
    for exe in (nvcc_path(), shutil.which("ninja"), shutil.which(os.environ.get("CXX", "c++"))):
        if exe:
            paths += [exe, os.path.realpath(exe)]
    return sorted(set(paths))


def nvcc_version() -> str | None:
    nvcc = nvcc_path()
    if nvcc is None:
        return None
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"release ([\d.]+), V([\d.]+)", out)
    return m.group(2) if m else None


# --------------------------------------------------------------------------- counting


class LaunchTracker:
    """Calls of the extensions' bound functions while a tracker context is open
    (:class:`core.contracts.LaunchTracker`). ``inside`` stays False during a call on purpose: the
    ATen audit then sees the ops the C++ dispatches (``at::relu``), so they count as PyTorch compute."""

    MAX_NAMES = 10_000

    def __init__(self) -> None:
        self.count = 0
        self.kernels: list[str] = []
        self.inside = False


@dataclass
class LaunchLog:
    """What the candidates built (with the globals of the code that called ``load_inline``) and the
    trackers that count calls."""

    extensions: list[tuple[InlineExtension, dict[str, Any] | None]] = field(default_factory=list)
    trackers: list[LaunchTracker] = field(default_factory=list)
    build_errors: list[str] = field(default_factory=list)

    def extensions_of(self, namespace: dict[str, Any]) -> list[InlineExtension]:
        return [ext for ext, owner in self.extensions if owner is namespace]

    def forget_others(self, namespace: dict[str, Any]) -> None:
        """Drop what earlier candidates recorded (a warm worker judges many candidates)."""
        self.extensions = [(ext, owner) for ext, owner in self.extensions if owner is namespace]
        self.build_errors = []

    def launched(self, name: str) -> None:
        for t in self.trackers:
            t.count += 1
            if len(t.kernels) < LaunchTracker.MAX_NAMES:
                t.kernels.append(name)


class CountingExtension:
    """A built extension module whose bound functions count a launch per call."""

    def __init__(self, module: Any, ext: InlineExtension, log: LaunchLog):
        self._module, self._ext, self._log = module, ext, log
        self._wrapped: dict[str, Callable[..., Any]] = {}

    def __getattr__(self, item: str) -> Any:
        target = getattr(self._module, item)
        if item not in self._ext.functions or not callable(target):
            return target
        if item not in self._wrapped:
            log, label = self._log, f"{self._ext.name}.{item}"

            def call(*args: Any, **kwargs: Any) -> Any:
                log.launched(label)
                return target(*args, **kwargs)

            call.__name__ = item
            self._wrapped[item] = call
        return self._wrapped[item]

    def __repr__(self) -> str:
        return f"<cuda_inline extension {self._ext.name!r}: {', '.join(self._ext.functions)}>"


class DryExtension:
    """What ``load_inline`` returns where nothing is built (no GPU): its functions refuse to run."""

    def __init__(self, ext: InlineExtension):
        self._ext = ext

    def __getattr__(self, item: str) -> Any:
        if item.startswith("__"):
            raise AttributeError(item)

        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise GpuRequiredError(f"{self._ext.name}.{item} was called, but {NEEDS_GPU}")

        return refuse

    def __repr__(self) -> str:
        return f"<cuda_inline extension {self._ext.name!r}, not built: {NEEDS_GPU}>"


def _caller_globals() -> dict[str, Any] | None:
    """Globals of the first frame outside torch and this file: the code that called ``load_inline``."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not (name == __name__ or name.startswith("torch.")):
            return frame.f_globals
        frame = frame.f_back
    return None


def condensed_build_error(text: str, limit: int = 12) -> str:
    """The compiler's error lines out of a build log (ninja echoes long command lines first)."""
    lines = [ln.strip() for ln in text.splitlines()]
    errors = [ln for ln in lines if re.search(r"\berror\b", ln, re.I) and not ln.startswith(("[", "FAILED:"))]
    errors = list(dict.fromkeys(errors))  # nvcc reports a line once per compilation pass
    chosen = errors[:limit] or [ln for ln in lines if ln][-limit:]
    return "\n".join(chosen)


class InlineRecorder:
    """Swap ``torch.utils.cpp_extension.load_inline`` for one that records every call, and on a GPU
    builds (in ``TORCH_EXTENSIONS_DIR``, never the candidate's ``build_directory``) and counts."""

    def __init__(self, dry: bool, admit: Callable[[InlineExtension, dict[str, Any] | None], str | None] | None = None):
        self.dry = dry
        self.log = LaunchLog()
        # admit(extension, caller globals) -> None, or why this call may not build (checked first)
        self.admit = admit
        self._original: Callable[..., Any] | None = None

    def install(self) -> "InlineRecorder":
        from torch.utils import cpp_extension

        if self._original is not None:
            return self
        original = self._original = cpp_extension.load_inline
        signature = inspect.signature(original)
        log, dry, admit = self.log, self.dry, self.admit

        def load_inline(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            ext = InlineExtension.from_arguments(dict(bound.arguments))
            owner = _caller_globals()
            refused = admit(ext, owner) if admit is not None else None
            if refused:
                raise PermissionError(f"load_inline(name={ext.name!r}) refused: {refused}")
            log.extensions.append((ext, owner))
            if dry:
                return DryExtension(ext)
            bound.arguments.pop("build_directory", None)  # always inside the worker's scratch
            try:
                module = original(*bound.args, **bound.kwargs)
            except Exception as exc:
                message = f"building extension {ext.name!r} failed:\n{condensed_build_error(str(exc))}"
                log.build_errors.append(message)
                raise RuntimeError(message) from None
            return CountingExtension(module, ext, log)

        load_inline.__doc__ = original.__doc__
        cpp_extension.load_inline = load_inline
        return self

    def uninstall(self) -> None:
        from torch.utils import cpp_extension

        if self._original is not None:
            cpp_extension.load_inline = self._original
            self._original = None

    @contextlib.contextmanager
    def tracking(self) -> Iterator[LaunchTracker]:
        tracker = LaunchTracker()
        self.log.trackers.append(tracker)
        try:
            yield tracker
        finally:
            self.log.trackers.remove(tracker)


# --------------------------------------------------------------------------- compile-only


@dataclass
class CompileReport:
    """The compile-only stage's outcome: ``ok`` only when every extension's CUDA unit compiled."""

    ok: bool
    reason: str | None
    detail: str
    arch: str
    extensions: int = 0
    kernels: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "reason": self.reason, "detail": self.detail, "arch": self.arch,
                "extensions": self.extensions, "kernels": list(self.kernels), "seconds": self.seconds}


def _arch_number(arch: str) -> str:
    digits = re.sub(r"\D", "", arch)
    if not digits:
        raise ValueError(f"arch {arch!r} should look like 'sm_90'")
    return digits


def cuda_unit(ext: InlineExtension) -> str:
    """The ``cuda.cu`` that ``load_inline`` writes for this extension."""
    head = [] if ext.no_implicit_headers else list(_IMPLICIT_CUDA_HEADERS)
    return "\n".join(head + list(ext.cuda_sources))


def include_dirs(workdir: Path) -> list[str]:
    """torch's include paths, Python's, the CUDA toolkit's, and (for a CPU build of torch) a folder
    holding the one generated header such a build lacks."""
    from torch.utils import cpp_extension

    dirs = list(cpp_extension.include_paths())
    python_include = sysconfig.get_path("include", scheme="posix_prefix")
    if python_include:
        dirs.append(python_include)
    root = toolkit_root()
    if root and os.path.isdir(os.path.join(root, "include")):
        dirs.append(os.path.join(root, "include"))
    torch_include = Path(dirs[0])
    for rel, text in _CPU_TORCH_MISSING.items():
        if not (torch_include / rel).exists():
            stub = workdir / "torch-cpu-stubs" / rel
            stub.parent.mkdir(parents=True, exist_ok=True)
            stub.write_text(text)
            dirs.append(str(workdir / "torch-cpu-stubs"))
    return dirs


def nvcc_command(ext: InlineExtension, source: Path, obj: Path, arch: str, includes: list[str]) -> list[str]:
    """``nvcc -c`` as torch's ninja build compiles ``cuda.cu`` (torch.utils.cpp_extension's flags)."""
    from torch.utils import cpp_extension

    nvcc = nvcc_path()
    if nvcc is None:
        raise FileNotFoundError("nvcc is not on the PATH (install the CUDA toolkit or set CUDA_HOME)")
    flags = [f.strip() for f in ext.extra_cuda_cflags if f.strip()]
    cmd = [nvcc, "-c", str(source), "-o", str(obj), f"-DTORCH_EXTENSION_NAME={ext.name}",
           "-DTORCH_API_INCLUDE_EXTENSION_H"]
    for d in includes:
        cmd += ["-isystem", d]
    cmd += list(getattr(cpp_extension, "COMMON_NVCC_FLAGS", ()))
    if not any(f.startswith(_ARCH_FLAGS) for f in flags):
        n = _arch_number(arch)
        cmd.append(f"-gencode=arch=compute_{n},code=sm_{n}")
    cmd += ["--compiler-options", "-fPIC", *flags]
    if not any(f.startswith("-std=") for f in flags):
        cmd.append("-std=c++20")
    return cmd


def compile_cuda_unit(ext: InlineExtension, arch: str | None = None,
                      timeout_s: float = COMPILE_TIMEOUT_S) -> tuple[bool, str, float]:
    """Compile one extension's CUDA translation unit for ``arch`` (default: the reference GPU's);
    ``(ok, compiler messages, seconds)``."""
    arch = arch or default_arch()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kz-inline-") as tmp:
        work = Path(tmp)
        source, obj = work / "cuda.cu", work / "cuda.o"
        source.write_text(cuda_unit(ext))
        cmd = nvcc_command(ext, source, obj, arch, include_dirs(work))
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=tmp)
        except subprocess.TimeoutExpired:
            return False, f"nvcc did not finish within {timeout_s:.0f} s", time.perf_counter() - start
        log = (proc.stderr + proc.stdout).replace(str(source), "cuda.cu").replace(str(work), ".")
        return proc.returncode == 0 and obj.is_file(), log, time.perf_counter() - start


def compile_extensions(extensions: list[InlineExtension], arch: str | None = None,
                       timeout_s: float = COMPILE_TIMEOUT_S) -> CompileReport:
    """Compile every extension's CUDA unit; the first failure's compiler errors become the reason."""
    arch = arch or default_arch()
    if not extensions:
        return CompileReport(False, "the candidate called no load_inline (nothing to compile)", "nothing to compile", arch)
    seconds, kernels = 0.0, []
    for ext in extensions:
        ok, log, took = compile_cuda_unit(ext, arch, timeout_s)
        seconds += took
        if not ok:
            return CompileReport(False, f"nvcc failed on the CUDA sources of extension {ext.name!r} ({ext.origin}) "
                                 f"for {arch}:\n{condensed_build_error(log)}", "nvcc failed", arch, len(extensions),
                                 seconds=seconds)
        kernels += ext.kernels
    detail = (f"{len(extensions)} extension(s): CUDA sources compiled with nvcc -c for {arch} "
              f"({', '.join(kernels)}); the C++ bindings and the link are built only on a GPU host")
    return CompileReport(True, None, detail, arch, len(extensions), kernels, seconds)

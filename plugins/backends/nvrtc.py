"""Compile CUDA C to PTX without a GPU, through the raw NVRTC binding CuPy ships.

CuPy's own ``compile_using_nvrtc`` asks the device for its architecture and so fails on a machine
without a GPU (NOTES.md). ``cupy_backends.cuda.libs.nvrtc`` (createProgram / compileProgram /
getPTX) needs only the NVRTC library (the ``nvidia-cuda-nvrtc`` wheel or a CUDA toolkit), compiles a
small kernel in ~0.05-0.2 s and returns the compiler's log on a syntax error. When that binding is
missing, ``nvcc -ptx`` is used if it is on the PATH.

The options mimic what ``cupy.RawModule`` passes NVRTC (``-std=c++17`` unless the source asks for
another standard, CuPy's include directory, the CUDA headers) so a source that compiles here
compiles under ``RawModule`` on a GPU.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path



def default_arch() -> str:
    """The device-less compile target: the reference GPU's arch, from the device registry (plugins/devices.py)."""
    from core.api.devices import reference_device

    return reference_device().arch


def __getattr__(name: str) -> str:
    if name == "DEFAULT_ARCH":  # the old constant, kept for one release: default_arch() reads the registry
        return default_arch()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_ENTRY_RE = re.compile(r"\.entry\s+([A-Za-z_$][\w$]*)\s*\(")
_ARCH_OPTION_RE = re.compile(r"^(-arch|--gpu-architecture|-arch=|--gpu-architecture=)")


@dataclass
class CompileResult:
    """What compiling one CUDA source produced.

    :param ok: the source compiled.
    :param ptx: the PTX text (empty when ``ok`` is false).
    :param log: the compiler's messages (errors when ``ok`` is false; warnings otherwise).
    :param entries: the ``__global__`` entry points in the PTX (their lowered names).
    """

    ok: bool
    ptx: str = ""
    log: str = ""
    arch: str = ""
    compiler: str = ""
    seconds: float = 0.0
    entries: list[str] = field(default_factory=list)
    lowered_names: dict[str, str] = field(default_factory=dict)

    def summary(self) -> str:
        if self.ok:
            return f"compiled with {self.compiler} for {self.arch}: {len(self.entries)} kernel(s) {self.entries}"
        first = next((ln for ln in self.log.splitlines() if "error" in ln.lower()), self.log.strip()[:300])
        return f"{self.compiler} failed for {self.arch}: {first.strip()}"


class NoCompilerError(RuntimeError):
    """Neither the NVRTC binding nor nvcc is available."""


def ptx_entries(ptx: str) -> list[str]:
    """Names of the kernels (``.entry`` directives) defined in a PTX text."""
    return _ENTRY_RE.findall(ptx)


def _arch_number(arch: str) -> str:
    digits = re.sub(r"\D", "", arch)
    if not digits:
        raise ValueError(f"arch {arch!r} should look like 'sm_90' or 'compute_90'")
    return digits


def include_dirs() -> list[str]:
    """Directories holding the CUDA headers (cuda_fp16.h ...) and CuPy's own headers."""
    dirs: list[str] = []
    for env in ("CUDA_PATH", "CUDA_HOME", "CUDA_ROOT"):
        if os.environ.get(env):
            dirs.append(os.path.join(os.environ[env], "include"))
    dirs += ["/usr/local/cuda/include"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        real = Path(nvcc).resolve()
        dirs.append(str(real.parent.parent / "include"))
        # a wrapper script (``exec /usr/local/cuda-13.0/bin/nvcc``) hides the toolkit behind it
        try:
            text = real.read_text(errors="ignore")[:2000] if real.stat().st_size < 4096 else ""
        except OSError:
            text = ""
        for m in re.finditer(r"(/\S+)/bin/nvcc", text):
            dirs.append(os.path.join(m.group(1), "include"))
    try:  # the nvidia-cuda-runtime wheel ships the headers next to CuPy
        import nvidia  # type: ignore

        for base in getattr(nvidia, "__path__", []):
            dirs += [str(p) for p in Path(base).glob("cuda_runtime/include")]
            dirs += [str(p) for p in Path(base).glob("cu*/include")]
    except ImportError:
        pass
    try:
        import cupy  # noqa: F401  (only to locate its headers)

        dirs.append(str(Path(cupy.__file__).parent / "_core" / "include"))
    except ImportError:
        pass
    seen: list[str] = []
    for d in dirs:
        if d not in seen and os.path.isdir(d):
            seen.append(d)
    return seen


def _options(arch: str, user_options: tuple[str, ...], for_nvcc: bool) -> list[str]:
    opts = [o for o in user_options if not _ARCH_OPTION_RE.match(o)]
    if not for_nvcc and not any(o.startswith(("-std", "--std")) for o in opts):
        opts.append("-std=c++17")  # CuPy >= 14 adds this unless the user chose a standard
    opts += [f"-I{d}" for d in include_dirs()]
    return opts


def nvrtc_available() -> bool:
    try:
        from cupy_backends.cuda.libs import nvrtc

        nvrtc.getVersion()
        return True
    except Exception:  # ImportError, or the shared library is missing
        return False


def nvrtc_version() -> str | None:
    """``"major.minor"`` of the NVRTC library the binding loads, or ``None`` without one."""
    try:
        from cupy_backends.cuda.libs import nvrtc

        major, minor = nvrtc.getVersion()
        return f"{major}.{minor}"
    except Exception:  # ImportError, or the shared library is missing
        return None


def compile_with_nvrtc(
    source: str,
    *,
    arch: str | None = None,
    options: tuple[str, ...] = (),
    name_expressions: tuple[str, ...] = (),
    filename: str = "candidate.cu",
) -> CompileResult:
    arch = arch or default_arch()
    from cupy_backends.cuda.libs import nvrtc

    major, minor = nvrtc.getVersion()
    compiler = f"nvrtc {major}.{minor}"
    opts = [f"--gpu-architecture=compute_{_arch_number(arch)}"] + _options(arch, tuple(options), False)
    start = time.perf_counter()
    prog = nvrtc.createProgram(source, filename, (), ())
    try:
        for expr in name_expressions:
            nvrtc.addNameExpression(prog, expr)
        try:
            nvrtc.compileProgram(prog, tuple(opts))
        except nvrtc.NVRTCError as exc:
            log = nvrtc.getProgramLog(prog) or str(exc)
            return CompileResult(False, log=log, arch=arch, compiler=compiler, seconds=time.perf_counter() - start)
        ptx = nvrtc.getPTX(prog)
        ptx = ptx.decode("utf-8", "replace") if isinstance(ptx, bytes) else ptx
        ptx = ptx.rstrip("\x00")
        lowered = {expr: nvrtc.getLoweredName(prog, expr) for expr in name_expressions}
        return CompileResult(
            True,
            ptx=ptx,
            log=nvrtc.getProgramLog(prog) or "",
            arch=arch,
            compiler=compiler,
            seconds=time.perf_counter() - start,
            entries=ptx_entries(ptx),
            lowered_names=lowered,
        )
    finally:
        nvrtc.destroyProgram(prog)


def compile_with_nvcc(source: str, *, arch: str | None = None, options: tuple[str, ...] = ()) -> CompileResult:
    arch = arch or default_arch()
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise NoCompilerError("nvcc is not on the PATH")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kz-nvcc-") as tmp:
        src, out = Path(tmp, "candidate.cu"), Path(tmp, "candidate.ptx")
        src.write_text(source)
        cmd = [nvcc, f"-arch=compute_{_arch_number(arch)}", "-ptx", *_options(arch, tuple(options), True),
               str(src), "-o", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        log = (proc.stderr + proc.stdout).replace(str(src), "candidate.cu")
        if proc.returncode != 0:
            return CompileResult(False, log=log, arch=arch, compiler="nvcc", seconds=time.perf_counter() - start)
        ptx = out.read_text()
    return CompileResult(True, ptx=ptx, log=log, arch=arch, compiler="nvcc",
                         seconds=time.perf_counter() - start, entries=ptx_entries(ptx))


def compile_to_ptx(
    source: str,
    *,
    arch: str | None = None,
    options: tuple[str, ...] = (),
    name_expressions: tuple[str, ...] = (),
) -> CompileResult:
    """Compile CUDA C (as ``cupy.RawModule(code=...)`` would) to PTX for ``arch``, no GPU needed.

    Uses the NVRTC binding when present, else ``nvcc -ptx``; raises :class:`NoCompilerError` with
    what to install when neither exists.
    """
    if nvrtc_available():
        return compile_with_nvrtc(source, arch=arch, options=options, name_expressions=name_expressions)
    if shutil.which("nvcc") and not name_expressions:
        return compile_with_nvcc(source, arch=arch, options=options)
    raise NoCompilerError(
        "no CUDA compiler found: the CuPy NVRTC binding did not load and nvcc is not on the PATH. "
        "Install the extra: pip install 'kernelzero[cuda]' (cupy-cuda12x and nvidia-cuda-nvrtc-cu12)"
    )

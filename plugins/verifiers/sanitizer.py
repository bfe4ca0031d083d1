"""compute-sanitizer as the GPU memory and race stages, for both backends (Triton and CUDA).

On a GPU the Triton interpreter's bounds checks and shuffled program orders (the CPU memory and
race stages) do not apply; NVIDIA's compute-sanitizer does the same jobs on the real hardware:

* ``gpu_memcheck`` (memory stage): out-of-bounds and misaligned global/shared accesses, invalid
  frees, device-side errors;
* ``gpu_racecheck`` (race stage): shared-memory data hazards between threads of a block;
* ``gpu_synccheck`` (race stage): invalid ``__syncthreads``/barrier use (divergent barriers).

``collect`` runs in the candidate's sandboxed worker: it writes a small driver that imports the
task and the candidate, draws inputs on the GPU and calls ``ModelNew.forward`` twice, and runs it
under ``compute-sanitizer --tool <tool>`` with PyTorch's caching allocator off
(``PYTORCH_NO_CUDA_MEMORY_CACHING=1``), so every tensor is its own allocation and an access past a
tensor's end is out of bounds for the sanitizer too. ``evaluate`` (judging process) reads the
error summary. A run that could not happen (no sanitizer, timeout) is recorded and does not reject.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from core import hookimpl
from core.api.evidence import MEMORY, RACES, Evidence
from core.api.sandbox import COMPUTE_SANITIZER, gpu_tool_applies
from core.verdict import CheckResult, could_not_run

_OUT_OF_MEMORY_RE = re.compile(r"cudaErrorMemoryAllocation|\bout of memory\b", re.I)
_SUMMARY_RE = re.compile(r"=+\s*ERROR SUMMARY:\s*(\d+)\s+error", re.I)
_RACE_SUMMARY_RE = re.compile(r"=+\s*RACECHECK SUMMARY:\s*\d+\s+hazards?\s+displayed\s*\((\d+)\s+errors?", re.I)
_FINDING_RE = re.compile(r"^=+\s+((?:Invalid|Misaligned|Out of range|Program hit|Race|Error|Barrier|Divergent|"
                         r"Uninitialized|Malloc|Free|Leaked|Warning|.*hazard).*)$", re.M | re.I)

_DRIVER = r'''
import contextlib, json, signal, sys, time, torch, importlib.util
task_path, cand_path, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
lock_desc, project, timeout_s = json.loads(sys.argv[4]), sys.argv[5], float(sys.argv[6])
dev = sys.argv[7] if len(sys.argv) > 7 else "cuda"  # "cpu" only in the CPU tests of this protocol
def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path); m = importlib.util.module_from_spec(spec)
    sys.modules[name] = m; spec.loader.exec_module(m); return m
torch.empty(1, device=dev)  # the CUDA context (slow under the sanitizer) before the GPU lock
task, cand = load(task_path, "kz_task"), load(cand_path, "kz_candidate")
lock = contextlib.nullcontext()
if lock_desc:  # share the GPU fairly with the judge's other workers (core/verification/devicelock.py)
    sys.path.insert(0, project)
    from core.api.workers import DeviceLock
    lock = DeviceLock.from_description(lock_desc).shared(time.monotonic() + float(lock_desc.get("wait_s", timeout_s)))
t0 = time.monotonic()
with lock:
    t1 = time.monotonic()
    if lock_desc.get("hold_s"):  # a kernel that hangs must not keep the GPU lock: the alarm ends us
        signal.alarm(max(1, int(float(lock_desc["hold_s"]))))
    torch.manual_seed(seed)
    model = cand.ModelNew(*task.get_init_inputs())
    model = model.to(dev).eval() if isinstance(model, torch.nn.Module) else model
    for i in range(2):
        torch.manual_seed(seed + 1 + i)
        with torch.device(dev):
            inputs = [x.to(dev) if isinstance(x, torch.Tensor) else x for x in task.get_inputs()]
        with torch.no_grad():
            model(*inputs)
        if dev == "cuda":
            torch.cuda.synchronize()
    signal.alarm(0)
print(f"KZ_GPU_LOCK wait={t1 - t0:.3f} held={time.monotonic() - t1:.3f}")
print("KZ_DRIVER_DONE")
'''


def parse_sanitizer_output(text: str) -> dict[str, Any]:
    """Errors and the first findings from compute-sanitizer's report."""
    errors = None
    m = _SUMMARY_RE.search(text) or _RACE_SUMMARY_RE.search(text)
    if m:
        errors = int(m.group(1))
    findings: list[str] = []
    for f in _FINDING_RE.findall(text):
        f = f.strip()
        if f and f not in findings and not f.upper().startswith("ERROR SUMMARY"):
            findings.append(f)
    parsed: dict[str, Any] = {"errors": errors, "findings": findings[:16], "completed": "KZ_DRIVER_DONE" in text}
    held = re.search(r"KZ_GPU_LOCK wait=([\d.]+) held=([\d.]+)", text)
    if held:
        parsed["gpu_lock_wait_s"], parsed["gpu_held_s"] = float(held.group(1)), float(held.group(2))
    return parsed


def run_sanitizer(tool: str, task_source: str, candidate_path: str, scratch: Path, *, timeout_s: float,
                  extra: tuple[str, ...] = (), device_lock: dict[str, str] | None = None,
                  device: str = "cuda") -> dict[str, Any]:
    """Run the driver under ``compute-sanitizer --tool <tool>``; with ``device_lock`` (a
    :meth:`core.verification.devicelock.DeviceLock.describe`) the driver holds that GPU lock shared around its GPU
    work only, not around the sanitizer's and Python's start-up."""
    exe = shutil.which("compute-sanitizer")
    if exe is None:
        for guess in ("/usr/local/cuda/bin/compute-sanitizer", "/usr/local/cuda/compute-sanitizer/compute-sanitizer"):
            if os.path.exists(guess):
                exe = guess
                break
    if exe is None:
        return {"skipped": "compute-sanitizer is not installed (it ships with the CUDA toolkit)"}
    task_path, driver = scratch / "kz_sanitize_task.py", scratch / "kz_sanitize_driver.py"
    task_path.write_text(task_source)
    driver.write_text(_DRIVER)
    env = {**os.environ, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    project = str(Path(__file__).resolve().parents[2])
    cmd = [exe, "--tool", tool, "--print-limit", "20", *extra, sys.executable, str(driver), str(task_path),
           candidate_path, str(int.from_bytes(os.urandom(3), "little")), json.dumps(device_lock or {}), project,
           str(timeout_s), device]
    try:
        wait_s = float((device_lock or {}).get("wait_s", 0.0))  # the GPU lock's wait is not the tool's time
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s + wait_s, cwd=scratch, env=env)
    except subprocess.TimeoutExpired:
        return {"skipped": f"compute-sanitizer {tool} did not finish within {timeout_s:.0f} s"}
    text = proc.stdout + "\n" + proc.stderr
    parsed = parse_sanitizer_output(text)
    parsed["returncode"] = proc.returncode
    if parsed["errors"] is None and not parsed["completed"]:
        parsed["skipped"] = f"the sanitized run failed before a report: {text.strip()[-400:]}"
    elif not parsed["completed"]:
        parsed["crashed"] = text.strip()[-400:]
    return parsed


@dataclass
class _SanitizerCheck:
    name: str = "gpu_memcheck"
    reads: ClassVar[frozenset[str]] = frozenset()  # compares no run's outputs through the keeper (Check.reads)
    stage: int = MEMORY
    hard: bool = True
    where: str = "worker"
    needs: frozenset[str] = frozenset({"trials"})
    tool: str = "memcheck"
    timeout_s: float = 300.0
    what: str = "out-of-bounds or misaligned memory access"
    device_lock: dict[str, str] | None = None  # set by the judge (locks_device_itself)

    # The judge does not hold the GPU lock around this stage: the driver takes it, shared, around its
    # GPU work only, so a timed stage waits for a moment of GPU work, not seconds of start-up.
    locks_device_itself: ClassVar[bool] = True

    def applies(self, backend: str, device: str) -> bool:
        # NVIDIA's tool, for the backends that declare it applies (core.api.sandbox.SandboxNeeds.gpu_tools)
        return device == "cuda" and gpu_tool_applies(COMPUTE_SANITIZER, backend)

    def _extra_args(self) -> tuple[str, ...]:
        return ()

    def collect(self, session: Any) -> dict[str, Any]:
        from plugins.verifiers.performance import task_source_of

        source = task_source_of(session)
        path = getattr(getattr(session, "module", None), "__file__", None)
        if source is None or not path or not os.path.exists(path):
            return {"skipped": "the worker session exposes no task source or candidate file to sanitize"}
        scratch = Path(getattr(getattr(session, "worker", None), "scratch", None) or os.path.dirname(path))
        return run_sanitizer(self.tool, source, path, scratch, timeout_s=self.timeout_s, extra=self._extra_args(),
                             device_lock=self.device_lock)

    def evaluate(self, evidence: Evidence) -> CheckResult:
        data = evidence.extra.get(self.name) or {}
        if not data:
            return could_not_run(f"compute-sanitizer {self.tool} reported nothing", data)
        if data.get("error"):
            return could_not_run(str(data["error"]), data)
        if data.get("skipped"):
            return could_not_run(str(data["skipped"]), data)
        errors = data.get("errors") or 0
        findings = data.get("findings") or []
        if errors and findings and all(_OUT_OF_MEMORY_RE.search(f) for f in findings):
            # the GPU was full (at real KernelBench sizes, beside other verifications): an allocation failed,
            # which says nothing about the kernel's accesses. Still fails closed; it is just not called a bug.
            return could_not_run(f"the GPU ran out of memory under compute-sanitizer {self.tool} ({errors} failed "
                                 f"CUDA API call(s)): {findings[0]}", data)
        if errors:
            first = (findings or ["(no detail)"])[0]
            return CheckResult(False, f"compute-sanitizer {self.tool}: {errors} error(s), {self.what}: {first}",
                               data=data)
        if data.get("crashed"):
            return CheckResult(False, f"the candidate crashed under compute-sanitizer {self.tool}: "
                                      f"{data['crashed'][-200:]}", data=data)
        return CheckResult(True, f"compute-sanitizer {self.tool}: no errors in two calls", data=data)


@dataclass
class MemcheckCheck(_SanitizerCheck):
    """compute-sanitizer memcheck: out-of-bounds/misaligned accesses, device-side errors (GPU)."""

    name: str = "gpu_memcheck"
    stage: int = MEMORY
    tool: str = "memcheck"
    what: str = "out-of-bounds or misaligned memory access"

    def _extra_args(self) -> tuple[str, ...]:
        return ("--leak-check", "no")


@dataclass
class RacecheckCheck(_SanitizerCheck):
    """compute-sanitizer racecheck: shared-memory hazards between threads of a block (GPU)."""

    name: str = "gpu_racecheck"
    stage: int = RACES
    tool: str = "racecheck"
    what: str = "shared-memory data race"


@dataclass
class SynccheckCheck(_SanitizerCheck):
    """compute-sanitizer synccheck: invalid or divergent barrier synchronisation (GPU)."""

    name: str = "gpu_synccheck"
    stage: int = RACES
    tool: str = "synccheck"
    what: str = "invalid barrier synchronisation"


@hookimpl
def register_verifiers(register):
    for check in (MemcheckCheck, RacecheckCheck, SynccheckCheck):
        register(check.name, check)

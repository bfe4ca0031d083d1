"""The GPU performance stage: honest timing, speedups, roofline terms, optional hardware counters.

``collect`` runs in the candidate's sandboxed worker on the GPU (after correctness passed):

* the task's ``Model`` is built there too (trusted code; the static integrity check forbids the
  candidate from patching torch) and its inputs are drawn **on the GPU** (``get_inputs()`` under
  ``torch.device("cuda")``: no minute of CPU random numbers per trial for large level-1 tasks);
* candidate, eager reference and ``torch.compile`` reference are timed by :mod:`core.timing`
  (fresh inputs per run, L2 flushed, device-wide sync before the end event, median of many runs
  adapted to the kernel's length);
* the candidate's outputs of the first and last timed runs are compared with the reference's on
  the same inputs, so a kernel that behaves while checked and cheats while timed is caught;
* FLOPs and minimum bytes of the task give the roofline record (:mod:`core.roofline`) against the
  device registered through ``register_devices``; with ``counters=True`` Nsight Compute supplies
  achieved DRAM bytes and SM throughput instead (``roofline["source"] == "ncu"``).

``evaluate`` (judging process) fails the candidate, flagged as a hack, when work was still running
on another stream when ``forward`` returned, when outputs during timing differ from the reference,
or (``reject_implausible``) when the time is under the speed-of-light floor. The verdict's
``timing``/``roofline`` come from this check's ``data``.
"""

from __future__ import annotations

import csv
import io
import math
import secrets
import shutil
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from core import hookimpl
from core.evidence import PERFORMANCE, Evidence, compare_outputs
from core.verdict import CheckResult

NCU_METRICS = (
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "gpu__time_duration.sum",
)


# --------------------------------------------------------------------------- worker-side helpers


def task_field(session: Any, name: str) -> Any:
    """A field of the task the worker session carries (``session.task`` as a Task or a dict)."""
    task = getattr(session, "task", None)
    if isinstance(task, dict):
        return task.get(name)
    return getattr(task, name, None)


def task_source_of(session: Any) -> str | None:
    """The task's source as the worker session exposes it (``task_source``, or ``task.source``)."""
    src = getattr(session, "task_source", None)
    if isinstance(src, str):
        return src
    task = getattr(session, "task", None)
    src = task if isinstance(task, str) else task_field(session, "source")
    return src if isinstance(src, str) else None


def load_task_module(source: str, name: str = "kz_perf_task") -> types.ModuleType:
    module = types.ModuleType(name)
    module.__file__ = f"<{name}>"
    sys.modules[name] = module
    try:
        exec(compile(source, module.__file__, "exec"), module.__dict__)  # the task: trusted reference code
    finally:
        sys.modules.pop(name, None)
    return module


def gpu_inputs(task_module: types.ModuleType, seed: int) -> list[Any]:
    """``get_inputs()`` drawn on the GPU (tensors it creates without a device land on CUDA)."""
    import torch

    torch.manual_seed(seed)
    with torch.device("cuda"):
        inputs = list(task_module.get_inputs())
    return [x.cuda() if isinstance(x, torch.Tensor) and not x.is_cuda else x for x in inputs]


def flatten(out: Any) -> list[Any]:
    if isinstance(out, (list, tuple)):
        return [y for x in out for y in flatten(x)]
    return [out]


def has_state(model: Any) -> bool:
    return any(True for _ in model.parameters()) or any(True for _ in model.buffers())


def parse_ncu_csv(text: str) -> dict[str, float]:
    """Sum Nsight Compute's ``--csv`` metric rows over every profiled kernel.

    Returns ``{"dram_bytes", "duration_s", "sm_throughput_pct", "kernels"}``; SM throughput is
    the duration-weighted mean over kernels.
    """
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    if not lines:
        raise ValueError("no CSV rows in Nsight Compute's output")
    rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
    per_kernel: dict[str, dict[str, float]] = {}
    for row in rows:
        metric, value, unit = row.get("Metric Name"), row.get("Metric Value", ""), (row.get("Metric Unit") or "").lower()
        if not metric:
            continue
        try:
            v = float(value.replace(",", ""))
        except ValueError:
            continue
        scale = {"kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "usecond": 1e-6, "msecond": 1e-3, "nsecond": 1e-9,
                 "second": 1.0, "byte": 1.0}.get(unit, 1.0)
        if metric == "gpu__time_duration.sum" and unit in ("", "nsecond"):
            scale = 1e-9
        per_kernel.setdefault(row.get("ID", "0"), {})[metric] = v * scale
    if not per_kernel:
        raise ValueError("Nsight Compute reported none of the requested metrics")
    dram = sum(k.get("dram__bytes_read.sum", 0.0) + k.get("dram__bytes_write.sum", 0.0) for k in per_kernel.values())
    dur = sum(k.get("gpu__time_duration.sum", 0.0) for k in per_kernel.values())
    weighted = sum(k.get("sm__throughput.avg.pct_of_peak_sustained_elapsed", 0.0) * k.get("gpu__time_duration.sum", 0.0)
                   for k in per_kernel.values())
    return {"dram_bytes": dram, "duration_s": dur, "sm_throughput_pct": weighted / dur if dur > 0 else 0.0,
            "kernels": float(len(per_kernel))}


_NCU_DRIVER = r'''
import sys, torch, importlib.util
task_path, cand_path, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path); m = importlib.util.module_from_spec(spec)
    sys.modules[name] = m; spec.loader.exec_module(m); return m
task, cand = load(task_path, "kz_task"), load(cand_path, "kz_candidate")
torch.manual_seed(seed)
model = cand.ModelNew(*task.get_init_inputs()).cuda().eval()
torch.manual_seed(seed + 1)
with torch.device("cuda"):
    inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in task.get_inputs()]
with torch.no_grad():
    model(*inputs); torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("kz_measure")
    model(*inputs); torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
'''


def ncu_counters(task_source: str, candidate_path: str, scratch: Path, timeout_s: float = 300) -> dict[str, float]:
    """Run the candidate once under ``ncu`` (clock control left alone) and read the counters."""
    ncu = shutil.which("ncu")
    if ncu is None:
        raise RuntimeError("ncu (Nsight Compute) is not on the PATH")
    task_path, driver = scratch / "kz_ncu_task.py", scratch / "kz_ncu_driver.py"
    task_path.write_text(task_source)
    driver.write_text(_NCU_DRIVER)
    cmd = [ncu, "--clock-control", "none", "--nvtx", "--nvtx-include", "kz_measure/", "--metrics", ",".join(NCU_METRICS),
           "--csv", "--print-units", "base", "--target-processes", "all", sys.executable, str(driver), str(task_path),
           candidate_path, str(secrets.randbits(31))]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=scratch)
    if proc.returncode != 0:
        raise RuntimeError(f"ncu exited {proc.returncode}: {(proc.stderr or proc.stdout)[-600:]}")
    return parse_ncu_csv(proc.stdout)


# --------------------------------------------------------------------------- the check


@dataclass
class PerformanceCheck:
    """Times the candidate on the GPU against eager PyTorch and ``torch.compile``; roofline terms.

    :param compare_compile: also time ``torch.compile(Model)`` (its first call compiles, untimed).
    :param budget_ms / min_runs / max_runs / warmup_ms: the repetition policy (:mod:`core.timing`).
    :param slack: speed-of-light slack (:func:`core.roofline.roofline`).
    :param reject_implausible: fail (as a hack) a time under the speed-of-light floor.
    :param side_stream_ms: work still running elsewhere after ``forward`` returned, beyond which
        the candidate fails (its output was not ready on the caller's stream).
    :param counters: take achieved DRAM bytes and SM throughput from Nsight Compute.
    :param hide_launch_us: keep the host's launch latency out of the timed window by filling the GPU
        this long before the start event (:class:`core.timing.GpuFiller`); 0 times it.
    """

    # The judge gives this stage the GPU alone (core.devicelock): other workers' trials would
    # otherwise run inside the timed window.
    exclusive_device: ClassVar[bool] = True

    name: str = "performance"
    stage: int = PERFORMANCE
    hard: bool = True
    where: str = "worker"
    needs: frozenset[str] = frozenset({"trials"})
    compare_compile: bool = True
    budget_ms: float = 400.0
    min_runs: int = 10
    max_runs: int = 500
    warmup_ms: float = 25.0
    slack: float = 1.15
    reject_implausible: bool = True
    side_stream_ms: float = 0.05
    side_stream_fraction: float = 0.10
    counters: bool = False
    hide_launch_us: float = 100.0
    settle_rel: float = 0.0  # core.timing.TimingPolicy.settle_rel: stop once the median is this tight

    def applies(self, backend: str, device: str) -> bool:
        return device == "cuda"

    def dirties_worker(self) -> bool:
        """True when the worker must not judge another candidate after this stage: torch.compile
        leaves compile threads, patched frames and caches behind in the process. (On the H200 a pool
        whose workers had run the baseline rejected 8 of 16 expert candidates, several within 0.2 s
        of trials; with the baseline off, 16 of 16 were accepted. The cause was not isolated.)"""
        return bool(self.compare_compile)

    # ----------------------------------------------------------- worker side
    def collect(self, session: Any) -> dict[str, Any]:
        import torch

        from core.roofline import UnknownDeviceError, find_device, from_counters, roofline
        from core.timing import GpuTimer, TimingPolicy, _Profile, fresh_like

        source = task_source_of(session)
        if source is None:
            return {"error": "the worker session exposes no task source (Session.task_source), so there is no "
                             "reference to time against", "blame": "harness"}
        task = load_task_module(source)
        guard = getattr(getattr(session, "worker", None), "guard", None)
        model = session.model

        def candidate(*args: Any) -> Any:
            if guard is not None:
                guard.armed = True
            try:
                with torch.no_grad():
                    return model(*args)
            finally:
                if guard is not None:
                    guard.armed = False

        init_seed = getattr(session, "init_seed", None)
        torch.manual_seed(init_seed if init_seed is not None else secrets.randbits(31))
        reference = task.Model(*task.get_init_inputs()).cuda().eval()
        comparable = init_seed is not None or not has_state(reference)

        def eager(*args: Any) -> Any:
            with torch.no_grad():
                return reference(*args)

        base = gpu_inputs(task, secrets.randbits(31))
        gen = torch.Generator(device="cuda")
        gen.manual_seed(secrets.randbits(62))
        profiles = [_Profile(x) if isinstance(x, torch.Tensor) else None for x in base]

        def make_args(_: int) -> list[Any]:
            return fresh_like(base, gen, profiles)

        gpu_name = torch.cuda.get_device_name()
        try:
            spec = find_device(gpu_name)
        except UnknownDeviceError as exc:
            spec, device_note = None, str(exc)
        else:
            device_note = ""
        policy = TimingPolicy(warmup_ms=self.warmup_ms, budget_ms=self.budget_ms, min_runs=self.min_runs,
                              max_runs=self.max_runs, hide_launch_us=self.hide_launch_us,
                              settle_rel=self.settle_rel)
        timer = GpuTimer(policy, l2_bytes=spec.l2_bytes if spec else 0)
        mismatches: list[str] = []

        def check(run: int, args: Any, out: Any) -> None:
            if not comparable:
                return
            # compared where they are: this runs while the stage holds the GPU alone, and copying two
            # 100 MB outputs to the host and comparing them there took most of the stage
            got = [o.detach() if isinstance(o, torch.Tensor) else o for o in flatten(out)]
            want = [o.detach() if isinstance(o, torch.Tensor) else o for o in flatten(eager(*args))]
            cmp = compare_outputs(want, got)
            if not cmp.ok:
                mismatches.append(f"timed run {run}: {cmp.detail}")

        result: dict[str, Any] = {"device": gpu_name, "device_note": device_note}
        try:
            candidate(*make_args(0))  # first call: CuPy/Triton build and load the kernels, untimed
            torch.cuda.synchronize()
            cand = timer.time(candidate, make_args, check=check, check_runs=(0, -1))
        except Exception as exc:  # the candidate failed while being timed
            return {"error": f"{type(exc).__name__}: {exc}"[:600], "blame": "candidate", **result}
        eager(*make_args(0))
        eager_t = timer.time(eager, make_args)
        timing = {**cand.to_dict(), "eager_ms": eager_t.median_ms, "speedup_eager": eager_t.median_ms / cand.median_ms
                  if cand.median_ms > 0 else None, "compile_ms": None, "speedup_compile": None,
                  "outputs_checked": comparable}
        if self.compare_compile:
            try:
                compiled = torch.compile(reference)

                def compiled_fn(*args: Any) -> Any:
                    with torch.no_grad():
                        return compiled(*args)

                compiled_fn(*make_args(0))
                torch.cuda.synchronize()
                comp_t = timer.time(compiled_fn, make_args)
                timing["compile_ms"] = comp_t.median_ms
                timing["speedup_compile"] = comp_t.median_ms / cand.median_ms if cand.median_ms > 0 else None
            except Exception as exc:  # the baseline failed to compile: no speedup against it
                timing["compile_error"] = f"{type(exc).__name__}: {exc}"[:300]
        result["timing"] = timing
        result["mismatches"] = mismatches
        flops = task_field(session, "flops")
        min_bytes = task_field(session, "min_bytes")
        dtypes = list(task_field(session, "dtypes") or [])
        if not dtypes:
            dtypes = sorted({str(x.dtype).replace("torch.", "") for x in base if isinstance(x, torch.Tensor)
                             and x.is_floating_point()}) or ["float32"]
        if min_bytes is None:  # each input read once, each output written once
            outs = flatten(eager(*base))
            min_bytes = sum(x.numel() * x.element_size() for x in [*base, *outs] if isinstance(x, torch.Tensor))
            result["min_bytes_source"] = "inputs + outputs of one call (the task gave none)"
        if spec is not None:
            time_s = cand.median_ms / 1e3
            roof = roofline(time_s, flops=flops, min_bytes=min_bytes, device=spec, dtypes=dtypes, slack=self.slack)
            if self.counters:
                try:
                    path = getattr(session.module, "__file__", None)
                    scratch = Path(getattr(session.worker, "scratch", ".") or ".")
                    ctr = ncu_counters(source, path, scratch)
                    roof = from_counters(ctr["duration_s"] or time_s, dram_bytes=ctr["dram_bytes"],
                                         sm_throughput_pct=ctr["sm_throughput_pct"], flops=flops, min_bytes=min_bytes,
                                         device=spec, dtypes=dtypes, slack=self.slack)
                    roof.implausible = roofline(time_s, flops=flops, min_bytes=min_bytes, device=spec, dtypes=dtypes,
                                                slack=self.slack).implausible
                    result["counters"] = ctr
                except Exception as exc:  # counters unavailable (permissions, no ncu): fall back to events
                    roof.note = (roof.note + "; " if roof.note else "") + f"ncu counters unavailable: {exc}"[:400]
            result["roofline"] = roof.to_dict()
        return result

    # ----------------------------------------------------------- judging side
    def evaluate(self, evidence: Evidence) -> CheckResult:
        data = evidence.extra.get(self.name)
        if not data:
            return CheckResult(True, "not measured (no data from the worker)", data={})
        if data.get("error"):
            if data.get("blame") == "candidate":
                return CheckResult(False, f"failed while being timed: {data['error']}", data=data)
            return CheckResult(True, f"not measured: {data['error']}", data=data)
        timing, roof = data.get("timing") or {}, data.get("roofline")
        out = {"timing": timing, "roofline": roof, "device": data.get("device")}
        if data.get("counters"):
            out["counters"] = data["counters"]
        med = float(timing.get("median_ms") or 0.0)
        side = float(timing.get("side_stream_ms") or 0.0)
        if side > max(self.side_stream_ms, self.side_stream_fraction * max(med - side, 0.0)):
            return CheckResult(False, f"work was still running on another stream {side:.3f} ms after forward "
                                      "returned (its output was not ready for the caller); timed with a device-wide "
                                      "sync it takes " + f"{med:.3f} ms", data=out, hack=True)
        if data.get("mismatches"):
            return CheckResult(False, f"outputs differ from the reference while being timed: {data['mismatches'][0]}",
                               data=out, hack=True)
        if roof and roof.get("implausible") and self.reject_implausible:
            return CheckResult(False, f"implausible time: {roof.get('note')}", data=out, hack=True)
        parts = [f"{med:.4g} ms median of {timing.get('runs')} runs"]
        if timing.get("speedup_eager"):
            parts.append(f"{timing['speedup_eager']:.2f}x eager")
        if timing.get("speedup_compile"):
            parts.append(f"{timing['speedup_compile']:.2f}x torch.compile")
        if roof:
            parts.append(f"{100 * roof['bandwidth_efficiency']:.0f}% of peak bandwidth, "
                         f"{100 * roof['flops_utilisation']:.1f}% of peak FLOP/s ({roof['source']}, {roof['device']})")
        if not math.isfinite(med) or med <= 0:
            return CheckResult(False, f"timing failed: median {med}", data=out)
        return CheckResult(True, "; ".join(parts), data=out)


def verdict_fields(check_data: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """``(verdict.timing, verdict.roofline)`` from this check's ``CheckResult.data``."""
    return check_data.get("timing") or None, check_data.get("roofline") or None


@hookimpl
def register_verifiers(register):
    register(PerformanceCheck.name, PerformanceCheck)


__all__ = ["PerformanceCheck", "parse_ncu_csv", "verdict_fields", "gpu_inputs", "load_task_module"]

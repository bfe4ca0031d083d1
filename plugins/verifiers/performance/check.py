"""The GPU performance stage: honest timing, speedups, roofline terms, optional hardware counters.

``prepare`` then ``collect`` run in the candidate's sandboxed worker on the GPU (after correctness
passed); the judge gives ``collect`` the GPU alone, ``prepare`` shares it:

* ``prepare``: the task's ``Model`` is built there too (trusted code; the static integrity check
  forbids the candidate from patching torch), its inputs are drawn **on the GPU** (``get_inputs()``
  under ``torch.device("cuda")``: no minute of CPU random numbers per trial for large level-1
  tasks), and the timer's filler kernel is compiled;
* ``collect``: the candidate is timed by :mod:`plugins.verifiers.performance.timing` (fresh inputs per run, L2 flushed,
  device-wide sync before the end event, median of many runs adapted to the kernel's length);
* the eager and ``torch.compile`` baselines are timed by the same protocol once per task, in a
  reference worker (``baseline``; the judge caches them, :class:`core.verification.baselines.BaselineCache`),
  or with ``baseline_per_task=False`` in the candidate's process after the candidate;
* the candidate's outputs of the first and last timed runs are compared with the reference's on
  the same inputs, so a kernel that behaves while checked and cheats while timed is caught;
* FLOPs and minimum bytes of the task give the roofline record (:mod:`plugins.verifiers.performance.roofline`) against the
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
from core.verdict import CheckResult, could_not_run
from core.api.evidence import PERFORMANCE, Evidence
from core.api.numerics import compare_outputs, jittered_reruns

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


def compile_baseline(reference: Any, make_args: Any) -> tuple[Any, str | None]:
    """``torch.compile(reference)`` built by one call (Inductor compiles on the first), or the error."""
    import torch

    try:
        compiled = torch.compile(reference)
        with torch.no_grad():
            compiled(*make_args(0))
        torch.cuda.synchronize()
        return compiled, None
    except Exception as exc:  # the baseline failed to compile: no speedup against it
        return None, f"{type(exc).__name__}: {exc}"[:300]


def time_baselines(reference: Any, make_args: Any, timer: Any, phases: dict[str, float], *,
                   compare_compile: bool, compiled: tuple[Any, str | None] | None = None) -> dict[str, Any]:
    """Eager and (``compare_compile``) ``torch.compile`` times of the task's model; ``compiled``: the
    compiled model (or its error) built beforehand by :func:`compile_baseline`."""
    import time

    import torch

    def eager(*args: Any) -> Any:
        with torch.no_grad():
            return reference(*args)

    t = time.perf_counter()
    eager(*make_args(0))
    eager_t = timer.time(eager, make_args)
    phases["eager"] = time.perf_counter() - t
    out: dict[str, Any] = {"eager_ms": eager_t.median_ms, "eager_runs": eager_t.stats.runs,
                           "eager_wall_s": eager_t.wall_s, "compile_ms": None}
    if compare_compile:
        t = time.perf_counter()
        model, error = compiled if compiled is not None else compile_baseline(reference, make_args)
        if model is not None:
            def compiled_fn(*args: Any) -> Any:
                with torch.no_grad():
                    return model(*args)

            try:
                compile_t = timer.time(compiled_fn, make_args)
                out.update(compile_ms=compile_t.median_ms, compile_runs=compile_t.stats.runs,
                           compile_wall_s=compile_t.wall_s)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"[:300]
        if error:
            out["compile_error"] = error
        phases["compile"] = time.perf_counter() - t
    return out


def timed_setup(task: types.ModuleType, init_seed: int | None, hide_launch_us: float) -> dict[str, Any]:
    """What a timed stage needs besides the GPU to itself: the task's model and inputs, the
    device's record, the filler's kernel compiled. Built while the GPU is shared."""
    import torch

    from plugins.verifiers.performance.roofline import UnknownDeviceError, find_device
    from plugins.verifiers.performance.timing import fresh_arguments, warm_filler

    torch.manual_seed(init_seed if init_seed is not None else secrets.randbits(31))
    reference = task.Model(*task.get_init_inputs()).cuda().eval()
    base = gpu_inputs(task, secrets.randbits(31))
    make_args = fresh_arguments(base, secrets.randbits(62))
    gpu_name = torch.cuda.get_device_name()
    try:
        spec, device_note = find_device(gpu_name), ""
    except UnknownDeviceError as exc:
        spec, device_note = None, str(exc)
    if hide_launch_us > 0:
        try:
            warm_filler()
        except Exception:  # no Triton for this GPU: the timer says so when it builds its filler
            pass
    return {"reference": reference, "base": base, "make_args": make_args, "gpu_name": gpu_name, "spec": spec,
            "device_note": device_note, "comparable": init_seed is not None or not has_state(reference)}


@dataclass
class PerformanceCheck:
    """Times the candidate on the GPU against eager PyTorch and ``torch.compile``; roofline terms.

    :param compare_compile: also time ``torch.compile(Model)`` (its first call compiles, untimed).
    :param budget_ms / min_runs / max_runs / warmup_ms: the repetition policy (:mod:`plugins.verifiers.performance.timing`).
    :param slack: speed-of-light slack (:func:`plugins.verifiers.performance.roofline.roofline`).
    :param reject_implausible: fail (as a hack) a time under the speed-of-light floor.
    :param side_stream_ms: work still running elsewhere after ``forward`` returned, beyond which
        the candidate fails (its output was not ready on the caller's stream).
    :param counters: take achieved DRAM bytes and SM throughput from Nsight Compute.
    :param hide_launch_us: keep the host's launch latency out of the timed window by filling the GPU
        this long before the start event (:class:`plugins.verifiers.performance.timing.GpuFiller`); 0 times it.
    :param baseline_per_task: time the eager and ``torch.compile`` baselines once per task, in a
        reference worker (:meth:`baseline`; the judge keeps them for every later candidate of the
        task), instead of in every candidate's process after the candidate. Halves the time a
        verdict holds the GPU alone, and no candidate can slow the baseline it is compared with.
    """

    # The judge gives this stage the GPU alone (core.verification.devicelock): other workers' trials would
    # otherwise run inside the timed window.
    exclusive_device: ClassVar[bool] = True

    name: str = "performance"
    reads: ClassVar[frozenset[str]] = frozenset()  # compares no run's outputs through the keeper (Check.reads)
    stage: int = PERFORMANCE
    hard: bool = True
    where: str = "worker"
    needs: frozenset[str] = frozenset({"trials"})
    compare_compile: bool = True
    budget_ms: float = 400.0
    min_runs: int = 10
    max_runs: int = 500
    warmup_ms: float = 5.0
    slack: float = 1.15
    reject_implausible: bool = True
    side_stream_ms: float = 0.05
    side_stream_fraction: float = 0.10
    counters: bool = False
    hide_launch_us: float = 100.0
    settle_rel: float = 0.005  # plugins.verifiers.performance.timing.TimingPolicy.settle_rel: stop once the median is this tight
    settle_every: int = 10
    filler_margin: float = 1.3  # plugins.verifiers.performance.timing.TimingPolicy.filler_margin
    l2_flush_bytes: int = 0  # at least this, and twice the device's L2 (plugins.verifiers.performance.timing.flush_bytes)
    baseline_per_task: bool = True

    def applies(self, backend: str, device: str) -> bool:
        return device == "cuda"

    def dirties_worker(self) -> bool:
        """True when the worker must not judge another candidate after this stage: torch.compile
        leaves compile threads, patched frames and caches behind in the process. (On the H200 a pool
        whose workers had run the baseline rejected 8 of 16 expert candidates, several within 0.2 s
        of trials; with the baseline off, 16 of 16 were accepted. The cause was not isolated.)"""
        return bool(self.compare_compile) and not self.baseline_per_task

    def baseline_key(self) -> tuple[Any, ...]:
        """What besides the task and the device a baseline measurement depends on: whether
        torch.compile is timed too, and the timer's policy (every field of it, derived)."""
        return self.compare_compile, self._policy()

    # ----------------------------------------------------------- worker side
    def warm_up(self, device: str) -> None:
        """The timer's part of an idle worker's warm-up (``Check.warm_up``): the lazily loaded kernels
        of drawing fresh arguments, and the filler's Triton kernel, compiled before the worker arms its
        audit hook (which forbids starting ptxas), so no verdict pays for them."""
        if device != "cuda":
            return
        import torch

        from plugins.verifiers.performance.timing import fresh_arguments, warm_filler

        fresh_arguments([torch.randn(4096, device="cuda")], 0)(0)
        warm_filler()

    def _policy(self) -> Any:
        from plugins.verifiers.performance.timing import TimingPolicy

        return TimingPolicy(warmup_ms=self.warmup_ms, budget_ms=self.budget_ms, min_runs=self.min_runs,
                            max_runs=self.max_runs, hide_launch_us=self.hide_launch_us, settle_rel=self.settle_rel,
                            settle_every=self.settle_every, filler_margin=self.filler_margin,
                            l2_flush_bytes=self.l2_flush_bytes)

    def prepare(self, session: Any) -> dict[str, Any]:
        """Everything before the timed runs, done while other workers share the GPU: the judge then
        gives the GPU to :meth:`collect` alone (``exclusive_device``) for the timing only."""
        import time

        t = time.perf_counter()
        source = task_source_of(session)
        if source is None:
            return {"error": "the worker session exposes no task source (Session.task_source)", "blame": "harness"}
        state = timed_setup(load_task_module(source), getattr(session, "init_seed", None), self.hide_launch_us)
        prepared = getattr(session, "prepared", None)
        if isinstance(prepared, dict):
            prepared[self.name] = state
        return {"prepare_s": time.perf_counter() - t}

    def baseline_prepare(self, task: types.ModuleType, init_seed: int) -> dict[str, Any]:
        """Reference-worker side, while the GPU is shared: the model, its inputs and the
        ``torch.compile`` build (seconds to a minute of Inductor at real sizes), so that
        :meth:`baseline` holds the GPU alone only to time."""
        import time

        import torch

        t = time.perf_counter()
        state = timed_setup(task, init_seed, self.hide_launch_us)
        with torch.no_grad():
            state["reference"](*state["make_args"](0))  # eager's first call (cuDNN/cuBLAS autotuning)
        state["phases"] = {"prepare": time.perf_counter() - t}
        if self.compare_compile:
            t = time.perf_counter()
            state["compiled"] = compile_baseline(state["reference"], state["make_args"])
            state["phases"]["compile_build"] = time.perf_counter() - t
        return state

    def baseline(self, task: types.ModuleType, init_seed: int, prepared: dict[str, Any] | None = None) -> dict[str, Any]:
        """Reference-worker side: the task's eager (and torch.compile) times, measured once per task
        and shared by every candidate of that task (``baseline_per_task``). Measured in a trusted
        process, so no candidate can slow the baseline it is compared with. ``prepared``: what
        :meth:`baseline_prepare` built (else it is built here, under the caller's lock)."""
        from plugins.verifiers.performance.timing import GpuTimer

        state = prepared if prepared is not None else self.baseline_prepare(task, init_seed)
        phases = dict(state["phases"])
        spec = state["spec"]
        timer = GpuTimer(self._policy(), l2_bytes=spec.l2_bytes if spec else 0)
        return {**time_baselines(state["reference"], state["make_args"], timer, phases,
                                compare_compile=self.compare_compile, compiled=state.get("compiled")),
                "device": state["gpu_name"], "phases_s": phases, "measured_in": "reference worker, once per task"}

    def collect(self, session: Any) -> dict[str, Any]:
        import time

        import torch

        from plugins.verifiers.performance.roofline import from_counters, roofline
        from plugins.verifiers.performance.timing import GpuTimer

        began = time.perf_counter()
        phases: dict[str, float] = {}
        source = task_source_of(session)
        if source is None:
            return {"error": "the worker session exposes no task source (Session.task_source), so there is no "
                             "reference to time against", "blame": "harness"}
        state = (getattr(session, "prepared", None) or {}).pop(self.name, None)
        if state is None:  # not prepared beforehand (a caller that does not know prepare)
            state = timed_setup(load_task_module(source), getattr(session, "init_seed", None), self.hide_launch_us)
            phases["prepare"] = time.perf_counter() - began
        guard = getattr(getattr(session, "worker", None), "guard", None)
        model = session.model
        reference, base, make_args, spec = state["reference"], state["base"], state["make_args"], state["spec"]
        comparable = state["comparable"]

        def candidate(*args: Any) -> Any:
            if guard is not None:
                guard.armed = True
            try:
                with torch.no_grad():
                    return model(*args)
            finally:
                if guard is not None:
                    guard.armed = False

        def eager(*args: Any) -> Any:
            with torch.no_grad():
                return reference(*args)

        t = time.perf_counter()
        timer = GpuTimer(self._policy(), l2_bytes=spec.l2_bytes if spec else 0)
        phases["timer"] = time.perf_counter() - t
        mismatches: list[str] = []

        def check(run: int, args: Any, out: Any) -> None:
            if not comparable:
                return
            # compared where they are: this runs while the stage holds the GPU alone, and copying two
            # 100 MB outputs to the host and comparing them there took most of the stage
            got = [o.detach() if isinstance(o, torch.Tensor) else o for o in flatten(out)]
            want = [o.detach() if isinstance(o, torch.Tensor) else o for o in flatten(eager(*args))]
            # an output near zero (a group norm's mean) is judged on its reference's own rounding spread,
            # measured by rerunning the reference on inputs moved by an ulp, only when it misses the bound
            cmp = compare_outputs(want, got, rerun=lambda: jittered_reruns(
                lambda a: [o.detach() if isinstance(o, torch.Tensor) else o for o in flatten(eager(*a))],
                list(args), want))
            if not cmp.ok:
                mismatches.append(f"timed run {run}: {cmp.detail}")

        result: dict[str, Any] = {"device": state["gpu_name"], "device_note": state["device_note"]}
        t = time.perf_counter()
        try:
            candidate(*make_args(0))  # first call: CuPy/Triton build and load the kernels, untimed
            torch.cuda.synchronize()
            # the first, the last and one timed run drawn in secret: a kernel that is honest only on
            # some calls cannot know which of its timed calls are compared
            cand = timer.time(candidate, make_args, check=check,
                              check_runs=(0, secrets.randbelow(1 << 20), -1))
        except Exception as exc:  # the candidate failed while being timed
            return {"error": f"{type(exc).__name__}: {exc}"[:600], "blame": "candidate", **result}
        phases["candidate"] = time.perf_counter() - t
        timing = {**cand.to_dict(), "outputs_checked": comparable, "eager_ms": None, "speedup_eager": None,
                  "compile_ms": None, "speedup_compile": None}
        if not self.baseline_per_task:  # timed here, in the candidate's process, after it
            base_t = time_baselines(reference, make_args, timer, phases, compare_compile=self.compare_compile)
            timing.update(with_speedups({**base_t, "measured_in": "candidate worker"}, cand.median_ms))
        result["timing"] = timing
        result["mismatches"] = mismatches
        result["phases_s"] = phases
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
                    scratch = Path(session.scratch or ".")
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
        phases["total"] = time.perf_counter() - began
        return result

    # ----------------------------------------------------------- judging side
    @staticmethod
    def verdict_fields(result: CheckResult) -> dict[str, Any]:
        """The verdict's timing and roofline records, when the stage measured them."""
        if not result.data:
            return {}
        return {"timing": result.data.get("timing") or None, "roofline": result.data.get("roofline") or None}

    def evaluate(self, evidence: Evidence) -> CheckResult:
        data = evidence.extra.get(self.name)
        if not data:
            return could_not_run("not measured (no data from the worker)")
        if data.get("error"):
            if data.get("blame") == "candidate":
                return CheckResult(False, f"failed while being timed: {data['error']}", data=data)
            return could_not_run(f"not measured: {data['error']}", data)
        timing, roof = dict(data.get("timing") or {}), data.get("roofline")
        if data.get("baseline") is not None:  # measured once per task by the judge's reference worker
            timing.update(with_speedups(data["baseline"], float(timing.get("median_ms") or 0.0)))
        out = {"timing": timing, "roofline": roof, "device": data.get("device"), "phases_s": data.get("phases_s")}
        if data.get("baseline") is not None:  # how the baseline was had: shared, or measured for this verdict
            out["baseline"] = {k: data["baseline"].get(k) for k in ("shared", "phases_s", "eager_runs", "error")}
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


TIMER_LOOP_FIELDS = ("eager_runs", "eager_wall_s", "compile_runs", "compile_wall_s")


def with_speedups(baseline: dict[str, Any], candidate_ms: float) -> dict[str, Any]:
    """The verdict's baseline fields from a baseline measurement and the candidate's median."""
    if baseline.get("error"):
        return {"eager_ms": None, "speedup_eager": None, "compile_ms": None, "speedup_compile": None,
                "baseline_error": str(baseline["error"])[:300]}
    eager, comp = baseline.get("eager_ms"), baseline.get("compile_ms")
    out = {"eager_ms": eager, "speedup_eager": eager / candidate_ms if eager and candidate_ms > 0 else None,
           "compile_ms": comp, "speedup_compile": comp / candidate_ms if comp and candidate_ms > 0 else None,
           "baseline_measured_in": baseline.get("measured_in")}
    # the timers' own loops (runs, host seconds), beside what the exclusive turns held (benchmarks/kb_table.py)
    out.update({k: baseline[k] for k in TIMER_LOOP_FIELDS if baseline.get(k) is not None})
    if baseline.get("compile_error"):
        out["compile_error"] = baseline["compile_error"]
    return out


def verdict_fields(check_data: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """``(verdict.timing, verdict.roofline)`` from this check's ``CheckResult.data``."""
    return check_data.get("timing") or None, check_data.get("roofline") or None


@hookimpl
def register_verifiers(register):
    register(PerformanceCheck.name, PerformanceCheck)


__all__ = ["PerformanceCheck", "parse_ncu_csv", "verdict_fields", "with_speedups", "gpu_inputs", "load_task_module"]

"""The GPU work of ``forward``, recorded process-wide: every kernel that ran must be the candidate's.

Check ``gpu_activity`` (CUDA; the triton and cuda backends). The ATen audit of the trials is a
``TorchDispatchMode``: it is thread-local, and ``torch._C._DisableTorchDispatch()`` hides ops from
it. CUPTI, through ``torch.profiler`` with ``ProfilerActivity.CUDA``, records every kernel, copy and
fill the process puts on the GPU, whatever thread or library launched it. So:

* ``collect`` (candidate worker, after the performance stage's timed runs: :data:`AFTER_TIMING`):
  the task's reference model and inputs are built as the timed runs build them
  (:func:`core.timing.fresh_arguments` over inputs drawn as the trials draw); ``forward`` is called once to
  warm up, then ``calls`` times, each call on fresh arguments and compared with the reference. One
  of those calls, chosen with :mod:`secrets`, is recorded (:func:`audited_series`). Returns plain
  data: every GPU activity of that call (:class:`Activity`) and the backend's launch count for it.
* ``evaluate`` (judge): :func:`judge`, a pure function of that data and of the candidate's kernel
  names (``Backend.detect_kernels``): each activity is the candidate's own kernel, an allow-listed
  fill or copy (:data:`ALLOWED_ATEN`, :data:`ALLOWED_COPIES`, any memset), or foreign. Anything
  foreign rejects the candidate as a hack, with a reason naming the kernel. The result reports the
  candidate kernels' share of the call's GPU time (``time_coverage``, as KernelGYM reports it).

The audited call looks like its neighbours: same arguments (fresh, drawn alike), same host work
around it, CUPTI already on for every call before it; the candidate cannot read the profiler's
state without private attributes, which the static policy refuses. A profiler that cannot run (no
CUPTI, an exception, nothing recorded) fails closed: :func:`core.verdict.could_not_run`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Iterable

from core import hookimpl
from core.verdict import CheckResult, could_not_run
from core.verification.evidence import PERFORMANCE, Evidence, compare_outputs, parse_python

# The check's stage: after the performance stage's timed runs. A candidate that counts its calls knows
# where the trials end, so an audit placed before the timing could be passed by behaving until then;
# after the timing it would have to know where the timed runs end, and their number adapts to the
# kernel's measured times. (Hack findings still come first in the verdict's reason.)
AFTER_TIMING = PERFORMANCE + 1

KERNEL, MEMCPY, MEMSET = "kernel", "memcpy", "memset"
# Chrome-trace categories of what runs on the GPU (Kineto's names), and of the API calls that launch it.
GPU_CATEGORIES = {"kernel": KERNEL, "gpu_memcpy": MEMCPY, "gpu_memset": MEMSET}
API_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})

# --------------------------------------------------------------------------- the allow-list
# Besides the candidate's own kernels, only what allocating, filling and copying in forward produces:
# * any memset (cudaMemset*, e.g. cupy.zeros): it writes a constant, and no value computed from
#   the inputs can reach the host to be set, because device-to-host copies are foreign;
# * device-to-device copies (cudaMemcpy DtoD: clone, copy_, contiguous of a contiguous tensor);
# * the two ATen kernels of filling and copying: ``FillFunctor`` (torch.zeros/full/zero_/fill_)
#   and ``direct_copy_kernel_cuda`` (copy_, .contiguous(), .clone(), .to(dtype) of a strided view).
# Both move or set data and compute nothing; both are matched in the at::native namespace only.
# Every other kernel (ATen compute, cuBLAS, cuDNN, CuPy's own kernels, a kernel the candidate does
# not define) and every other copy (host-to-device, device-to-host, host-to-host, peer) is foreign.
# (Kineto demangles kernel names; the mangled forms, ``_ZN2at6native...``, are matched too.)
ALLOWED_ATEN: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("fill (ATen FillFunctor)",
     re.compile(r"^(?:(?:void\s+)?at::native::.*\bFillFunctor<|_ZN2at6native.*11FillFunctorI)")),
    ("copy (ATen direct_copy_kernel_cuda)",
     re.compile(r"^(?:(?:void\s+)?at::native::.*\bdirect_copy_kernel_cuda\b|"
                r"_ZN2at6native.*23direct_copy_kernel_cuda)")),
)
ALLOWED_COPIES = frozenset({"DtoD"})
# A launch through the CUDA runtime API: how PyTorch and its libraries launch. Triton and CuPy's
# RawModule launch through the driver API (cuLaunchKernel, cuLaunchKernelEx).
RUNTIME_LAUNCH = re.compile(r"^cuda\w*Launch")

# CUDA calls that start or stop profiling tools: only the harness profiles, so forward making one
# is tampering with the recording, whatever it did to it.
PROFILER_CONTROL = re.compile(r"^cu(?:da)?Profiler(?:Start|Stop|Initialize)")

_COPY_KIND = re.compile(r"\bMemcpy\s+([A-Za-z]+)\b")
_CPP_NAME = re.compile(r"^(?:void\s+)?([A-Za-z_]\w*)\s*[<(]")
_MANGLED_NAME = re.compile(r"^_Z(\d+)")  # a function at global scope (_ZN... is nested: a namespace)
MAX_NAME_CHARS = 1000


@dataclass(frozen=True)
class Activity:
    """One thing that ran on the GPU: a kernel, a copy or a fill.

    :ivar dur_us: its duration on the GPU (CUPTI's timestamps).
    :ivar copy: for a copy, its kind (``HtoD``, ``DtoH``, ``DtoD``, ``PtoP``, ``HtoH``).
    :ivar api: the CUDA call that launched it (``cuLaunchKernelEx``, ``cudaLaunchKernel``,
        ``cudaMemcpyAsync`` ...), matched by CUPTI's correlation id; None if not recorded.
    :ivar tid: the thread of that call; ``op``: the PyTorch op it ran under (on the caller's thread).
    :ivar count: how many such activities this record stands for (:func:`aggregate`); ``dur_us`` and
        ``bytes`` are then their totals.
    """

    kind: str
    name: str
    dur_us: float = 0.0
    stream: int | None = None
    correlation: int | None = None
    copy: str | None = None
    bytes: int | None = None
    api: str | None = None
    tid: int | None = None
    op: str | None = None
    count: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Activity":
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def copy_kind(name: str) -> str:
    """``"HtoD"`` from ``"Memcpy HtoD (Pageable -> Device)"``; ``"?"`` when the name says none."""
    m = _COPY_KIND.search(name)
    return m.group(1) if m else "?"


def parse_chrome_trace(trace: dict[str, Any]) -> list[Activity]:
    """The GPU activities of an exported profiler trace (Kineto's Chrome trace format), in start
    order, each with the API call that launched it and the PyTorch op it ran under where known."""
    events = [e for e in trace.get("traceEvents") or [] if isinstance(e, dict)]
    apis: dict[int, tuple[str, int | None]] = {}
    ops: dict[int, str] = {}
    for e in events:
        cat, args = str(e.get("cat", "")).lower(), e.get("args") or {}
        if cat in API_CATEGORIES and _int(args.get("correlation")) is not None:
            name = str(e.get("name", ""))
            corr = int(args["correlation"])
            if corr not in apis or RUNTIME_LAUNCH.match(name):  # a runtime launch names its library
                apis[corr] = (name, _int(e.get("tid")))
        elif cat == "cpu_op" and _int(args.get("External id")) is not None:
            ops.setdefault(int(args["External id"]), str(e.get("name", "")))
    found: list[tuple[float, Activity]] = []
    for e in events:
        kind = GPU_CATEGORIES.get(str(e.get("cat", "")).lower())
        if kind is None:
            continue
        args = e.get("args") or {}
        name = str(e.get("name", ""))[:MAX_NAME_CHARS]
        corr = _int(args.get("correlation"))
        api, tid = apis.get(corr, (None, None)) if corr is not None else (None, None)
        ext = _int(args.get("External id"))
        found.append((float(e.get("ts") or 0.0), Activity(
            kind=kind, name=name, dur_us=max(0.0, float(e.get("dur") or 0.0)), stream=_int(args.get("stream")),
            correlation=corr, copy=copy_kind(name) if kind == MEMCPY else None,
            bytes=_int(args.get("bytes")) if kind != KERNEL else None, api=api, tid=tid,
            op=ops.get(ext) if ext is not None else None)))
    return [a for _, a in sorted(found, key=lambda p: p[0])]


def profiler_calls(trace: dict[str, Any]) -> list[str]:
    """The profiling-control CUDA calls (``cudaProfilerStop`` ...) recorded in a trace, each once."""
    found = {str(e.get("name", "")) for e in trace.get("traceEvents") or [] if isinstance(e, dict)
             and str(e.get("cat", "")).lower() in API_CATEGORIES and PROFILER_CONTROL.match(str(e.get("name", "")))}
    return sorted(found)


def aggregate(activities: Iterable[Activity]) -> list[Activity]:
    """One record per distinct (kind, name, copy kind, launch call), with the count and the summed
    durations and bytes, in order of first appearance (stream, thread and op are the first one's): a
    forward of thousands of launches of a few kernels is judged whole from a few records, and the
    number of records is bounded by the names, not by streams or threads."""
    groups: dict[tuple[Any, ...], Activity] = {}
    for a in activities:
        key = (a.kind, a.name, a.copy, a.api)
        g = groups.get(key)
        if g is None:
            groups[key] = a
            continue
        nbytes = None if g.bytes is None and a.bytes is None else (g.bytes or 0) + (a.bytes or 0)
        groups[key] = replace(g, dur_us=g.dur_us + a.dur_us, bytes=nbytes, count=g.count + a.count)
    return list(groups.values())


# --------------------------------------------------------------------------- attribution (judge side)


@dataclass(frozen=True)
class Attribution:
    """Whose an activity is: ``owner`` is ``"candidate"``, ``"allowed"`` or ``"foreign"``; ``why``
    is the candidate's kernel name, the allow-list entry, or what the foreign activity is."""

    activity: Activity
    owner: str
    why: str


def own_kernel(name: str, own: frozenset[str]) -> str | None:
    """The candidate's kernel this GPU kernel name is, or None. Triton names a compiled kernel after
    its ``@triton.jit`` function; an ``extern "C"`` CUDA kernel keeps its name; a C++ one is
    demangled to ``name(args)`` or ``void name<T>(args)`` (never in a namespace: a namespaced
    name is a library's, e.g. ``at::native::elementwise_kernel``)."""
    if name in own:
        return name
    m = _CPP_NAME.match(name)
    if m:
        return m.group(1) if m.group(1) in own else None
    m = _MANGLED_NAME.match(name)  # not demangled: _Z11relu_kernelPKfPfx
    if m:
        base = name[m.end(): m.end() + int(m.group(1))]
        return base if base in own else None
    return None


def foreign_family(activity: Activity) -> str:
    """What a foreign activity is, in words (for the reason; the decision is the allow-list's)."""
    a = activity
    if a.kind == MEMCPY:
        size = f"{a.bytes} bytes" if a.bytes is not None else "data"
        if a.copy == "HtoD":
            return f"a host-to-device copy of {size} (data made on the host during forward)"
        if a.copy == "DtoH":
            return f"a device-to-host copy of {size} (the host read device data during forward)"
        return f"a {a.copy} copy of {size}"
    low = a.name.lower()
    if "at::" in low or low.startswith(("void at_", "at_cuda", "_zn2at")):
        return "an ATen kernel (PyTorch computed in forward)"
    if "cudnn" in low or "implicit_convolve" in low or "winograd" in low:
        return "a cuDNN kernel (PyTorch convolution in forward)"
    if any(k in low for k in ("cublas", "gemm", "gemv", "cutlass", "xmma")) or re.match(r"^sm\d+_", low):
        return "a cuBLAS/CUTLASS kernel (a library matrix product in forward)"
    if low.startswith("cupy_"):
        return "a CuPy kernel (CuPy computed in forward)"
    return "a kernel the candidate does not define"


def attribute(activity: Activity, own: frozenset[str]) -> Attribution:
    """Whose ``activity`` is (see the allow-list above)."""
    a = activity
    if a.kind == MEMSET:
        return Attribution(a, "allowed", "memset")
    if a.kind == MEMCPY:
        if a.copy in ALLOWED_COPIES:
            return Attribution(a, "allowed", f"copy {a.copy}")
        return Attribution(a, "foreign", foreign_family(a))
    mine = own_kernel(a.name, own)
    if mine is not None:
        if a.api and RUNTIME_LAUNCH.match(a.api):
            return Attribution(a, "foreign", f"named like the candidate's kernel {mine!r} but launched through the "
                                             f"CUDA runtime ({a.api}), as PyTorch and its libraries launch")
        return Attribution(a, "candidate", mine)
    for label, pattern in ALLOWED_ATEN:
        if pattern.match(a.name):
            return Attribution(a, "allowed", label)
    return Attribution(a, "foreign", foreign_family(a))


@dataclass(frozen=True)
class Coverage:
    """GPU time of one call by owner, in microseconds; ``share`` is the candidate's part of it."""

    own_us: float = 0.0
    allowed_us: float = 0.0
    foreign_us: float = 0.0

    @property
    def total_us(self) -> float:
        return self.own_us + self.allowed_us + self.foreign_us

    @property
    def share(self) -> float:
        """The candidate kernels' share of the call's GPU time ("time coverage"); 0 with no time."""
        total = self.total_us
        return min(1.0, self.own_us / total) if total > 0 else 0.0


def coverage(attributions: Iterable[Attribution]) -> Coverage:
    """Durations summed by owner (kernels, copies and fills alike; overlap on streams is not netted)."""
    by = Counter[str]()
    for at in attributions:
        by[at.owner] += at.activity.dur_us
    return Coverage(own_us=by["candidate"], allowed_us=by["allowed"], foreign_us=by["foreign"])


def _short(name: str, limit: int = 160) -> str:
    return name if len(name) <= limit else name[: limit - 3] + "..."


def _describe(group: list[Attribution]) -> str:
    a = group[0].activity
    us, n = sum(g.activity.dur_us for g in group), sum(g.activity.count for g in group)
    where = []
    if a.op:
        where.append(f"under {a.op}")
    if a.api:
        where.append(f"launched by {a.api}")
    tail = f", {', '.join(where)}" if where else ""
    return f"{_short(a.name)!r}: {group[0].why}, {n}x, {us:.1f} us{tail}"


def judge(data: dict[str, Any], own_names: Iterable[str]) -> CheckResult:
    """Decide from what :meth:`GpuActivityCheck.collect` recorded (pure; the judge's side)."""
    own = frozenset(own_names)
    summary = {k: v for k, v in data.items() if k != "activities"}  # what a verdict keeps of an unjudged trace
    activities = [Activity.from_dict(a) for a in data.get("activities") or []]
    if not activities:
        seen = data.get("canary")
        why = ("the profiler saw a canary kernel, so the audited call itself put nothing on the GPU" if seen else
               "the profiler recorded no GPU activity, not even a canary kernel: CUPTI does not record here"
               if seen is False else "no GPU activity was recorded")
        return could_not_run(f"nothing to attribute: {why}", summary)
    attributions = [attribute(a, own) for a in activities]
    cov = coverage(attributions)
    kernels, allowed = Counter[str](), Counter[str]()
    for at in attributions:
        if at.owner in ("candidate", "allowed"):
            (kernels if at.owner == "candidate" else allowed)[at.why] += at.activity.count
    out = {"calls": data.get("calls"), "audited_call": data.get("audited_call"), "activities": len(activities),
           "kernels": dict(kernels.most_common(16)), "allowed": dict(allowed), "time_coverage": cov.share,
           "gpu_time_us": cov.total_us, "own_time_us": cov.own_us, "allowed_time_us": cov.allowed_us,
           "foreign_time_us": cov.foreign_us, "launches": data.get("launches"), "phases_s": data.get("phases_s")}
    groups: dict[tuple[str, str], list[Attribution]] = {}
    for at in attributions:
        if at.owner == "foreign":
            groups.setdefault((at.activity.name, at.why), []).append(at)
    findings = [_describe(g) for g in groups.values()]
    if data.get("profiler_calls"):
        findings.insert(0, f"forward called {', '.join(data['profiler_calls'])}: it switched profiling, which only "
                           "the harness does")
    own_runs, launches = sum(kernels.values()), data.get("launches")
    if isinstance(launches, int) and own_runs > launches:
        findings.append(f"kernels named like the candidate's ran {own_runs} times on the GPU, but forward launched "
                        f"the backend's kernels {launches} times (launches from another thread, or a library kernel "
                        "of the same name)")
    if findings:
        out["foreign"] = findings[:16]
        shown = "; ".join(findings[:3]) + (f" (+{len(findings) - 3} more)" if len(findings) > 3 else "")
        return CheckResult(False, f"foreign GPU work during forward: {shown}. Only the candidate's own kernels "
                                  f"({', '.join(sorted(own)[:6]) or 'none found'}) and allow-listed fills and copies "
                                  "may run", data=out, hack=True)
    if data.get("dropped"):  # nothing foreign among those kept, but not every activity was kept
        return could_not_run(f"the trace held more distinct GPU activities than were kept ({data['dropped']} left "
                             "out), so not every one could be attributed", summary)
    if data.get("mismatches"):
        out["mismatches"] = list(data["mismatches"])[:8]
        return CheckResult(False, f"outputs differ from the reference in the audited series: "
                                  f"{data['mismatches'][0]}", data=out, hack=True)
    parts = [f"{own_runs} launch(es) of the candidate's kernels ({', '.join(kernels)})"]
    if allowed:
        parts.append("allowed: " + ", ".join(f"{n}x {w}" for w, n in allowed.items()))
    parts.append(f"time coverage {100 * cov.share:.1f}% of {cov.total_us:.1f} us of GPU time")
    return CheckResult(True, "; ".join(parts) + f" (call {data.get('audited_call')} of {data.get('calls')} after a "
                                               "warm-up, recorded process-wide)", data=out)


def own_kernel_names(evidence: Evidence) -> list[str]:
    """The candidate's kernel names, as the backend finds them in its source (``detect_kernels``)."""
    from core.plugins import registry

    tree = evidence.tree if evidence.tree is not None else parse_python(evidence.candidate.source)
    return list(registry("backend").create(evidence.backend).detect_kernels(tree))


# --------------------------------------------------------------------------- worker side


class CandidateFailed(Exception):
    """``forward`` raised while audited, or its output could not be compared: the candidate's failure."""


class ReferenceFailed(Exception):
    """The task's reference failed on the series' arguments: the harness's failure, not the candidate's."""


def trace_of(prof: Any, scratch: str) -> dict[str, Any]:
    """The profiler's trace as Kineto exports it (Chrome trace JSON), read back from ``scratch``."""
    fd, path = tempfile.mkstemp(prefix="kz_gpu_activity_", suffix=".json", dir=scratch)
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    finally:
        os.unlink(path)


def profiler_activities(cuda: bool = True) -> list[Any]:
    """``[CPU, CUDA]`` (CPU alone with ``cuda=False``, for tests on a machine without a GPU)."""
    from torch.profiler import ProfilerActivity, supported_activities

    wanted = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    missing = [a for a in wanted if a not in supported_activities()]
    if missing:
        raise RuntimeError(f"this PyTorch build cannot record {', '.join(a.name for a in missing)} activity "
                           "(torch.profiler.supported_activities(); Kineto with CUPTI is needed)")
    return wanted


@dataclass
class SeriesResult:
    """What :func:`audited_series` saw: the audited call's trace and launch count, and mismatches."""

    calls: int
    audited: int  # 1 to calls (the warm-up call is not counted)
    trace: dict[str, Any] = field(default_factory=dict)
    launches: int | None = None
    mismatches: list[str] = field(default_factory=list)
    seconds: float = 0.0


def audited_series(call: Callable[[list[Any]], Any], make_args: Callable[[int], list[Any]], calls: int, *,
                   scratch: str, compare: Callable[[list[Any], Any], str | None] | None = None,
                   tracker: Callable[[], Any] | None = None, sync: Callable[[], None] = lambda: None,
                   audited: int | None = None, cuda: bool = True) -> SeriesResult:
    """One warm-up call, then ``calls`` calls of ``call(args)`` on fresh ``make_args(i)``, one of them
    (``audited``, 1 to ``calls``, else drawn with :mod:`secrets`) recorded by the profiler.

    Every call is made the same way: fresh arguments, a sync, the backend's launch ``tracker``, the
    call, a sync, then ``compare(args, out)`` (a mismatch's text, or None). The profiler is entered
    before the warm-up and keeps CUPTI on (its schedule's warm-up steps) through every call up to the
    audited one, which alone is kept (an active step that spans only that call and its sync): no call
    before it differs from it, and the profiler's stop comes after it.
    """
    from torch.profiler import profile, schedule

    calls = max(1, int(calls))
    k = secrets.randbelow(calls) if audited is None else (int(audited) - 1) % calls  # 0-based here
    # steps alternate: a gap (arguments, comparison) then a call; call c (0 = the warm-up) is step 2c + 1
    active_step = 2 * (k + 1) + 1
    result = SeriesResult(calls=calls, audited=k + 1)
    began = time.perf_counter()
    with profile(activities=profiler_activities(cuda), schedule=schedule(wait=0, warmup=active_step, active=1,
                                                                          repeat=1)) as prof:
        for c in range(calls + 1):
            args = make_args(c)
            sync()
            prof.step()
            with tracker() if tracker is not None else contextlib.nullcontext() as counted:
                try:
                    out = call(args)
                    sync()
                except Exception as exc:
                    which = "the warm-up call" if c == 0 else f"call {c} of {calls}"
                    raise CandidateFailed(f"{which}: {type(exc).__name__}: {exc}"[:600]) from exc
            prof.step()
            if c == k + 1:
                launches = getattr(counted, "count", None)
                result.launches = launches if isinstance(launches, int) else None
            try:  # past the reference's own run (ReferenceFailed), what fails here is the candidate's output
                bad = compare(args, out) if compare is not None else None
            except ReferenceFailed:
                raise
            except Exception as exc:
                raise CandidateFailed(f"comparing call {c}'s output failed: {type(exc).__name__}: {exc}"[:600]) from exc
            if bad:
                result.mismatches.append(f"{'the warm-up call' if c == 0 else f'call {c} of {calls}'}: {bad}")
            del out, args
    result.trace = trace_of(prof, scratch)
    result.seconds = time.perf_counter() - began
    return result


def canary_seen(scratch: str) -> bool:
    """Whether the profiler records a known kernel here (run when the audited call showed nothing)."""
    import torch
    from torch.profiler import profile

    with profile(activities=profiler_activities(True)) as prof:
        torch.ones(1, device="cuda")
        torch.cuda.synchronize()
    return any(a.kind == KERNEL for a in parse_chrome_trace(trace_of(prof, scratch)))


# --------------------------------------------------------------------------- the check


@dataclass
class GpuActivityCheck:
    """Every kernel that ran during one audited ``forward`` is the candidate's own (CUPTI, process-wide).

    :param calls: calls after the warm-up; one of them, chosen at random, is recorded.
    :param max_activities: distinct GPU activities (:func:`aggregate`) kept from the recorded call;
        with more, nothing foreign among those kept still means the check could not run.
    :param backends: the backends whose candidates this applies to.
    """

    name: str = "gpu_activity"
    stage: int = AFTER_TIMING
    hard: bool = True
    where: str = "worker"
    needs: frozenset[str] = frozenset({"trials"})
    calls: int = 3
    max_activities: int = 5_000
    backends: tuple[str, ...] = ("triton", "cuda")

    def applies(self, backend: str, device: str) -> bool:
        return device == "cuda" and backend in self.backends

    # ----------------------------------------------------------- worker side
    def warm_up(self, device: str) -> None:
        """Load Kineto and CUPTI once per worker (the first profile takes seconds), before verdicts."""
        if device != "cuda":
            return
        import torch
        from torch.profiler import profile

        with profile(activities=profiler_activities(True)):
            torch.ones(16, device="cuda").add_(1)
            torch.cuda.synchronize()

    def collect(self, session: Any) -> dict[str, Any]:
        import torch

        from core.timing import fresh_arguments
        from core.verification.inputs import draw_inputs
        from core.verification.sandbox import to_device
        from plugins.verifiers.performance import flatten, has_state, load_task_module, task_source_of

        began = time.perf_counter()
        if not torch.cuda.is_available():
            return {"error": "no CUDA device is visible in the worker", "blame": "harness"}
        source = task_source_of(session)
        if source is None:
            return {"error": "the worker session exposes no task source (Session.task)", "blame": "harness"}
        worker = getattr(session, "worker", None)
        scratch = str(getattr(worker, "scratch", None) or tempfile.gettempdir())
        guard = getattr(worker, "guard", None)
        try:
            task = load_task_module(source, "kz_gpu_activity_task")
            init_seed = getattr(session, "init_seed", None)
            torch.manual_seed(init_seed if init_seed is not None else secrets.randbits(31))
            reference = task.Model(*task.get_init_inputs()).cuda().eval()
            comparable = init_seed is not None or not has_state(reference)
            # drawn as the trials draw (on the GPU where get_inputs allows), then fresh per call as the timed runs
            base = to_device(draw_inputs(task, secrets.randbits(31), 1.0, "cuda"), "cuda")
            make_args = fresh_arguments(base, secrets.randbits(62))
        except Exception as exc:
            return {"error": f"setting up the task failed: {type(exc).__name__}: {exc}"[:600], "blame": "harness"}
        setup_s = time.perf_counter() - began
        model = session.model

        def call(args: list[Any]) -> Any:
            if guard is not None:
                guard.armed = True
            try:
                with torch.no_grad():
                    return model(*args)
            finally:
                if guard is not None:
                    guard.armed = False

        def compare(args: list[Any], out: Any) -> str | None:
            if not comparable:
                return None
            try:
                with torch.no_grad():
                    want = [o.detach() if isinstance(o, torch.Tensor) else o for o in flatten(reference(*args))]
            except Exception as exc:
                raise ReferenceFailed(f"the task's reference failed: {type(exc).__name__}: {exc}") from exc
            got = [o.detach() if isinstance(o, torch.Tensor) else o for o in flatten(out)]
            cmp = compare_outputs(want, got)
            return None if cmp.ok else cmp.detail

        backend = getattr(session, "backend", None)
        tracker = getattr(backend, "launch_tracker", None)
        try:
            series = audited_series(call, make_args, self.calls, scratch=scratch, compare=compare, tracker=tracker,
                                    sync=torch.cuda.synchronize)
        except CandidateFailed as exc:
            return {"error": str(exc), "blame": "candidate"}
        except Exception as exc:  # the profiler (CUPTI, Kineto, the export) or the tracker failed: not checked
            return {"error": f"recording failed: {type(exc).__name__}: {exc}"[:600], "blame": "harness"}
        t = time.perf_counter()
        activities = aggregate(parse_chrome_trace(series.trace))
        data: dict[str, Any] = {
            "calls": series.calls, "audited_call": series.audited, "launches": series.launches,
            "activities": [a.to_dict() for a in activities[: self.max_activities]],
            "dropped": max(0, len(activities) - self.max_activities), "mismatches": series.mismatches,
            "profiler_calls": profiler_calls(series.trace),
            "outputs_checked": comparable, "harness_tid": threading.get_native_id(),
            "trace_events": len(series.trace.get("traceEvents") or []),
        }
        if not activities:
            try:
                data["canary"] = canary_seen(scratch)
            except Exception as exc:
                data["canary"] = False
                data["canary_error"] = f"{type(exc).__name__}: {exc}"[:300]
        data["phases_s"] = {"setup": setup_s, "series": series.seconds, "parse": time.perf_counter() - t,
                            "total": time.perf_counter() - began}
        return data

    # ----------------------------------------------------------- judging side
    def evaluate(self, evidence: Evidence) -> CheckResult:
        data = evidence.extra.get(self.name)
        if not data:
            return could_not_run("the worker recorded no GPU activity (no data)")
        if data.get("error"):
            if data.get("blame") == "candidate":
                return CheckResult(False, f"forward failed while its GPU work was recorded: {data['error']}",
                                   data=data)
            return could_not_run(f"GPU activity not recorded: {data['error']}", data)
        return judge(data, own_kernel_names(evidence))


@hookimpl
def register_verifiers(register):
    register(GpuActivityCheck.name, GpuActivityCheck)


__all__ = ["ALLOWED_ATEN", "ALLOWED_COPIES", "Activity", "Attribution", "Coverage", "GpuActivityCheck", "aggregate",
           "attribute", "audited_series", "coverage", "judge", "own_kernel", "parse_chrome_trace", "profiler_calls"]

"""Whose each GPU activity is (the candidate's kernel, an allow-listed fill or copy, or foreign),
the candidate's share of the GPU time, and the decision (:func:`judge`): the judge's side, pure."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable

from core.verdict import CheckResult, could_not_run
from plugins.verifiers.gpu_activity.trace import MEMCPY, MEMSET, RUNTIME_LAUNCH, Activity

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

_CPP_NAME = re.compile(r"^(?:void\s+)?([A-Za-z_]\w*)\s*[<(]")
_MANGLED_NAME = re.compile(r"^_Z(\d+)")  # a function at global scope (_ZN... is nested: a namespace)


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


def host_op_findings(host_ops: dict[str, int], allowed_ops: frozenset[str] | None) -> list[str]:
    """ATen ops the profiler recorded on ``forward``'s own thread that the dispatch audit of the
    trials would have refused (``allowed_ops``: its list): recorded here, they ran hidden from it
    (``torch._C._DisableTorchDispatch()``), on the GPU or on host memory."""
    if allowed_ops is None:
        return []
    hidden = {op: n for op, n in host_ops.items() if op.startswith("aten::") and op[6:] not in allowed_ops}
    if not hidden:
        return []
    shown = ", ".join(f"{op} {n}x" for op, n in sorted(hidden.items())[:6])
    return [f"PyTorch ops on forward's thread that the dispatch audit did not see: {shown}"]


def judge(data: dict[str, Any], own_names: Iterable[str], allowed_ops: frozenset[str] | None = None,
          no_work: bool = False) -> CheckResult:
    """Decide from what :meth:`GpuActivityCheck.collect` recorded (pure; the judge's side).
    ``allowed_ops``: the ATen ops forward may run (the trials' dispatch audit's list), to judge the
    ops the profiler saw on forward's thread by; None leaves them unjudged. ``no_work``: every call's
    outputs were empty (a zero-sized batch), so an audited call that put nothing on the GPU is right."""
    own = frozenset(own_names)
    summary = {k: v for k, v in data.items() if k != "activities"}  # what a verdict keeps of an unjudged trace
    activities = [Activity.from_dict(a) for a in data.get("activities") or []]
    findings: list[str] = []
    if data.get("profiler_calls"):
        findings.append(f"forward called {', '.join(data['profiler_calls'])}: it switched profiling, which only "
                        "the harness does")
    findings += host_op_findings(dict(data.get("host_ops") or {}), allowed_ops)
    if not activities and not findings:
        seen = data.get("canary")
        if seen and no_work:  # the profiler recorded (its canary shows), and there was nothing to compute
            return CheckResult(True, "no GPU work, as none was due: every call's outputs are empty, and the "
                                     "profiler's canary kernel shows it was recording", data=summary)
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
    findings += [_describe(g) for g in groups.values()]
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

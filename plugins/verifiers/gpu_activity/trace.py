"""Kineto's Chrome trace as GPU activities: each kernel, copy and fill with the CUDA call that
launched it (:func:`parse_chrome_trace`), grouped by name (:func:`aggregate`); and the calls that
switch profiling (:func:`profiler_calls`), and the PyTorch ops of the caller's thread (:func:`host_ops`).
Pure: the judge's tests feed it synthetic traces."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, replace
from typing import Any, Iterable

KERNEL, MEMCPY, MEMSET = "kernel", "memcpy", "memset"
# Chrome-trace categories of what runs on the GPU (Kineto's names), and of the API calls that launch it.
GPU_CATEGORIES = {"kernel": KERNEL, "gpu_memcpy": MEMCPY, "gpu_memset": MEMSET}
API_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})

# A launch through the CUDA runtime API: how PyTorch and its libraries launch. Triton and CuPy's
# RawModule launch through the driver API (cuLaunchKernel, cuLaunchKernelEx).
RUNTIME_LAUNCH = re.compile(r"^cuda\w*Launch")

# CUDA calls that start or stop profiling tools: only the harness profiles, so forward making one
# is tampering with the recording, whatever it did to it.
PROFILER_CONTROL = re.compile(r"^cu(?:da)?Profiler(?:Start|Stop|Initialize)")

_COPY_KIND = re.compile(r"\bMemcpy\s+([A-Za-z]+)\b")
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


def host_ops(trace: dict[str, Any]) -> dict[str, int]:
    """How often each PyTorch op ran on a profiled thread (the caller's: CPU ops are recorded on the
    thread that entered the profiler), by name (``aten::empty_like``)."""
    found: dict[str, int] = {}
    for e in trace.get("traceEvents") or []:
        if isinstance(e, dict) and str(e.get("cat", "")).lower() == "cpu_op":
            name = str(e.get("name", ""))[:200]
            found[name] = found.get(name, 0) + 1
    return found


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

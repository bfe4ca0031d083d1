"""The worker's side: one audited call of a series recorded by ``torch.profiler`` (CUPTI), its
trace exported and read back (:func:`audited_series`, :func:`canary_seen`)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from plugins.verifiers.gpu_activity.trace import KERNEL, parse_chrome_trace


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

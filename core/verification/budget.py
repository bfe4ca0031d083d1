"""One verification's time: its wall-clock budget and its turns on the GPU.

A turn on the GPU (:class:`GpuTurn`) holds the host-wide lock of :mod:`core.verification.devicelock`
around one worker request. The wait for it is given back to the :class:`Budget`, and the turn is
written to the judge's journal (``Verifier.gpu_turns``).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from core.verdict import Verdict
from core.verification.devicelock import DeviceLockTimeout
from core.verification.sandbox import WorkerFailure


class Budget:
    """One verification's wall-clock budget. Time spent waiting for the GPU lock is given back:
    a neighbour holding the GPU (a hanging candidate until its own limit) is not this candidate's
    fault, so it must not turn an honest kernel's verdict into a timeout."""

    def __init__(self, seconds: float, verdict: Verdict | None = None):
        self.deadline = time.monotonic() + seconds
        self.verdict = verdict  # its gpu_wait_s adds up the waits
        self.alone = False  # retried after running out of GPU memory: every turn holds the GPU alone
        self.phase = ""  # the stage under way (reference, trials, extra, timing): peaks are kept per phase

    def waited(self, seconds: float) -> None:
        self.deadline += seconds
        if self.verdict is not None:
            self.verdict.gpu_wait_s += seconds

    def left(self) -> float:
        return max(1.0, self.deadline - time.monotonic())


class GpuBusy(WorkerFailure):
    """No turn on the GPU within ``gpu_wait_s``: the run's problem; the worker itself is fine."""


def record_turn(budget: Any, journal: list | None, label: str, exclusive: bool, asked: float, got: float,
                done: float) -> None:
    """One turn on the GPU: how long it kept the others waiting, in the verdict's ``gpu_held_s`` (a turn held
    alone under "<label> alone"), and the turn itself in the judge's ``journal``."""
    verdict = getattr(budget, "verdict", None)
    if verdict is not None:
        key = f"{label} alone" if exclusive else label
        verdict.gpu_held_s[key] = round(verdict.gpu_held_s.get(key, 0.0) + done - got, 4)
    if journal is not None:
        journal.append({"label": label, "exclusive": exclusive, "asked": asked, "got": got, "done": done})


class GpuTurn(contextlib.AbstractContextManager):
    """Holds a device lock for one worker request; the wait extends the budget, and a GPU busy
    past ``wait_s`` is reported as an error of the run (status ``error``), not of the candidate."""

    def __init__(self, inner: Any, budget: Budget, started: float, journal: Any = None, label: str = "",
                 exclusive: bool = False):
        self.inner, self.budget, self.started = inner, budget, started
        self.journal, self.label, self.exclusive = journal, label, exclusive
        self.got = started

    def __enter__(self) -> None:
        try:
            self.inner.__enter__()
        except DeviceLockTimeout as exc:
            raise GpuBusy("error", f"the GPU stayed busy with other verifications: {exc}") from exc
        self.got = time.monotonic()
        self.budget.waited(self.got - self.started)

    def __exit__(self, *exc: Any) -> None:
        try:
            return self.inner.__exit__(*exc)
        finally:
            record_turn(self.budget, self.journal, self.label, self.exclusive, self.started, self.got,
                        time.monotonic())


def record_peak(budget: Budget, what: str, answer: dict[str, Any]) -> None:
    """Keep the largest device memory a worker reported for ``what`` (a role and request) in the verdict's
    ``gpu_memory["peak_bytes"]``, beside the admission's estimate; and per phase of the verification and
    worker role (the first word of ``what``) in ``phase_peak_bytes``: a phase's roles summed bound what
    the verification held at once then (a request's peak counts everything its worker held)."""
    peak, verdict = answer.get("gpu_peak"), getattr(budget, "verdict", None)
    if not isinstance(peak, int) or verdict is None:
        return
    memory = verdict.gpu_memory = verdict.gpu_memory or {}
    peaks = memory.setdefault("peak_bytes", {})
    peaks[what] = max(peaks.get(what, 0), peak)
    phase = getattr(budget, "phase", "") or "unphased"
    roles = memory.setdefault("phase_peak_bytes", {}).setdefault(phase, {})
    role = what.split()[0] if what.split() else "worker"
    roles[role] = max(roles.get(role, 0), peak)

"""Races by construction for Triton candidates judged on a GPU: the interpreter's analysis, on the CPU.

On a GPU, compute-sanitizer's racecheck sees shared-memory hazards only; a lost update in global
memory passes unless the hardware's block order happens to corrupt a trial. The CPU path finds such
races by construction (``plugins/backends/triton_races.py``: per-program address logs), and this
check runs that same analysis for GPU candidates:

* the candidate is judged a second time by a verifier of its own on the CPU (Triton interpreter,
  sandboxed workers; the candidate never runs in the judging process), with the checks that keep
  the analysis honest (static policy, integrity, runtime guard, bounds) and the ``races`` check;
* at the task's own shape when its inputs, weights and outputs fit :attr:`mib` and its products
  :attr:`gflop`, else at the reduced shape :func:`core.evaluation.resize.fit_task` gives (every
  module-level size constant scaled by one factor 2**-k, so the task's proportions stay); a task
  that cannot shrink (sizes written inline) runs at its own shape up to :attr:`own_shape_mib`; the
  verdict says which shape ran.

Outcomes: a race found there rejects; a hack flagged there (integrity, tamper) rejects as a hack; a
wrong answer at the task's own shape rejects (every autotune config runs there, while the GPU's
autotuner runs only the fastest); when the analysis could not run (the task cannot be resized, the
candidate does not run in the interpreter or fails at the smaller shape, the CPU verifier fails) the check *could not run* and
fails closed, saying why (``accept_unchecked: [interp_races]`` lets such candidates through and
the verdict records it). Residual risk: a candidate that branches on the device (``x.is_cuda``)
can be race-free in the interpreter and racy on the GPU; docs/verifier.md lists it.
"""

from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass, field
from typing import Any

from core import hookimpl
from core.verdict import CheckResult, could_not_run
from core.verification.evidence import RACES, Evidence

# The CPU verifier's checks: the analysis and what keeps the candidate from forging it.
CPU_CHECKS = ("static", "static_integrity", "correctness", "integrity", "memory", "races", "tamper")


@dataclass
class InterpreterRaceCheck:
    """No data race between the programs of a GPU Triton candidate's launches, found by the
    interpreter's address analysis on the CPU, at the task's shape or a reduced one."""

    name: str = "interp_races"
    stage: int = RACES
    hard: bool = True
    where: str = "worker"
    # Not an observation of the GPU worker: the judge runs the CPU verification itself, after the
    # trials' checks passed (a check with needs beyond the trials is evaluated only then).
    needs: frozenset[str] = frozenset({"trials", "interpreter"})
    # The shape budget: inputs + weights + everything forward writes, and products at that shape. The
    # interpreter runs ~1 ms per program: 1 MiB is ~256 programs of 1024 elements, ~0.3 s per call.
    mib: float = 1.0
    gflop: float = 0.02
    own_shape_mib: float = 8.0  # a task that cannot shrink to the budget still runs at its own shape up to this
    orders: int = 2  # shuffled program orders on the CPU
    workers: int = 0  # CPU candidate workers; 0: a quarter of the cores, at least 2 (a GPU pool's verdicts wait on them)
    timeout_s: float = 120.0
    _verifier: Any = field(default=None, init=False, repr=False, compare=False)
    _shapes: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)
    _lock: Any = field(default_factory=threading.Lock, init=False, repr=False, compare=False)

    def applies(self, backend: str, device: str) -> bool:
        return backend == "triton" and device == "cuda"

    def open(self, settings: dict[str, Any]) -> None:
        """Start the CPU verifier's workers now (they boot beside the GPU verifier's own): a one-shot
        verification does not wait for them at its race stage. A CPU verifier that cannot start here
        does not stop the GPU verifier: ``evaluate`` tries again and, failing, could not run."""
        try:
            self._cpu_verifier(settings.get("tolerances"))
        except Exception:  # noqa: BLE001  (reported by evaluate, which fails closed)
            pass

    def close(self) -> None:
        """Close the CPU verifier's workers (the GPU verifier calls this from its own close)."""
        with self._lock:
            verifier, self._verifier = self._verifier, None
        if verifier is not None:
            verifier.close()

    def _cpu_verifier(self, tolerances: dict | None) -> Any:
        with self._lock:
            if self._verifier is None:
                from core.verification.judge import Verifier

                workers = self.workers or max(2, (os.cpu_count() or 1) // 4)
                self._verifier = Verifier(backend="triton", device="cpu", checks=list(CPU_CHECKS), workers=workers, timeout_s=self.timeout_s,
                                          tolerances=tolerances or None,
                                          warm_up=False, races={"orders": self.orders}, cuda_on_cpu=True)
            return self._verifier

    def _shape_for(self, task: Any) -> tuple[Any, str]:
        """The task to analyse at (its own or a reduced copy), and words for the verdict."""
        key = f"{task.id}:{hash(task.source)}"
        with self._lock:
            if key in self._shapes:
                return self._shapes[key]
        from core.evaluation.resize import fit_task

        fitted = fit_task(task, self.mib, gflop=self.gflop)
        record = fitted.resized or {}
        measured = record.get("mib")
        if (not record.get("fitted", True) and isinstance(measured, (int, float)) and math.isfinite(measured)
                and measured > self.own_shape_mib):
            # Programs run one at a time there (~1 ms each): a task that cannot shrink to the budget
            # would hold a CPU worker for minutes.
            raise ValueError(f"no shape of it fits the interpreter's budget ({self.mib} MiB, {self.gflop} GFLOP; its "
                             f"own shape up to {self.own_shape_mib} MiB): {measured} MiB at the smallest shape; "
                             f"{record.get('note') or ''}".strip())
        if fitted.source == task.source:
            # A task that cannot be sized (it does not run on the meta device) runs at its own shape,
            # within the CPU verifier's time limit.
            words = "at the task's own shape"
            if record.get("note"):
                words += f" ({record['note'][:160]})"
        else:
            words = f"at a reduced shape (every size x{record.get('factor')}: {record.get('sizes')})"
        with self._lock:
            self._shapes[key] = (fitted, words)
        return fitted, words

    def evaluate(self, evidence: Evidence) -> CheckResult:
        if evidence.backend != "triton":
            return CheckResult(True, "not a Triton candidate")
        try:
            task, shape = self._shape_for(evidence.task)
        except Exception as exc:  # a task the resizer cannot load: nothing to analyse at
            return could_not_run(f"the task could not be sized for the interpreter: {type(exc).__name__}: {exc}"[:300])
        try:
            verdict = self._cpu_verifier(evidence.config.get("tolerances")).verify(task, evidence.candidate)
        except Exception as exc:
            return could_not_run(f"the CPU verifier failed: {type(exc).__name__}: {exc}"[:300])
        data = {"shape": shape, "cpu_status": verdict.status, "cpu_reason": (verdict.reason or "")[:300],
                "cpu_checks": {n: c.passed for n, c in verdict.checks.items()}}
        races = verdict.checks.get("races")
        if races is not None and not races.passed:
            return CheckResult(False, f"in the Triton interpreter {shape}: {races.detail}", data={**data, **races.data})
        if verdict.hack_flags:
            return CheckResult(False, f"in the Triton interpreter {shape}, a hack was flagged: {verdict.reason}"[:500],
                               data=data, hack=True)
        if races is not None and races.passed and verdict.accepted:
            return CheckResult(True, f"Triton interpreter on the CPU {shape}: {races.detail}", data={**data, **races.data})
        wrong = verdict.checks.get("correctness")
        if wrong is not None and not wrong.passed and task.source == evidence.task.source:
            # At the task's own shape a wrong answer is the candidate's, not the shape's: there every
            # autotune config runs (the GPU's benchmark picks one), and the programs in other orders.
            return CheckResult(False, f"wrong in the Triton interpreter {shape}, where every autotune config runs: "
                                      f"{wrong.detail}"[:500], data=data)
        return could_not_run(f"the race analysis did not run in the Triton interpreter {shape}: the CPU run was "
                             f"{verdict.status}: {verdict.reason}"[:500], data)


@hookimpl
def register_verifiers(register):
    register(InterpreterRaceCheck.name, InterpreterRaceCheck)

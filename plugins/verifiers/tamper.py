"""The tamper check: the judge's instrumentation in the candidate worker stayed intact through the
whole verification, including the checks' own measurements (``collect``), which call the candidate
outside the trials' audit (a performance stage times ``forward`` many times).

The worker verifies its instrumentation after every trial, load and ``collect``
(:mod:`core.verification.worker.tamper`); what it finds during the trials is an ``integrity``
finding, and what it finds during the checks' measurements is kept in the session and reported
here. This check's own ``collect`` runs last (its stage is after every other), so it sees them all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from core import hookimpl
from core.api.evidence import PERFORMANCE, TAMPERED, Evidence
from core.verdict import CheckResult

TAMPER = PERFORMANCE + 1  # after every check that measures in the worker


@dataclass
class TamperCheck:
    """No sandbox refusal and no change to the instrumentation while the checks' measurements ran
    the candidate (``collect``); a check that could not run does not pass."""

    name: str = "tamper"
    reads: ClassVar[frozenset[str]] = frozenset()  # compares no run's outputs through the keeper (Check.reads)
    stage: int = TAMPER
    hard: bool = True
    where: str = "worker"
    needs: frozenset[str] = frozenset({"trials"})

    def applies(self, backend: str, device: str) -> bool:
        return True

    def collect(self, session: Any) -> dict[str, Any]:
        """Worker side: what was found after the trials, and the instrumentation verified once more now."""
        now = [f"{TAMPERED}{name}" for name in session.verify_instrumentation()]
        return {"findings": list(session.late_findings) + now}

    def evaluate(self, evidence: Evidence) -> CheckResult:
        data = evidence.extra.get(self.name)
        if not isinstance(data, dict) or not isinstance(data.get("findings"), list):
            error = data.get("error") if isinstance(data, dict) else None
            return CheckResult(False, f"the instrumentation could not be verified: {error or 'no report from the worker'}")
        findings = [str(f) for f in data["findings"]]
        if findings:
            tampered = [f for f in findings if f.startswith(TAMPERED)]
            detail = tampered[0] if tampered else f"sandbox refused: {findings[0]}"
            return CheckResult(False, f"{detail} (while the checks measured the candidate)",
                               data={"findings": findings[:16]}, hack=True)
        measured = [n for n in evidence.extra if n != self.name]
        after = f" and {', '.join(measured)}" if measured else ""
        return CheckResult(True, f"instrumentation intact after the trials{after}")


@hookimpl
def register_verifiers(register):
    register(TamperCheck.name, TamperCheck)

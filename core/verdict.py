"""The verifier's verdict: a plain, JSON-serialisable record, and the reward's only input."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

# Outcomes of a verification. "accepted"/"rejected" come from checks; the others from the sandbox.
STATUSES = ("accepted", "rejected", "timeout", "crashed", "oom", "error", "declined")


@dataclass
class CheckResult:
    passed: bool
    detail: str = ""
    # Extra numbers a check wants to keep (trial errors, launch counts ...); JSON-serialisable.
    data: dict[str, Any] = field(default_factory=dict)
    # A finding that marks a hack attempt (integrity), counted apart from honest mistakes.
    hack: bool = False
    # The check could not run (tool missing, timed out, crashed): it did not pass, it failed closed.
    # A verifier configured with ``accept_unchecked`` may let it pass; the verdict then says so.
    unchecked: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def could_not_run(detail: str, data: dict[str, Any] | None = None) -> CheckResult:
    """The result of a check that could not run: it fails closed, and says why."""
    return CheckResult(False, f"could not run: {detail}", data=dict(data or {}), unchecked=True)


@dataclass
class Verdict:
    """``accepted`` is true only when it compiled, is correct, and every check passed."""

    accepted: bool = False
    reason: str | None = None
    compiled: bool = False
    correct: bool = False
    accuracy: float = 0.0  # share of correctness trials that matched the reference
    checks: dict[str, CheckResult] = field(default_factory=dict)
    timing: dict[str, Any] | None = None  # performance stage: median_ms, eager_ms, compile_ms, ...
    roofline: dict[str, Any] | None = None  # flops_utilisation, bandwidth_efficiency, source, ...
    status: str = "rejected"
    task_id: str | None = None
    candidate_id: str | None = None
    backend: str | None = None
    device: str | None = None
    elapsed_s: float = 0.0
    stage_s: dict[str, float] = field(default_factory=dict)
    gpu_wait_s: float = 0.0  # of elapsed_s, spent waiting for a turn on the GPU (neighbours' timed stages)
    # seconds this verification held the GPU lock, per turn label ("... alone" when exclusive): what
    # its neighbours waited for
    gpu_held_s: dict[str, float] = field(default_factory=dict)
    # checks that could not run and were let pass only because the verifier was told to (accept_unchecked)
    accepted_unchecked: list[str] = field(default_factory=list)
    # GPU memory admission (core.verification.gpumemory): estimate, capacity, alone, wait, retried
    gpu_memory: dict[str, Any] | None = None
    # why the judge sent the trials' inputs as tensors after the candidate's process drew other ones from their
    # seeds (a get_inputs not reproducible across processes; core.verification.pipeline.InputsNotReproducible)
    inputs_sent: str | None = None

    @property
    def unchecked(self) -> list[str]:
        """Checks that could not run (whether or not ``accept_unchecked`` let them pass)."""
        return sorted(name for name, c in self.checks.items() if c.unchecked)

    @property
    def hack_flags(self) -> list[str]:
        return sorted(name for name, c in self.checks.items() if c.hack and not c.passed)

    def add_check(self, name: str, passed: bool, detail: str = "", **kw: Any) -> CheckResult:
        result = CheckResult(passed=passed, detail=detail, **kw)
        self.checks[name] = result
        return result

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["hack_flags"] = self.hack_flags
        data["unchecked"] = self.unchecked
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, default=str)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Verdict":
        known = set(cls.__dataclass_fields__)
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["checks"] = {
            name: c if isinstance(c, CheckResult) else CheckResult(**c)
            for name, c in (data.get("checks") or {}).items()
        }
        return cls(**kwargs)

    @classmethod
    def from_json(cls, text: str) -> "Verdict":
        return cls.from_dict(json.loads(text))

    @classmethod
    def failure(cls, status: str, reason: str, **kw: Any) -> "Verdict":
        """A verdict for a candidate that never got through the pipeline (timeout, crash ...)."""
        if status not in STATUSES:
            raise ValueError(f"unknown verdict status {status!r}; expected one of {STATUSES}")
        return cls(accepted=False, reason=reason, status=status, **kw)

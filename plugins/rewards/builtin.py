"""Built-in reward terms: correctness (phase 1), roofline and speedup (phase 2), format."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from core import hookimpl
from core.task import Task
from core.verdict import Verdict

# The published formulas (DESIGN.md: phase 1, phase 2); the terms below apply them to verdicts.


def correctness_reward(accuracy: float) -> float:
    """The published phase-1 reward: ``1 - (1 - accuracy) ** 2``.

    >>> correctness_reward(1.0), correctness_reward(0.0), correctness_reward(0.5)
    (1.0, 0.0, 0.75)
    """
    accuracy = min(1.0, max(0.0, float(accuracy)))
    return 1.0 - (1.0 - accuracy) ** 2


def roofline_reward(flops_utilisation: float, bandwidth_efficiency: float) -> float:
    """The published phase-2 reward: ``0.7 * FLOPs utilisation + 0.3 * bandwidth efficiency``.

    >>> round(roofline_reward(0.5, 1.0), 3)
    0.65
    """
    clip = lambda v: min(1.0, max(0.0, float(v)))  # noqa: E731
    return 0.7 * clip(flops_utilisation) + 0.3 * clip(bandwidth_efficiency)


GPU_TIMING_ONLY = "GPU timing is measured only on device=cuda (the performance check)"


def needs_gpu_timing(device: str) -> str | None:
    """``supports(device)`` of a term read from the performance check's timing (RewardTerm contract)."""
    return None if device == "cuda" else GPU_TIMING_ONLY


@dataclass
class CorrectnessTerm:
    """``1 - (1 - accuracy)^2``; partial credit for candidates right on some trials.

    Accuracy is the share of correctness trials that matched. A candidate that matched every trial
    but failed an integrity or safety check earns nothing: ``scores_failures`` is True only so
    that partially correct (but otherwise honest) candidates keep their partial credit.
    """

    name: str = "correctness"
    scores_failures: bool = True

    def __call__(self, verdicts: Sequence[Verdict], tasks: Sequence[Task], **context) -> list[float]:
        out = []
        for v in verdicts:
            if not v.compiled or v.hack_flags or v.status not in ("accepted", "rejected"):
                out.append(0.0)
                continue
            failed_other = any(not c.passed for n, c in v.checks.items() if n != "correctness")
            out.append(0.0 if failed_other else correctness_reward(v.accuracy))
        return out


@dataclass
class RooflineTerm:
    """``0.7 * FLOPs utilisation + 0.3 * bandwidth efficiency`` from the verdict's roofline record."""

    name: str = "roofline"

    def supports(self, device: str) -> str | None:
        return needs_gpu_timing(device)

    def __call__(self, verdicts: Sequence[Verdict], tasks: Sequence[Task], **context) -> list[float]:
        out = []
        for v in verdicts:
            r = v.roofline or {}
            if not r or r.get("implausible"):
                out.append(0.0)
            else:
                out.append(roofline_reward(r.get("flops_utilisation", 0.0), r.get("bandwidth_efficiency", 0.0)))
        return out


@dataclass
class SpeedupTerm:
    """Clipped log-speedup over a baseline (eager or torch.compile), scaled into [0, 1].

    ``log(speedup) / log(max_speedup)`` clipped to [0, 1]: no reward for being slower than the
    baseline, full reward at ``max_speedup``.
    """

    name: str = "speedup"
    baseline: str = "eager"
    max_speedup: float = 4.0

    def supports(self, device: str) -> str | None:
        return needs_gpu_timing(device)

    def __call__(self, verdicts: Sequence[Verdict], tasks: Sequence[Task], **context) -> list[float]:
        out = []
        for v in verdicts:
            s = (v.timing or {}).get(f"speedup_{self.baseline}")
            if not s or s <= 0 or (v.roofline or {}).get("implausible"):
                out.append(0.0)
            else:
                out.append(min(1.0, max(0.0, math.log(s) / math.log(self.max_speedup))))
        return out


@dataclass
class FormatTerm:
    """1 when the candidate parsed and held a kernel for its backend (the static stage passed)."""

    name: str = "format"
    scores_failures: bool = True

    def __call__(self, verdicts: Sequence[Verdict], tasks: Sequence[Task], **context) -> list[float]:
        return [1.0 if (c := v.checks.get("static")) is not None and c.passed else 0.0 for v in verdicts]


@hookimpl
def register_rewards(register):
    register("correctness", CorrectnessTerm)
    register("roofline", RooflineTerm)
    register("speedup", SpeedupTerm)
    register("format", FormatTerm)

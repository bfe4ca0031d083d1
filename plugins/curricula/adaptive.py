"""The adaptive curriculum: the published rule, with its thresholds in config.

Once the steps since its last decision hold at least ``window_attempts`` attempts (verified samples,
the ``samples`` of each step's metrics), it looks at their accuracy and takes one decision:

1. accuracy (``pass_rate``) below ``accuracy_threshold`` (0.85): shrink the parameter space,
   ``param_scale *= shrink`` (0.7), not below ``min_param_scale``;
2. else latency above ``latency_threshold`` (1.2) times the target (``latency_ratio`` is the
   candidates' time over the target time; the trainer reports it when timings exist): add
   performance samples, ``perf_share += perf_share_step`` (0.5), at most ``max_perf_share``;
3. else introduce new APIs: ``max_tier += 1`` up to ``tier_limit``.

Every decision, holds included, is returned (the trainer logs it) and kept in ``history``.

Why attempts and not steps: a GRPO step of 2 tasks x 4 samples estimates accuracy from 8 samples
(standard error ~0.18 at 0.5), so a decision per step or two was noise (measured 2026-11-29: the
default run shrank ``param_scale`` at every decision). The window's accuracy is the mean over all its
attempts (each step's ``accept_rate`` weighted by its ``samples``), not the mean of step means.
A metrics mapping without ``samples`` counts as one attempt.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

from core import hookimpl
from core.contracts import CurriculumState

log = logging.getLogger(__name__)


@dataclass
class AdaptiveCurriculum:
    name: str = "adaptive"
    max_tier: int = 0
    param_scale: float = 1.0
    perf_share: float = 0.0
    accuracy_threshold: float = 0.85
    shrink: float = 0.7
    min_param_scale: float = 0.05
    latency_threshold: float = 1.2
    perf_share_step: float = 0.5
    max_perf_share: float = 1.0
    tier_limit: int = 4
    window_attempts: int = 1  # attempts (verified samples) gathered before a decision
    accuracy_key: str = "accept_rate"
    latency_key: str = "latency_ratio"
    state: CurriculumState = field(init=False)
    history: list[dict[str, Any]] = field(default_factory=list, init=False)
    _pending: list[dict[str, float]] = field(default_factory=list, init=False)
    _updates: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if not 0 < self.shrink < 1:
            raise ValueError(f"adaptive curriculum: shrink must be in (0, 1), got {self.shrink}")
        if self.window_attempts < 1:
            raise ValueError(f"adaptive curriculum: window_attempts must be >= 1, got {self.window_attempts}")
        self.state = CurriculumState(param_scale=self.param_scale, max_tier=self.max_tier, perf_share=self.perf_share)

    @staticmethod
    def attempts_of(metrics: dict[str, float]) -> int:
        """Attempts behind one metrics mapping (its ``samples``; 1 without that key)."""
        samples = metrics.get("samples")
        return 1 if samples is None else max(0, int(samples))

    @classmethod
    def _mean(cls, rows: list[dict[str, float]], key: str) -> float | None:
        """Mean of ``key`` over the window, each row weighted by its attempts."""
        pairs = [(float(r[key]), cls.attempts_of(r)) for r in rows
                 if r.get(key) is not None and not math.isnan(float(r[key]))]
        weight = sum(w for _, w in pairs)
        return sum(v * w for v, w in pairs) / weight if weight else None

    def pending_attempts(self) -> int:
        """Attempts gathered since the last decision."""
        return sum(self.attempts_of(r) for r in self._pending)

    def update(self, metrics: dict[str, float]) -> list[str]:
        self._updates += 1
        self._pending.append(dict(metrics))
        attempts = self.pending_attempts()
        if attempts < self.window_attempts:
            return []
        rows, self._pending = self._pending, []
        accuracy = self._mean(rows, self.accuracy_key)
        latency = self._mean(rows, self.latency_key)
        s = self.state
        if accuracy is None:
            decision = f"hold: no {self.accuracy_key!r} in the last {len(rows)} step(s)"
        elif accuracy < self.accuracy_threshold:
            new = max(self.min_param_scale, s.param_scale * self.shrink)
            decision = (f"shrink: accuracy {accuracy:.3f} < {self.accuracy_threshold} over {attempts} attempts: "
                        f"param_scale {s.param_scale:.3f} -> {new:.3f}")
            s.param_scale = new
        elif latency is not None and latency > self.latency_threshold:
            new = min(self.max_perf_share, s.perf_share + self.perf_share_step)
            decision = (f"performance: latency {latency:.2f}x > {self.latency_threshold}x target: "
                        f"perf_share {s.perf_share:.2f} -> {new:.2f}")
            s.perf_share = new
        elif s.max_tier < self.tier_limit:
            decision = (f"new APIs: accuracy {accuracy:.3f} >= {self.accuracy_threshold} over {attempts} attempts: "
                        f"max_tier {s.max_tier} -> {s.max_tier + 1}")
            s.max_tier += 1
        else:
            decision = f"hold: accuracy {accuracy:.3f}, max_tier already at tier_limit {self.tier_limit}"
        self.history.append({"update": self._updates, "attempts": attempts, "accuracy": accuracy,
                             "decision": decision, "state": s.to_dict()})
        log.info("curriculum: %s", decision)
        return [decision]

    def state_dict(self) -> dict[str, Any]:
        return {"state": self.state.to_dict(), "history": list(self.history), "pending": list(self._pending),
                "updates": self._updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state = CurriculumState(**state["state"])
        self.history = list(state.get("history", []))
        self._pending = list(state.get("pending", []))
        self._updates = int(state.get("updates", 0))


@hookimpl
def register_curricula(register):
    register("adaptive", AdaptiveCurriculum)

"""The adaptive curriculum: the published rule, with its thresholds in config.

Every ``window`` steps it looks at the mean of the metrics it was given and takes one decision:

1. accuracy (``pass_rate``) below ``accuracy_threshold`` (0.85): shrink the parameter space,
   ``param_scale *= shrink`` (0.7), not below ``min_param_scale``;
2. else latency above ``latency_threshold`` (1.2) times the target (``latency_ratio`` is the
   candidates' time over the target time; the trainer reports it when timings exist): add
   performance samples, ``perf_share += perf_share_step`` (0.5), at most ``max_perf_share``;
3. else introduce new APIs: ``max_tier += 1`` up to ``tier_limit``.

Every decision, holds included, is returned (the trainer logs it) and kept in ``history``.
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
    window: int = 1  # steps whose metrics are averaged before a decision
    accuracy_key: str = "pass_rate"
    latency_key: str = "latency_ratio"
    state: CurriculumState = field(init=False)
    history: list[dict[str, Any]] = field(default_factory=list, init=False)
    _pending: list[dict[str, float]] = field(default_factory=list, init=False)
    _updates: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if not 0 < self.shrink < 1:
            raise ValueError(f"adaptive curriculum: shrink must be in (0, 1), got {self.shrink}")
        if self.window < 1:
            raise ValueError(f"adaptive curriculum: window must be >= 1, got {self.window}")
        self.state = CurriculumState(param_scale=self.param_scale, max_tier=self.max_tier, perf_share=self.perf_share)

    @staticmethod
    def _mean(rows: list[dict[str, float]], key: str) -> float | None:
        values = [float(r[key]) for r in rows if r.get(key) is not None and not math.isnan(float(r[key]))]
        return sum(values) / len(values) if values else None

    def update(self, metrics: dict[str, float]) -> list[str]:
        self._updates += 1
        self._pending.append(dict(metrics))
        if len(self._pending) < self.window:
            return []
        rows, self._pending = self._pending, []
        accuracy = self._mean(rows, self.accuracy_key)
        latency = self._mean(rows, self.latency_key)
        s = self.state
        if accuracy is None:
            decision = f"hold: no {self.accuracy_key!r} in the last {len(rows)} step(s)"
        elif accuracy < self.accuracy_threshold:
            new = max(self.min_param_scale, s.param_scale * self.shrink)
            decision = (f"shrink: accuracy {accuracy:.3f} < {self.accuracy_threshold}: "
                        f"param_scale {s.param_scale:.3f} -> {new:.3f}")
            s.param_scale = new
        elif latency is not None and latency > self.latency_threshold:
            new = min(self.max_perf_share, s.perf_share + self.perf_share_step)
            decision = (f"performance: latency {latency:.2f}x > {self.latency_threshold}x target: "
                        f"perf_share {s.perf_share:.2f} -> {new:.2f}")
            s.perf_share = new
        elif s.max_tier < self.tier_limit:
            decision = f"new APIs: accuracy {accuracy:.3f} >= {self.accuracy_threshold}: max_tier {s.max_tier} -> {s.max_tier + 1}"
            s.max_tier += 1
        else:
            decision = f"hold: accuracy {accuracy:.3f}, max_tier already at tier_limit {self.tier_limit}"
        self.history.append({"update": self._updates, "decision": decision, "state": s.to_dict()})
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

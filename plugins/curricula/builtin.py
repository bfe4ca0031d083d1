"""The fixed curriculum: the task distribution never moves (baseline for curriculum experiments)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core import hookimpl
from core.contracts import CurriculumState


@dataclass
class FixedCurriculum:
    name: str = "fixed"
    max_tier: int = 1
    param_scale: float = 1.0
    perf_share: float = 0.0
    state: CurriculumState = field(init=False)

    def __post_init__(self) -> None:
        self.state = CurriculumState(param_scale=self.param_scale, max_tier=self.max_tier, perf_share=self.perf_share)

    def update(self, metrics: dict[str, float]) -> list[str]:
        return []

    def state_dict(self) -> dict[str, Any]:
        return self.state.to_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state = CurriculumState(**state)


@hookimpl
def register_curricula(register):
    register("fixed", FixedCurriculum)

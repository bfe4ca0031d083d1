"""The ``random`` proposer: uniformly random op chains over the catalog, shapes solved by z3.

The baseline for MCTS: ops are drawn uniformly by family (then by op) among those the curriculum
allows (tier <= ``max_tier``, ``allowed_ops``) and the current value's rank accepts.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from core import hookimpl
from core.contracts import CurriculumState
from core.task import Task
from plugins.proposers.common import AdversarialSchedule, resolve_catalog
from plugins.proposers.generate import TaskFactory, random_policy
from plugins.proposers.solver import Constraints


@dataclass
class RandomProposer:
    """Random programs of ``min_ops``..``max_ops`` catalog ops.

    :param min_ops: fewest ops per task (``min_ops - 1`` intermediates need temporaries).
    :param max_ops: most ops per task.
    :param seed: seeds the whole stream: the same seed and config give the same tasks in order.
    :param max_numel: most elements in any tensor (x the curriculum's ``param_scale``); small keeps the
        Triton interpreter on CPU fast.
    :param max_dim: largest single dimension.
    :param min_flops: / max_flops / min_bytes / max_bytes: requested cost ranges (``None``: any).
    :param memory_budget: bytes the eager reference may materialise (values and weights).
    :param align: every input's last dim is a multiple of this.
    :param dtypes: input dtypes to draw from.
    :param adversarial_share: share of edge-case tasks (deterministic schedule: any 100 consecutive
        tasks hold ``floor`` or ``ceil`` of 100 x share).
    :param residual_share: chance that a binary op's second operand is an earlier value.
    :param filter_degenerate: redraw tasks whose output is constant, near zero or input-independent.
    :param max_attempts: redraws per task before giving up with an error.
    :param catalog: op catalog (defaults to the ``op`` registry).
    """

    min_ops: int = 1
    max_ops: int = 3
    seed: int = 0
    max_numel: int = 16384
    max_dim: int = 4096
    min_flops: int | None = None
    max_flops: int | None = None
    min_bytes: int | None = None
    max_bytes: int | None = None
    memory_budget: int | None = 64 * 2**20
    align: int = 1
    dtypes: tuple[str, ...] = ("float32",)
    adversarial_share: float = 0.12
    residual_share: float = 0.3
    filter_degenerate: bool = True
    max_attempts: int = 64
    catalog: Any = None
    name: str = field(default="random", init=False)

    def __post_init__(self) -> None:
        if not 1 <= self.min_ops <= self.max_ops:
            raise ValueError(f"need 1 <= min_ops <= max_ops; got min_ops={self.min_ops}, max_ops={self.max_ops}")
        self.catalog = resolve_catalog(self.catalog)
        self.factory = TaskFactory(
            self.catalog, self.constraints(), dtypes=tuple(self.dtypes), residual_share=self.residual_share,
            filter_degenerate=self.filter_degenerate, max_attempts=self.max_attempts, proposer=self.name,
        )
        self._rng = random.Random(self.seed)
        self._schedule = AdversarialSchedule(self.adversarial_share)
        self.proposed = 0

    def constraints(self) -> Constraints:
        return Constraints(min_ops=self.min_ops, max_ops=self.max_ops, min_flops=self.min_flops,
                           max_flops=self.max_flops, min_bytes=self.min_bytes, max_bytes=self.max_bytes,
                           memory_budget=self.memory_budget, max_numel=self.max_numel, max_dim=self.max_dim,
                           align=self.align)

    # ------------------------------------------------------------------ Proposer protocol

    def propose(self, n: int, curriculum: CurriculumState | None = None) -> list[Task]:
        curriculum = curriculum or CurriculumState()
        tasks = []
        for _ in range(n):
            task, _ = self.factory.make(self._rng, curriculum, random_policy, self._schedule.next())
            tasks.append(task)
            self.proposed += 1
        return tasks

    def feedback(self, solve_rates: dict[str, float]) -> None:
        """The random proposer does not learn; solve rates are ignored."""

    def state_dict(self) -> dict[str, Any]:
        return {"rng": encode_rng(self._rng), "schedule": self._schedule.state_dict(), "proposed": self.proposed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        decode_rng(self._rng, state["rng"])
        self._schedule.load_state_dict(state["schedule"])
        self.proposed = int(state["proposed"])


def encode_rng(rng: random.Random) -> list:
    """A JSON-friendly copy of a ``random.Random`` state."""
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def decode_rng(rng: random.Random, data: list) -> None:
    version, internal, gauss = data
    rng.setstate((version, tuple(internal), gauss))


@hookimpl
def register_proposers(register):
    register("random", RandomProposer)

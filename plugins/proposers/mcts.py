"""The ``mcts`` proposer: Monte Carlo tree search over op sequences, rewarded by learnability.

The tree's first level chooses a *size bucket* (a multiplier on the curriculum's ``param_scale``),
every level below chooses the next op (or ``STOP``). One task = one descent: UCT among explored
children, expansion of one unexplored child, then a random rollout to the task's length; z3
(:mod:`plugins.proposers.solver`) fills in the shapes. Visits are counted when a task is proposed
(so one batch spreads over the tree); values arrive later through :meth:`MCTSProposer.feedback`
with the verified solve rate ``p`` of each task and are backed up along its path.

Reward (``learnability``):

* ``variance`` (default): ``4 p (1 - p)``. GRPO's advantage is zero when all samples of a task
  agree; the expected squared advantage of a Bernoulli reward is ``p (1 - p)``, so this is the
  training signal a task gives, peaking at ``p = 0.5`` and symmetric in "too easy"/"too hard".
* ``absolute_zero``: ``1 - p if p > 0 else 0`` (Absolute Zero's proposer reward). It scores a task
  solved once in many samples near 1 — noisy with few samples per task — and is kept as a baseline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

from core import hookimpl
from core.contracts import CurriculumState
from core.task import Task
from plugins.proposers.generate import random_policy
from plugins.proposers.random_proposer import RandomProposer
from plugins.proposers.solver import ProgramBuilder

STOP = "STOP"
ROOT = ""


def learnability(p: float, rule: str = "variance") -> float:
    """Score of a task solved at rate ``p`` (see the module docstring)."""
    p = min(max(float(p), 0.0), 1.0)
    if rule == "variance":
        return 4.0 * p * (1.0 - p)
    if rule == "absolute_zero":
        return 1.0 - p if p > 0 else 0.0
    raise ValueError(f"unknown learnability rule {rule!r}; expected 'variance' or 'absolute_zero'")


@dataclass
class _Stats:
    visits: int = 0
    value_sum: float = 0.0
    value_n: int = 0


class _TreePolicy:
    """One descent: UCT inside the tree, expand one child, then a random rollout."""

    def __init__(self, mcts: "MCTSProposer", bucket_key: str):
        self.mcts, self.path, self.in_tree = mcts, [bucket_key], True

    def __call__(self, builder: ProgramBuilder, choices: Sequence[str], step: int, target_ops: int) -> str | None:
        if not self.in_tree:
            return random_policy(builder, choices, step, target_ops)
        actions = sorted(choices) + ([STOP] if step >= self.mcts.min_ops else [])
        key = self.path[-1]
        unexplored = [a for a in actions if _child(key, a) not in self.mcts.tree]
        if unexplored:
            action = builder.rng.choice(unexplored)
            self.in_tree = False
        else:
            action = self.mcts.select(key, actions)
        self.path.append(_child(key, action))
        return None if action == STOP else action


def _child(key: str, action: str) -> str:
    return f"{key}/{action}"


@dataclass
class MCTSProposer(RandomProposer):
    """Random proposer's configuration plus the search's.

    :param exploration: UCT exploration constant ``c`` in ``Q + c * sqrt(ln N / (n + 1))``.
    :param prior: value assumed for a node that has been proposed but has no feedback yet.
    :param reward: learnability rule, ``variance`` or ``absolute_zero``.
    :param size_buckets: name -> multiplier of the curriculum's ``param_scale`` (the first choice).
    :param max_pending: tasks remembered while waiting for their solve rates (oldest dropped).
    """

    exploration: float = 1.0
    prior: float = 0.5
    reward: str = "variance"
    size_buckets: Mapping[str, float] = field(default_factory=lambda: {"small": 0.15, "medium": 0.4, "large": 1.0})
    max_pending: int = 10000
    name: str = field(default="mcts", init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        learnability(0.5, self.reward)  # fail early on an unknown rule
        self.size_buckets = dict(self.size_buckets)
        if not self.size_buckets or any(v <= 0 for v in self.size_buckets.values()):
            raise ValueError(f"size_buckets needs positive multipliers; got {self.size_buckets}")
        self.tree: dict[str, _Stats] = {ROOT: _Stats()}
        self.pending: dict[str, list[str]] = {}
        self.feedback_count = 0

    # ------------------------------------------------------------------ search

    def select(self, key: str, actions: Sequence[str]) -> str:
        """UCT among ``actions`` (all explored) below node ``key``."""
        parent = self.tree[key]
        log_n = math.log(parent.visits + 1)

        def score(action: str) -> float:
            s = self.tree[_child(key, action)]
            q = s.value_sum / s.value_n if s.value_n else self.prior
            return q + self.exploration * math.sqrt(log_n / (s.visits + 1))

        best = max(score(a) for a in actions)
        return self._rng.choice([a for a in actions if score(a) >= best - 1e-12])

    def propose(self, n: int, curriculum: CurriculumState | None = None) -> list[Task]:
        curriculum = curriculum or CurriculumState()
        tasks = []
        for _ in range(n):
            buckets = sorted(self.size_buckets)
            unexplored = [b for b in buckets if _child(ROOT, b) not in self.tree]
            bucket = self._rng.choice(unexplored) if unexplored else self.select(ROOT, buckets)
            bucket_key = _child(ROOT, bucket)
            self.tree.setdefault(bucket_key, _Stats())
            scaled = replace(curriculum, param_scale=curriculum.param_scale * self.size_buckets[bucket])
            policies: list[_TreePolicy] = []

            def policy(builder, choices, step, target_ops, _p=policies):
                if step == 0:
                    _p.append(_TreePolicy(self, bucket_key))
                return _p[-1](builder, choices, step, target_ops)

            task, _ = self.factory.make(self._rng, scaled, policy, self._schedule.next())
            path = [ROOT] + policies[-1].path
            for key in path:
                self.tree.setdefault(key, _Stats()).visits += 1
            self.pending[task.id] = path
            while len(self.pending) > self.max_pending:
                self.pending.pop(next(iter(self.pending)))
            task.difficulty["size_bucket"] = float(self.size_buckets[bucket])
            tasks.append(task)
            self.proposed += 1
        return tasks

    def feedback(self, solve_rates: dict[str, float]) -> None:
        """Back up ``learnability(p)`` along the path of every task this proposer made.

        Ids it never proposed (or already scored) are ignored, so one dict can serve many proposers.
        """
        for task_id, p in solve_rates.items():
            path = self.pending.pop(task_id, None)
            if path is None:
                continue
            r = learnability(p, self.reward)
            for key in path:
                s = self.tree.setdefault(key, _Stats())
                s.value_sum += r
                s.value_n += 1
            self.feedback_count += 1

    # ------------------------------------------------------------------ introspection and state

    def best_paths(self, k: int = 5, min_feedback: int = 1) -> list[tuple[str, float, int]]:
        """The ``k`` deepest-valued nodes: (path, mean learnability, feedback count)."""
        rows = [(key, s.value_sum / s.value_n, s.value_n) for key, s in self.tree.items()
                if key and s.value_n >= min_feedback]
        return sorted(rows, key=lambda r: (-r[1], -r[2], r[0]))[:k]

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "tree": {k: [s.visits, s.value_sum, s.value_n] for k, s in self.tree.items()},
            "pending": {k: list(v) for k, v in self.pending.items()},
            "feedback_count": self.feedback_count,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.tree = {k: _Stats(int(v[0]), float(v[1]), int(v[2])) for k, v in state["tree"].items()}
        self.tree.setdefault(ROOT, _Stats())
        self.pending = {k: list(v) for k, v in state["pending"].items()}
        self.feedback_count = int(state.get("feedback_count", 0))


@hookimpl
def register_proposers(register):
    register("mcts", MCTSProposer)

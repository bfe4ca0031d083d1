"""The ``replay`` proposer: prioritized task replay around any other proposer.

Prioritized Level Replay (Jiang, Grefenstette and Rocktaschel, 2021) for self-play on kernels. GRPO
learns a task it sees again (the same four tasks every step: accept rate 0.34 -> 0.72 in 9 steps,
docs/training.md), but a stream of fresh tasks shows it each task once, in one group of samples. This
proposer keeps the tasks whose last solve rate was mixed and serves them again, most learnable first,
beside fresh tasks from the ``base`` proposer.

- **Score**: a task's learnability on its last visit, ``4 p (1 - p)`` (the MCTS proposer's ``variance``
  rule: GRPO's expected squared advantage). Tasks solved by every sample or by none score 0 and leave
  the buffer: neither carries gradient.
- **Replay distribution** (PLR's): ``(1 - staleness) * P_rank + staleness * P_stale``, where
  ``P_rank(i)`` is proportional to ``(1 / rank_i) ** (1 / temperature)`` (rank 1 = highest score) and
  ``P_stale(i)`` to the steps since task ``i`` was last scored.
- **Share**: ``replay_share`` of every batch is replayed once enough tasks are waiting (an
  accumulator keeps the share exact over batches of any size); the rest are the base proposer's.
- Replayed tasks respect the curriculum's current ``max_tier``; the buffer holds at most
  ``buffer_size`` tasks (the lowest score leaves first).
- The base proposer also gets every feedback, so an MCTS base still learns its tree.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from core import hookimpl
from core.contracts import CurriculumState
from core.task import Task
from plugins.proposers.mcts import learnability
from plugins.proposers.random_proposer import decode_rng, encode_rng


@dataclass
class _Entry:
    task: Task
    score: float
    scored_at: int   # the feedback count when it was last scored
    visits: int = 1


@dataclass
class ReplayProposer:
    """Fresh tasks from ``base``, with learnable past tasks served again.

    :param base: the wrapped proposer's config node (``name`` plus its keys), e.g. ``{name: random}``.
    :param seed: seeds the replay draws; the base proposer gets the same seed, so the fresh tasks are
        exactly the base proposer's stream.
    :param replay_share: share of each batch drawn from the buffer (0 = the base proposer unchanged).
    :param buffer_size: most tasks kept for replay.
    :param min_buffer: replay only once this many tasks are waiting (early batches are all fresh).
    :param temperature: PLR's beta; lower concentrates replay on the highest scores.
    :param staleness: PLR's rho; weight of "not seen for a while" in the replay distribution.
    :param max_visits: a task leaves the buffer after this many visits (0 = no limit).
    :param reward: learnability rule, ``variance`` or ``absolute_zero`` (see the mcts proposer).
    """

    base: Mapping[str, Any] = field(default_factory=lambda: {"name": "random"})
    seed: int = 0
    replay_share: float = 0.5
    buffer_size: int = 128
    min_buffer: int = 4
    temperature: float = 0.3
    staleness: float = 0.1
    max_visits: int = 0
    reward: str = "variance"
    name: str = field(default="replay", init=False)

    def __post_init__(self) -> None:
        from core.config import build

        if not 0.0 <= self.replay_share <= 1.0:
            raise ValueError(f"replay_share must be in [0, 1], got {self.replay_share}")
        if not 0.0 <= self.staleness <= 1.0:
            raise ValueError(f"staleness must be in [0, 1], got {self.staleness}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.buffer_size < 1 or self.min_buffer < 1:
            raise ValueError(f"buffer_size and min_buffer must be >= 1, got {self.buffer_size}, {self.min_buffer}")
        learnability(0.5, self.reward)  # an unknown rule fails here, not at the first feedback
        base = dict(self.base)
        if base.get("name") in (None, self.name):
            raise ValueError(f"replay needs a base proposer other than itself, got base={base!r}")
        self.inner = build("proposer", base, seed=self.seed)
        self._rng = random.Random(self.seed)
        self.buffer: dict[str, _Entry] = {}
        self.pending: OrderedDict[str, Task] = OrderedDict()  # proposed, not yet scored
        self.feedback_count = 0
        self.replayed = 0
        self._carry = 0.0

    # ------------------------------------------------------------------ Proposer protocol

    def propose(self, n: int, curriculum: CurriculumState | None = None) -> list[Task]:
        curriculum = curriculum or CurriculumState()
        waiting = [e for e in self.buffer.values() if e.task.tier <= curriculum.max_tier]
        replay: list[Task] = []
        if len(waiting) >= self.min_buffer:
            self._carry += n * self.replay_share
            k = min(int(self._carry), len(waiting), n)
            self._carry -= k
            replay = self._draw(waiting, k)
        fresh = self.inner.propose(n - len(replay), curriculum) if n > len(replay) else []
        for task in replay:
            self.buffer[task.id].visits += 1
        for task in fresh:
            self.pending[task.id] = task
            self.pending.move_to_end(task.id)
        while len(self.pending) > 4 * self.buffer_size:  # tasks never scored (skipped prompts) do not pile up
            self.pending.popitem(last=False)
        self.replayed += len(replay)
        # replays go to random places; the fresh tasks keep the base proposer's order
        slots = set(self._rng.sample(range(n), len(replay))) if replay else set()
        replays, fresh_tasks = iter(replay), iter(fresh)
        return [next(replays) if i in slots else next(fresh_tasks) for i in range(len(replay) + len(fresh))]

    def _draw(self, waiting: list[_Entry], k: int) -> list[Task]:
        """``k`` distinct tasks by PLR's mix of rank priority and staleness."""
        chosen: list[Task] = []
        ranked = sorted(waiting, key=lambda e: (-e.score, e.scored_at, e.task.id))  # stays sorted as picks leave
        for _ in range(k):
            rank_w = [(1.0 / (rank + 1)) ** (1.0 / self.temperature) for rank in range(len(ranked))]
            stale_w = [float(self.feedback_count - e.scored_at) for e in ranked]
            total_rank, total_stale = sum(rank_w), sum(stale_w)
            weights = [(1.0 - self.staleness) * r / total_rank + (self.staleness * s / total_stale if total_stale else 0.0)
                       for r, s in zip(rank_w, stale_w)]
            pick = self._rng.choices(range(len(ranked)), weights=weights, k=1)[0]
            chosen.append(ranked.pop(pick).task)
        return chosen

    def feedback(self, solve_rates: dict[str, float]) -> None:
        """Score the tasks this proposer served; ids it never served are ignored."""
        self.inner.feedback(solve_rates)
        self.feedback_count += 1
        for task_id, p in solve_rates.items():
            entry = self.buffer.pop(task_id, None)
            task = entry.task if entry else self.pending.pop(task_id, None)
            if task is None:
                continue
            score = learnability(p, self.reward)
            visits = entry.visits if entry else 1
            if score <= 0 or (self.max_visits and visits >= self.max_visits):
                continue
            self.buffer[task_id] = _Entry(task, score, self.feedback_count, visits)
        if len(self.buffer) > self.buffer_size:
            keep = sorted(self.buffer.values(), key=lambda e: (-e.score, -e.scored_at, e.task.id))[:self.buffer_size]
            self.buffer = {e.task.id: e for e in keep}

    def state_dict(self) -> dict[str, Any]:
        return {
            "base": self.inner.state_dict(),
            "rng": encode_rng(self._rng),
            "buffer": [{"task": e.task.to_dict(), "score": e.score, "scored_at": e.scored_at, "visits": e.visits}
                       for e in self.buffer.values()],
            "pending": [t.to_dict() for t in self.pending.values()],
            "feedback_count": self.feedback_count,
            "replayed": self.replayed,
            "carry": self._carry,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state["base"])
        decode_rng(self._rng, state["rng"])
        self.buffer = {}
        for row in state["buffer"]:
            task = Task.from_dict(row["task"])
            self.buffer[task.id] = _Entry(task, float(row["score"]), int(row["scored_at"]), int(row["visits"]))
        self.pending = OrderedDict((t.id, t) for t in map(Task.from_dict, state["pending"]))
        self.feedback_count = int(state["feedback_count"])
        self.replayed = int(state["replayed"])
        self._carry = float(state["carry"])


@hookimpl
def register_proposers(register):
    register("replay", ReplayProposer)

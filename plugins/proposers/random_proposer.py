"""The ``random`` proposer: uniformly random chains of catalog ops (the baseline for MCTS)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from core import hookimpl
from core.contracts import CurriculumState
from core.program import Node, Program, TensorSpec
from core.task import Task
from plugins.proposers.common import AdversarialSchedule, eligible_ops, program_to_task, resolve_catalog
from plugins.proposers.validate import degeneracy

CHAIN_FAMILIES = ("elementwise", "activation")
TAIL_FAMILIES = ("reduction", "softmax")


@dataclass
class RandomProposer:
    """Elementwise/activation chains, optionally closed by one row reduction or softmax.

    :param min_ops: fewest ops per task.
    :param max_ops: most ops per task.
    :param seed: seeds the whole stream: the same seed and config give the same tasks in order.
    :param max_rows: largest leading dimension (scaled by the curriculum's ``param_scale``).
    :param max_cols: largest last dimension (scaled by the curriculum's ``param_scale``).
    :param dtypes: input dtypes to draw from.
    :param adversarial_share: share of tasks that are edge cases (deterministic schedule).
    :param filter_degenerate: run each reference on CPU and redraw tasks whose output is constant,
        near zero or independent of the inputs.
    :param max_attempts: redraws per task before giving up with an error.
    :param catalog: op catalog (defaults to the ``op`` registry).
    """

    min_ops: int = 1
    max_ops: int = 3
    seed: int = 0
    max_rows: int = 64
    max_cols: int = 256
    dtypes: tuple[str, ...] = ("float32",)
    adversarial_share: float = 0.12
    filter_degenerate: bool = True
    max_attempts: int = 32
    catalog: Any = None
    name: str = field(default="random", init=False)

    def __post_init__(self) -> None:
        if not 1 <= self.min_ops <= self.max_ops:
            raise ValueError(f"need 1 <= min_ops <= max_ops; got min_ops={self.min_ops}, max_ops={self.max_ops}")
        self.catalog = resolve_catalog(self.catalog)
        self.dtypes = tuple(self.dtypes)
        self._rng = random.Random(self.seed)
        self._schedule = AdversarialSchedule(self.adversarial_share)
        self.proposed = 0

    # ------------------------------------------------------------------ Proposer protocol

    def propose(self, n: int, curriculum: CurriculumState | None = None) -> list[Task]:
        curriculum = curriculum or CurriculumState()
        tasks = []
        for _ in range(n):
            adversarial = self._schedule.next()
            tasks.append(self._valid_task(curriculum, adversarial))
            self.proposed += 1
        return tasks

    def _valid_task(self, curriculum: CurriculumState, adversarial: bool) -> Task:
        reasons = []
        for _ in range(self.max_attempts):
            task = self._task(self._rng.randrange(2**31), curriculum, adversarial)
            if not self.filter_degenerate:
                return task
            verdict = degeneracy(task, allow_empty=adversarial)
            if not verdict:
                return task
            reasons.append(verdict.reason)
        raise RuntimeError(f"{self.max_attempts} draws in a row were degenerate ({sorted(set(reasons))}); "
                           f"allowed ops at max_tier={curriculum.max_tier}: "
                           f"{eligible_ops(self.catalog, curriculum.max_tier, curriculum.allowed_ops)}")

    def feedback(self, solve_rates: dict[str, float]) -> None:
        """The random proposer does not learn; solve rates are ignored."""

    def state_dict(self) -> dict[str, Any]:
        return {"rng": _encode_rng(self._rng.getstate()), "schedule": self._schedule.state_dict(),
                "proposed": self.proposed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._rng.setstate(_decode_rng(state["rng"]))
        self._schedule.load_state_dict(state["schedule"])
        self.proposed = int(state["proposed"])

    # ------------------------------------------------------------------ generation

    def _task(self, task_seed: int, curriculum: CurriculumState, adversarial: bool) -> Task:
        rng = random.Random(task_seed)
        chain = eligible_ops(self.catalog, curriculum.max_tier, curriculum.allowed_ops, CHAIN_FAMILIES)
        tails = eligible_ops(self.catalog, curriculum.max_tier, curriculum.allowed_ops, TAIL_FAMILIES)
        if not chain and not tails:
            raise ValueError(f"no elementwise, activation or reduction op is allowed at max_tier={curriculum.max_tier} "
                             f"with allowed_ops={curriculum.allowed_ops}; raise max_tier or widen allowed_ops")
        scale = max(min(curriculum.param_scale, 1.0), 0.05)
        rows = rng.randint(1, max(1, int(self.max_rows * scale)))
        cols = rng.randint(2, max(2, int(self.max_cols * scale)))
        tags: list[str] = []
        if adversarial:
            rows, cols, tags = _edge_shape(rng, rows, cols)
        dtype = rng.choice(self.dtypes)
        inputs = [TensorSpec((rows, cols), dtype=dtype)]
        n_ops = rng.randint(self.min_ops, self.max_ops)
        use_tail = bool(tails) and (not chain or rng.random() < 0.5)
        nodes: list[Node] = []
        for k in range(n_ops - (1 if use_tail else 0)):
            spec = self.catalog[rng.choice(chain)]
            args = [0]
            if spec.arity == 2:
                inputs.append(TensorSpec((rows, cols), dtype=dtype))
                args.append(len(inputs) - 1)
            elif spec.arity != 1:
                continue
            nodes.append(Node(spec.name, tuple(args), _draw_params(rng, spec.params)))
        if use_tail:
            spec = self.catalog[rng.choice(tails)]
            nodes.append(Node(spec.name, (0,), _draw_params(rng, spec.params)))
        program = _chain(inputs, nodes)
        return program_to_task(program, self.catalog, seed=task_seed, adversarial=tags or None, proposer=self.name)


def _draw_params(rng: random.Random, space) -> dict[str, Any]:
    return {k: rng.choice(tuple(v)) for k, v in sorted(space.items())}


def _chain(inputs: list[TensorSpec], nodes: list[Node]) -> Program:
    """Wire nodes into a chain: each node reads the previous value (second operands keep their input)."""
    wired: list[Node] = []
    previous = 0
    for i, node in enumerate(nodes):
        args = (previous,) + node.args[1:]
        wired.append(Node(node.op, args, node.params))
        previous = len(inputs) + i
    return Program(inputs=inputs, nodes=wired)


def _edge_shape(rng: random.Random, rows: int, cols: int) -> tuple[int, int, list[str]]:
    kind = rng.choice(("size_one", "non_power_of_two", "zero_size"))
    if kind == "size_one":
        return (1, cols, ["size_one_dim"]) if rng.random() < 0.5 else (rows, 1, ["size_one_dim"])
    if kind == "zero_size":
        return 0, cols, ["zero_size_dim"]
    odd = [97, 131, 257, 193, 61]
    return rng.choice(odd[:3]), rng.choice(odd), ["non_power_of_two"]


def _encode_rng(state) -> list:
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _decode_rng(data) -> tuple:
    version, internal, gauss = data
    return (version, tuple(internal), gauss)


@hookimpl
def register_proposers(register):
    register("random", RandomProposer)

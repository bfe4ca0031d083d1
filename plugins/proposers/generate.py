"""From an op-choice policy to a finished, validated task: the engine both built-in proposers share.

:class:`TaskFactory` asks a *policy* for ops one at a time, grows a symbolic program with
:class:`~plugins.proposers.solver.ProgramBuilder`, applies the adversarial edge case when the
schedule says so, lets z3 pick shapes, renders the task and (optionally) drops degenerate ones.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import z3

from core.contracts import CurriculumState
from core.program import OpSpec, Program, ProgramError
from core.task import Task
from plugins.proposers.common import eligible_ops, program_to_task
from plugins.proposers.solver import Constraints, ProgramBuilder, SolveError, draw_numel, program_costs
from plugins.proposers.validate import degeneracy

# Edge cases an adversarial task may carry; every adversarial task is tagged with those it has.
EDGE_CASES = ("zero_size_dim", "size_one_dim", "non_power_of_two", "transposed_input", "strided_input",
              "offset_input", "large_magnitude", "tiny_magnitude", "nan_inf")

# Edge cases that set the same thing (a dim's size, the layout, the scale) and so cannot be combined.
_EXCLUSIVE = ({"zero_size_dim", "size_one_dim", "non_power_of_two"},
              {"transposed_input", "strided_input", "offset_input"}, {"large_magnitude", "tiny_magnitude"})

# A policy is asked for the next op: (builder, eligible op names, step index, target op count)
# -> op name, or None to stop. The target is a random length in [min_ops, max_ops] a policy may use.
Policy = Callable[[ProgramBuilder, Sequence[str], int, int], "str | None"]


@dataclass
class GenerationStats:
    tasks: int = 0
    attempts: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    solver_seconds: float = 0.0
    filter_seconds: float = 0.0
    total_seconds: float = 0.0
    solver_checks: int = 0

    def reject(self, reason: str) -> None:
        key = reason.split(":")[0][:60]
        self.rejected[key] = self.rejected.get(key, 0) + 1

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class TaskFactory:
    """Builds tasks for any op-choice policy.

    :param catalog: op catalog.
    :param constraints: requested complexity (scaled by the curriculum's ``param_scale``).
    :param dtypes: input dtypes to draw from.
    :param residual_share: chance that a second operand is an earlier value (a residual) when one fits.
    :param filter_degenerate: run the reference on CPU and reject degenerate tasks.
    :param max_attempts: draws per task before giving up.
    :param proposer: name recorded in the tasks.
    """

    catalog: Mapping[str, OpSpec]
    constraints: Constraints = field(default_factory=Constraints)
    dtypes: tuple[str, ...] = ("float32",)
    residual_share: float = 0.3
    filter_degenerate: bool = True
    max_attempts: int = 64
    proposer: str = ""
    stats: GenerationStats = field(default_factory=GenerationStats)

    def make(self, rng: random.Random, curriculum: CurriculumState, policy: Policy, adversarial: bool,
             on_attempt: Callable[[], None] | None = None) -> tuple[Task, ProgramBuilder]:
        """One valid task. Each attempt draws a fresh sub-seed from ``rng``, so the stream is deterministic."""
        eligible = eligible_ops(self.catalog, curriculum.max_tier, curriculum.allowed_ops)
        if not eligible:
            raise ValueError(f"no op is allowed at max_tier={curriculum.max_tier} with "
                             f"allowed_ops={curriculum.allowed_ops}; known ops: {sorted(self.catalog)}")
        limits = self.constraints.scaled(curriculum.param_scale)
        started = time.perf_counter()
        try:
            for _ in range(self.max_attempts):
                self.stats.attempts += 1
                if on_attempt is not None:
                    on_attempt()
                task_seed = rng.randrange(2**31)
                try:
                    task, builder = self._attempt(task_seed, curriculum, limits, eligible, policy, adversarial)
                except SolveError as exc:
                    self.stats.reject(f"solver_{exc.kind}")
                    continue
                except (ProgramError, z3.Z3Exception) as exc:
                    self.stats.reject(f"invalid: {exc}")
                    continue
                if self.filter_degenerate:
                    t0 = time.perf_counter()
                    verdict = degeneracy(task, allow_empty="zero_size_dim" in (task.adversarial or ()))
                    self.stats.filter_seconds += time.perf_counter() - t0
                    if verdict:
                        self.stats.reject(f"degenerate: {verdict.reason}")
                        continue
                self.stats.tasks += 1
                return task, builder
        finally:
            self.stats.total_seconds += time.perf_counter() - started
        raise RuntimeError(f"{self.max_attempts} draws in a row failed at max_tier={curriculum.max_tier}, "
                           f"constraints={limits}; rejections so far: {self.stats.rejected}. "
                           f"Loosen the constraints or allow more ops.")

    # ------------------------------------------------------------------ one attempt

    def _attempt(self, task_seed: int, curriculum: CurriculumState, limits: Constraints,
                 eligible: Sequence[str], policy: Policy, adversarial: bool) -> tuple[Task, ProgramBuilder]:
        rng = random.Random(task_seed)
        builder = ProgramBuilder(self.catalog, rng, dtype=rng.choice(self.dtypes))
        numel = draw_numel(rng, limits)
        target_ops = rng.randint(limits.min_ops, max(limits.min_ops, limits.max_ops))
        for step in range(limits.max_ops):
            choices = [op for op in eligible if builder.accepts(op)]
            if not choices:
                break
            op = policy(builder, choices, step, target_ops)
            if op is None:
                break
            for _ in range(4):  # parameter draws that do not fit the current value are redrawn
                try:
                    builder.apply(op, builder.draw_params(op), numel, self.residual_share)
                    break
                except ProgramError:
                    continue
            else:
                raise ProgramError(f"{op} does not apply after {[d.op for d in builder.drafts]}")
        if len(builder.drafts) < limits.min_ops:
            raise ProgramError(f"only {len(builder.drafts)} ops fit; at least {limits.min_ops} requested")
        tags = self._edge_cases(builder, rng) if adversarial else []
        self.stats.solver_checks -= builder.stats.checks
        try:
            program = builder.solve(limits, zero_ok="zero_size_dim" in tags)
        finally:
            self.stats.solver_seconds += builder.stats.seconds
            self.stats.solver_checks += builder.stats.checks
        program = _apply_input_edits(program, builder.input_edits)
        _check_limits(program, self.catalog, limits, tags)
        task = program_to_task(program, self.catalog, seed=task_seed, adversarial=tags or None,
                               proposer=self.proposer)
        return task, builder

    def _edge_cases(self, builder: ProgramBuilder, rng: random.Random) -> list[str]:
        """Choose one or two edge cases and impose them (hard z3 conditions or input specs)."""
        first = builder.inputs[0]
        kinds = rng.sample(EDGE_CASES, 2) if rng.random() < 0.3 else [rng.choice(EDGE_CASES)]
        if len(kinds) == 2 and any(set(kinds) <= group for group in _EXCLUSIVE):
            kinds = kinds[:1]  # two edge cases of one kind would overwrite each other
        tags = []
        for kind in kinds:
            if kind == "zero_size_dim":
                builder.hard.append(first[0] == 0)
            elif kind == "size_one_dim":
                builder.hard.append(first[rng.randrange(len(first))] == 1)
            elif kind == "non_power_of_two":
                for dims in builder.inputs:
                    for d in dims:
                        builder.hard.append(d % 2 == 1)
                        builder.hard.append(d > 1)
            elif kind == "transposed_input":
                if len(first) < 2:
                    continue
                builder.layouts[0] = "transposed"
            elif kind == "strided_input":
                builder.layouts[0] = "strided"
            elif kind == "offset_input":
                builder.layouts[0] = "offset"
            elif kind == "large_magnitude":
                builder.input_edits["scale"] = 1e4 if builder.dtype == "float32" else 1e2
            elif kind == "tiny_magnitude":
                builder.input_edits["scale"] = 1e-4 if builder.dtype == "float32" else 1e-2
            elif kind == "nan_inf":
                builder.input_edits["distribution"] = "specials"
            tags.append(kind)
        if not tags:
            tags.append("non_power_of_two")
            for d in first:
                builder.hard.append(d % 2 == 1)
        return tags


def _apply_input_edits(program: Program, edits: Mapping[str, Any]) -> Program:
    if not edits:
        return program
    from dataclasses import replace

    first = replace(program.inputs[0], **edits)
    return Program(inputs=[first] + program.inputs[1:], nodes=program.nodes)


def _check_limits(program: Program, catalog: Mapping[str, OpSpec], limits: Constraints, tags: list[str]) -> None:
    """Re-check, on concrete numbers, everything z3 was asked for (belt and braces)."""
    costs = program_costs(program, catalog)
    problems = []
    if not limits.min_ops <= len(program.nodes) <= limits.max_ops:
        problems.append(f"{len(program.nodes)} ops outside [{limits.min_ops}, {limits.max_ops}]")
    if limits.min_flops is not None and costs["flops"] < limits.min_flops:
        problems.append(f"flops {costs['flops']} < {limits.min_flops}")
    if limits.max_flops is not None and costs["flops"] > limits.max_flops:
        problems.append(f"flops {costs['flops']} > {limits.max_flops}")
    if limits.min_bytes is not None and costs["min_bytes"] < limits.min_bytes:
        problems.append(f"min_bytes {costs['min_bytes']} < {limits.min_bytes}")
    if limits.max_bytes is not None and costs["min_bytes"] > limits.max_bytes:
        problems.append(f"min_bytes {costs['min_bytes']} > {limits.max_bytes}")
    if limits.memory_budget is not None and costs["memory"] > limits.memory_budget:
        problems.append(f"memory {costs['memory']} > {limits.memory_budget}")
    if costs["max_numel"] > limits.max_numel:
        problems.append(f"a tensor has {costs['max_numel']} > {limits.max_numel} elements")
    if limits.align > 1 and any(t.shape and t.shape[-1] % limits.align for t in program.inputs):
        problems.append(f"an input's last dim is not a multiple of {limits.align}")
    if problems:
        raise ProgramError("solved program breaks its constraints: " + "; ".join(problems))


def random_policy(builder: ProgramBuilder, choices: Sequence[str], step: int, target_ops: int) -> str | None:
    """Stop at the target length; otherwise uniform over op families, then over the family's ops
    (so fourteen activations do not drown one attention op)."""
    if step >= target_ops:
        return None
    families: dict[str, list[str]] = {}
    for op in choices:
        families.setdefault(builder.catalog[op].family, []).append(op)
    family = builder.rng.choice(sorted(families))
    return builder.rng.choice(families[family])

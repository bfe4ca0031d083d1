"""Pieces every built-in proposer shares: the op catalog, turning a Program into a Task,
the deterministic adversarial scheduler and the degenerate-task filter."""

from __future__ import annotations

import math
import re
from typing import Any, Mapping

from core.program import OpSpec, Program, render_task_source
from core.task import Task


def resolve_catalog(catalog: Any = None) -> dict[str, OpSpec]:
    """The op catalog as a plain ``name -> OpSpec`` dict.

    :param catalog: ``None`` (the process-wide ``op`` registry), a :class:`core.plugins.Registry`,
        or any mapping of names to op specs.
    """
    if catalog is None:
        from core.plugins import registry

        catalog = registry("op")
    entries = getattr(catalog, "entries", catalog)
    return dict(entries)


def eligible_ops(catalog: Mapping[str, OpSpec], max_tier: int, allowed: list[str] | None = None,
                 families: tuple[str, ...] | None = None) -> list[str]:
    """Names of the ops a curriculum state allows, sorted (so choices are seed-deterministic)."""
    names = []
    for name, spec in catalog.items():
        if spec.tier > max_tier:
            continue
        if allowed is not None and name not in allowed:
            continue
        if families is not None and spec.family not in families:
            continue
        names.append(name)
    return sorted(names)


_MISSING_COMMA = re.compile(r"(\d) dtype=torch\.")


def render_source(program: Program, catalog: Mapping[str, OpSpec], docstring: str = "") -> str:
    """:func:`core.program.render_task_source`, guarded against its multi-dim ``torch.randn(2, 3 dtype=...)``.

    core/program.py (2026-11-29) drops the comma before ``dtype=`` for inputs of rank >= 2; until
    that is fixed there, the comma is restored here. A no-op once the renderer is fixed.
    """
    source = render_task_source(program, catalog, docstring=docstring)
    return _MISSING_COMMA.sub(r"\1, dtype=torch.", source)


def program_to_task(program: Program, catalog: Mapping[str, OpSpec], *, seed: int | None,
                    adversarial: list[str] | None = None, proposer: str = "",
                    extra_difficulty: Mapping[str, float] | None = None) -> Task:
    """Render a program as a KernelBench task and fill in every metadata field the loop reads."""
    shapes = program.value_shapes(catalog)
    flops = program.flops(catalog)
    min_bytes = program.min_bytes(catalog)
    tier = max(catalog[n.op].tier for n in program.nodes)
    doc = " -> ".join(program.ops)
    if adversarial:
        doc += f"  [adversarial: {', '.join(adversarial)}]"
    source = render_source(program, catalog, docstring=doc)
    difficulty = {
        "n_ops": float(len(program.nodes)),
        "intermediates": float(program.intermediates()),
        "log10_flops": math.log10(flops + 1),
        "log10_bytes": math.log10(min_bytes + 1),
        "arithmetic_intensity": flops / max(min_bytes, 1),
        "tier": float(tier),
        "output_numel": float(math.prod(shapes[-1])),
    }
    difficulty.update(extra_difficulty or {})
    return Task(
        source=source,
        ops=program.ops,
        shapes=[list(t.shape) for t in program.inputs],
        dtypes=[t.dtype for t in program.inputs],
        flops=int(flops),
        min_bytes=int(min_bytes),
        difficulty=difficulty,
        tier=int(tier),
        adversarial=list(adversarial) if adversarial else None,
        seed=seed,
        program=program.to_dict(),
        name=proposer or None,
    )


class AdversarialSchedule:
    """Decides, task by task, which positions of the stream are adversarial.

    Position ``i`` is adversarial when ``floor((i + 1) * share + phase) > floor(i * share + phase)``:
    the low-discrepancy (Bresenham) sequence. Any ``L`` consecutive positions then hold either
    ``floor(L * share)`` or ``ceil(L * share)`` adversarial tasks, so a share of 0.12 gives 12 (at
    worst 11 or 13) in every window of 100, which iid coin flips cannot promise.
    """

    def __init__(self, share: float = 0.12, phase: float = 0.0, position: int = 0):
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"adversarial share must be within [0, 1]; got {share}")
        self.share, self.phase, self.position = float(share), float(phase) % 1.0, int(position)

    def next(self) -> bool:
        i = self.position
        self.position += 1
        return math.floor((i + 1) * self.share + self.phase) > math.floor(i * self.share + self.phase)

    def state_dict(self) -> dict[str, Any]:
        return {"share": self.share, "phase": self.phase, "position": self.position}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.share, self.phase, self.position = float(state["share"]), float(state["phase"]), int(state["position"])

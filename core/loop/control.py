"""Control arms: the same wall-clock time spent another way, so a phase's gain can be judged.

A phase with ``control_for: X`` (``trainer.phases.<name>.control_for``) is a control arm of phase
``X``. It runs after the run's own phases and does not change the run's model:

- it starts from the model ``X`` started from (for the default run: the SFT warm start);
- it trains for as long as ``X``'s training loop took (wall clock, :class:`core.loop.phase_common.PhaseProgress`
  measures both), its ``steps`` being only a cap; when a phase ran before ``X`` (for the default run:
  the SFT warm start), the step count is estimated from that phase's seconds per step so the
  learning-rate schedule spans the budget rather than stopping part way down it; a run without such
  a phase (it started from another run's SFT model) schedules by the control's ``pace_s``, when given;
- an SFT control without a dataset of its own reuses the verified teacher pairs of the SFT phase it
  continues (no new teacher calls, whose time the budget would not count);
- it is evaluated on the same held-out tasks, and reported beside ``X`` in the final table.

``training`` below is the run, a :class:`core.loop.training.Training`.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from core.loop.training_config import Phase, TrainingError
from core.task import Task


def predecessor(phases: Sequence[Phase], name: str) -> Phase | None:
    """The phase with steps that ran just before ``name`` (None: ``name`` was the first); a feedback
    SFT phase (``refine``: token rows of the model's own failures) is passed over, so an SFT control
    continues on the teacher's pairs at the teacher phase's pace."""
    before = None
    for phase in phases:
        if phase.name == name:
            return before
        if phase.steps > 0 and phase.control_for is None and not getattr(phase, "feedback", False):
            before = phase
    return None


def budget_steps(phase: Phase, budget_s: float, seconds_per_step: float | None) -> int:
    """Steps to schedule for a control of ``budget_s`` seconds: ``phase.steps`` capped by the estimate."""
    if not seconds_per_step or seconds_per_step <= 0:
        return phase.steps
    return max(1, min(phase.steps, math.ceil(budget_s / seconds_per_step)))


def run_control(training: Any, phase: Phase, runner: Callable[[Any, Phase, set[str]], None],
                eval_tasks: Sequence[Task]) -> dict[str, Any]:
    """Run the control arm ``phase`` of ``phase.control_for`` and evaluate it; the run's model is kept."""
    target = str(phase.control_for)
    progress = training.progress
    budget = float(progress.get("seconds", {}).get(target, 0.0))
    start_model = progress.get("start_model", {}).get(target)
    if budget <= 0 or not start_model:
        raise TrainingError(f"control {phase.name!r} of {target!r}: no measured time or start model for "
                            f"{target!r} in train_state.json (did {target!r} run in this output directory?)")
    before = predecessor(training.settings.phases, target)
    rate = progress.get("seconds_per_step", {}).get(before.name) if before is not None else None
    rate = rate or phase.pace_s
    scheduled = replace(phase, steps=budget_steps(phase, budget, rate))
    if phase.kind == "sft" and not phase.dataset and before is not None and before.kind == "sft":
        pairs = training.out / f"{before.name}_pairs.jsonl"
        if pairs.exists() and not (training.out / f"{phase.name}_pairs.jsonl").exists():
            shutil.copyfile(pairs, training.out / f"{phase.name}_pairs.jsonl")
    run_model = progress.get("model")
    training.load_model_dir(start_model)
    training.console.rule(f"control {phase.name} ({phase.kind}) for {target}: {budget:.0f}s of wall clock, "
                          f"at most {scheduled.steps} steps, from {start_model}")
    training.time_limit_s = budget
    try:
        runner(training, scheduled, {t.id for t in eval_tasks})
    finally:
        training.time_limit_s = None
    result = training.evaluate(eval_tasks, f"control {phase.name}")
    result.update(control_for=target, train_seconds=progress.get("seconds", {}).get(phase.name, 0.0),
                  budget_s=budget, steps=progress.get("steps_done", {}).get(phase.name, 0))
    # the run's model stays the one its own phases trained
    progress["model"] = run_model
    training.load_model_dir(run_model)
    return result

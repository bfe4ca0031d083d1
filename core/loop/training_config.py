"""The training run's configuration: the phase schedule and the ``trainer`` group, apart from behaviour.

As TRL keeps ``grpo_config.py`` beside ``grpo_trainer.py``: :class:`Phase` is one entry of
``trainer.phases`` and :class:`TrainSettings` the whole ``trainer`` group (conf/trainer/grpo.yaml
documents every key). :mod:`core.loop.training` runs them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf

PHASE_KINDS = ("sft", "grpo")


class TrainingError(RuntimeError):
    """A training run is misconfigured in a way the user must fix."""


@dataclass
class Phase:
    """One phase of the schedule (``trainer.phases.<name>``)."""

    name: str
    kind: str
    steps: int
    learning_rate: float = 5e-5
    reward: dict[str, Any] | None = None  # RewardMix kwargs; None = the run's ``reward`` group
    # A control arm of the named phase: same start model and wall clock, reported beside it
    # (core.loop.control); ``steps`` is then only a cap.
    control_for: str | None = None
    # A control arm's seconds per step, to schedule its learning rate over its budget when no SFT phase of
    # this run measured a pace (a run that starts from another run's SFT model); None: schedule ``steps``.
    pace_s: float | None = None
    # Checkpoint every this many steps; None: the trainer's ``save_steps``. An SFT control arm saves less
    # often than GRPO: its steps are short, and saving a model and its optimiser would eat its wall clock.
    save_steps: int | None = None
    # sft only
    tasks: int = 64  # tasks the teacher is asked to solve (in-process distillation)
    dataset: str | None = None  # a ``core.distill`` JSONL instead of in-process distillation
    teacher: str = "expert"
    teacher_kwargs: dict[str, Any] = field(default_factory=dict)
    batch_size: int = 8
    max_length: int | None = None  # SFT sequence budget; None = coder.max_prompt_tokens + coder.max_new_tokens
    # sft only: pairs from the current model's rejected attempts (prompt + attempt + verdict feedback ->
    # the teacher's fix, core.loop.feedback_sft) for multi-turn refinement (coder.turns > 1)
    feedback: bool = False
    # grpo only (core.loop.grpo_loss): negative advantages x this; replay_weight x the SFT loss of
    # replay_batch verified pairs of the run's SFT phases, added to every step's loss
    negative_advantage_scale: float = 1.0
    replay_weight: float = 0.0
    replay_batch: int = 8
    replay_dataset: str | None = None  # pairs to replay instead of this run's SFT phases' (<phase>_pairs.jsonl)
    self_imitation: bool = False  # accepted completions of the phase join the replay pool

    def __post_init__(self) -> None:
        if self.kind not in PHASE_KINDS:
            raise TrainingError(f"phase {self.name!r}: kind must be one of {PHASE_KINDS}, got {self.kind!r}")
        if self.steps < 0:
            raise TrainingError(f"phase {self.name!r}: steps must be >= 0, got {self.steps}")
        if self.save_steps is not None and self.save_steps < 1:
            raise TrainingError(f"phase {self.name!r}: save_steps must be >= 1, got {self.save_steps}")
        if self.pace_s is not None and not self.pace_s > 0:
            raise TrainingError(f"phase {self.name!r}: pace_s must be > 0 seconds per step, got {self.pace_s}")


PRECISIONS = ("fp32", "bf16", "fp16", "auto")


def mixed_precision(precision: str, device: str) -> dict[str, bool]:
    """The ``bf16``/``fp16`` fields of TRL's configs for ``trainer.precision`` on ``device``.

    TRL's configs turn bf16 autocast on by default, on a CPU too. Without native bf16 (AVX512-BF16/AMX) a
    CPU emulates it: an SFT step of the embedded model was 7-10x slower than in fp32 on the 2-core machine
    (docs/training.md). ``auto`` keeps bf16 for GPUs that support it and trains in fp32 elsewhere.
    """
    if precision == "auto":
        import torch

        precision = "bf16" if device != "cpu" and torch.cuda.is_available() and torch.cuda.is_bf16_supported() \
            else "fp32"
    return {"bf16": precision == "bf16", "fp16": precision == "fp16"}


@dataclass
class TrainSettings:
    """The ``trainer`` group (see conf/trainer/grpo.yaml for every key and its meaning)."""

    phases: list[Phase]
    name: str = "grpo"
    resume: str = "auto"  # auto | never
    tasks_per_step: int = 2
    num_generations: int = 4
    beta: float = 0.0
    turn_discount: float = 0.4  # multi-turn episodes (coder.turns > 1): reward = sum_t turn_discount^(t-1) r_t
    save_steps: int = 5
    save_total_limit: int = 2
    steps_per_round: int = 5
    eval_tasks: int = 16
    eval_seed_offset: int = 1_000_003
    # Share of the task-fingerprint space reserved for this run's held-out evaluation: training
    # proposers never yield a task in it, the held-out tasks come only from it (core.evaluation.suites.HeldOut).
    eval_share: float = 0.2
    # The proposer node (``name`` + kwargs, like the ``proposer`` group) that draws the held-out tasks;
    # None: the run's own proposer. Fix it to compare runs of different proposers on the same tasks.
    eval_proposer: dict[str, Any] | None = None
    report_to: list[str] = field(default_factory=lambda: ["tensorboard"])
    logging_steps: int = 1
    torch_threads: int | None = None  # intra-op threads of the training process (None: torch's default)
    precision: str = "fp32"  # fp32 | bf16 | fp16 | auto (bf16 on a GPU that has it, else fp32); see mixed_precision()
    eval_each_phase: bool = False  # also evaluate the held-out tasks between phases (e.g. after SFT, before GRPO)
    # Verify each step's share of a generation round while the next is generated (core.loop.overlap); rewards are
    # the same either way. Overlaps only with GRPOConfig's steps_per_generation > 1 (trainer.grpo_kwargs).
    overlap_verification: bool = False
    # A step whose gradients are not finite is skipped, up to this many in a row; then the phase stops
    # (core.loop.phase_common.FiniteGuard). 0: stop at the first.
    max_skipped_updates: int = 3
    grpo_kwargs: dict[str, Any] = field(default_factory=dict)  # any other GRPOConfig field
    sft_kwargs: dict[str, Any] = field(default_factory=dict)  # any other SFTConfig field

    @classmethod
    def from_config(cls, node: DictConfig | Mapping[str, Any]) -> "TrainSettings":
        data = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
        phases_node = data.pop("phases", None) or {}
        if isinstance(phases_node, list):
            phases_node = {p["name"]: {k: v for k, v in p.items() if k != "name"} for p in phases_node}
        phases = [Phase(name=name, **dict(spec)) for name, spec in phases_node.items() if spec is not None]
        known = set(cls.__dataclass_fields__) - {"phases"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise TrainingError(f"unknown trainer keys {unknown}; known keys: {sorted(known | {'phases'})}")
        if isinstance(data.get("report_to"), str):
            data["report_to"] = [data["report_to"]]
        settings = cls(phases=phases, **data)
        if not phases:
            raise TrainingError("trainer.phases is empty: list at least one phase (kind: sft or grpo)")
        validate_controls(phases)
        if settings.eval_proposer is not None and not (isinstance(settings.eval_proposer, Mapping)
                                                       and settings.eval_proposer.get("name")):
            raise TrainingError(f"trainer.eval_proposer must be a proposer node with a name, e.g. "
                                f"'{{name: random, max_ops: 1}}', or null; got {settings.eval_proposer!r}")
        if settings.precision not in PRECISIONS:
            raise TrainingError(f"trainer.precision must be one of {PRECISIONS}, got {settings.precision!r}")
        if settings.max_skipped_updates < 0:
            raise TrainingError(f"trainer.max_skipped_updates must be >= 0, got {settings.max_skipped_updates}")
        if settings.resume not in ("auto", "never"):
            raise TrainingError(f"trainer.resume must be 'auto' or 'never', got {settings.resume!r}")
        return settings


def validate_controls(phases: Sequence[Phase]) -> None:
    """Every ``control_for`` names an earlier, non-control phase with steps."""
    seen: dict[str, Phase] = {}
    for phase in phases:
        target = phase.control_for
        if target is not None and (target not in seen or seen[target].control_for is not None):
            raise TrainingError(f"phase {phase.name!r}: control_for must name an earlier phase of the run "
                                f"(one that is not itself a control), got {target!r}; phases before it: "
                                f"{sorted(n for n, p in seen.items() if p.control_for is None)}")
        seen[phase.name] = phase

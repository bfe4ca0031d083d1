"""The GRPO phase (``kind: grpo``): self-play reinforcement learning through TRL's ``GRPOTrainer``.

Data flow per step: the task stream asks the proposer for tasks under the curriculum's current
state -> TRL generates ``num_generations`` completions per task -> the completions are verified once
(:mod:`core.loop.shared_verification`) -> each reward term scores the verdicts -> TRL updates the
model -> at step end (:class:`StepCallback`) the solve rates go to ``proposer.feedback``, the step's
metrics to ``curriculum.update`` (every decision is printed and kept), ``metrics.jsonl`` and
``on_step_end``; every ``steps_per_round`` steps a round summary goes to ``on_round_end``.

``training`` below is the run, a :class:`core.loop.training.Training`.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from omegaconf import OmegaConf
from transformers import TrainerCallback

from core.contracts import optional
from core.loop.grpo_loss import grpo_trainer_class, replay_pairs, tokenized_replay
from core.loop.metrics import aggregate, solve_rates, step_metrics
from core.loop.overlap import timed_trainer_class
from core.loop.phase_common import (
    FiniteGuard,
    LossLog,
    PhaseProgress,
    StateCallback,
    common_args,
    finish_phase,
    quiet,
    report_skipped,
    resume_checkpoint,
)
from core.loop.refinement import training_env
from core.loop.rewards import RewardMix, phase_reward
from core.loop.shared_verification import SharedVerification
from core.loop.step_clock import StepClock, breakdown, breakdown_line
from core.loop.taskstream import TaskStream
from core.loop.training_config import Phase, TrainingError
from core.plugins import notify

log = logging.getLogger(__name__)


def run_grpo(training: Any, phase: Phase, exclude: set[str]) -> None:
    """Train ``training.coder`` by GRPO on streamed tasks for ``phase.steps`` steps."""
    from trl import GRPOConfig

    mix = phase_mix(training.cfg, phase)
    if not mix.terms:
        raise TrainingError(f"phase {phase.name!r} has no reward terms; give it reward.weights")
    s = training.settings
    coder, backend = training.coder, training.backend
    clock = StepClock(training.device)
    env = training_env(training, mix)  # coder.turns > 1: multi-turn episodes (TRL's rollout_func)
    if env is not None:
        env.clock = clock

    def prompt(task):
        return coder.prompt(task, backend)

    stream = TaskStream(training.proposer, training.curriculum, prompt=env.registering(prompt) if env else prompt,
                        fits=coder.fits, batch=s.tasks_per_step, exclude=exclude)
    shared = SharedVerification(verifier=training.verifier, stream=stream,
                                to_candidate=lambda t, text: coder.to_candidate(t, text, backend),
                                mix=mix, num_generations=s.num_generations, clock=clock,
                                overlap=s.overlap_verification and env is None)
    grpo_kwargs = dict(
        per_device_train_batch_size=s.tasks_per_step * s.num_generations, num_generations=s.num_generations,
        gradient_accumulation_steps=1, max_completion_length=int(optional(coder, "Coder", "max_new_tokens")),
        temperature=float(optional(coder, "Coder", "temperature")), top_p=float(optional(coder, "Coder", "top_p")),
        beta=s.beta, reward_weights=[mix.weights[name] for name in mix.terms], shuffle_dataset=False,
        remove_unused_columns=False,
    )
    grpo_kwargs.update(s.grpo_kwargs)
    args = GRPOConfig(**common_args(training, phase), **grpo_kwargs)
    bar = PhaseProgress(training, phase)
    step_cb = StepCallback(training, phase, env or shared, stream, bar, clock)
    replay = []
    if phase.replay_weight > 0:
        sft_phases = [p.name for p in s.phases if p.kind == "sft" and p.control_for is None]
        replay = tokenized_replay(coder.hf_tokenizer, replay_pairs(training.out, sft_phases, phase.replay_dataset))
    if phase.self_imitation and env is not None:
        raise TrainingError(f"phase {phase.name!r}: self_imitation replays single-turn completions; "
                            "it does not support multi-turn episodes (coder.turns > 1)")
    trainer_class = grpo_trainer_class(phase.negative_advantage_scale, replay, phase.replay_weight,
                                       phase.replay_batch, seed=training.seed,
                                       accepted=shared.last_accepted if phase.self_imitation else None)
    guard = FiniteGuard(phase, s.max_skipped_updates, say=training.console.print)
    trainer_class = timed_trainer_class(trainer_class, clock, on_batch=shared.submit if shared.overlap else None,
                                        on_rows=shared.submit_early if shared.overlap else None,
                                        on_loss_inputs=guard.note_inputs)
    trainer = trainer_class(model=coder.hf_model, reward_funcs=(env or shared).reward_functions(), args=args,
                          train_dataset=stream.dataset(), processing_class=coder.hf_tokenizer,
                          callbacks=[LossLog(training.out / f"{phase.name}_loss.jsonl"), guard,
                                     StateCallback(training, phase, bar), step_cb, bar], rollout_func=env)
    checkpoint = resume_checkpoint(training, phase)
    quiet(trainer)
    try:
        trainer.train(resume_from_checkpoint=checkpoint)
    finally:
        shared.close()
    step_cb.flush_round()
    report_skipped(training, phase, guard)
    step_time = breakdown(clock.rows)
    if step_time:
        step_time["overlap_verification"] = float(shared.overlap)
        training.progress.setdefault("step_time", {})[phase.name] = step_time
        training.console.print(breakdown_line(f"{phase.name} step time", step_time), soft_wrap=True, markup=False,
                               highlight=False)
    if phase.self_imitation:
        training.console.print(f"{phase.name}: self-imitation replayed {trainer_class.self_imitated()} accepted "
                               f"completions beside {len(replay)} teacher pairs")
    training.progress["step_offset"] = int(training.progress.get("step_offset", 0)) + phase.steps
    training.console.print(f"{phase.name}: {(env or shared).verifications} verifications, {stream.streamed} tasks streamed "
                           f"({stream.distinct} distinct), {stream.skipped} skipped (held out or too long)")
    finish_phase(training, phase, trainer)


def phase_mix(cfg: Any, phase: Phase) -> RewardMix:
    """The reward mix a GRPO phase trains on: the run's ``reward`` group, plus what the phase's own
    ``reward`` block adds (:func:`core.loop.rewards.phase_reward`; the run's values win)."""
    kwargs, _ = phase_reward(OmegaConf.to_container(cfg.reward, resolve=True), phase.reward)
    return RewardMix(**kwargs)


class StepCallback(TrainerCallback):
    """After every GRPO step: metrics, proposer feedback, curriculum update, hooks, the printed curve."""

    def __init__(self, training: Any, phase: Phase, shared: SharedVerification, stream: TaskStream,
                 bar: PhaseProgress | None = None, clock: StepClock | None = None):
        self.training, self.phase, self.shared, self.stream, self.bar = training, phase, shared, stream, bar
        self.clock = clock
        self.round_rows: list[dict[str, Any]] = []
        self.round_index = 0
        # With steps_per_generation > 1 one step scores a whole generation round; each step then reports
        # (and feeds back to the proposer and curriculum) its own share of it: one step's batch, in order.
        self._backlog: list[Any] = []

    def on_train_begin(self, args, state, control, **kwargs):
        if self.clock is not None:
            self.clock.start()

    def on_step_end(self, args, state, control, **kwargs):
        t = self.training
        timing = self.clock.step_end() if self.clock is not None else {}
        self._backlog.extend(self.shared.take())
        size = max(1, t.settings.tasks_per_step * t.settings.num_generations)
        attempts, self._backlog = self._backlog[:size], self._backlog[size:]
        step = int(t.progress.get("step_offset", 0)) + state.global_step - 1
        metrics: dict[str, Any] = {"step": step, "phase": self.phase.name}
        metrics.update(step_metrics(attempts, self.shared.mix.terms))
        metrics.update(timing)
        t.proposer.feedback(solve_rates(attempts))
        decisions = t.curriculum.update(dict(metrics))
        cstate = t.curriculum.state
        metrics.update({"curriculum/param_scale": cstate.param_scale, "curriculum/max_tier": cstate.max_tier,
                        "curriculum/perf_share": cstate.perf_share})
        with open(t.curriculum_log, "a") as f:
            for decision in decisions:
                f.write(json.dumps({"step": step, "decision": decision, "state": cstate.to_dict()}) + "\n")
                t.console.print(f"[cyan]curriculum[/] step {step}: {decision}")
        t.metrics.append(metrics)
        notify("on_step_end", step=step, metrics={k: v for k, v in metrics.items() if isinstance(v, (int, float))})
        tiers = " ".join(f"t{k.split('tier')[-1]}:{int(v)}" for k, v in sorted(metrics.items()) if k.startswith("tasks/tier"))
        line = (f"pass {metrics['pass_rate']:.2f} pass@{int(metrics['k'])} {metrics['pass_at_k']:.2f} density "
                f"{metrics['information_density']:.2f} reward {metrics['reward']:.3f} "
                f"compile {metrics['compile_rate']:.2f} hacks {metrics['hack_flag_rate']:.2f} {tiers}")
        if timing:
            line += (f" | {timing['time/step_s']:.1f}s: gen {timing['time/generate_s']:.1f} verify "
                     f"{timing['time/verify_s']:.1f} wait {timing['time/wait_s']:.1f} opt {timing['time/optimize_s']:.1f}")
        # every step goes to the log file; the screen shows it only on the phase's progress bar
        log.info("step %d [%s] %s", step, self.phase.name, line)
        if self.bar is not None:
            self.bar.set_status(line)
        else:
            t.console.print(f"step {step:4d} [{self.phase.name}] {line}")
        self.round_rows.append(metrics)
        if len(self.round_rows) >= max(1, t.settings.steps_per_round):
            self.flush_round()

    def flush_round(self) -> None:
        if not self.round_rows:
            return
        summary = aggregate(self.round_rows)
        summary["round"] = float(self.round_index)
        notify("on_round_end", round_index=self.round_index, metrics=summary)
        with open(self.training.out / "rounds.jsonl", "a") as f:
            f.write(json.dumps({"phase": self.phase.name, **summary}) + "\n")
        self.round_index += 1
        self.round_rows = []

"""What the SFT and GRPO phases share: their TrainingArguments, checkpoint state, resuming, the phase's model.

Checkpoints: TRL saves model and optimiser every ``save_steps`` under ``checkpoints/<phase>/``;
:class:`StateCallback` writes ``kernelzero_state.json`` (proposer and curriculum state, step
offsets) beside each one, and :func:`resume_checkpoint` restarts a phase from the newest checkpoint
that has it. A finished phase leaves its model in ``models/<phase>/`` (:func:`finish_phase`).

``training`` below is the run, a :class:`core.loop.training.Training` (not imported: that module
imports this one).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from core.loop.training_config import Phase, TrainingError, mixed_precision

STATE_FILE = "kernelzero_state.json"


def phase_dir(training: Any, phase: Phase) -> Path:
    return training.out / "checkpoints" / phase.name


def common_args(training: Any, phase: Phase) -> dict[str, Any]:
    """The ``TrainingArguments`` fields both ``SFTConfig`` and ``GRPOConfig`` get."""
    s = training.settings
    return dict(
        output_dir=str(phase_dir(training, phase)), max_steps=phase.steps, learning_rate=phase.learning_rate,
        logging_steps=s.logging_steps, save_strategy="steps", save_steps=phase.save_steps or s.save_steps,
        save_total_limit=s.save_total_limit, report_to=list(s.report_to),
        use_cpu=training.device == "cpu", seed=training.seed, ignore_data_skip=True, disable_tqdm=True,
        **mixed_precision(s.precision, training.device),
    )


def quiet(trainer: Any) -> None:
    """Drop the callback that prints every log dict; our own step lines and TensorBoard remain."""
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)


def _bar_with_status_line():
    """A rich ``Progress`` that draws the bar on one line and the status under it, cut at the terminal's
    width: on one line a long status (GRPO's step metrics) squeezed the bar and the count out of it."""
    from rich.progress import Progress
    from rich.text import Text

    class BarWithStatus(Progress):
        status = ""

        def get_renderables(self):
            yield self.make_tasks_table(self.tasks)
            if self.status:
                yield Text(self.status, no_wrap=True, overflow="ellipsis")

    return BarWithStatus


class PhaseProgress(TrainerCallback):
    """The phase's progress (a rich bar on a terminal, a plain line every few steps without one);
    measures its training loop's wall clock.

    Without a terminal (output to a file or a pipe) rich draws a bar only when it stops, so the
    progress is printed as lines: every step of a phase of up to :attr:`LINES` steps, else every
    ``steps / LINES`` steps, and at least once a minute.

    The seconds and steps go to ``training.progress`` (``seconds``, ``steps_done``,
    ``seconds_per_step``): control arms (:mod:`core.loop.control`) get the same time as the phase
    they control. With ``training.time_limit_s`` set, training stops once that much time has passed.
    A phase resumed from a checkpoint counts the time it had spent before it (saved beside the checkpoint
    by :class:`StateCallback`), so its control arm's budget is the whole phase's, not the resumed part's.
    """

    LINES = 20  # progress lines a phase prints at most without a terminal (plus one a minute)
    LINE_EVERY_S = 60.0

    def __init__(self, training: Any, phase: Phase):
        self.training, self.phase = training, phase
        self.status = ""
        self._total = 0
        self._stride = 1
        self._last_line = 0.0  # when the last plain progress line was printed
        self._bar: Any = None
        self._task: Any = None
        self._t0 = 0.0
        self._before = 0.0  # seconds spent in the phase before the checkpoint it resumed from

    def on_train_begin(self, args, state, control, **kwargs):
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

        self._t0, self._before = time.perf_counter(), 0.0
        if state.global_step > 0:  # resumed by TRL from checkpoint-<global_step>
            resumed = Path(args.output_dir) / f"checkpoint-{state.global_step}" / STATE_FILE
            saved = json.loads(resumed.read_text()) if resumed.exists() else {}
            if "phase_seconds" in saved:
                self._before = float(saved["phase_seconds"])
            else:  # a checkpoint from before the clock was saved: this phase's time counts from here
                self.training.console.print(f"[yellow]note[/]: {resumed} holds no phase clock; {self.phase.name}'s "
                                            "recorded time (a control arm's budget) counts from this resume only")
        self._total = int(state.max_steps or self.phase.steps)
        console = self.training.console
        if not console.is_terminal or console.is_dumb_terminal:
            self._stride = max(1, -(-self._total // self.LINES))
            self._last_line = time.perf_counter()
            self._plain(f"{self._total} steps" + (f", from step {state.global_step}" if state.global_step else ""))
            return
        self._bar = _bar_with_status_line()(
            TextColumn(f"{self.phase.name} ({self.phase.kind})"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), console=console, transient=False)
        self._task = self._bar.add_task(self.phase.name, total=self._total, completed=state.global_step)
        self._bar.start()

    def _plain(self, text: str) -> None:
        self.training.console.print(f"{self.phase.name} ({self.phase.kind}) {text}", soft_wrap=True, markup=False,
                                    highlight=False, emoji=False)

    def set_status(self, text: str) -> None:
        """Text shown under the bar (GRPO: the last step's pass rate and information density)."""
        self.status = text
        if self._bar is not None:
            self._bar.status = text
            self._bar.refresh()

    def elapsed(self) -> float:
        """The phase's training seconds so far, those before a resume included."""
        return self._before + time.perf_counter() - self._t0

    def on_step_end(self, args, state, control, **kwargs):
        if self._bar is not None:
            self._bar.update(self._task, completed=state.global_step)
        else:
            step, now = state.global_step, time.perf_counter()
            if step % self._stride == 0 or step >= self._total or now - self._last_line >= self.LINE_EVERY_S:
                self._last_line = now
                minutes, seconds = divmod(int(self.elapsed()), 60)
                self._plain(f"step {step}/{self._total} {minutes}:{seconds:02d}" + (f"  {self.status}" if self.status else ""))
        limit = getattr(self.training, "time_limit_s", None)
        if limit is not None and self.elapsed() >= limit:
            control.should_training_stop = True

    def on_train_end(self, args, state, control, **kwargs):
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        p, name = self.training.progress, self.phase.name
        p.setdefault("seconds", {})[name] = self.elapsed()
        p.setdefault("steps_done", {})[name] = state.global_step
        if p["steps_done"][name]:
            p.setdefault("seconds_per_step", {})[name] = p["seconds"][name] / p["steps_done"][name]


def finish_phase(training: Any, phase: Phase, trainer: Any) -> None:
    """Save the phase's model (and tokenizer) and generate with it from now on."""
    model_dir = training.out / "models" / phase.name
    trainer.save_model(str(model_dir))
    training.coder.hf_tokenizer.save_pretrained(str(model_dir))
    training.coder.set_model(trainer.model)
    training.progress["model"] = str(model_dir)


def resume_checkpoint(training: Any, phase: Phase) -> str | None:
    """The newest checkpoint of ``phase`` that has our state beside it (None: start fresh)."""
    if training.settings.resume == "never":
        return None
    ckpts = sorted(phase_dir(training, phase).glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
    for ckpt in reversed(ckpts):
        state_path = ckpt / STATE_FILE
        if not state_path.exists():
            continue
        state = json.loads(state_path.read_text())
        training.proposer.load_state_dict(state["proposer"])
        training.curriculum.load_state_dict(state["curriculum"])
        training.metrics.truncate(int(state["last_step"]))
        training.console.print(f"[yellow]resuming[/] phase {phase.name} from {ckpt}")
        return str(ckpt)
    return None


class StateCallback(TrainerCallback):
    """Writes proposer and curriculum state beside every checkpoint TRL saves, and the phase's clock
    (``clock``: its :class:`PhaseProgress`) so that a resumed phase knows the time it had spent."""

    def __init__(self, training: Any, phase: Phase, clock: PhaseProgress | None = None):
        self.training, self.phase, self.clock = training, phase, clock

    def on_save(self, args, state, control, **kwargs):
        ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if not ckpt.is_dir():
            return
        t = self.training
        data = {"phase": self.phase.name, "global_step": state.global_step,
                "last_step": int(t.progress.get("step_offset", 0)) + state.global_step - 1
                if self.phase.kind == "grpo" else (t.metrics.rows[-1]["step"] if t.metrics.rows else -1),
                "proposer": t.proposer.state_dict(), "curriculum": t.curriculum.state_dict()}
        if self.clock is not None:
            data["phase_seconds"] = self.clock.elapsed()
        tmp = ckpt / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(data, default=str))
        tmp.replace(ckpt / STATE_FILE)


def loss_input_summary(inputs: dict[str, Any]) -> dict[str, Any]:
    """What a GRPO micro-batch's loss is computed from, reduced on the device without a sync (TRL's ``inputs``:
    completion mask, advantages, the old policy's per-token log-probabilities where TRL keeps them): the values
    that turn an importance ratio or a normalisation non-finite."""
    import torch

    mask = inputs.get("completion_mask")
    if mask is None or not mask.numel():
        return {}
    on = mask.bool()
    lengths = on.sum(-1)
    summary = {"longest": lengths.max(), "empty_rows": (lengths == 0).sum()}
    advantages = inputs.get("advantages")
    if advantages is not None:
        summary["advantage"] = advantages.detach().abs().max()
    old = inputs.get("old_per_token_logps")
    if old is not None:
        old = old.detach()
        summary["old_logp_min"] = torch.where(on, old, torch.zeros((), dtype=old.dtype, device=old.device)).min()
        summary["old_logp_bad"] = (on & ~torch.isfinite(old)).sum()
    return summary


# how FiniteGuard combines each summary over a step's micro-batches, and names it
LOSS_INPUT_KEYS: dict[str, tuple[Any, str]] = {
    "longest": (lambda t: t.max(), "longest completion (tokens)"),
    "empty_rows": (lambda t: t.sum(), "rows without a completion token"),
    "advantage": (lambda t: t.max(), "largest |advantage|"),
    "old_logp_min": (lambda t: t.min(), "lowest old log-prob"),
    "old_logp_bad": (lambda t: t.sum(), "non-finite old log-probs"),
}


class FiniteGuard(TrainerCallback):
    """Keeps a phase's weights finite: a step whose gradients are not finite is skipped, and the phase stops
    once ``max_skipped`` steps in a row were, or at the first step that leaves the weights, its loss or its
    gradient norm not finite otherwise.

    Non-finite weights do not fail by themselves: SFT goes on training and saves a model that answers
    nothing, and the next GRPO step's sampling dies inside ``generate`` (on a GPU "device-side assert
    triggered", which loses the CUDA context; seen on one H200, 2026-12-02). One bad batch should not end a run
    either: a 1.3B model in bf16 (H100, 2026-12-06) had its fifth GRPO update turn every weight into NaN. So,
    as loss scaling and large-scale trainers do with an overflowing step, the update is not applied (every
    gradient dropped before the optimiser's step: AdamW leaves a parameter without one untouched), said on the
    console and counted (``skipped``). Stopped, after the optimiser's update and before that step is logged or
    saved, the phase fails with its name and step, and the newest checkpoint on disk is one from before it.
    """

    WATCHED = ("loss", "grad_norm")

    def __init__(self, phase: Phase, max_skipped: int = 0, say: Any = print):
        self.phase, self.max_skipped, self.say = phase, max_skipped, say
        self.skipped: list[int] = []  # the steps whose update was not applied
        self.where: dict[int, str] = {}  # a skipped step: where its non-finite gradients arose, where known
        self.in_a_row = 0
        self._logit_grad_norms: list[Any] = []  # this step's gradient norms at the logits, one per backward
        self._inputs: list[dict[str, Any]] = []  # this step's loss inputs, summarised (loss_input_summary)
        self._hook: Any = None

    def note_inputs(self, summary: dict[str, Any]) -> None:
        """A micro-batch's loss inputs, summarised on the device (:func:`loss_input_summary`); read only when the
        step's gradients are not finite."""
        self._inputs.append(summary)

    def _inputs_line(self, summaries: list[dict[str, Any]]) -> str:
        import torch

        if not summaries:
            return ""
        parts = []
        for key, (combine, label) in LOSS_INPUT_KEYS.items():
            values = [s[key] for s in summaries if key in s]
            if values:
                value = combine(torch.stack([torch.as_tensor(v, dtype=torch.float64) for v in values])).item()
                parts.append(f"{label} {value:.4g}")
        return "loss inputs: " + ", ".join(parts) if parts else ""

    # Where a non-finite gradient arises: the gradient at the logits (the output embedding's output) is the loss's
    # alone. Not finite there: the loss made it (an importance ratio exp(logp - old_logp) that overflows where a
    # mask then discards it gives 0 * inf); finite there: the model's own backward did (attention, a recomputed
    # checkpoint). Its norm is taken on the device, no copy, and read only when a step's gradients are bad.
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        head = getattr(model, "get_output_embeddings", lambda: None)() if model is not None else None
        if head is not None and self._hook is None:
            self._hook = head.register_forward_hook(self._watch_logits)

    def on_train_end(self, args, state, control, **kwargs):
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def _watch_logits(self, module, inputs, output):
        import torch

        if isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(lambda grad: self._logit_grad_norms.append(torch.linalg.vector_norm(grad.detach())))

    def _origin(self, norms: list[Any]) -> str:
        import torch

        if not norms:
            return ""
        if bool(torch.isfinite(torch.stack([n.float() for n in norms])).all()):
            return "the gradient at the logits was finite: they arose inside the model's backward"
        return "the gradient at the logits was already not finite: the loss made them"

    def _stop(self, what: str, step: int) -> None:
        raise TrainingError(
            f"phase {self.phase.name!r}: {what} at step {step}, so the phase stopped before saving it. "
            f"Rerunning the same command resumes from the last checkpoint before it (every save_steps); "
            f"if it recurs there, lower trainer.phases.{self.phase.name}.learning_rate")

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        import torch

        named = [(name, p.grad) for name, p in model.named_parameters() if p.grad is not None] if model else []
        norms, self._logit_grad_norms = self._logit_grad_norms, []
        summaries, self._inputs = self._inputs, []
        # one device sync for the whole model, not one per tensor
        finite = torch.stack([torch.isfinite(g).all() for _, g in named]) if named else None
        if finite is None or bool(finite.all()):
            self.in_a_row = 0
            return
        step = state.global_step + 1  # the step this update would complete
        flags = finite.tolist()
        names = [name for (name, _), ok in zip(named, flags) if not ok]
        origin, inputs = self._origin(norms), self._inputs_line(summaries)
        what = (f"{len(names)} of {len(named)} tensors, first {names[0]}, last {names[-1]}"
                + (f"; {origin}" if origin else "") + (f"; {inputs}" if inputs else ""))
        if self.in_a_row >= self.max_skipped:
            self._stop(f"the gradients were not finite ({names[0]}, among others; {what}) "
                       f"{self.in_a_row + 1} step(s) in a row", step)
        for p in model.parameters():
            p.grad = None
        self.skipped.append(step)
        self.where[step] = what
        self.in_a_row += 1
        self.say(f"phase {self.phase.name!r} step {step}: gradients not finite ({what}); update skipped "
                 f"({self.in_a_row} in a row of at most {self.max_skipped}, {len(self.skipped)} in the phase)")

    def on_step_end(self, args, state, control, model=None, **kwargs):
        import torch

        params = [p.detach() for p in model.parameters()] if model is not None else []
        if params and not bool(torch.stack([torch.isfinite(p).all() for p in params]).all()):
            bad = next(name for name, p in model.named_parameters() if not bool(torch.isfinite(p).all()))
            self._stop(f"the update left weights that are not finite ({bad}, among others)", state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.skipped and self.skipped[-1] == state.global_step:
            return  # that step's loss or gradient norm is the non-finite one whose update was skipped
        for key in self.WATCHED:
            value = (logs or {}).get(key)
            if isinstance(value, (int, float)) and not math.isfinite(value):
                self._stop(f"{key} was {value}", state.global_step)


def report_skipped(training: Any, phase: Phase, guard: FiniteGuard) -> None:
    """A finished phase's skipped updates, on the console and in the run's progress (train_state.json)."""
    if guard.skipped:
        training.progress.setdefault("skipped_updates", {})[phase.name] = list(guard.skipped)
        if guard.where:
            training.progress.setdefault("skipped_updates_where", {})[phase.name] = {
                str(step): what for step, what in guard.where.items()}
        training.console.print(f"{phase.name}: {len(guard.skipped)} update(s) skipped for gradients that were not "
                               f"finite (steps {', '.join(map(str, guard.skipped))})")


class LossLog(TrainerCallback):
    """Writes the trainer's logged rows that have a loss (with the gradient norm, TRL's clip ratios and entropy)
    to ``path`` as they are logged, so what led up to a failed step is on disk: the whole history at the first
    log (a resumed phase's comes with its checkpoint), then each new row appended."""

    def __init__(self, path: Path):
        self.path, self.written = path, None  # how many of state.log_history are on disk

    def on_log(self, args, state, control, logs=None, **kwargs):
        start = 0 if self.written is None else self.written
        rows = [r for r in state.log_history[start:] if "loss" in r]
        with open(self.path, "w" if self.written is None else "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        self.written = len(state.log_history)

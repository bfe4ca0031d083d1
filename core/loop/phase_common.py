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
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from core.loop.training_config import Phase

STATE_FILE = "kernelzero_state.json"


def phase_dir(training: Any, phase: Phase) -> Path:
    return training.out / "checkpoints" / phase.name


def common_args(training: Any, phase: Phase) -> dict[str, Any]:
    """The ``TrainingArguments`` fields both ``SFTConfig`` and ``GRPOConfig`` get."""
    s = training.settings
    return dict(
        output_dir=str(phase_dir(training, phase)), max_steps=phase.steps, learning_rate=phase.learning_rate,
        logging_steps=s.logging_steps, save_strategy="steps", save_steps=s.save_steps,
        save_total_limit=s.save_total_limit, report_to=list(s.report_to),
        use_cpu=training.device == "cpu", seed=training.seed, ignore_data_skip=True, disable_tqdm=True,
    )


def quiet(trainer: Any) -> None:
    """Drop the callback that prints every log dict; our own step lines and TensorBoard remain."""
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)


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
    """Writes proposer and curriculum state beside every checkpoint TRL saves."""

    def __init__(self, training: Any, phase: Phase):
        self.training, self.phase = training, phase

    def on_save(self, args, state, control, **kwargs):
        ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if not ckpt.is_dir():
            return
        t = self.training
        data = {"phase": self.phase.name, "global_step": state.global_step,
                "last_step": int(t.progress.get("step_offset", 0)) + state.global_step - 1
                if self.phase.kind == "grpo" else (t.metrics.rows[-1]["step"] if t.metrics.rows else -1),
                "proposer": t.proposer.state_dict(), "curriculum": t.curriculum.state_dict()}
        tmp = ckpt / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(data, default=str))
        tmp.replace(ckpt / STATE_FILE)

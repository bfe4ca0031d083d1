"""Two additions to TRL's GRPO loss, both off by default (``trainer.phases.<grpo phase>``):

- ``negative_advantage_scale``: negative advantages are multiplied by it (1: plain GRPO; 0: only
  completions better than their group's mean are reinforced). A small model that memorised its
  teacher pairs is pushed off them by the many failed samples of a step (measured on the embedded
  default, CHANGELOG.md's history); down-weighting the pushes keeps
  the pulls toward verified kernels.
- ``replay_weight`` / ``replay_batch``: each step also adds ``replay_weight`` x the SFT loss of
  ``replay_batch`` pairs drawn from the warm start's verified teacher pairs (the pretraining mix of
  InstructGPT's PPO-ptx), so what distillation taught is rehearsed while self-play learns new tasks.
- ``self_imitation``: every completion the verifier accepts during the phase joins that replay pool
  (once per distinct prompt and completion), so the kernels self-play found for tasks no teacher
  answered are rehearsed as well (self-imitation learning, Oh et al. 2018: replay of the agent's own
  past successes).

``replay_pairs`` reads those pairs from the run directory, where the SFT phase cached them, or from
``replay_dataset`` (a run that starts from another run's model replays that run's pairs).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from core.loop.training_config import TrainingError

REPLAY_STATE = "replay_state.json"  # beside each GRPO checkpoint: the replay sampler and self-imitated rows


def replay_pairs(out: Path, phase_names: Sequence[str], dataset: str | Path | None = None) -> list[dict[str, str]]:
    """The verified ``{"prompt", "completion"}`` pairs to replay: those the run's SFT phases cached
    (``<phase>_pairs.jsonl``), or ``dataset``'s (such a file of another run, e.g. the run whose model
    this one starts from)."""
    paths = [Path(dataset)] if dataset else [out / f"{name}_pairs.jsonl" for name in phase_names]
    if dataset and not paths[0].exists():
        raise TrainingError(f"replay_dataset {dataset} does not exist")
    rows: list[dict[str, str]] = []
    for path in paths:
        if path.exists():
            rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{"prompt": r["prompt"], "completion": r["completion"]} for r in rows if "prompt" in r and "completion" in r]


def tokenized_replay(tokenizer: Any, pairs: Sequence[dict[str, str]]) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, completion ids + EOS) per pair, as TRL's completion-only SFT loss sees them."""
    eos = tokenizer.eos_token_id
    out = []
    for pair in pairs:
        prompt = tokenizer(pair["prompt"], add_special_tokens=False)["input_ids"]
        completion = tokenizer(pair["completion"], add_special_tokens=False)["input_ids"]
        out.append((prompt, completion + ([eos] if eos is not None else [])))
    return out


def replay_loss(model: Any, rows: Sequence[tuple[list[int], list[int]]], pad_id: int) -> torch.Tensor:
    """Mean next-token NLL of the completions of ``rows`` (prompt tokens are context only)."""
    length = max(len(p) + len(c) for p, c in rows)
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), length), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    for i, (prompt, completion) in enumerate(rows):
        seq = prompt + completion
        ids[i, :len(seq)] = torch.tensor(seq)
        labels[i, len(prompt):len(seq)] = torch.tensor(completion)
        mask[i, :len(seq)] = 1
    device = next(model.parameters()).device
    return model(input_ids=ids.to(device), attention_mask=mask.to(device), labels=labels.to(device)).loss


def accepted_rows(output: dict[str, Any], accepted: Sequence[bool]) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, completion ids) of the accepted rows of one TRL generation batch, padding removed
    (TRL's completion ids keep the EOS that ended the completion, as ``tokenized_replay``'s do)."""
    rows = []
    for i, ok in enumerate(accepted):
        if ok:
            prompt = output["prompt_ids"][i][output["prompt_mask"][i].bool()].tolist()
            completion = output["completion_ids"][i][output["completion_mask"][i].bool()].tolist()
            rows.append((prompt, completion))
    return rows


def grpo_trainer_class(negative_advantage_scale: float = 1.0, replay: Sequence[tuple[list[int], list[int]]] = (),
                       replay_weight: float = 0.0, replay_batch: int = 8, seed: int = 0,
                       accepted: Callable[[], Sequence[bool]] | None = None) -> type:
    """TRL's ``GRPOTrainer``, or a subclass with the additions above when any is on.

    :param accepted: self-imitation: called after each generation batch is scored, the verifier's
        acceptance of each of its completions, in TRL's order.
    """
    from trl import GRPOTrainer

    if not 0.0 <= negative_advantage_scale <= 1.0:
        raise TrainingError(f"negative_advantage_scale must be in [0, 1], got {negative_advantage_scale}")
    if replay_weight < 0:
        raise TrainingError(f"replay_weight must be >= 0, got {replay_weight}")
    if accepted is not None and replay_weight == 0:
        raise TrainingError("self_imitation replays accepted completions; give the phase replay_weight > 0")
    if replay_weight > 0 and not replay and accepted is None:
        raise TrainingError("replay_weight > 0 needs verified SFT pairs to replay; the run has none cached "
                            "(run an SFT phase before this one, give replay_dataset: a <phase>_pairs.jsonl, "
                            "or set replay_weight: 0)")
    if negative_advantage_scale == 1.0 and replay_weight == 0.0:
        return GRPOTrainer
    rows, rng = list(replay), random.Random(seed)
    seen = {(tuple(p), tuple(c)) for p, c in rows}
    teacher_rows = len(rows)

    class KernelZeroGRPOTrainer(GRPOTrainer):
        @staticmethod
        def self_imitated() -> int:
            """Accepted completions in the replay pool (everything after the teacher's pairs)."""
            return len(rows) - teacher_rows

        # A resumed phase replays what an uninterrupted one would: the sampler's state and the
        # self-imitated rows are saved with each checkpoint (as TRL saves its entropy controller's).
        def _save_checkpoint(self, model, trial):
            super()._save_checkpoint(model, trial)
            if self.args.should_save:
                ckpt = Path(self._get_output_dir(trial=trial)) / f"checkpoint-{self.state.global_step}"
                state = {"rng": rng.getstate(), "self_imitated": [[p, c] for p, c in rows[teacher_rows:]]}
                (ckpt / REPLAY_STATE).write_text(json.dumps(state))

        def _load_optimizer_and_scheduler(self, checkpoint):
            super()._load_optimizer_and_scheduler(checkpoint)
            path = Path(checkpoint) / REPLAY_STATE if checkpoint is not None else None
            if path is not None and path.exists():
                state = json.loads(path.read_text())
                version, internal, gauss = state["rng"]
                rng.setstate((version, tuple(internal), gauss))
                rows[teacher_rows:] = [(prompt, completion) for prompt, completion in state["self_imitated"]]
                seen.clear()
                seen.update((tuple(p), tuple(c)) for p, c in rows)

        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            if accepted is not None:
                flags = list(accepted())
                if len(flags) != len(output["completion_ids"]):
                    raise TrainingError(f"self_imitation: {len(flags)} verdicts for a batch of "
                                        f"{len(output['completion_ids'])} completions")
                for prompt, completion in accepted_rows(output, flags):
                    if (key := (tuple(prompt), tuple(completion))) not in seen:
                        seen.add(key)
                        rows.append((prompt, completion))
            return output

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if negative_advantage_scale != 1.0:
                adv = inputs["advantages"]
                inputs = {**inputs, "advantages": torch.where(adv < 0, adv * negative_advantage_scale, adv)}
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            if replay_weight > 0 and rows:
                batch = rng.sample(rows, min(replay_batch, len(rows)))
                pad = self.processing_class.pad_token_id
                loss = loss + replay_weight * replay_loss(model, batch, 0 if pad is None else pad)
            return loss

    return KernelZeroGRPOTrainer

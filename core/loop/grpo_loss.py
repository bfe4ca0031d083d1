"""Two additions to TRL's GRPO loss, both off by default (``trainer.phases.<grpo phase>``):

- ``negative_advantage_scale``: negative advantages are multiplied by it (1: plain GRPO; 0: only
  completions better than their group's mean are reinforced). A small model that memorised its
  teacher pairs is pushed off them by the many failed samples of a step (measured on the embedded
  default, docs/results/cpu-2026-12-01/training/rl-gain/NOTES.md); down-weighting the pushes keeps
  the pulls toward verified kernels.
- ``replay_weight`` / ``replay_batch``: each step also adds ``replay_weight`` x the SFT loss of
  ``replay_batch`` pairs drawn from the warm start's verified teacher pairs (the pretraining mix of
  InstructGPT's PPO-ptx), so what distillation taught is rehearsed while self-play learns new tasks.

``replay_pairs`` reads those pairs from the run directory, where the SFT phase cached them, or from
``replay_dataset`` (a run that starts from another run's model replays that run's pairs).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from core.loop.training_config import TrainingError


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


def grpo_trainer_class(negative_advantage_scale: float = 1.0, replay: Sequence[tuple[list[int], list[int]]] = (),
                       replay_weight: float = 0.0, replay_batch: int = 8, seed: int = 0) -> type:
    """TRL's ``GRPOTrainer``, or a subclass with the two additions above when either is on."""
    from trl import GRPOTrainer

    if not 0.0 <= negative_advantage_scale <= 1.0:
        raise TrainingError(f"negative_advantage_scale must be in [0, 1], got {negative_advantage_scale}")
    if replay_weight < 0:
        raise TrainingError(f"replay_weight must be >= 0, got {replay_weight}")
    if replay_weight > 0 and not replay:
        raise TrainingError("replay_weight > 0 needs verified SFT pairs to replay; the run has none cached "
                            "(run an SFT phase before this one, give replay_dataset: a <phase>_pairs.jsonl, "
                            "or set replay_weight: 0)")
    if negative_advantage_scale == 1.0 and replay_weight == 0.0:
        return GRPOTrainer
    rows, rng = list(replay), random.Random(seed)

    class KernelZeroGRPOTrainer(GRPOTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if negative_advantage_scale != 1.0:
                adv = inputs["advantages"]
                inputs = {**inputs, "advantages": torch.where(adv < 0, adv * negative_advantage_scale, adv)}
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            if replay_weight > 0:
                batch = rng.sample(rows, min(replay_batch, len(rows)))
                pad = self.processing_class.pad_token_id
                loss = loss + replay_weight * replay_loss(model, batch, 0 if pad is None else pad)
            return loss

    return KernelZeroGRPOTrainer

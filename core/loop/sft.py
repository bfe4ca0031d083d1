"""The SFT phase (``kind: sft``): distillation of verified teacher kernels through TRL's ``SFTTrainer``.

The dataset is, in order of preference: the phase's cached ``<phase>_pairs.jsonl`` (a resumed run),
feedback pairs from the current model's rejected attempts (``feedback: true``,
:mod:`core.loop.feedback_sft`), a ``core.distill`` JSONL (``trainer.phases.<name>.dataset``), or pairs made in-process by the
attempts loop (:mod:`core.loop.attempts`): propose tasks, ask the teacher, verify every answer and
keep the accepted ones, written in the trained coder's own prompt format. Pairs longer than the SFT
budget are dropped (a truncated target never learns to stop).

``training`` below is the run, a :class:`core.loop.training.Training`.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from core.config import build
from core.contracts import optional
from core.loop.attempts import attempt, copy_state, propose, reports_progress
from core.loop.feedback_sft import phase_rows
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
from core.loop.training_config import Phase, TrainingError
from core.plugins import registry
from core.task import Task

# Seed offset of the proposer that draws the teacher's tasks (apart from the training stream's).
TEACHER_SEED_OFFSET = 104729


def run_sft(training: Any, phase: Phase, exclude: set[str]) -> None:
    """Train ``training.coder`` on the phase's distillation pairs for ``phase.steps`` steps."""
    from trl import SFTConfig, SFTTrainer

    dataset = sft_dataset(training, phase, exclude)
    if len(dataset) == 0:
        raise TrainingError(f"phase {phase.name!r}: the distillation dataset is empty (no accepted teacher "
                            f"answers); check the teacher {phase.teacher!r} and the verifier, or set "
                            f"trainer.phases.{phase.name}.dataset to a core.distill JSONL")
    args = SFTConfig(**common_args(training, phase), per_device_train_batch_size=phase.batch_size,
                     max_length=sft_budget(training.coder, phase), completion_only_loss=True, packing=False,
                     **dict(training.settings.sft_kwargs))
    clock = PhaseProgress(training, phase)
    guard = FiniteGuard(phase, training.settings.max_skipped_updates, say=training.console.print)
    trainer = SFTTrainer(model=training.coder.hf_model, args=args, train_dataset=dataset,
                         processing_class=training.coder.hf_tokenizer,
                         callbacks=[LossLog(training.out / f"{phase.name}_loss.jsonl"), guard,
                                    StateCallback(training, phase, clock), clock])
    quiet(trainer)
    trainer.train(resume_from_checkpoint=resume_checkpoint(training, phase))
    rows = [r for r in trainer.state.log_history if "loss" in r]
    report_skipped(training, phase, guard)
    if rows:
        training.console.print(f"{phase.name}: loss {rows[0]['loss']:.3f} -> {rows[-1]['loss']:.3f} over "
                               f"{trainer.state.global_step} steps ({len(dataset)} pairs)")
    finish_phase(training, phase, trainer)


def sft_dataset(training: Any, phase: Phase, exclude: set[str]):
    """The phase's ``datasets.Dataset`` of ``{"prompt", "completion"}`` rows (cached beside the run)."""
    from datasets import Dataset

    cache = training.out / f"{phase.name}_pairs.jsonl"
    if cache.exists():
        rows = [json.loads(line) for line in cache.read_text().splitlines() if line.strip()]
    elif phase.feedback:
        budget = sft_budget(training.coder, phase)
        rows = [r for r in phase_rows(training, phase, exclude) if len(r["input_ids"]) <= budget]
    elif phase.dataset:
        rows = pairs_from_jsonl(training, Path(phase.dataset), exclude, phase)
    else:
        rows = pairs_from_teacher(training, phase, exclude)
    cache.write_text("".join(json.dumps(r) + "\n" for r in rows))
    if phase.feedback:  # token rows: TRL takes input_ids + completion_mask as they are
        return Dataset.from_list(rows)
    return Dataset.from_list([{"prompt": r["prompt"], "completion": r["completion"]} for r in rows])


def pairs_from_teacher(training: Any, phase: Phase, exclude: set[str]) -> list[dict[str, str]]:
    """Propose tasks, ask the teacher, verify every answer, keep the accepted ones as SFT pairs."""
    teacher = training.teacher(phase)
    if teacher is None:
        raise TrainingError(f"phase {phase.name!r} distils from coder {phase.teacher!r}, which is not "
                            f"registered (known coders: {', '.join(registry('coder').names())}); set "
                            f"trainer.phases.{phase.name}.teacher or .dataset (a core.distill JSONL)")
    t0 = time.perf_counter()
    proposer = training.heldout.guard(build("proposer", training.cfg.proposer,
                                            seed=training.seed + TEACHER_SEED_OFFSET))
    tasks = propose(proposer, phase.tasks, copy_state(training.curriculum.state), exclude)
    attempts = attempt(teacher, tasks, training.verifier, training.backend,
                       on_verdicts=verdict_progress(training, phase, len(tasks), t0))
    coder, backend = training.coder, training.backend
    rows = [{"task_id": task.id, "prompt": coder.prompt(task, backend), "completion": coder.completion_for(cand.source)}
            for task, cand, _ in attempts.accepted()]
    training.console.print(f"{phase.name}: teacher {phase.teacher!r} answered {len(attempts.pairs)}/{len(tasks)} "
                           f"tasks, {len(rows)} accepted by the verifier ({time.perf_counter() - t0:.1f}s)")
    keep_rejections(training, phase, attempts.rejected())
    return fitting(training, rows, phase)


# At most one progress line per this many seconds while the teacher's answers are verified (a GPU verifier
# takes minutes for a few hundred; without a line the run looks hung).
PROGRESS_EVERY_S = 15.0


def verdict_progress(training: Any, phase: Phase, total: int, t0: float) -> Any:
    """An ``on_verdicts`` callback printing how many of the teacher's answers are verified and accepted,
    at most every :data:`PROGRESS_EVERY_S` and at the last; None where the verifier's ``verify_many``
    takes no callback (a verifier need only have ``verify_many(pairs)``)."""
    if not reports_progress(training.verifier):
        return None
    seen = {"done": 0, "accepted": 0, "printed": t0}

    def on_verdicts(indices: list[int], verdicts: list[Any]) -> None:
        seen["done"] += len(verdicts)
        seen["accepted"] += sum(bool(getattr(v, "accepted", False)) for v in verdicts)
        now = time.perf_counter()
        if now - seen["printed"] >= PROGRESS_EVERY_S or seen["done"] >= total:
            seen["printed"] = now
            training.console.print(f"{phase.name}: {seen['done']}/{total} teacher answers verified, "
                                   f"{seen['accepted']} accepted ({now - t0:.0f} s)")

    return on_verdicts


def keep_rejections(training: Any, phase: Phase, rejected: list[tuple[Task, Any, Any]]) -> None:
    """The teacher's rejected answers, each with its task and verdict, in ``<phase>_rejected.jsonl``
    (a teacher is meant to be right: each one is a teacher bug or a false rejection to look into), and
    the reasons counted on the console."""
    if not rejected:
        return
    with open(training.out / f"{phase.name}_rejected.jsonl", "w") as f:
        f.writelines(json.dumps({"task": task.to_dict(), "candidate": cand.source, "verdict": verdict.to_dict()}) + "\n"
                     for task, cand, verdict in rejected)
    reasons = Counter(reason_kind(v.reason) for _, _, v in rejected)
    training.console.print(f"{phase.name}: {len(rejected)} teacher answer(s) rejected ("
                           + "; ".join(f"{n} x {why}" for why, n in reasons.most_common(5))
                           + f"): {phase.name}_rejected.jsonl")


def reason_kind(reason: str | None) -> str:
    """The stage or check a verdict's reason names (``"correctness"``, ``"stability"``, ``"timeout"``)."""
    return (reason or "no reason").split(":")[0].strip()[:40]


def pairs_from_jsonl(training: Any, path: Path, exclude: set[str], phase: Phase) -> list[dict[str, str]]:
    """Accepted pairs of a ``core.distill`` JSONL, re-rendered in this coder's prompt format when the
    line carries the task (``task`` object or ``source``); otherwise its prompt is used as written."""
    if not path.exists():
        raise TrainingError(f"distillation dataset {path} does not exist; write one with "
                            f"`python -m core.distill n=256 out={path}`")
    coder, backend = training.coder, training.backend
    rows = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        if not row.get("accepted") or row.get("task_id") in exclude:
            continue
        task = None
        if isinstance(row.get("task"), dict):
            task = Task.from_dict(row["task"])
        elif isinstance(row.get("source"), str):
            task = Task(source=row["source"])
        prompt = coder.prompt(task, backend) if task is not None else row["prompt"]
        rows.append({"task_id": row.get("task_id"), "prompt": prompt,
                     "completion": coder.completion_for(coder.extract(row["completion"]))})
    return fitting(training, rows, phase, source=f"accepted pairs of {path}")


def sft_budget(coder: Any, phase: Phase) -> int:
    """Tokens of prompt + completion an SFT pair may have (``max_length``, else the coder's budgets)."""
    if phase.max_length:
        return int(phase.max_length)
    return int(optional(coder, "Coder", "max_prompt_tokens")) + int(optional(coder, "Coder", "max_new_tokens"))


def fitting(training: Any, rows: list[dict[str, str]], phase: Phase,
            source: str = "accepted teacher answers") -> list[dict[str, str]]:
    """Drop pairs longer than the SFT budget: a truncated target never learns to stop.

    When every pair is too long the phase stops here, saying how many ``source`` pairs there were,
    that all were dropped as too long, and which setting to raise to what."""
    budget = sft_budget(training.coder, phase)
    tok = training.coder.hf_tokenizer
    lengths = [len(tok(r["prompt"] + r["completion"], add_special_tokens=False)["input_ids"]) for r in rows]
    kept = [r for r, n in zip(rows, lengths) if n < budget]
    if rows and not kept:
        need = min(lengths) + 1  # what keeps at least the shortest pair
        if phase.max_length:
            setting = f"trainer.phases.{phase.name}.max_length (now {budget}) to at least {need}"
        else:
            prompt_tokens = int(optional(training.coder, "Coder", "max_prompt_tokens"))
            new_tokens = int(optional(training.coder, "Coder", "max_new_tokens"))
            setting = (f"coder.max_new_tokens (now {new_tokens}) to at least {need - prompt_tokens}, or set "
                       f"trainer.phases.{phase.name}.max_length")
        raise TrainingError(f"phase {phase.name!r}: the distillation dataset is empty: all {len(rows)} {source} "
                            f"were dropped as too long (the shortest pair has {min(lengths)} tokens, the SFT budget "
                            f"is {budget}, coder.max_prompt_tokens + coder.max_new_tokens unless "
                            f"trainer.phases.{phase.name}.max_length is set). Raise {setting}")
    if len(kept) < len(rows):
        training.console.print(f"[yellow]dropped {len(rows) - len(kept)} of {len(rows)} pairs longer than "
                               f"{budget} tokens (trainer.phases.{phase.name}.max_length, default "
                               f"coder.max_prompt_tokens + coder.max_new_tokens)[/]")
    # The budget above is prompt + completion; generation stops at max_new_tokens of completion, so a
    # longer target is learnt but never written out in full (2026-12-01: mish's 150 tokens vs 128).
    limit = int(optional(training.coder, "Coder", "max_new_tokens"))
    cut = sum(len(tok(r["completion"], add_special_tokens=False)["input_ids"]) >= limit for r in kept)
    if cut:
        training.console.print(f"[yellow]{cut} of {len(kept)} pairs have completions of {limit} tokens or more: "
                               f"the coder stops before their end when it generates (raise coder.max_new_tokens)[/]")
    return kept

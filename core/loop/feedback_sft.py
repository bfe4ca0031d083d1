"""SFT pairs that teach a model to use the verdict's feedback: ``failed attempt + feedback -> teacher's fix``.

A model distilled on single-turn prompts has never seen text after its own EOS, so the feedback of a
multi-turn episode (:mod:`core.loop.refinement`) means nothing to it (measured in docs/training.md,
"Multi-turn refinement": none of its second attempts compiled). An SFT phase with ``feedback: true``
makes the pairs from the model's own failures:

1. the current model answers ``tasks`` training tasks greedily (held-out tasks never drawn);
2. the verifier judges every answer; the teacher answers the tasks whose answer was rejected, and
   the verifier judges those too;
3. each rejected answer with an accepted teacher answer becomes one row whose prompt is the episode's
   context after turn 1 (prompt, the failed attempt, the feedback, as token ids exactly as an episode
   holds them) and whose completion is the teacher's kernel;
4. as many single-turn pairs of the run's first distillation phase are replayed beside them
   (``<first sft phase>_pairs.jsonl``), so turn 1 is not forgotten.

Rows are token-level (``input_ids``, ``completion_mask``), which TRL's ``SFTTrainer`` takes as they are.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from core.loop.attempts import attempt
from core.loop.refinement import Generate, RefinementEnv, generate_ids
from core.task import Task

TokenRow = dict[str, list[int]]


def greedy(model: Any, tokenizer: Any, max_new_tokens: int, batch: int = 8) -> Generate:
    """``contexts -> new ids``: ``model`` decoding greedily, ``batch`` contexts at a time."""
    model.eval()

    def generate(contexts: list[list[int]]) -> list[list[int]]:
        out: list[list[int]] = []
        for start in range(0, len(contexts), batch):
            out += generate_ids(model, contexts[start:start + batch], pad_token_id=tokenizer.pad_token_id,
                                eos_token_ids=tokenizer.eos_token_id, do_sample=False, max_new_tokens=max_new_tokens)
        return out

    return generate


def row(context: list[int], target: list[int]) -> TokenRow:
    return {"input_ids": context + target, "completion_mask": [0] * len(context) + [1] * len(target)}


def feedback_rows(env: RefinementEnv, tasks: Sequence[Task], prompts: Sequence[str], generate: Generate,
                  teacher: Any, completion_for: Any) -> tuple[list[TokenRow], dict[str, int]]:
    """Rows ``context after a rejected turn 1 -> teacher's accepted kernel`` and the counts behind them.

    :param completion_for: ``solution source -> completion text`` (the coder's SFT target format).
    """
    tok = env.tokenizer
    single = RefinementEnv(verifier=env.verifier, tokenizer=tok, mix=env.mix, turns=1, backend=env.backend,
                           to_candidate=env.to_candidate)
    episodes = single.play(list(tasks), list(prompts), generate)
    failed = [e for e in episodes if not e.turns[0].verdict.accepted]
    answered = attempt(teacher, [e.task for e in failed], env.verifier, env.backend)
    fixes = {task.id: cand for task, cand, _ in answered.accepted()}
    rows = [row(e.prompt_ids + e.turns[0].completion_ids + env.feedback_ids(e.turns[0].verdict),
                env.encode(completion_for(fixes[e.task.id].source)) + [tok.eos_token_id])
            for e in failed if e.task.id in fixes]
    return rows, {"tasks": len(episodes), "failed_turn_1": len(failed), "teacher_fixes": len(fixes), "pairs": len(rows)}


def replay_rows(path: Path, tokenizer: Any, n: int) -> list[TokenRow]:
    """The first ``n`` prompt/completion pairs of an SFT pairs file, as token rows (EOS appended, as TRL does)."""
    if n <= 0 or not path.exists():
        return []
    pairs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()][:n]
    return [row(tokenizer(p["prompt"], add_special_tokens=False)["input_ids"],
                tokenizer(p["completion"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])
            for p in pairs]


# Seed offset of the proposer that draws a feedback phase's tasks (apart from the run's other proposers).
FEEDBACK_SEED_OFFSET = 1_299_709


def phase_rows(training: Any, phase: Any, exclude: set[str]) -> list[TokenRow]:
    """The rows of a ``feedback: true`` SFT phase of a training run (the current model's failures)."""
    from omegaconf import OmegaConf

    from core.config import build
    from core.contracts import optional
    from core.loop.attempts import copy_state, propose
    from core.loop.rewards import RewardMix

    coder, backend = training.coder, training.backend
    tok = coder.hf_tokenizer
    proposer = training.heldout.guard(build("proposer", training.cfg.proposer, seed=training.seed + FEEDBACK_SEED_OFFSET))
    tasks = propose(proposer, phase.tasks, copy_state(training.curriculum.state), exclude)
    reward = {k: v for k, v in OmegaConf.to_container(training.cfg.reward, resolve=True).items() if k != "name"}
    env = RefinementEnv(verifier=training.verifier, tokenizer=tok, mix=RewardMix(**reward), turns=2, backend=backend,
                        feedback_tokens=int(optional(coder, "Coder", "feedback_tokens")),
                        to_candidate=lambda task, text: coder.to_candidate(task, text, backend))
    generate = greedy(coder.hf_model, tok, int(optional(coder, "Coder", "max_new_tokens")))
    rows, counts = feedback_rows(env, tasks, [coder.prompt(t, backend) for t in tasks], generate,
                                 training.teacher(phase), coder.completion_for)
    first = next((p for p in training.settings.phases if p.kind == "sft" and not p.feedback), None)
    replayed = replay_rows(training.out / f"{first.name}_pairs.jsonl", tok, len(rows)) if first else []
    training.console.print(f"{phase.name}: feedback pairs from {counts['tasks']} tasks: {counts['failed_turn_1']} "
                           f"rejected, {counts['pairs']} with the teacher's fix; {len(replayed)} single-turn pairs "
                           f"replayed")
    return rows + replayed

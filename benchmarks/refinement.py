"""Does the verdict's feedback help? pass@1 after turn 1 vs after turn k on a training run's held-out tasks.

    python -m benchmarks.refinement --run RUN_DIR [--turns 3] [--feedback-sft 300] \
        [--out refinement.json] [--plot refinement.png]

``RUN_DIR`` is the output directory of a ``python -m core.run`` training run (its ``.hydra/config.yaml``
and ``train_state.json`` say which coder, tasks and model). The held-out tasks are the run's own
(the reserved eval bucket, never trained on). Each task is one episode of
:class:`core.loop.refinement.RefinementEnv`, generated greedily: turn 1 is the run's held-out
evaluation; a rejected attempt is followed by the verdict's reason and failing check's detail
(``coder.feedback_tokens``) and the model writes again, up to ``--turns`` turns. Every attempt is
judged by the run's sandboxed verifier. "pass@1 after turn t" is the share of tasks accepted at a
turn <= t.

``--feedback-sft STEPS`` then teaches the model to use feedback and measures again, with the rows a
``feedback: true`` SFT phase makes (:mod:`core.loop.feedback_sft`): the model answers ``--sft-tasks``
*training* tasks (the held-out bucket excluded), the teacher (``expert``) answers the ones it failed,
and each verified teacher answer becomes one pair ``prompt + failed attempt + feedback -> teacher's
kernel`` (token ids exactly as an episode's context holds them), mixed with as many of the run's own
distillation pairs (replay, so turn 1 is not forgotten).
The SFT'd model is measured twice: with the feedback, and with an empty feedback budget (the same
"# Fix it." retry prompt without the verdict's words), which tells the feedback's content from a
second attempt in a new context.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from core.loop.feedback_sft import feedback_rows, greedy, replay_rows
from core.loop.refinement import Episode, RefinementEnv
from core.loop.rewards import RewardMix

# Seed offset of the proposer that draws the feedback-SFT tasks (apart from every other proposer of the run).
SFT_SEED_OFFSET = 7_340_033


def run_config(run: Path, overrides: Sequence[str] = ()) -> DictConfig:
    """The run's own composed config (``.hydra/config.yaml``), ``key=value`` overrides merged on top."""
    cfg = OmegaConf.merge(OmegaConf.load(run / ".hydra" / "config.yaml"), OmegaConf.from_dotlist(list(overrides)))
    with open_dict(cfg):
        cfg.out_dir = str(run)
    return cfg


def load_training(run: Path, verifier: Any, model_dir: Path | None = None, overrides: Sequence[str] = ()):
    """The run's :class:`core.loop.training.Training` (config, held-out tasks, coder with its trained model,
    or with the model saved in ``model_dir``)."""
    from core.loop.training import Training

    training = Training(run_config(run, overrides), verifier, reader=True)
    if model_dir is not None:
        training.load_model_dir(str(model_dir))
        return training
    if not training.progress.get("model"):
        raise SystemExit(f"{run} has no trained model yet (train_state.json names none); finish the run first")
    training._load_coder()
    return training


def summarise(episodes: list[Episode], turns: int, seconds: float) -> dict[str, Any]:
    n = max(1, len(episodes))
    first_fail = [e.turns[0].verdict for e in episodes if not e.turns[0].verdict.accepted]
    refined = [e for e in episodes if len(e.turns) > 1]
    repeated = sum(e.turns[1].candidate.source == e.turns[0].candidate.source for e in refined)
    return {
        "tasks": len(episodes),
        "pass_after_turn": [sum(e.passed_by(t) for e in episodes) / n for t in range(1, turns + 1)],
        "compile_at_turn": [sum(len(e.turns) >= t and e.turns[t - 1].verdict.compiled for e in episodes)
                            / max(1, sum(len(e.turns) >= t for e in episodes)) for t in range(1, turns + 1)],
        "rejected_at_turn_1": len(first_fail),
        "first_failures": dict(Counter((v.reason or v.status).split(":")[0] for v in first_fail).most_common()),
        "second_turn_repeats_first": repeated, "second_turns": len(refined),
        "seconds": round(seconds, 1),
    }


def measure(env: RefinementEnv, training: Any, tasks: list, label: str) -> dict[str, Any]:
    coder, backend = training.coder, training.backend
    t0 = time.perf_counter()
    episodes = env.play(tasks, [coder.prompt(t, backend) for t in tasks], greedy(coder.hf_model, coder.hf_tokenizer, coder.max_new_tokens, coder.batch_size))
    result = summarise(episodes, env.turns, time.perf_counter() - t0)
    curve = " -> ".join(f"{p:.3f}" for p in result["pass_after_turn"])
    print(f"{label}: pass@1 after turn 1..{env.turns}: {curve} on {len(tasks)} held-out tasks; "
          f"{result['rejected_at_turn_1']} rejected at turn 1 ({result['first_failures']}); second turn repeats the "
          f"first in {result['second_turn_repeats_first']}/{result['second_turns']} ({result['seconds']} s)", flush=True)
    return result


def feedback_pairs(env: RefinementEnv, training: Any, n_tasks: int) -> tuple[list[dict[str, list[int]]], dict[str, int]]:
    """The feedback phase's rows (:mod:`core.loop.feedback_sft`) for ``n_tasks`` training tasks."""
    from core.config import build
    from core.loop.attempts import copy_state, propose

    coder, backend = training.coder, training.backend
    proposer = training.heldout.guard(build("proposer", training.cfg.proposer, seed=training.seed + SFT_SEED_OFFSET))
    tasks = propose(proposer, n_tasks, copy_state(training.curriculum.state))
    generate = greedy(coder.hf_model, coder.hf_tokenizer, coder.max_new_tokens, coder.batch_size)
    return feedback_rows(env, tasks, [coder.prompt(t, backend) for t in tasks], generate, training.teacher(),
                         coder.completion_for)


def feedback_sft(training: Any, rows: list[dict[str, list[int]]], steps: int, lr: float, out: Path) -> dict[str, float]:
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    coder = training.coder
    args = SFTConfig(output_dir=str(out), max_steps=steps, learning_rate=lr, per_device_train_batch_size=8,
                     completion_only_loss=True, packing=False, max_length=4096, report_to=[], save_strategy="no",
                     logging_steps=max(1, steps // 10), use_cpu=coder.hf_model.device.type == "cpu",
                     seed=training.seed)
    trainer = SFTTrainer(model=coder.hf_model, args=args, train_dataset=Dataset.from_list(rows),
                         processing_class=coder.hf_tokenizer)
    trainer.train()
    coder.set_model(trainer.model)
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    return {"steps": steps, "pairs": len(rows), "loss_first": losses[0], "loss_last": losses[-1]}


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for key, label, style in (("base", "trained model (the run's)", "-"), ("feedback_sft", "after feedback SFT", "-"),
                              ("feedback_sft_no_feedback", "after feedback SFT, feedback withheld", "--")):
        if key in result:
            ys = result[key]["pass_after_turn"]
            ax.plot(range(1, len(ys) + 1), ys, style, marker="o", label=label)
    ax.set_xlabel("turn (attempts so far)")
    ax.set_ylabel("held-out pass@1 (accepted by turn t)")
    ax.set_xticks(range(1, result["turns"] + 1))
    ax.set_ylim(0, 1)
    ax.set_title(f"Refinement from verdict feedback, {result['base']['tasks']} held-out tasks")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", type=Path, required=True, help="a finished `python -m core.run` output directory")
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--tasks", type=int, default=None, help="held-out tasks (default: the run's trainer.eval_tasks)")
    p.add_argument("--feedback-tokens", type=int, default=None, help="default: the run's coder.feedback_tokens")
    p.add_argument("--feedback-sft", type=int, default=0, help="SFT steps on feedback pairs, then measure again")
    p.add_argument("--sft-tasks", type=int, default=256)
    p.add_argument("--sft-lr", type=float, default=1e-3)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--plot", type=Path, default=None)
    a = p.parse_args(argv)
    from core.contracts import optional
    from core.verification.executor import executor_for_run

    t0 = time.perf_counter()
    cfg = run_config(a.run)
    with executor_for_run(cfg) as verifier:
        training = load_training(a.run, verifier)
        budget = a.feedback_tokens or int(optional(training.coder, "Coder", "feedback_tokens"))
        mix = RewardMix(**{k: v for k, v in OmegaConf.to_container(cfg.reward, resolve=True).items() if k != "name"})
        coder, backend = training.coder, training.backend
        env = RefinementEnv(verifier=verifier, tokenizer=coder.hf_tokenizer, mix=mix, turns=a.turns,
                            discount=training.settings.turn_discount, feedback_tokens=budget, backend=backend,
                            to_candidate=lambda task, text: coder.to_candidate(task, text, backend))
        if a.tasks:
            training.settings.eval_tasks = a.tasks  # more tasks from the same reserved eval bucket
        tasks = training._held_out_tasks()
        result: dict[str, Any] = {"run": str(a.run), "model": training.progress["model"], "turns": a.turns,
                                  "feedback_tokens": budget, "base": measure(env, training, tasks, "trained model")}
        if a.feedback_sft:
            rows, counts = feedback_pairs(env, training, a.sft_tasks)
            replay = replay_rows(training.out / "distill_pairs.jsonl", training.coder.hf_tokenizer, len(rows))
            print(f"feedback SFT data: {counts}; + {len(replay)} replayed distillation pairs", flush=True)
            result["feedback_sft_data"] = {**counts, "replayed": len(replay)}
            if rows:
                result["feedback_sft_train"] = feedback_sft(training, rows + replay, a.feedback_sft, a.sft_lr,
                                                            a.run / "feedback_sft")
                result["feedback_sft"] = measure(env, training, tasks, "after feedback SFT")
                env.feedback_tokens = 0
                result["feedback_sft_no_feedback"] = measure(env, training, tasks, "after feedback SFT, feedback withheld")
    result["seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(result, indent=2))
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(result, indent=2) + "\n")
    if a.plot:
        plot(result, a.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

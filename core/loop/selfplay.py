"""Self-play rounds without learning: propose -> code -> verify -> reward -> feedback -> curriculum.

This is the loop of DESIGN.md with the coder held fixed (an expert teacher, or a frozen model);
``core.loop.training`` runs the same data flow with a TRL trainer updating the coder between steps.

Self-play that cannot judge anything fails instead of reporting a pass rate over nothing: a backend
that cannot run kernels on this machine (``backend=cuda`` without a GPU) is refused before the first
round, and a run whose every answer the coder declined ends with the decline reasons and an error.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from core.config import build, resolve_device
from core.loop.attempts import attempt
from core.loop.console import print_table, run_console
from core.loop.rewards import RewardMix, mix_kwargs, unmeasurable_terms
from core.plugins import PluginError, notify
from core.task import Candidate, Task
from core.verdict import Verdict


@dataclass
class RoundResult:
    round_index: int
    tasks: list[Task]
    candidates: list[Candidate]
    verdicts: list[Verdict]
    rewards: list[float]
    per_term: dict[str, list[float]]
    declined: int
    seconds: float
    metrics: dict[str, float] = field(default_factory=dict)
    # why the coder declined, with how many answers for each reason
    decline_reasons: Counter = field(default_factory=Counter)


def round_metrics(result: RoundResult, reward_terms: Sequence[str]) -> dict[str, float]:
    n = len(result.verdicts)
    metrics: dict[str, float] = {
        "round": result.round_index,
        "tasks": len(result.tasks),
        "attempts": n,
        "declined": result.declined,
        "pass_rate": sum(v.accepted for v in result.verdicts) / n if n else 0.0,
        "compile_rate": sum(v.compiled for v in result.verdicts) / n if n else 0.0,
        "mean_reward": sum(result.rewards) / n if n else 0.0,
        "hack_flag_rate": sum(bool(v.hack_flags) for v in result.verdicts) / n if n else 0.0,
        "adversarial_share": (sum(bool(t.adversarial) for t in result.tasks) / len(result.tasks)
                              if result.tasks else 0.0),
        "seconds": result.seconds,
    }
    for term in reward_terms:
        values = result.per_term.get(term, [])
        metrics[f"reward/{term}"] = sum(values) / len(values) if values else 0.0
    return metrics


class SelfPlay:
    """Ties a proposer, a coder, a verifier, a reward mix and a curriculum into rounds.

    ``verifier`` is a ``core.verification.executor`` executor (``verify_many(pairs, on_verdicts=...)``).
    """

    def __init__(self, *, proposer: Any, coder: Any, verifier: Any, reward: RewardMix, curriculum: Any,
                 backend: str, tasks_per_round: int, samples_per_task: int = 1,
                 out_dir: str | Path | None = None, console: Console | None = None):
        self.proposer, self.coder, self.verifier = proposer, coder, verifier
        self.reward, self.curriculum, self.backend = reward, curriculum, backend
        self.tasks_per_round, self.samples_per_task = tasks_per_round, samples_per_task
        self.out_dir = Path(out_dir) if out_dir else None
        self.console = console or run_console()
        self.history: list[dict[str, float]] = []

    def run_round(self, round_index: int, progress: Progress | None = None) -> RoundResult:
        start = time.perf_counter()
        stage = progress.add_task(f"round {round_index}: propose", total=None) if progress else None

        def advance(description: str, **kw: Any) -> None:
            if progress is not None and stage is not None:
                progress.update(stage, description=f"round {round_index}: {description}", **kw)

        tasks = self.proposer.propose(self.tasks_per_round, self.curriculum.state)
        advance("code")
        done = 0

        def coded(pairs: list[tuple[Task, Candidate]]) -> None:
            advance("verify", total=len(pairs), completed=0)

        def landed(indices: list[int], _verdicts: list[Verdict]) -> None:
            nonlocal done
            done += len(indices)
            advance("verify", completed=done)

        # One batch over every worker (a lost worker's pairs are retried); progress as verdicts land.
        attempts = attempt(self.coder, tasks, self.verifier, self.backend, self.samples_per_task,
                           on_answers=coded, on_verdicts=landed, hooks=True)
        pairs, verdicts, declined = attempts.pairs, attempts.verdicts, attempts.declined
        pair_tasks = [t for t, _ in pairs]
        per_term = self.reward.per_term(verdicts, pair_tasks, attempts.candidates)
        rewards = self.reward.combine(per_term) if per_term else [0.0] * len(verdicts)
        self.proposer.feedback(attempts.solve_rates())
        result = RoundResult(round_index, tasks, [c for _, c in pairs], verdicts, rewards, per_term, declined,
                             time.perf_counter() - start)
        result.decline_reasons = Counter(str(c.declined) for samples in attempts.answers for c in samples
                                         if c.declined)
        result.metrics = round_metrics(result, list(self.reward.terms))
        decisions = self.curriculum.update(result.metrics)
        for decision in decisions:
            self.console.print(f"[cyan]curriculum[/]: {decision}")
        notify("on_round_end", round_index=round_index, metrics=result.metrics)
        if progress is not None and stage is not None:
            progress.update(stage, description=f"round {round_index}: done", completed=len(pairs))
        return result

    def run(self, rounds: int) -> list[dict[str, float]]:
        """``rounds`` rounds; every round's metrics. PluginError when the coder declined every answer."""
        declines: Counter = Counter()
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=self.console, transient=False) as progress:
            for r in range(rounds):
                result = self.run_round(r, progress)
                self.history.append(result.metrics)
                m = result.metrics
                progress.console.print(
                    f"round {r}: tasks {m['tasks']:.0f}, attempts {m['attempts']:.0f}, "
                    f"pass rate {m['pass_rate']:.3f}, mean reward {m['mean_reward']:.3f}, "
                    f"declined {m['declined']:.0f}, {m['seconds']:.1f}s",
                    soft_wrap=True,
                )
                if result.decline_reasons:
                    declines.update(result.decline_reasons)
                    progress.console.print(f"round {r}: declined because " + reasons(result.decline_reasons),
                                           soft_wrap=True, markup=False, highlight=False)
                if self.out_dir is not None:
                    self._write_round(result)
        self.print_summary()
        if declines and not sum(m["attempts"] for m in self.history):
            name = self.coder.name
            raise PluginError(
                f"coder {name!r} declined all {sum(declines.values())} answers on backend {self.backend!r}, so "
                f"nothing was verified: {reasons(declines)}. Choose a coder that writes for {self.backend!r} "
                f"(coder=llm), or a backend this coder writes for")
        return self.history

    def _write_round(self, result: RoundResult) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with open(self.out_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(result.metrics) + "\n")
        with open(self.out_dir / "verdicts.jsonl", "a") as f:
            for cand, verdict, reward in zip(result.candidates, result.verdicts, result.rewards):
                f.write(json.dumps({"round": result.round_index, "task_id": cand.task_id, "reward": reward,
                                    "verdict": verdict.to_dict()}, default=str) + "\n")

    def print_summary(self) -> None:
        if not self.history:
            return
        rows = [(f"{m['round']:.0f}", f"{m['tasks']:.0f}", f"{m['attempts']:.0f}", f"{m['pass_rate']:.3f}",
                 f"{m['mean_reward']:.3f}", f"{m['hack_flag_rate']:.3f}", f"{m['seconds']:.1f}") for m in self.history]
        print_table(self.console, "self-play rounds",
                    ("round", "tasks", "attempts", "pass rate", "mean reward", "hack flags", "seconds"), rows)
        attempts = sum(m["attempts"] for m in self.history)
        passed = sum(m["pass_rate"] * m["attempts"] for m in self.history)
        rate = passed / attempts if attempts else 0.0
        declined = sum(m["declined"] for m in self.history)
        self.console.print(f"overall pass rate {rate:.3f} over {attempts:.0f} attempts"
                           + (f" ({declined:.0f} answers declined, never verified)" if declined else ""))


def reasons(counts: Counter) -> str:
    """``"6 x the expert lowers to ('triton',), not 'cuda'"`` for the most common reasons."""
    return "; ".join(f"{n} x {why}" for why, n in counts.most_common(3)) + (
        f"; and {len(counts) - 3} other reason(s)" if len(counts) > 3 else "")


def refuse_unrunnable_backend(cfg: DictConfig) -> None:
    """PluginError, before anything starts, when the backend cannot run kernels on this run's device.

    Self-play accepts an answer only when it ran correctly; where the backend cannot execute (CUDA C
    without a GPU only compiles, to PTX) every verdict would stop at compile and nothing could pass."""
    device = resolve_device(str(cfg.device))
    why = build("backend", cfg.backend).supports(device)
    if why:
        raise PluginError(f"backend {cfg.backend.name!r} cannot run kernels on {device} here, so self-play could "
                          f"accept no answer (verification would stop after compiling): {why}")


def run_selfplay(cfg: DictConfig) -> list[dict[str, float]]:
    """``cfg.rounds`` self-play rounds with the configured plugins; every round's metrics, in order."""
    from core.evaluation.suites import HeldOut
    from core.verification.executor import executor_for_run

    backend_name = cfg.backend.name
    refuse_unrunnable_backend(cfg)
    # Tasks ever used for evaluation (core.eval's registry) never reach training or self-play.
    proposer = HeldOut.load().guard(build("proposer", cfg.proposer, seed=cfg.seed))
    coder = build("coder", cfg.coder)
    curriculum = build("curriculum", cfg.curriculum)
    reward = RewardMix(**mix_kwargs(OmegaConf.to_container(cfg.reward, resolve=True)))
    unmeasured = unmeasurable_terms({"the run's reward": reward}, resolve_device(str(cfg.device)))
    if unmeasured:
        run_console().print(f"[bold yellow]warning[/]: {unmeasured}")
    with executor_for_run(cfg) as verifier:
        loop = SelfPlay(proposer=proposer, coder=coder, verifier=verifier, reward=reward, curriculum=curriculum,
                        backend=backend_name, tasks_per_round=cfg.tasks_per_round,
                        samples_per_task=cfg.samples_per_task, out_dir=cfg.out_dir)
        return loop.run(cfg.rounds)


def selfplay_trainer(cfg: DictConfig) -> dict[str, float] | None:
    """The ``none`` trainer (self-play, no learning): the last round's metrics, or None without rounds."""
    history = run_selfplay(cfg)
    return history[-1] if history else None

"""Training the coder through TRL: distillation (``SFTTrainer``) then GRPO self-play (``GRPOTrainer``).

The ``grpo`` and ``embedded`` trainers (``plugins/trainers.py``) call :func:`run_training`. The trainer
config lists phases in order (``distill`` -> ``correctness`` -> ``performance`` by default); each has
a ``kind`` (``sft`` or ``grpo``), a step budget and, for GRPO, its own reward mix. The pieces:

- :mod:`core.loop.training_config`: :class:`Phase` and :class:`TrainSettings` (the ``trainer`` group);
- :mod:`core.loop.sft`: the SFT phase and its dataset of verified teacher pairs;
- :mod:`core.loop.grpo`: the GRPO phase and its per-step callback (metrics, feedback, curriculum);
- :mod:`core.loop.shared_verification`: one verification per completion behind every TRL reward function;
- :mod:`core.loop.phase_common`: arguments, checkpoint state and resuming shared by both phases;
- this module: :class:`Training`, which evaluates held-out tasks before, between and after the
  phases and runs them in order.

Checkpoints: TRL saves model and optimiser every ``save_steps``; beside each checkpoint the run
writes ``kernelzero_state.json`` (proposer and curriculum state, step offsets). A run restarted on
the same output directory (``trainer.resume=auto``) skips finished phases and resumes the current
one from its last complete checkpoint.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from rich.console import Console

from core.config import build, resolve_device
from core.contracts import CurriculumState, optional
from core.evaluation.suites import HeldOut
from core.loop.attempts import attempt, copy_state
from core.loop.console import run_console
from core.loop.control import run_control
from core.loop.grpo import run_grpo
from core.loop.metrics import MetricsLog, plot_summary
from core.loop.phase_common import STATE_FILE
from core.loop.report import (
    headline,
    print_learning_curve,
    print_results,
    proposer_label,
    read_decisions,
    run_summary,
)
from core.loop.rewards import reward_notes
from core.loop.run_lock import hold_run_dir
from core.loop.sft import run_sft
from core.loop.shared_verification import ScoredBatch, SharedVerification
from core.loop.training_config import PHASE_KINDS, Phase, TrainingError, TrainSettings
from core.plugins import registry
from core.task import Task

log = logging.getLogger(__name__)

PROGRESS_FILE = "train_state.json"
# What runs each phase kind: ``runner(training, phase, exclude)``.
PHASE_RUNNERS: dict[str, Callable[[Any, Phase, set[str]], None]] = {"sft": run_sft, "grpo": run_grpo}

__all__ = ["PHASE_KINDS", "PROGRESS_FILE", "STATE_FILE", "Phase", "ScoredBatch", "SharedVerification", "TrainSettings",
           "Training", "TrainingError", "make_verifier", "run_training"]


def make_verifier(cfg: DictConfig):
    """The verification executor for the run (tests replace this function with a fake)."""
    from core.verification.executor import executor_for_run

    return executor_for_run(cfg)


def run_training(cfg: DictConfig) -> dict[str, Any]:
    """Train the configured coder through the configured phases; return the run's summary.

    The summary holds ``pass_rate`` (held-out pass rate after training), ``pass_rate_before``,
    ``steps``, ``metrics`` (path of metrics.jsonl) and ``plot`` (path of the summary PNG).
    """
    with make_verifier(cfg) as verifier:
        return Training(cfg, verifier).run()


class Training:
    """One training run on ``cfg`` with ``verifier`` (anything with ``verify_many``)."""

    def __init__(self, cfg: DictConfig, verifier: Any, console: Console | None = None, reader: bool = False):
        """``reader``: this process only evaluates the run's saved models; it shares the run directory with
        other readers and waits for no trainer (core/loop/run_lock.py)."""
        self.cfg, self.verifier = cfg, verifier
        self.console = console or run_console()
        self.settings = TrainSettings.from_config(cfg.trainer)
        if self.settings.torch_threads:
            import torch

            # On a small CPU machine the verifier's workers share the cores; torch's default of one
            # thread per core then oversubscribes them and generation slows down 10-20x (measured).
            torch.set_num_threads(int(self.settings.torch_threads))
        self.out = Path(cfg.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        hold_run_dir(self.out, reader=reader)  # before anything of the directory is read or truncated
        self.backend = str(cfg.backend.name)
        self.seed = int(cfg.seed)
        self.device = resolve_device(str(cfg.device))
        # Evaluation tasks (core.eval's registry, and this run's eval bucket) never reach training.
        self.heldout = HeldOut.load(eval_share=self.settings.eval_share)
        self.proposer = self.heldout.guard(build("proposer", cfg.proposer, seed=self.seed))
        self.curriculum = build("curriculum", cfg.curriculum)
        self.coder = build("coder", cfg.coder)
        for attr in ("hf_model", "hf_tokenizer", "prompt", "to_candidate", "load"):
            if not hasattr(type(self.coder), attr):  # on the class: hf_model is a property that loads
                raise TrainingError(f"trainer {self.settings.name!r} trains a language-model coder; coder "
                                    f"{cfg.coder.name!r} has no {attr!r}. Use coder=llm (or trainer=none for "
                                    f"self-play without learning)")
        self.metrics = MetricsLog(self.out / "metrics.jsonl")
        self.reader = reader
        self.progress = self._read_progress()
        self.curriculum_log = self.out / "curriculum.jsonl"
        self.time_limit_s: float | None = None  # set while a control arm runs (core.loop.control)

    # ------------------------------------------------------------------ progress file

    def _read_progress(self) -> dict[str, Any]:
        path = self.out / PROGRESS_FILE
        if self.settings.resume == "auto" and path.exists():
            progress = json.loads(path.read_text())
            self.console.print(f"[yellow]resuming[/] from {path}: phases done {progress.get('done', [])}")
            self._check_finished_phases(progress)
            return progress
        if self.settings.resume == "never" and self.metrics.rows and not self.reader:
            self.metrics.truncate(-1)
        return {"done": [], "model": None, "step_offset": 0}

    def _check_finished_phases(self, progress: dict[str, Any]) -> None:
        """Refuse to resume when a phase the run finished is now asked for more steps than it ran.

        A finished phase is skipped on resume; extending it would leave the phases and held-out
        evaluations after it built on the shorter phase's model, so the run stops here and says so
        instead of adding no steps in silence. A control arm's steps are a cap (its wall clock decides)."""
        done = set(progress.get("done", []))
        recorded = {**progress.get("steps_done", {}), **progress.get("phase_steps", {})}
        for phase in self.settings.phases:
            if phase.name not in done or phase.control_for is not None:
                continue
            ran = int(recorded.get(phase.name, 0))
            if phase.steps > ran:
                raise TrainingError(
                    f"{self.out} already finished phase {phase.name!r} with {ran} steps; "
                    f"trainer.phases.{phase.name}.steps={phase.steps} asks for {phase.steps - ran} more, but a "
                    f"resumed run does not extend a finished phase (the phases and held-out evaluations after it "
                    f"started from its {ran}-step model). Train the longer run in a new directory "
                    f"(hydra.run.dir=...), or retrain this one from the start with trainer.resume=never")

    def _write_progress(self) -> None:
        path = self.out / PROGRESS_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.progress, indent=2, sort_keys=True))
        tmp.replace(path)

    # ------------------------------------------------------------------ the whole run

    def run(self) -> dict[str, Any]:
        start = time.perf_counter()
        self.announce_rewards()
        self._load_coder()
        eval_tasks = self._held_out_tasks()
        if "eval_before" not in self.progress:
            self.progress["eval_before"] = self.evaluate(eval_tasks, "before training")
            self._write_progress()
        exclude = {t.id for t in eval_tasks}
        own = [p for p in self.settings.phases if p.control_for is None]
        running = [p.name for p in own if p.steps > 0]
        for phase in own:
            if phase.name in self.progress["done"]:
                continue
            if phase.steps > 0:
                self.console.rule(f"phase {phase.name} ({phase.kind}, {phase.steps} steps)")
                self.progress.setdefault("start_model", {})[phase.name] = self._start_model_dir()
                PHASE_RUNNERS[phase.kind](self, phase, exclude)
                if self.settings.eval_each_phase and phase.name != running[-1]:
                    # the held-out pass rate between phases (the last phase's is the "after" evaluation)
                    self.progress.setdefault("eval_phases", {})[phase.name] = self.evaluate(eval_tasks, f"after {phase.name}")
            self.progress["done"].append(phase.name)
            self.progress.setdefault("phase_steps", {})[phase.name] = phase.steps
            self._write_progress()
        if "eval_after" not in self.progress:
            self.progress["eval_after"] = self.evaluate(eval_tasks, "after training")
            self._write_progress()
        for phase in self.settings.phases:
            if phase.control_for is None or phase.steps == 0 or phase.name in self.progress["done"]:
                continue
            self.progress.setdefault("eval_controls", {})[phase.name] = run_control(
                self, phase, PHASE_RUNNERS[phase.kind], eval_tasks)
            self.progress["done"].append(phase.name)
            self._write_progress()
        plot = plot_summary(self.metrics.rows, self.out / "summary.png",
                            title=f"KernelZero: {self.cfg.coder.name} on {proposer_label(self.cfg)}/{self.backend}",
                            decisions=read_decisions(self.curriculum_log),
                            headline=headline(self.progress, self.settings.phases))
        print_learning_curve(self.console, self.metrics.rows)
        summary = run_summary(self.progress, len(eval_tasks))
        summary.update(steps=len(self.metrics.rows), metrics=str(self.metrics.path), plot=str(plot),
                       seconds=time.perf_counter() - start)
        (self.out / "result.json").write_text(json.dumps(summary, indent=2))
        print_results(self.console, self.progress, self.settings.phases)
        return summary

    def announce_rewards(self) -> list[str]:
        """Warn once at start where a GRPO phase's own reward block gives way to the run's ``reward`` group,
        and about weighted terms that cannot be nonzero on this device (core.loop.rewards.reward_notes)."""
        notes = reward_notes(OmegaConf.to_container(self.cfg.reward, resolve=True), self.settings.phases, self.device)
        for note in notes:
            log.info("reward: %s", note)
            self.console.print(f"[bold yellow]warning[/]: {note}")
        return notes

    def load_model_dir(self, model_dir: str | None) -> None:
        """Generate (and train) from the model saved in ``model_dir`` from now on."""
        if not model_dir:
            raise TrainingError("no model directory to load (train_state.json has no model for this phase)")
        self.coder.set_model(None)
        if (Path(model_dir) / "adapter_config.json").exists():
            self.coder.adapter = model_dir
        else:
            self.coder.model, self.coder.tokenizer = model_dir, model_dir
        self.coder.load()

    def _start_model_dir(self) -> str:
        """Where the model a phase starts from is saved (a control arm restarts from it)."""
        if self.progress.get("model"):
            return str(self.progress["model"])
        initial = self.out / "models" / "initial"
        if not (initial / "config.json").exists():
            self.coder.hf_model.save_pretrained(str(initial))
            self.coder.hf_tokenizer.save_pretrained(str(initial))
        return str(initial)

    def _load_coder(self) -> None:
        if self.progress.get("model"):
            self.load_model_dir(self.progress["model"])
            return
        corpus = None
        if optional(self.coder, "Coder", "model") == "embedded":
            corpus = self._embedded_corpus()
        self.coder.load(corpus)

    def _embedded_corpus(self) -> list[str]:
        """Tokenizer corpus: tasks from the configured proposer (its own seed) and the teacher's kernels."""
        n = int(optional(self.coder, "Coder", "corpus_tasks"))
        proposer = self.heldout.guard(build("proposer", self.cfg.proposer, seed=self.seed + 7919))
        tasks = list(proposer.propose(n, CurriculumState(max_tier=max(1, self.curriculum.state.max_tier))))
        solutions: list[str] = []
        teacher = self.teacher()
        if teacher is not None:
            answers = teacher.generate(tasks, self.backend, 1)
            solutions = [c.source for cands in answers for c in cands if not c.declined and c.source.strip()]
        self.console.print(f"embedded model: tokenizer corpus of {len(tasks)} tasks and {len(solutions)} teacher kernels")
        return self.coder.corpus(tasks, solutions, self.backend)

    def teacher(self, phase: Phase | None = None) -> Any:
        """The phase's teacher coder (the first SFT phase's without one); None when it is not registered."""
        name = phase.teacher if phase else next((p.teacher for p in self.settings.phases if p.kind == "sft"), "expert")
        kwargs = phase.teacher_kwargs if phase else {}
        if name not in registry("coder"):
            return None
        return registry("coder").create(name, **dict(kwargs))

    def _held_out_tasks(self) -> list[Task]:
        n = self.settings.eval_tasks
        if n <= 0:
            return []
        node = self.settings.eval_proposer or self.cfg.proposer
        proposer = build("proposer", node, seed=self.seed + self.settings.eval_seed_offset)
        if self.settings.eval_share <= 0:
            return list(proposer.propose(n, copy_state(self.curriculum.state)))
        # Only tasks in the reserved eval bucket, which no training proposer can yield.
        tasks: dict[str, Task] = {}
        for _ in range(200):
            for task in proposer.propose(n, copy_state(self.curriculum.state)):
                if self.heldout.in_eval_bucket(task):
                    tasks.setdefault(task.id, task)
            if len(tasks) >= n:
                return list(tasks.values())[:n]
        raise TrainingError(f"found only {len(tasks)} of {n} held-out tasks in the eval bucket "
                            f"(eval_share={self.settings.eval_share}); raise trainer.eval_share or lower eval_tasks")

    # ------------------------------------------------------------------ evaluation

    def evaluate(self, tasks: Sequence[Task], label: str) -> dict[str, Any]:
        """Greedy first-sample pass rate of the current model on ``tasks`` (held out from training)."""
        if not tasks:
            return {"pass_rate": 0.0, "compile_rate": 0.0, "tasks": 0}
        t0 = time.perf_counter()
        attempts = attempt(self.coder, tasks, self.verifier, self.backend)
        pairs, verdicts = attempts.pairs, attempts.verdicts
        accepted = sum(v.accepted for v in verdicts)
        compiled = sum(v.compiled for v in verdicts)
        passed = {task.id for task, _, _ in attempts.accepted()}
        result = {"pass_rate": accepted / len(tasks), "compile_rate": compiled / len(tasks), "tasks": len(tasks),
                  "declined": len(tasks) - len(pairs), "seconds": time.perf_counter() - t0,
                  # per task, in the held-out order: paired comparisons between stages and seeds
                  "outcomes": [int(task.id in passed) for task in tasks]}
        self.console.print(f"held-out eval {label}: pass rate {result['pass_rate']:.3f}, compile rate "
                           f"{result['compile_rate']:.3f} on {len(tasks)} tasks ({result['seconds']:.1f}s)")
        return result

"""Training the coder through TRL: distillation (``SFTTrainer``) then GRPO self-play (``GRPOTrainer``).

``core.run`` calls :func:`run_training` when ``trainer.name != "none"``. The trainer config lists
phases in order (``distill`` -> ``correctness`` -> ``performance`` by default); each has a ``kind``
(``sft`` or ``grpo``), a step budget and, for GRPO, its own reward mix. Every reward term is its own
TRL reward function named after the term (TRL logs ``rewards/<term>/mean``) and weighted through
``GRPOConfig.reward_weights``; the functions share one verification of each completion per step,
and the verifier judges a step's completions concurrently (``verify_many``).

Self-play data flow per GRPO step: the task stream asks the proposer for tasks under the
curriculum's current state -> TRL generates ``num_generations`` completions per task -> the
completions are verified once -> each reward term scores the verdicts -> TRL updates the model ->
at step end the solve rates go to ``proposer.feedback``, the step's metrics to
``curriculum.update`` (every decision is printed and kept), ``metrics.jsonl`` and ``on_step_end``.

Checkpoints: TRL saves model and optimiser every ``save_steps``; beside each checkpoint this
module writes ``kernelzero_state.json`` (proposer and curriculum state, step offsets). A run
restarted on the same output directory (``trainer.resume=auto``) skips finished phases and resumes
the current one from its last complete checkpoint.
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table

from core.config import build, resolve_device
from core.evaluation.suites import HeldOut
from core.contracts import CurriculumState
from core.loop.metrics import Attempt, MetricsLog, aggregate, latency_ratio, plot_summary, solve_rates, sparkline, step_metrics
from core.plugins import notify, registry
from core.loop.rewards import RewardMix, trl_reward_function
from core.task import Candidate, Task
from core.loop.taskstream import TaskStream
from core.verdict import Verdict

log = logging.getLogger(__name__)

STATE_FILE = "kernelzero_state.json"
PROGRESS_FILE = "train_state.json"
PHASE_KINDS = ("sft", "grpo")


class TrainingError(RuntimeError):
    """A training run is misconfigured in a way the user must fix."""


# --------------------------------------------------------------------------- configuration


@dataclass
class Phase:
    """One phase of the schedule (``trainer.phases.<name>``)."""

    name: str
    kind: str
    steps: int
    learning_rate: float = 5e-5
    reward: dict[str, Any] | None = None  # RewardMix kwargs; None = the run's ``reward`` group
    # sft only
    tasks: int = 64  # tasks the teacher is asked to solve (in-process distillation)
    dataset: str | None = None  # a ``core.distill`` JSONL instead of in-process distillation
    teacher: str = "expert"
    teacher_kwargs: dict[str, Any] = field(default_factory=dict)
    batch_size: int = 8
    max_length: int | None = None  # SFT sequence budget; None = coder.max_prompt_tokens + coder.max_new_tokens

    def __post_init__(self) -> None:
        if self.kind not in PHASE_KINDS:
            raise TrainingError(f"phase {self.name!r}: kind must be one of {PHASE_KINDS}, got {self.kind!r}")
        if self.steps < 0:
            raise TrainingError(f"phase {self.name!r}: steps must be >= 0, got {self.steps}")


@dataclass
class TrainSettings:
    """The ``trainer`` group (see conf/trainer/grpo.yaml for every key and its meaning)."""

    phases: list[Phase]
    name: str = "grpo"
    resume: str = "auto"  # auto | never
    tasks_per_step: int = 2
    num_generations: int = 4
    beta: float = 0.0
    save_steps: int = 5
    save_total_limit: int = 2
    steps_per_round: int = 5
    eval_tasks: int = 16
    eval_seed_offset: int = 1_000_003
    # Share of the task-fingerprint space reserved for this run's held-out evaluation: training
    # proposers never yield a task in it, the held-out tasks come only from it (core.evaluation.suites.HeldOut).
    eval_share: float = 0.2
    report_to: list[str] = field(default_factory=lambda: ["tensorboard"])
    logging_steps: int = 1
    torch_threads: int | None = None  # intra-op threads of the training process (None: torch's default)
    eval_each_phase: bool = False  # also evaluate the held-out tasks between phases (e.g. after SFT, before GRPO)
    grpo_kwargs: dict[str, Any] = field(default_factory=dict)  # any other GRPOConfig field
    sft_kwargs: dict[str, Any] = field(default_factory=dict)  # any other SFTConfig field

    @classmethod
    def from_config(cls, node: DictConfig | Mapping[str, Any]) -> "TrainSettings":
        data = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
        phases_node = data.pop("phases", None) or {}
        if isinstance(phases_node, list):
            phases_node = {p["name"]: {k: v for k, v in p.items() if k != "name"} for p in phases_node}
        phases = [Phase(name=name, **dict(spec)) for name, spec in phases_node.items() if spec is not None]
        known = set(cls.__dataclass_fields__) - {"phases"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise TrainingError(f"unknown trainer keys {unknown}; known keys: {sorted(known | {'phases'})}")
        if isinstance(data.get("report_to"), str):
            data["report_to"] = [data["report_to"]]
        settings = cls(phases=phases, **data)
        if not phases:
            raise TrainingError("trainer.phases is empty: list at least one phase (kind: sft or grpo)")
        if settings.resume not in ("auto", "never"):
            raise TrainingError(f"trainer.resume must be 'auto' or 'never', got {settings.resume!r}")
        return settings


# --------------------------------------------------------------------------- verification shared by rewards


@dataclass
class ScoredBatch:
    tasks: list[Task]
    candidates: list[Candidate]
    verdicts: list[Verdict]
    per_term: dict[str, list[float]]
    totals: list[float]


class SharedVerification:
    """Verifies each completion once per step; every TRL reward function reads the same verdicts.

    TRL calls the reward functions one after another on the same batch. The first call verifies
    the batch (concurrently, through ``verifier.verify_many``) and scores every term; the others
    read the cached result. Verdicts are also cached by (task id, candidate id) across steps, so a
    model repeating itself is not re-verified.
    """

    def __init__(self, *, verifier: Any, stream: TaskStream, to_candidate: Callable[[Task, str], Candidate],
                 mix: RewardMix, num_generations: int, keep: int = 4096):
        self.verifier, self.stream, self.to_candidate = verifier, stream, to_candidate
        self.mix, self.num_generations, self.keep = mix, num_generations, keep
        self._batch_key: tuple | None = None
        self._batch: ScoredBatch | None = None
        self._verdicts: "OrderedDict[tuple[str, str], Verdict]" = OrderedDict()
        self.pending: list[Attempt] = []
        self.pending_tasks: list[Task] = []
        self._groups = 0
        self.verifications = 0

    def score(self, completions: Sequence[Any], task_ids: Sequence[str], log_metric: Callable | None = None) -> ScoredBatch:
        texts = [_completion_text(c) for c in completions]
        key = tuple(zip(task_ids, texts))
        if key == self._batch_key and self._batch is not None:
            return self._batch
        tasks = [self.stream.task(tid) for tid in task_ids]
        candidates = [self.to_candidate(t, text) for t, text in zip(tasks, texts)]
        verdicts = self._verify(tasks, candidates)
        per_term = self.mix.per_term(verdicts, tasks, candidates)
        totals = self.mix.combine(per_term)
        batch = ScoredBatch(tasks, candidates, verdicts, per_term, totals)
        self._record(batch)
        self._batch_key, self._batch = key, batch
        if log_metric is not None:
            m = step_metrics(self.pending, self.mix.terms)
            for name in ("pass_rate", "information_density", "hack_flag_rate"):
                log_metric(f"kernelzero/{name}", m[name])
        return batch

    def _verify(self, tasks: list[Task], candidates: list[Candidate]) -> list[Verdict]:
        verdicts: list[Verdict | None] = [None] * len(candidates)
        todo: dict[tuple[str, str], list[int]] = {}
        for i, (task, cand) in enumerate(zip(tasks, candidates)):
            if cand.declined:
                verdicts[i] = Verdict.failure("declined", cand.declined, task_id=task.id, candidate_id=cand.id)
                continue
            k = (task.id, cand.id)
            if k in self._verdicts:
                verdicts[i] = self._verdicts[k]
            else:
                todo.setdefault(k, []).append(i)
        if todo:
            firsts = [idx[0] for idx in todo.values()]
            fresh = self.verifier.verify_many([(tasks[i], candidates[i]) for i in firsts])
            self.verifications += len(fresh)
            for (k, idx), verdict in zip(todo.items(), fresh):
                self._verdicts[k] = verdict
                notify("on_verdict", task=tasks[idx[0]], candidate=candidates[idx[0]], verdict=verdict)
                for i in idx:
                    verdicts[i] = verdict
            while len(self._verdicts) > self.keep:
                self._verdicts.popitem(last=False)
        return [v for v in verdicts if v is not None]

    def _record(self, batch: ScoredBatch) -> None:
        g = max(1, self.num_generations)
        for i, (task, verdict) in enumerate(zip(batch.tasks, batch.verdicts)):
            self.pending.append(Attempt(
                task_id=task.id, group=self._groups + i // g, accepted=bool(verdict.accepted),
                rewards={name: values[i] for name, values in batch.per_term.items()}, total=batch.totals[i],
                tier=int(task.tier), compiled=bool(verdict.compiled), hack_flags=list(verdict.hack_flags),
                latency_ratio=latency_ratio(verdict)))
        self._groups += (len(batch.tasks) + g - 1) // g
        self.pending_tasks.extend(batch.tasks)

    def take(self) -> list[Attempt]:
        """The attempts since the last call (one step's worth), forgetting them."""
        out, self.pending, self.pending_tasks = self.pending, [], []
        return out

    def reward_functions(self) -> list[Callable[..., list[float]]]:
        """One TRL reward function per term, named after the term, in the mix's order."""

        def term_fn(term: str) -> Callable[[list[Any], dict[str, Any]], list[float]]:
            def fn(completions: list[Any], kwargs: dict[str, Any]) -> list[float]:
                task_ids = kwargs.get("task_id")
                if task_ids is None:
                    raise TrainingError("reward functions need the dataset's 'task_id' column; "
                                        "keep GRPOConfig.remove_unused_columns=False")
                return self.score(completions, task_ids, kwargs.get("log_metric")).per_term[term]

            return fn

        return [trl_reward_function(term, term_fn(term)) for term in self.mix.terms]


def _completion_text(completion: Any) -> str:
    """TRL passes strings for plain prompts and message lists for conversational ones."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)


# --------------------------------------------------------------------------- the run


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

    def __init__(self, cfg: DictConfig, verifier: Any, console: Console | None = None):
        self.cfg, self.verifier = cfg, verifier
        self.console = console or Console()
        self.settings = TrainSettings.from_config(cfg.trainer)
        if self.settings.torch_threads:
            import torch

            # On a small CPU machine the verifier's workers share the cores; torch's default of one
            # thread per core then oversubscribes them and generation slows down 10-20x (measured).
            torch.set_num_threads(int(self.settings.torch_threads))
        self.out = Path(cfg.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.backend = str(cfg.backend.name)
        self.seed = int(cfg.seed)
        self.device = resolve_device(str(cfg.device))
        # Evaluation tasks (core.eval's registry, and this run's eval bucket) never reach training.
        self.heldout = HeldOut.load(eval_share=self.settings.eval_share)
        self.proposer = self.heldout.guard(build("proposer", cfg.proposer, seed=self.seed))
        self.curriculum = build("curriculum", cfg.curriculum)
        self.coder = build("coder", cfg.coder)
        for attr in ("hf_model", "hf_tokenizer", "prompt", "to_candidate", "load"):
            if not hasattr(self.coder, attr):
                raise TrainingError(f"trainer {self.settings.name!r} trains a language-model coder; coder "
                                    f"{cfg.coder.name!r} has no {attr!r}. Use coder=llm (or trainer=none for "
                                    f"self-play without learning)")
        self.metrics = MetricsLog(self.out / "metrics.jsonl")
        self.progress = self._read_progress()
        self.curriculum_log = self.out / "curriculum.jsonl"

    # ------------------------------------------------------------------ progress file

    def _read_progress(self) -> dict[str, Any]:
        path = self.out / PROGRESS_FILE
        if self.settings.resume == "auto" and path.exists():
            progress = json.loads(path.read_text())
            self.console.print(f"[yellow]resuming[/] from {path}: phases done {progress.get('done', [])}")
            return progress
        if self.settings.resume == "never" and self.metrics.rows:
            self.metrics.truncate(-1)
        return {"done": [], "model": None, "step_offset": 0}

    def _write_progress(self) -> None:
        path = self.out / PROGRESS_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.progress, indent=2, sort_keys=True))
        tmp.replace(path)

    # ------------------------------------------------------------------ the whole run

    def run(self) -> dict[str, Any]:
        start = time.perf_counter()
        self._load_coder()
        eval_tasks = self._held_out_tasks()
        if "eval_before" not in self.progress:
            self.progress["eval_before"] = self.evaluate(eval_tasks, "before training")
            self._write_progress()
        exclude = {t.id for t in eval_tasks}
        running = [p.name for p in self.settings.phases if p.steps > 0]
        for phase in self.settings.phases:
            if phase.name in self.progress["done"]:
                continue
            if phase.steps > 0:
                self.console.rule(f"phase {phase.name} ({phase.kind}, {phase.steps} steps)")
                if phase.kind == "sft":
                    self._run_sft(phase, exclude)
                else:
                    self._run_grpo(phase, exclude)
                if self.settings.eval_each_phase and phase.name != running[-1]:
                    # the held-out pass rate between phases (the last phase's is the "after" evaluation)
                    self.progress.setdefault("eval_phases", {})[phase.name] = self.evaluate(eval_tasks, f"after {phase.name}")
            self.progress["done"].append(phase.name)
            self._write_progress()
        after = self.evaluate(eval_tasks, "after training")
        self.progress["eval_after"] = after
        self._write_progress()
        plot = plot_summary(self.metrics.rows, self.out / "summary.png",
                            title=f"KernelZero: {self.cfg.coder.name} on {self.cfg.proposer.name}/{self.backend}")
        self.print_learning_curve()
        before = self.progress["eval_before"]
        summary = {
            "pass_rate": after["pass_rate"], "pass_rate_before": before["pass_rate"],
            "compile_rate": after["compile_rate"], "compile_rate_before": before["compile_rate"],
            "pass_rate_after_phase": {name: e["pass_rate"] for name, e in self.progress.get("eval_phases", {}).items()},
            "eval_tasks": len(eval_tasks), "steps": len(self.metrics.rows),
            "metrics": str(self.metrics.path), "plot": str(plot), "seconds": time.perf_counter() - start,
        }
        (self.out / "result.json").write_text(json.dumps(summary, indent=2))
        between = "".join(f" -> after {name} {e['pass_rate']:.3f}" for name, e in self.progress.get("eval_phases", {}).items())
        self.console.print(f"held-out pass rate: before {before['pass_rate']:.3f}{between} -> after {after['pass_rate']:.3f} "
                           f"({len(eval_tasks)} tasks); compile rate {before['compile_rate']:.3f} -> "
                           f"{after['compile_rate']:.3f}")
        return summary

    def _load_coder(self) -> None:
        model_dir = self.progress.get("model")
        if model_dir:
            if (Path(model_dir) / "adapter_config.json").exists():
                self.coder.adapter = model_dir
            else:
                self.coder.model, self.coder.tokenizer = model_dir, model_dir
            self.coder.load()
            return
        corpus = None
        if getattr(self.coder, "model", None) == "embedded":
            corpus = self._embedded_corpus()
        self.coder.load(corpus)

    def _embedded_corpus(self) -> list[str]:
        """Tokenizer corpus: tasks from the configured proposer (its own seed) and the teacher's kernels."""
        n = int(getattr(self.coder, "corpus_tasks", 200))
        proposer = self.heldout.guard(build("proposer", self.cfg.proposer, seed=self.seed + 7919))
        tasks = list(proposer.propose(n, CurriculumState(max_tier=max(1, self.curriculum.state.max_tier))))
        solutions: list[str] = []
        teacher = self._teacher()
        if teacher is not None:
            answers = teacher.generate(tasks, self.backend, 1)
            solutions = [c.source for cands in answers for c in cands if not c.declined and c.source.strip()]
        self.console.print(f"embedded model: tokenizer corpus of {len(tasks)} tasks and {len(solutions)} teacher kernels")
        return self.coder.corpus(tasks, solutions, self.backend)

    def _teacher(self, phase: Phase | None = None) -> Any:
        name = phase.teacher if phase else next((p.teacher for p in self.settings.phases if p.kind == "sft"), "expert")
        kwargs = phase.teacher_kwargs if phase else {}
        if name not in registry("coder"):
            return None
        return registry("coder").create(name, **dict(kwargs))

    def _held_out_tasks(self) -> list[Task]:
        n = self.settings.eval_tasks
        if n <= 0:
            return []
        proposer = build("proposer", self.cfg.proposer, seed=self.seed + self.settings.eval_seed_offset)
        if self.settings.eval_share <= 0:
            return list(proposer.propose(n, _copy_state(self.curriculum.state)))
        # Only tasks in the reserved eval bucket, which no training proposer can yield.
        tasks: dict[str, Task] = {}
        for _ in range(200):
            for task in proposer.propose(n, _copy_state(self.curriculum.state)):
                if self.heldout.in_eval_bucket(task):
                    tasks.setdefault(task.id, task)
            if len(tasks) >= n:
                return list(tasks.values())[:n]
        raise TrainingError(f"found only {len(tasks)} of {n} held-out tasks in the eval bucket "
                            f"(eval_share={self.settings.eval_share}); raise trainer.eval_share or lower eval_tasks")

    # ------------------------------------------------------------------ evaluation

    def evaluate(self, tasks: Sequence[Task], label: str) -> dict[str, float]:
        """Greedy first-sample pass rate of the current model on ``tasks`` (held out from training)."""
        if not tasks:
            return {"pass_rate": 0.0, "compile_rate": 0.0, "tasks": 0}
        t0 = time.perf_counter()
        answers = self.coder.generate(list(tasks), self.backend, 1)
        pairs = [(t, c[0]) for t, c in zip(tasks, answers) if not c[0].declined]
        verdicts = self.verifier.verify_many(pairs) if pairs else []
        accepted = sum(v.accepted for v in verdicts)
        compiled = sum(v.compiled for v in verdicts)
        result = {"pass_rate": accepted / len(tasks), "compile_rate": compiled / len(tasks), "tasks": len(tasks),
                  "declined": len(tasks) - len(pairs), "seconds": time.perf_counter() - t0}
        self.console.print(f"held-out eval {label}: pass rate {result['pass_rate']:.3f}, compile rate "
                           f"{result['compile_rate']:.3f} on {len(tasks)} tasks ({result['seconds']:.1f}s)")
        return result

    # ------------------------------------------------------------------ phases

    def _phase_dir(self, phase: Phase) -> Path:
        return self.out / "checkpoints" / phase.name

    def _finish_phase(self, phase: Phase, trainer: Any) -> None:
        model_dir = self.out / "models" / phase.name
        trainer.save_model(str(model_dir))
        self.coder.hf_tokenizer.save_pretrained(str(model_dir))
        self.coder.set_model(trainer.model)
        self.progress["model"] = str(model_dir)

    def _common_args(self, phase: Phase) -> dict[str, Any]:
        return dict(
            output_dir=str(self._phase_dir(phase)), max_steps=phase.steps, learning_rate=phase.learning_rate,
            logging_steps=self.settings.logging_steps, save_strategy="steps", save_steps=self.settings.save_steps,
            save_total_limit=self.settings.save_total_limit, report_to=list(self.settings.report_to),
            use_cpu=self.device == "cpu", seed=self.seed, ignore_data_skip=True, disable_tqdm=True,
        )

    def _run_sft(self, phase: Phase, exclude: set[str]) -> None:
        from trl import SFTConfig, SFTTrainer

        dataset = self._distill_dataset(phase, exclude)
        if len(dataset) == 0:
            raise TrainingError(f"phase {phase.name!r}: the distillation dataset is empty (no accepted teacher "
                                f"answers); check the teacher {phase.teacher!r} and the verifier, or set "
                                f"trainer.phases.{phase.name}.dataset to a core.distill JSONL")
        max_length = self._sft_budget(phase)
        args = SFTConfig(**self._common_args(phase), per_device_train_batch_size=phase.batch_size,
                         max_length=max_length, completion_only_loss=True, packing=False,
                         **dict(self.settings.sft_kwargs))
        trainer = SFTTrainer(model=self.coder.hf_model, args=args, train_dataset=dataset,
                             processing_class=self.coder.hf_tokenizer,
                             callbacks=[_StateCallback(self, phase)])
        _quiet(trainer)
        trainer.train(resume_from_checkpoint=self._resume_checkpoint(phase))
        rows = [r for r in trainer.state.log_history if "loss" in r]
        with open(self.out / f"{phase.name}_loss.jsonl", "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        if rows:
            self.console.print(f"{phase.name}: loss {rows[0]['loss']:.3f} -> {rows[-1]['loss']:.3f} over "
                               f"{trainer.state.global_step} steps ({len(dataset)} pairs)")
        self._finish_phase(phase, trainer)

    def _distill_dataset(self, phase: Phase, exclude: set[str]):
        from datasets import Dataset

        cache = self.out / f"{phase.name}_pairs.jsonl"
        if cache.exists():
            rows = [json.loads(line) for line in cache.read_text().splitlines() if line.strip()]
        elif phase.dataset:
            rows = self._pairs_from_jsonl(Path(phase.dataset), exclude, phase)
        else:
            rows = self._pairs_from_teacher(phase, exclude)
        cache.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return Dataset.from_list([{"prompt": r["prompt"], "completion": r["completion"]} for r in rows])

    def _pairs_from_teacher(self, phase: Phase, exclude: set[str]) -> list[dict[str, str]]:
        """Propose tasks, ask the teacher, verify every answer, keep the accepted ones as SFT pairs."""
        teacher = self._teacher(phase)
        if teacher is None:
            raise TrainingError(f"phase {phase.name!r} distils from coder {phase.teacher!r}, which is not "
                                f"registered (known coders: {', '.join(registry('coder').names())}); set "
                                f"trainer.phases.{phase.name}.teacher or .dataset (a core.distill JSONL)")
        t0 = time.perf_counter()
        proposer = self.heldout.guard(build("proposer", self.cfg.proposer, seed=self.seed + 104729))
        tasks = [t for t in proposer.propose(phase.tasks, _copy_state(self.curriculum.state)) if t.id not in exclude]
        answers = teacher.generate(tasks, self.backend, 1)
        pairs = [(t, c[0]) for t, c in zip(tasks, answers) if c and not c[0].declined]
        verdicts = self.verifier.verify_many(pairs) if pairs else []
        rows = []
        for (task, cand), verdict in zip(pairs, verdicts):
            if verdict.accepted:
                rows.append({"task_id": task.id, "prompt": self.coder.prompt(task, self.backend),
                             "completion": self.coder.completion_for(cand.source)})
        self.console.print(f"{phase.name}: teacher {phase.teacher!r} answered {len(pairs)}/{len(tasks)} tasks, "
                           f"{len(rows)} accepted by the verifier ({time.perf_counter() - t0:.1f}s)")
        return self._fitting(rows, phase)

    def _pairs_from_jsonl(self, path: Path, exclude: set[str], phase: Phase) -> list[dict[str, str]]:
        """Accepted pairs of a ``core.distill`` JSONL, re-rendered in this coder's prompt format when the
        line carries the task (``task`` object or ``source``); otherwise its prompt is used as written."""
        if not path.exists():
            raise TrainingError(f"distillation dataset {path} does not exist; write one with "
                                f"`python -m core.distill n=256 out={path}`")
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
            prompt = self.coder.prompt(task, self.backend) if task is not None else row["prompt"]
            rows.append({"task_id": row.get("task_id"), "prompt": prompt,
                         "completion": self.coder.completion_for(self.coder.extract(row["completion"]))})
        return self._fitting(rows, phase)

    def _sft_budget(self, phase: Phase) -> int:
        if phase.max_length:
            return int(phase.max_length)
        return int(getattr(self.coder, "max_prompt_tokens", 1024)) + int(getattr(self.coder, "max_new_tokens", 512))

    def _fitting(self, rows: list[dict[str, str]], phase: Phase) -> list[dict[str, str]]:
        """Drop pairs longer than the SFT budget: a truncated target never learns to stop."""
        budget = self._sft_budget(phase)
        tok = self.coder.hf_tokenizer
        kept = [r for r in rows if len(tok(r["prompt"] + r["completion"], add_special_tokens=False)["input_ids"]) < budget]
        if len(kept) < len(rows):
            self.console.print(f"[yellow]dropped {len(rows) - len(kept)} of {len(rows)} pairs longer than "
                               f"{budget} tokens (trainer.phases.{phase.name}.max_length, default coder.max_prompt_tokens + "
                               f"coder.max_new_tokens)[/]")
        return kept

    def _resume_checkpoint(self, phase: Phase) -> str | None:
        """The newest checkpoint of ``phase`` that has our state beside it (None: start fresh)."""
        if self.settings.resume == "never":
            return None
        ckpts = sorted(self._phase_dir(phase).glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
        for ckpt in reversed(ckpts):
            state_path = ckpt / STATE_FILE
            if not state_path.exists():
                continue
            state = json.loads(state_path.read_text())
            self.proposer.load_state_dict(state["proposer"])
            self.curriculum.load_state_dict(state["curriculum"])
            self.metrics.truncate(int(state["last_step"]))
            self.console.print(f"[yellow]resuming[/] phase {phase.name} from {ckpt}")
            return str(ckpt)
        return None

    def _run_grpo(self, phase: Phase, exclude: set[str]) -> None:
        from trl import GRPOConfig, GRPOTrainer

        mix_kwargs = phase.reward if phase.reward is not None else OmegaConf.to_container(self.cfg.reward, resolve=True)
        mix = RewardMix(**{k: v for k, v in dict(mix_kwargs).items() if k != "name"})
        if not mix.terms:
            raise TrainingError(f"phase {phase.name!r} has no reward terms; give it reward.weights")
        s = self.settings
        coder = self.coder
        stream = TaskStream(self.proposer, self.curriculum, prompt=lambda t: coder.prompt(t, self.backend),
                            fits=coder.fits, batch=s.tasks_per_step, exclude=exclude)
        shared = SharedVerification(verifier=self.verifier, stream=stream,
                                    to_candidate=lambda t, text: coder.to_candidate(t, text, self.backend),
                                    mix=mix, num_generations=s.num_generations)
        grpo_kwargs = dict(
            per_device_train_batch_size=s.tasks_per_step * s.num_generations, num_generations=s.num_generations,
            gradient_accumulation_steps=1, max_completion_length=int(getattr(coder, "max_new_tokens", 256)),
            temperature=float(getattr(coder, "temperature", 1.0)), top_p=float(getattr(coder, "top_p", 1.0)),
            beta=s.beta, reward_weights=[mix.weights[name] for name in mix.terms], shuffle_dataset=False,
            remove_unused_columns=False,
        )
        grpo_kwargs.update(s.grpo_kwargs)
        args = GRPOConfig(**self._common_args(phase), **grpo_kwargs)
        step_cb = _StepCallback(self, phase, shared, stream)
        trainer = GRPOTrainer(model=coder.hf_model, reward_funcs=shared.reward_functions(), args=args,
                              train_dataset=stream.dataset(), processing_class=coder.hf_tokenizer,
                              callbacks=[_StateCallback(self, phase), step_cb])
        checkpoint = self._resume_checkpoint(phase)
        _quiet(trainer)
        trainer.train(resume_from_checkpoint=checkpoint)
        step_cb.flush_round()
        self.progress["step_offset"] = int(self.progress.get("step_offset", 0)) + phase.steps
        self.console.print(f"{phase.name}: {shared.verifications} verifications, {stream.streamed} tasks streamed, "
                           f"{stream.skipped} skipped (held out or too long)")
        self._finish_phase(phase, trainer)

    # ------------------------------------------------------------------ reporting

    def print_learning_curve(self) -> None:
        rows = self.metrics.rows
        if not rows:
            return
        table = Table(title="learning curve (GRPO steps)")
        for col in ("step", "phase", "pass rate", "pass@k", "info density", "reward", "hack flags", "tiers"):
            table.add_column(col, justify="right")
        stride = max(1, len(rows) // 20)
        for r in rows[::stride] + ([rows[-1]] if (len(rows) - 1) % stride else []):
            tiers = ",".join(f"{k.split('tier')[-1]}:{int(v)}" for k, v in sorted(r.items()) if k.startswith("tasks/tier"))
            table.add_row(str(r["step"]), str(r.get("phase", "")), f"{r['pass_rate']:.3f}", f"{r['pass_at_k']:.3f}",
                          f"{r['information_density']:.3f}", f"{r['reward']:.3f}", f"{r['hack_flag_rate']:.3f}", tiers)
        self.console.print(table)
        self.console.print("pass rate   " + sparkline([r["pass_rate"] for r in rows]))
        self.console.print("pass@k      " + sparkline([r["pass_at_k"] for r in rows]))
        self.console.print("info dens.  " + sparkline([r["information_density"] for r in rows]))


def _quiet(trainer: Any) -> None:
    """Drop the callback that prints every log dict; our own step lines and TensorBoard remain."""
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)


def _copy_state(state: CurriculumState) -> CurriculumState:
    return CurriculumState(**state.to_dict())


from transformers import TrainerCallback  # noqa: E402  (after the module's own definitions, for import speed)


class _StateCallback(TrainerCallback):
    """Writes proposer and curriculum state beside every checkpoint TRL saves."""

    def __init__(self, training: Training, phase: Phase):
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


class _StepCallback(TrainerCallback):
    """After every GRPO step: metrics, proposer feedback, curriculum update, hooks, the printed curve."""

    def __init__(self, training: Training, phase: Phase, shared: SharedVerification, stream: TaskStream):
        self.training, self.phase, self.shared, self.stream = training, phase, shared, stream
        self.round_rows: list[dict[str, Any]] = []
        self.round_index = 0

    def on_step_end(self, args, state, control, **kwargs):
        t = self.training
        attempts = self.shared.take()
        step = int(t.progress.get("step_offset", 0)) + state.global_step - 1
        metrics: dict[str, Any] = {"step": step, "phase": self.phase.name}
        metrics.update(step_metrics(attempts, self.shared.mix.terms))
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
        t.console.print(f"step {step:4d} [{self.phase.name}] pass {metrics['pass_rate']:.2f} "
                        f"pass@{int(metrics['k'])} {metrics['pass_at_k']:.2f} density "
                        f"{metrics['information_density']:.2f} reward {metrics['reward']:.3f} "
                        f"compile {metrics['compile_rate']:.2f} hacks {metrics['hack_flag_rate']:.2f} {tiers}")
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

"""``python -m core.distill``: a verified distillation dataset from a teacher coder.

    python -m core.distill n=500 seed=0 out=pairs.jsonl                 # expert teacher, Triton
    python -m core.distill coder=inductor device=cuda n=200 out=ind.jsonl
    python -m core.distill proposer=mcts curriculum.max_tier=1 accepted_only=true out=easy.jsonl

Propose -> teacher -> verify every answer -> one JSONL line per attempted task:
``{"task_id", "prompt", "completion", "accepted", "verdict", "ops", "families", "adversarial",
"teacher", "backend", "candidate_id"}``. ``prompt``/``completion`` are in the LLM coder's format
(the completion closes the prompt's open code fence), ready for TRL's ``SFTTrainer``
(prompt-completion datasets). Declined tasks are counted in the summary and not written. A
``datasets.Dataset`` of the same rows (verdict as JSON text) is saved at ``<out>.dataset/``.
"""

from __future__ import annotations

import collections
import importlib
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import hydra
from omegaconf import DictConfig, OmegaConf

from core.config import build, node_kwargs, resolve_device, store_plugin_configs
from core.contracts import CurriculumState
from core.plugins import PluginError
from core.task import Candidate, Task
from core.verdict import Verdict

CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")

_FENCE_OPEN, _FENCE_CLOSE = "```python\n", "```"


@dataclass
class PromptFormat:
    """How a task becomes a prompt and a solution a completion (the student's format)."""

    guide: Callable[[Any, str], str]
    prompt: Callable[[str, str, str], str]
    completion: Callable[[str], str]


def builtin_format() -> PromptFormat:
    """A short self-contained format: guide, the reference in a fence, an open fence for ModelNew."""

    def guide(backend: Any, name: str) -> str:
        text = getattr(backend, "guide", None) if backend is not None else None
        text = text() if callable(text) else text
        if isinstance(text, str) and text.strip():
            return text.strip()
        return (f"Write `class ModelNew(nn.Module)` with the same constructor and forward signature as `Model`, "
                f"doing all compute in {name} kernels; forward may only allocate outputs, make views and launch.")

    def prompt(source: str, name: str, guide_text: str) -> str:
        return (f"# Backend: {name}\n{guide_text}\n\n# Reference\n{_FENCE_OPEN}{source.rstrip()}\n{_FENCE_CLOSE}\n"
                f"# ModelNew\n{_FENCE_OPEN}")

    return PromptFormat(guide, prompt, lambda solution: solution.rstrip() + "\n" + _FENCE_CLOSE)


def load_format(module: str | None) -> PromptFormat:
    """The prompt format of ``module`` (``backend_guide``, ``render_prompt``, ``render_completion``),
    so the dataset matches what the student coder is prompted with; the built-in one otherwise."""
    if not module:
        return builtin_format()
    try:
        mod = importlib.import_module(module)
        return PromptFormat(mod.backend_guide, lambda s, n, g: mod.render_prompt(s, n, g), mod.render_completion)
    except (ImportError, AttributeError):
        return builtin_format()


def task_families(task: Task, catalog: dict[str, Any]) -> list[str]:
    """The op families a task uses (``elementwise``, ``softmax``, ``matmul`` ...), sorted."""
    return sorted({getattr(catalog.get(op), "family", "unknown") for op in task.ops})


@dataclass
class Summary:
    proposed: int = 0
    attempted: int = 0
    declined: int = 0
    accepted: int = 0
    by_family: dict[str, collections.Counter] = field(default_factory=lambda: collections.defaultdict(collections.Counter))
    decline_reasons: collections.Counter = field(default_factory=collections.Counter)
    reject_reasons: collections.Counter = field(default_factory=collections.Counter)
    adversarial: collections.Counter = field(default_factory=collections.Counter)
    seconds: float = 0.0

    def add(self, families: Sequence[str], adversarial: bool, outcome: str, reason: str | None = None) -> None:
        if outcome == "declined":
            self.declined += 1
            self.decline_reasons[_short(reason)] += 1
        else:
            self.attempted += 1
            self.accepted += outcome == "accepted"
            if outcome != "accepted":
                self.reject_reasons[_short(reason)] += 1
        for fam in families:
            self.by_family[fam]["proposed"] += 1
            self.by_family[fam][outcome] += 1
            if outcome != "declined":
                self.by_family[fam]["attempted"] += 1
        if adversarial:
            self.adversarial["proposed"] += 1
            self.adversarial[outcome] += 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "proposed": self.proposed, "attempted": self.attempted, "declined": self.declined,
            "accepted": self.accepted,
            "attempted_share": self.attempted / max(self.proposed, 1),
            "accepted_of_attempted": self.accepted / max(self.attempted, 1),
            "by_family": {k: dict(v) for k, v in sorted(self.by_family.items())},
            "adversarial": dict(self.adversarial),
            "decline_reasons": dict(self.decline_reasons.most_common(10)),
            "reject_reasons": dict(self.reject_reasons.most_common(10)),
            "seconds": round(self.seconds, 1),
        }


def _short(reason: str | None) -> str:
    return (reason or "?").splitlines()[0][:120]


def distill(tasks: Sequence[Task], teacher: Any, verifier: Any, backend_name: str, backend_obj: Any = None,
            fmt: PromptFormat | None = None, catalog: dict[str, Any] | None = None, accepted_only: bool = False,
            progress: bool = True) -> tuple[list[dict[str, Any]], Summary]:
    """Ask ``teacher`` for every task, verify every answer, and build the rows (attempted tasks only)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    fmt = fmt or builtin_format()
    catalog = catalog if catalog is not None else _catalog()
    guide = fmt.guide(backend_obj, backend_name)
    summary = Summary(proposed=len(tasks))
    started = time.perf_counter()
    answers: list[Candidate] = [samples[0] for samples in teacher.generate(list(tasks), backend_name, 1)]
    pairs = [(t, c) for t, c in zip(tasks, answers) if not c.declined]
    with Progress(TextColumn("[bold]verifying"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[ok]}"),
                  TimeRemainingColumn(), disable=not progress, transient=True) as bar:
        job = bar.add_task("verify", total=len(pairs), ok="")
        accepted_so_far = [0]

        def tick(_: int, verdict: Verdict) -> None:
            accepted_so_far[0] += bool(verdict.accepted)
            bar.update(job, advance=1, ok=f"accepted {accepted_so_far[0]}")

        verdicts = iter(verifier.verify_many(pairs, progress=tick))
    rows: list[dict[str, Any]] = []
    for task, cand in zip(tasks, answers):
        families = task_families(task, catalog)
        if cand.declined:
            summary.add(families, bool(task.adversarial), "declined", cand.declined)
            continue
        verdict = next(verdicts)
        outcome = "accepted" if verdict.accepted else "rejected"
        summary.add(families, bool(task.adversarial), outcome, verdict.reason)
        if accepted_only and not verdict.accepted:
            continue
        rows.append({
            "task_id": task.id,
            "prompt": fmt.prompt(task.source, backend_name, guide),
            "completion": fmt.completion(cand.source),
            "accepted": bool(verdict.accepted),
            "verdict": verdict.to_dict(),
            "ops": list(task.ops),
            "families": families,
            "adversarial": task.adversarial,
            "teacher": cand.coder,
            "backend": backend_name,
            "candidate_id": cand.id,
        })
    summary.seconds = time.perf_counter() - started
    return rows, summary


def write_rows(rows: Sequence[dict[str, Any]], out: str | Path, dataset: bool = True) -> tuple[Path, Path | None]:
    """JSONL (one row per line) and, optionally, a ``datasets.Dataset`` saved at ``<out>.dataset``."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r, sort_keys=True, default=str) + "\n" for r in rows))
    if not dataset:
        return out, None
    from datasets import Dataset

    flat = [{
        "task_id": r["task_id"], "prompt": r["prompt"], "completion": r["completion"], "accepted": r["accepted"],
        "verdict": json.dumps(r["verdict"], sort_keys=True, default=str), "ops": r["ops"], "families": r["families"],
        "adversarial": list(r["adversarial"] or []), "teacher": r["teacher"] or "", "backend": r["backend"],
    } for r in rows]
    columns = ("task_id", "prompt", "completion", "accepted", "verdict", "ops", "families", "adversarial",
               "teacher", "backend")
    ds = Dataset.from_list(flat) if flat else Dataset.from_dict({c: [] for c in columns})
    path = out.with_name(out.name + ".dataset")
    ds.save_to_disk(str(path))
    return out, path


def print_summary(summary: Summary, out: Path, dataset_path: Path | None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=True)
    s = summary.to_dict()
    table = Table(title=f"distilled {s['proposed']} tasks -> {out}  ({s['seconds']} s)")
    for col in ("family", "proposed", "declined", "attempted", "accepted", "accepted/attempted"):
        table.add_column(col, justify="left" if col == "family" else "right")
    for fam, c in s["by_family"].items():
        table.add_row(fam, str(c.get("proposed", 0)), str(c.get("declined", 0)), str(c.get("attempted", 0)),
                      str(c.get("accepted", 0)), f"{c.get('accepted', 0) / max(c.get('attempted', 0), 1):.0%}")
    table.add_row("[bold]all", str(s["proposed"]), str(s["declined"]), str(s["attempted"]), str(s["accepted"]),
                  f"{s['accepted_of_attempted']:.0%}")
    console.print(table)
    console.print(f"attempted {s['attempted']}/{s['proposed']} ({s['attempted_share']:.0%}), "
                  f"accepted {s['accepted']}/{s['attempted']} ({s['accepted_of_attempted']:.0%}) of attempted")
    for title, reasons in (("declined", s["decline_reasons"]), ("rejected", s["reject_reasons"])):
        if reasons:
            console.print(f"{title}: " + "; ".join(f"{n}x {r}" for r, n in reasons.items()))
    if dataset_path is not None:
        console.print(f"dataset saved at {dataset_path}")


def _catalog() -> dict[str, Any]:
    from core.plugins import registry

    ops = registry("op")
    return {n: ops.get(n) for n in ops.names()}


@hydra.main(version_base=None, config_path=CONF_DIR, config_name="distill")
def _main(cfg: DictConfig) -> None:
    from core.propose import propose_tasks
    from core.verification.judge import Verifier

    try:
        from core.evaluation.suites import HeldOut

        # Distillation pairs are training data: evaluation tasks (core.eval's registry) are excluded.
        proposer = HeldOut.load().guard(build("proposer", cfg.proposer, seed=cfg.seed))
        teacher = build("coder", cfg.coder)
        backend_name, backend_kwargs = node_kwargs(cfg.backend)
        try:
            backend_obj = build("backend", cfg.backend)
        except PluginError:
            raise
        except Exception:  # a backend that cannot be built here still has a name and a fallback guide
            backend_obj = None
    except PluginError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    device = resolve_device(str(cfg.device))
    curriculum = CurriculumState(**OmegaConf.to_container(cfg.curriculum, resolve=True))
    tasks = propose_tasks(proposer, int(cfg.n), curriculum, progress=bool(cfg.progress))
    verifier_kwargs = OmegaConf.to_container(cfg.verifier, resolve=True)
    verifier_kwargs.pop("name", None)
    with Verifier(backend=backend_name, device=device, **verifier_kwargs) as verifier:
        rows, summary = distill(tasks, teacher, verifier, backend_name, backend_obj, load_format(cfg.prompts_module),
                                accepted_only=bool(cfg.accepted_only), progress=bool(cfg.progress))
    out, dataset_path = write_rows(rows, cfg.out, dataset=bool(cfg.dataset))
    summary_path = out.with_name(out.name + ".summary.json")
    summary_path.write_text(json.dumps(summary.to_dict(), indent=2, sort_keys=True))
    print_summary(summary, out, dataset_path)


def main() -> None:
    store_plugin_configs()
    _main()


if __name__ == "__main__":
    main()

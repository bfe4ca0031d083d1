"""Verified distillation datasets: a teacher's answers, judged, as a student's prompt/completion rows.

:func:`distill` runs the attempts loop (:mod:`core.loop.attempts`) over proposed tasks with the
teacher as coder and writes one row per attempted task (declined ones are only counted in the
:class:`Summary`): ``{"task_id", "prompt", "completion", "source", "accepted", "verdict", "ops",
"families", "adversarial", "teacher", "backend", "candidate_id"}``. ``prompt``/``completion`` are in
the student's prompt format, ready for TRL's ``SFTTrainer`` (prompt-completion datasets);
``source`` is the candidate module itself, no fence around it, as KernelBench imports a solution.

The prompt format lives in one place, with the coder that is prompted with it: a coder offers it as
its optional ``prompt_format`` member (:data:`core.contracts.OPTIONAL_MEMBERS`), and
:func:`load_format` finds the student by its registry name (``student: llm`` in conf/distill.yaml),
so core never imports a coder's module. ``python -m core.distill`` (:mod:`core.distill`) is the CLI.
"""

from __future__ import annotations

import collections
import json
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from core.contracts import optional
from core.loop.attempts import attempt
from core.plugins import PluginError, registry
from core.task import Task
from core.verdict import Verdict

log = logging.getLogger(__name__)

# The coder whose format is used when the student named offers none: the built-in LLM coder.
DEFAULT_STUDENT = "llm"


@dataclass
class PromptFormat:
    """How a task becomes a prompt and a solution a completion (the student's format).

    :ivar guide: ``guide(backend_plugin_or_None, backend_name) -> str``, the backend's prompt guide.
    :ivar prompt: ``prompt(task_source, backend_name, guide) -> str``; it ends where the completion starts.
    :ivar completion: ``completion(solution_source) -> str``, what a perfect answer to the prompt is.
    """

    guide: Callable[[Any, str], str]
    prompt: Callable[[str, str, str], str]
    completion: Callable[[str], str]


def _format_of(student: str) -> PromptFormat | None:
    if student not in registry("coder"):
        return None
    return optional(registry("coder").create(student), "Coder", "prompt_format")


def builtin_format() -> PromptFormat:
    """The built-in LLM coder's format (``llm``, the default student): guide, the reference in a
    fence, an open fence the ``ModelNew`` completion continues."""
    fmt = _format_of(DEFAULT_STUDENT)
    if fmt is None:
        raise PluginError(f"no prompt format: coder {DEFAULT_STUDENT!r} is not registered or offers no "
                          f"prompt_format (known coders: {', '.join(registry('coder').names())}); name a "
                          f"student coder that does (student=...)")
    return fmt


def load_format(student: str | None) -> PromptFormat:
    """The prompt format of the registered coder ``student``, so the dataset matches what that coder is
    prompted with; the built-in LLM coder's format when ``student`` is unset, unregistered or offers none."""
    fmt = _format_of(student) if student else None
    if fmt is not None:
        return fmt
    if student and student != DEFAULT_STUDENT:
        log.warning("coder %r is not registered or offers no prompt format (known coders: %s); "
                    "the rows are in coder %r's",
                    student, ", ".join(registry("coder").names()), DEFAULT_STUDENT)
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
            progress: bool = True, log_every: int = 0) -> tuple[list[dict[str, Any]], Summary]:
    """Ask ``teacher`` for every task, verify every answer, and build the rows (attempted tasks only).

    ``verifier`` is an executor (:func:`core.verification.executor.executor_for_run`); with
    ``progress=False`` and no ``log_every`` anything with ``verify_many(pairs)`` will do. ``log_every``
    prints a plain line to stderr every that many verdicts, for a log no bar reaches (a run cut at a
    time limit still tells how far it got).
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    fmt = fmt or builtin_format()
    catalog = catalog if catalog is not None else _catalog()
    guide = fmt.guide(backend_obj, backend_name)
    summary = Summary(proposed=len(tasks))
    started = time.perf_counter()
    bar = Progress(TextColumn("[bold]verifying"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[ok]}"),
                   TimeRemainingColumn(), disable=not progress, transient=True)
    job, accepted_so_far, landed_so_far, total = None, 0, 0, 0

    def coded(pairs: list) -> None:
        nonlocal job, total
        total = len(pairs)
        bar.start()
        job = bar.add_task("verify", total=len(pairs), ok="")

    def landed(indices: list[int], verdicts: list[Verdict]) -> None:
        nonlocal accepted_so_far, landed_so_far
        accepted_so_far += sum(bool(v.accepted) for v in verdicts)
        before, landed_so_far = landed_so_far, landed_so_far + len(indices)
        bar.update(job, advance=len(indices), ok=f"accepted {accepted_so_far}")
        if log_every and (landed_so_far // log_every > before // log_every or landed_so_far == total):
            print(f"verified {landed_so_far}/{total}, accepted {accepted_so_far}, "
                  f"{time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)

    try:
        attempts = attempt(teacher, tasks, verifier, backend_name, on_answers=coded,
                           on_verdicts=landed if progress or log_every else None)
    finally:
        bar.stop()
    rows: list[dict[str, Any]] = []
    for task, cand, verdict in attempts.outcomes():
        families = task_families(task, catalog)
        if verdict is None:
            summary.add(families, bool(task.adversarial), "declined", cand.declined)
            continue
        outcome = "accepted" if verdict.accepted else "rejected"
        summary.add(families, bool(task.adversarial), outcome, verdict.reason)
        if accepted_only and not verdict.accepted:
            continue
        rows.append({
            "task_id": task.id,
            "prompt": fmt.prompt(task.source, backend_name, guide),
            "completion": fmt.completion(cand.source),
            "source": cand.source,
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
        "task_id": r["task_id"], "prompt": r["prompt"], "completion": r["completion"], "source": r.get("source", ""),
        "accepted": r["accepted"],
        "verdict": json.dumps(r["verdict"], sort_keys=True, default=str), "ops": r["ops"], "families": r["families"],
        "adversarial": list(r["adversarial"] or []), "teacher": r["teacher"] or "", "backend": r["backend"],
    } for r in rows]
    columns = ("task_id", "prompt", "completion", "source", "accepted", "verdict", "ops", "families",
               "adversarial", "teacher", "backend")
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
    ops = registry("op")
    return {n: ops.get(n) for n in ops.names()}

"""Evaluation suites and the held-out split that keeps them out of training.

A **suite** is an ordered list of tasks, each with a ``level`` (the group it is reported under):

* a **KernelBench-layout directory**: ``DIR/level1/19_ReLU.py``, ``DIR/level2/...``. Every ``*.py``
  directly inside a ``level*`` folder is a problem file. A JSON file beside it with the same stem
  (``19_ReLU.json``, a :meth:`core.task.Task.to_dict` without ``source``) adds metadata such as the
  proposer IR; it is used only when its ``id`` (if any) names that exact source.
* a **proposer JSONL** (``python -m core.propose ... out=tasks.jsonl``): one task dict per line.
  Its level is the task's ``level`` or, failing that, ``tier<k>``.

**Ready solutions** are matched to tasks by name: ``SOL/<level>/<name>.py``, then ``SOL/<name>.py``,
then ``SOL/<task id>.py``. By default :func:`load_suite` looks for ``DIR/solutions``.

**Held-out split.** Evaluation tasks must never be trained on. :func:`fingerprint` hashes a task's
normalised syntax tree (comments, docstrings and formatting do not change it), so a re-formatted or
re-commented copy of an evaluation problem is still recognised. :class:`HeldOut` holds the
fingerprints of every evaluated suite (``core.eval`` records them in a registry file) plus an optional
hash-bucket share reserved for evaluation among *generated* tasks. Trainers and proposers call::

    from core.evaluation.suites import HeldOut
    heldout = HeldOut.load()                      # registry file (KERNELZERO_HELDOUT or the default)
    train_tasks = heldout.filter_training(tasks)  # drops every evaluation task
    proposer = heldout.guard(proposer)            # a proposer that never yields an evaluation task
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.task import Candidate, Task, TaskIdMismatch

LEVEL_DIR = re.compile(r"^level[\w-]*$", re.IGNORECASE)
ENV_HELDOUT = "KERNELZERO_HELDOUT"
DEFAULT_HELDOUT_FILE = Path("~/.cache/kernelzero/heldout.txt")


class SuiteError(ValueError):
    """A suite path that does not hold what a suite needs."""


@dataclass
class Suite:
    """Tasks in report order, the place they came from, and their levels."""

    name: str
    source: str
    tasks: list[Task]

    @property
    def levels(self) -> list[str]:
        seen: dict[str, None] = {}
        for task in self.tasks:
            seen.setdefault(level_of(task), None)
        return list(seen)

    def __len__(self) -> int:
        return len(self.tasks)


def level_of(task: Task) -> str:
    """The group a task is reported under: its ``level``, else ``tier<k>``."""
    return task.level or f"tier{task.tier}"


def _problem_order(path: Path) -> tuple[int, str]:
    """KernelBench names start with their number (``19_ReLU``): order 2 before 10."""
    head = path.stem.split("_", 1)[0]
    return (int(head) if head.isdigit() else 1 << 30, path.stem)


def _level_order(path: Path) -> tuple[int, str]:
    digits = re.sub(r"\D", "", path.name)
    return (int(digits) if digits else 1 << 30, path.name)


def _sidecar_meta(problem: Path, source: str) -> dict[str, Any]:
    sidecar = problem.with_suffix(".json")
    if not sidecar.is_file():
        return {}
    try:
        meta = json.loads(sidecar.read_text())
    except json.JSONDecodeError as exc:
        raise SuiteError(f"{sidecar}: not valid JSON ({exc}); fix or delete the metadata file") from None
    if not isinstance(meta, dict):
        raise SuiteError(f"{sidecar}: expected a JSON object of task metadata, found {type(meta).__name__}")
    meta.pop("source", None)
    if meta.get("id") and meta["id"] != Task(source=source).id:
        # Metadata of another version of the problem: ignore it rather than attach the wrong IR.
        return {}
    meta.pop("id", None)
    return meta


def load_kernelbench_dir(root: str | Path) -> Suite:
    """Every ``root/level*/<name>.py`` as a task (level = folder name), in level then problem order."""
    root = Path(root).expanduser()
    levels = sorted((p for p in root.iterdir() if p.is_dir() and LEVEL_DIR.match(p.name)), key=_level_order)
    if not levels:
        found = sorted(p.name for p in root.iterdir())[:10]
        raise SuiteError(f"{root}: expected a KernelBench layout with level folders (level1/*.py, level2/*.py ...); "
                         f"found {found or 'nothing'}. Point suite= at the folder that holds level1/")
    tasks: list[Task] = []
    for level in levels:
        for problem in sorted(level.glob("*.py"), key=_problem_order):
            source = problem.read_text()
            meta = _sidecar_meta(problem, source)
            meta["name"] = problem.stem
            meta["level"] = level.name
            tasks.append(Task.from_dict({**meta, "source": source}))
    if not tasks:
        raise SuiteError(f"{root}: the level folders {[p.name for p in levels]} hold no *.py problem files")
    return Suite(name=root.name, source=str(root), tasks=tasks)


def load_jsonl(path: str | Path) -> Suite:
    """One task dict per line (blank lines skipped), e.g. the output of ``python -m core.propose``."""
    path = Path(path).expanduser()
    tasks = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SuiteError(f"{path}:{lineno}: not valid JSON ({exc})") from None
        if not isinstance(data, dict) or "source" not in data:
            raise SuiteError(f"{path}:{lineno}: expected a task object with a 'source' key")
        try:
            tasks.append(Task.from_dict(data))
        except TaskIdMismatch as exc:  # a hand-edited source: say where, and what to do
            raise SuiteError(f"{path}:{lineno}: {exc}") from None
    if not tasks:
        raise SuiteError(f"{path}: no tasks (the file is empty)")
    return Suite(name=path.stem, source=str(path), tasks=tasks)


def load_suite(path: str | Path) -> Suite:
    """A KernelBench-layout directory or a JSONL file of tasks."""
    p = Path(str(path)).expanduser()
    if not p.exists():
        raise SuiteError(f"suite {str(path)!r} does not exist; pass suite=<KernelBench-layout dir> or "
                         f"suite=<tasks.jsonl> (an absolute path, or one relative to {os.getcwd()})")
    if p.is_dir():
        return load_kernelbench_dir(p)
    if p.suffix in (".jsonl", ".json"):
        return load_jsonl(p)
    raise SuiteError(f"suite {str(path)!r} is neither a directory nor a .jsonl file")


def solution_path(solutions: Path, task: Task) -> Path | None:
    """The ready solution file for ``task`` under ``solutions``, or None."""
    names = []
    if task.name and task.level:
        names.append(Path(task.level) / f"{task.name}.py")
    if task.name:
        names.append(Path(f"{task.name}.py"))
    names.append(Path(f"{task.id}.py"))
    for rel in names:
        if (solutions / rel).is_file():
            return solutions / rel
    return None


def load_solutions(solutions: str | Path, tasks: Sequence[Task], backend: str) -> list[Candidate]:
    """One candidate per task from a solutions folder; a task with no file gets a declined candidate."""
    root = Path(solutions).expanduser()
    if not root.is_dir():
        raise SuiteError(f"solutions folder {str(solutions)!r} does not exist; expected <dir>/<level>/<name>.py files")
    out = []
    for task in tasks:
        path = solution_path(root, task)
        if path is None:
            out.append(Candidate(source="", backend=backend, task_id=task.id, coder="solutions",
                                 declined=f"no solution file for {task.level}/{task.name} under {root}"))
        else:
            out.append(Candidate(source=path.read_text(), backend=backend, task_id=task.id, coder="solutions",
                                 meta={"path": str(path)}))
    return out


def write_kernelbench_dir(tasks: Iterable[Task], root: str | Path, level: str | None = None) -> list[Path]:
    """Render tasks as a KernelBench layout: ``root/<level>/<k>_<name>.py`` plus metadata sidecars.

    :param level: folder for every task; by default each task's ``level`` or ``level<tier + 1>``.
    :returns: the problem files written, in order.
    """
    root = Path(root)
    counters: dict[str, int] = {}
    written = []
    for task in tasks:
        folder = level or task.level or f"level{task.tier + 1}"
        counters[folder] = counters.get(folder, 0) + 1
        stem = "_".join(task.ops[:3]) if task.ops else (task.name or "task")
        stem = re.sub(r"[^\w]+", "_", stem).strip("_") or "task"
        name = f"{counters[folder]}_{stem}_{task.id[:6]}"
        target = root / folder
        target.mkdir(parents=True, exist_ok=True)
        (target / f"{name}.py").write_text(task.source)
        meta = {k: v for k, v in task.to_dict().items() if k not in ("source", "name", "level")}
        (target / f"{name}.json").write_text(json.dumps(meta, sort_keys=True, indent=1))
        written.append(target / f"{name}.py")
    return written


# --------------------------------------------------------------------------- held-out split


class _StripDocstrings(ast.NodeTransformer):
    def _strip(self, node: Any) -> Any:
        self.generic_visit(node)
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
        return node

    visit_Module = visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _strip


def fingerprint(task: Task | str) -> str:
    """Hash of the task's syntax tree without docstrings: stable under comments and re-formatting.

    Source that does not parse falls back to the hash of its whitespace-normalised text.
    """
    source = task.source if isinstance(task, Task) else task
    try:
        tree = _StripDocstrings().visit(ast.parse(source))
        canonical = ast.dump(tree, annotate_fields=False, include_attributes=False)
    except (SyntaxError, ValueError):  # ValueError: null bytes
        canonical = " ".join(source.split())
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:20]


def heldout_file(path: str | Path | None = None) -> Path:
    """The registry file: ``path``, else ``$KERNELZERO_HELDOUT``, else ``heldout.txt`` in
    ``$KERNELZERO_CACHE`` (the root of every KernelZero cache), else ``~/.cache/kernelzero/heldout.txt``."""
    root = os.environ.get("KERNELZERO_CACHE")
    chosen = path or os.environ.get(ENV_HELDOUT) or (Path(root) / "heldout.txt" if root else DEFAULT_HELDOUT_FILE)
    return Path(chosen).expanduser()


@dataclass
class HeldOut:
    """The tasks training must never see.

    :param fingerprints: :func:`fingerprint` of every evaluation task (from evaluated suites).
    :param eval_share: share of the fingerprint hash space reserved for evaluation among generated
        tasks (0 disables). A generated task in that bucket is an evaluation task wherever it was
        generated, so a proposer's eval split and its training stream can never overlap.
    """

    fingerprints: set[str] = field(default_factory=set)
    eval_share: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.eval_share < 1.0:
            raise ValueError(f"eval_share must be in [0, 1); got {self.eval_share}")
        self.fingerprints = set(self.fingerprints)

    # -- membership
    def in_eval_bucket(self, task: Task | str) -> bool:
        bucket = int(fingerprint(task)[:8], 16) / 16**8
        return bucket < self.eval_share

    def is_heldout(self, task: Task | str) -> bool:
        """True for a task that belongs to evaluation (a registered suite, or the eval bucket)."""
        return fingerprint(task) in self.fingerprints or self.in_eval_bucket(task)

    __contains__ = is_heldout

    def filter_training(self, tasks: Iterable[Task]) -> list[Task]:
        """The tasks that training may use (every held-out task dropped)."""
        return [t for t in tasks if not self.is_heldout(t)]

    def split(self, tasks: Iterable[Task]) -> tuple[list[Task], list[Task]]:
        """(training tasks, evaluation tasks) by :meth:`is_heldout`."""
        train, evaluation = [], []
        for task in tasks:
            (evaluation if self.is_heldout(task) else train).append(task)
        return train, evaluation

    def guard(self, proposer: Any, max_redraws: int = 64) -> HeldOutProposer:
        """Wrap a proposer so that it never yields a held-out task."""
        return HeldOutProposer(proposer, self, max_redraws)

    # -- building and storing
    def add(self, tasks: Iterable[Task | str]) -> int:
        """Register tasks as held out; return how many were new."""
        before = len(self.fingerprints)
        self.fingerprints.update(fingerprint(t) for t in tasks)
        return len(self.fingerprints) - before

    @classmethod
    def from_suites(cls, *paths: str | Path, eval_share: float = 0.0) -> HeldOut:
        heldout = cls(eval_share=eval_share)
        for path in paths:
            heldout.add(load_suite(path).tasks)
        return heldout

    @classmethod
    def load(cls, path: str | Path | None = None, eval_share: float = 0.0) -> HeldOut:
        """Read the registry (one fingerprint per line, ``#`` comments); a missing file is empty."""
        file = heldout_file(path)
        prints: set[str] = set()
        if file.is_file():
            for line in file.read_text().splitlines():
                token = line.split("#", 1)[0].strip()
                if token:
                    prints.add(token)
        return cls(prints, eval_share)

    def record(self, tasks: Iterable[Task], path: str | Path | None = None, label: str = "") -> int:
        """Add ``tasks`` and append the new fingerprints to the registry file; return how many were new."""
        file = heldout_file(path)
        existing = HeldOut.load(file).fingerprints
        new = sorted({fingerprint(t) for t in tasks} - existing)
        self.fingerprints.update(existing)
        self.fingerprints.update(new)
        if new:
            file.parent.mkdir(parents=True, exist_ok=True)
            with open(file, "a") as f:
                if label:
                    f.write(f"# {label}\n")
                f.write("".join(f"{fp}\n" for fp in new))
        return len(new)


@dataclass
class HeldOutProposer:
    """A proposer that redraws every task the held-out set contains (same Proposer protocol)."""

    inner: Any
    heldout: HeldOut
    max_redraws: int = 64
    dropped: int = 0

    @property
    def name(self) -> str:
        return getattr(self.inner, "name", "proposer")

    def propose(self, n: int, curriculum: Any = None) -> list[Task]:
        kept: list[Task] = []
        draws = 0
        while len(kept) < n:
            batch = self.inner.propose(n - len(kept), curriculum)
            fresh = self.heldout.filter_training(batch)
            self.dropped += len(batch) - len(fresh)
            kept.extend(fresh)
            draws += 1
            if draws > self.max_redraws and len(kept) < n:
                raise RuntimeError(f"the proposer kept producing held-out evaluation tasks ({self.dropped} dropped "
                                   f"in {draws} draws); lower eval_share or widen the proposer's space")
        return kept

    def feedback(self, solve_rates: dict[str, float]) -> None:
        self.inner.feedback(solve_rates)

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)

    def __getattr__(self, item: str) -> Any:  # anything else the wrapped proposer offers
        if item == "inner":
            raise AttributeError(item)
        return getattr(self.inner, item)

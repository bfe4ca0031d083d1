"""``python -m core.propose``: write N proposed tasks as JSONL or as a directory of .py files.

    python -m core.propose proposer=random n=200 seed=1 out=tasks.jsonl
    python -m core.propose proposer=mcts n=50 out=tasks/             # tasks/0000_<id>.py ...
    python -m core.propose proposer.max_ops=5 curriculum.max_tier=1 out=easy.jsonl
    python -m core.propose n=200 layout=kernelbench out=suite/    # suite/level1/1_relu_<id>.py ...

Each JSONL line is ``Task.to_dict()``: at least ``id`` (content hash), ``source`` (the KernelBench
module), ``ops`` and ``adversarial`` (null or the edge-case tags). The same seed and config give
the same tasks in the same order.

``layout=kernelbench`` writes the folders KernelBench reads, ``out/level<N>/<k>_<ops>_<id>.py`` with
``k`` counting from 1 in each level, plus a ``.json`` sidecar per problem holding the rest of
``Task.to_dict()`` (so ``core.eval suite=out/`` gets the program IR back). The level follows
KernelBench's own definition, not the op tier: one op is a single-kernel operator (``level1``), two
or more are a fusion pattern (``level2``) (:func:`kernelbench_level`). A proposed task is never a
whole architecture (``level3``).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from core.cli import cannot_start
from core.config import build, conf_dir, store_plugin_configs
from core.contracts import CurriculumState
from core.task import Task

CONF_DIR = conf_dir()


def propose_tasks(proposer: Any, n: int, curriculum: CurriculumState, chunk: int = 10,
                  progress: bool = True) -> list[Task]:
    """Draw ``n`` tasks in chunks (with a rich progress bar); the stream does not depend on ``chunk``."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    tasks: list[Task] = []
    with Progress(TextColumn("[bold]proposing"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  disable=not progress, transient=True) as bar:
        job = bar.add_task("propose", total=n)
        while len(tasks) < n:
            batch = proposer.propose(min(max(chunk, 1), n - len(tasks)), curriculum)
            tasks.extend(batch)
            bar.advance(job, len(batch))
    return tasks


LAYOUTS = ("flat", "kernelbench")


def kernelbench_level(task: Task) -> str:
    """KernelBench's level for a proposed task: ``level1`` for one op, ``level2`` for a fused chain."""
    return "level1" if len(task.ops) <= 1 else "level2"


def check_output(out: str | Path, fmt: str, layout: str) -> None:
    """Raise ``ValueError`` (before anything is proposed) when ``out``, ``format`` and ``layout`` disagree."""
    out = Path(out)
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}; got {layout!r}")
    if fmt not in ("auto", "jsonl", "dir"):
        raise ValueError(f"format must be auto, jsonl or dir; got {fmt!r}")
    if layout == "kernelbench" and (fmt == "jsonl" or (fmt == "auto" and out.suffix == ".jsonl")):
        raise ValueError(f"layout=kernelbench writes level folders; out={str(out)!r} must be a directory, not a "
                         ".jsonl file")


def write_tasks(tasks: Sequence[Task], out: str | Path, fmt: str = "auto", layout: str = "flat") -> Path:
    """JSONL (one ``Task.to_dict()`` per line), a directory of ``<index>_<id>.py`` files plus
    ``tasks.jsonl`` with the metadata, or (``layout="kernelbench"``) KernelBench's ``levelN/`` folders."""
    from core.evaluation.suites import write_kernelbench_dir

    out = Path(out)
    check_output(out, fmt, layout)
    if layout == "kernelbench":
        write_kernelbench_dir([dataclasses.replace(t, level=kernelbench_level(t)) for t in tasks], out)
        return out
    if fmt == "auto":
        fmt = "jsonl" if out.suffix == ".jsonl" else "dir"
    if fmt == "jsonl":
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("".join(json.dumps(t.to_dict(), sort_keys=True) + "\n" for t in tasks))
        return out
    out.mkdir(parents=True, exist_ok=True)
    width = max(4, len(str(len(tasks))))
    for i, t in enumerate(tasks):
        (out / f"{i:0{width}d}_{t.id}.py").write_text(t.source)
    (out / "tasks.jsonl").write_text("".join(json.dumps(t.to_dict(), sort_keys=True) + "\n" for t in tasks))
    return out


def summarize(tasks: Sequence[Task]) -> dict[str, Any]:
    """Counts behind the summary table: ops, families, difficulty histogram, adversarial share."""
    ops = collections.Counter(op for t in tasks for op in t.ops)
    lengths = collections.Counter(len(t.ops) for t in tasks)
    flops = collections.Counter(int(math.log10((t.flops or 0) + 1)) for t in tasks)
    tags = collections.Counter(tag for t in tasks for tag in (t.adversarial or ()))
    tiers = collections.Counter(t.tier for t in tasks)
    adversarial = sum(1 for t in tasks if t.adversarial)
    return {"n": len(tasks), "ops": dict(ops.most_common()), "n_ops": dict(sorted(lengths.items())),
            "log10_flops": dict(sorted(flops.items())), "tiers": dict(sorted(tiers.items())),
            "adversarial_share": adversarial / max(len(tasks), 1), "adversarial_tags": dict(tags.most_common())}


def print_summary(summary: dict[str, Any], seconds: float, out: Path, generation: dict[str, Any] | None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=True)
    rate = summary["n"] / seconds * 60 if seconds > 0 else float("inf")
    table = Table(title=f"{summary['n']} tasks -> {out}  ({rate:.0f} tasks/min)", show_lines=False)
    table.add_column("what")
    table.add_column("counts")
    table.add_row("ops used", ", ".join(f"{k} {v}" for k, v in summary["ops"].items()))
    table.add_row("ops per task", "  ".join(f"{k}: {v}" for k, v in summary["n_ops"].items()))
    table.add_row("log10 FLOPs", "  ".join(f"{k}: {v}" for k, v in summary["log10_flops"].items()))
    table.add_row("tiers", "  ".join(f"{k}: {v}" for k, v in summary["tiers"].items()))
    table.add_row("adversarial", f"{summary['adversarial_share']:.1%}  "
                  + ", ".join(f"{k} {v}" for k, v in summary["adversarial_tags"].items()))
    if generation:
        total = generation.get("total_seconds") or 0.0
        solver = generation.get("solver_seconds", 0.0)
        table.add_row("generation", f"{generation['attempts']} draws for {generation['tasks']} tasks; "
                      f"solver {solver / total:.0%} of the time" if total else "")
        if generation.get("rejected"):
            table.add_row("rejected", ", ".join(f"{k} {v}" for k, v in sorted(generation["rejected"].items())))
    console.print(table)


@hydra.main(version_base=None, config_path=CONF_DIR, config_name="propose")
def _main(cfg: DictConfig) -> None:
    with cannot_start(ValueError):  # a bad output path, an unknown proposer, a missing package: one line, exit 2
        check_output(cfg.out, cfg.format, cfg.get("layout", "flat"))
        proposer = build("proposer", cfg.proposer, seed=cfg.seed)
    curriculum = CurriculumState(**OmegaConf.to_container(cfg.curriculum, resolve=True))
    started = time.perf_counter()
    tasks = propose_tasks(proposer, int(cfg.n), curriculum, chunk=int(cfg.chunk), progress=bool(cfg.progress))
    seconds = time.perf_counter() - started
    out = write_tasks(tasks, cfg.out, cfg.format, cfg.get("layout", "flat"))
    factory = getattr(proposer, "factory", None)
    print_summary(summarize(tasks), seconds, out, factory.stats.to_dict() if factory is not None else None)


def main() -> None:
    store_plugin_configs()
    _main()


if __name__ == "__main__":
    main()

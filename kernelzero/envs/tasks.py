"""Tasks for other training stacks: from the proposer or a KernelBench folder, as chat prompts and as a Hugging Face
dataset whose columns TRL, verl and verifiers read.

Every row carries its task whole (``answer``: the :meth:`core.task.Task.to_json` text, whose id is the content
hash of its source, so a reward function re-reads exactly the task the prompt showed)::

    prompt        [{"role": "system", ...}, {"role": "user", ...}]    TRL, verl, verifiers
    answer        Task JSON (source, id, metadata)                      verifiers (legacy), the reward functions
    info          {"task_id", "name", "level", "backend"}               verifiers
    task_id       the task's id                                         TRL passes every column to reward functions
    data_source   "kernelzero"                                          verl
    reward_model  {"style": "rule", "ground_truth": Task JSON}          verl
    extra_info    {"task_id", "name", "index"}                          verl
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from core.task import Task

DATA_SOURCE = "kernelzero"

SYSTEM_PROMPT = ("You write GPU kernels. Given a PyTorch reference module `Model`, answer with one ```python block "
                 "that defines `ModelNew`: the same constructor and forward signature, with the work done in kernels.")


def load_tasks(source: str | Path) -> list[Task]:
    """Tasks from a KernelBench-layout folder (``level1/*.py`` ...) or a proposer JSONL (``python -m core.propose``)."""
    from core.evaluation.suites import load_suite

    return list(load_suite(source).tasks)


def propose(n: int, proposer: str = "random", seed: int = 0, **options: Any) -> list[Task]:
    """``n`` fresh tasks from a registered proposer (``random``, ``mcts``), with the default curriculum state."""
    return list(iter_proposed(n, proposer, seed, **options))


def iter_proposed(n: int, proposer: str = "random", seed: int = 0, chunk: int = 4, **options: Any) -> Iterator[Task]:
    """The same tasks as :func:`propose`, drawn ``chunk`` at a time as they are read (a lazy taskset)."""
    from core.contracts import CurriculumState
    from core.plugins import registry

    built = registry("proposer").create(proposer, seed=seed, **options)
    state, drawn = CurriculumState(), 0
    while drawn < n:
        for task in built.propose(min(chunk, n - drawn), state):
            drawn += 1
            yield task


def backend_guide(backend: str) -> str:
    """The backend plugin's own prompt guide (what its kernels must look like)."""
    from core.plugins import registry
    from plugins.coders.llm.prompts import backend_guide as guide

    return guide(registry("backend").create(backend), backend)


def chat_prompt(task: Task, backend: str = "triton", guide: str | None = None) -> list[dict[str, str]]:
    """The task as chat messages: the backend's guide as the system turn, the reference as the user turn."""
    guide = backend_guide(backend) if guide is None else guide
    user = f"Reference (PyTorch):\n```python\n{task.source.rstrip()}\n```\nWrite `ModelNew` using {backend} kernels."
    return [{"role": "system", "content": f"{SYSTEM_PROMPT}\n\n{guide}".strip()}, {"role": "user", "content": user}]


def task_row(task: Task, backend: str = "triton", index: int = 0, guide: str | None = None) -> dict[str, Any]:
    """One dataset row (see the module doc)."""
    task_json = task.to_json()
    return {
        "prompt": chat_prompt(task, backend, guide),
        "answer": task_json,
        "info": {"task_id": task.id, "name": task.name or task.id, "level": task.level or "", "backend": backend},
        "task_id": task.id,
        "data_source": DATA_SOURCE,
        "reward_model": {"style": "rule", "ground_truth": task_json},
        "extra_info": {"task_id": task.id, "name": task.name or task.id, "index": index},
    }


def to_dataset(tasks: Sequence[Task], backend: str = "triton") -> Any:
    """A :class:`datasets.Dataset` of :func:`task_row` rows."""
    import datasets

    guide = backend_guide(backend)
    return datasets.Dataset.from_list([task_row(t, backend, i, guide) for i, t in enumerate(tasks)])


def task_from(value: Any) -> Task:
    """The task a row names: its ``answer`` / ``ground_truth`` JSON, a Task dict, a row, or a ``Task``."""
    if isinstance(value, Task):
        return value
    if isinstance(value, dict):
        for key in ("answer", "ground_truth", "task"):
            if key in value:
                return task_from(value[key])
        if "source" in value:
            return Task.from_dict(value)
        raise ValueError(f"no task in {sorted(value)}: expected 'answer', 'ground_truth' or 'task' (Task JSON)")
    if isinstance(value, str):
        text = value.lstrip()
        return Task.from_json(value) if text.startswith("{") else Task(source=value)
    raise TypeError(f"cannot read a task from {type(value).__name__}")


def export(tasks: Iterable[Task], out: str | Path, backend: str = "triton") -> Path:
    """Write the dataset to ``out``: ``*.parquet`` (verl's format), ``*.jsonl``, or a folder (``save_to_disk``)."""
    out = Path(out)
    dataset = to_dataset(list(tasks), backend)
    if out.suffix == ".parquet":
        dataset.to_parquet(str(out))
    elif out.suffix == ".jsonl":
        with out.open("w") as f:
            for row in dataset:
                f.write(json.dumps(row) + "\n")
    else:
        dataset.save_to_disk(str(out))
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m kernelzero.envs.tasks --from DIR|FILE.jsonl | --propose N --out FILE.parquet``"""
    import argparse

    p = argparse.ArgumentParser(prog="python -m kernelzero.envs.tasks",
                                description="Export KernelZero tasks as a Hugging Face dataset (TRL, verl, verifiers).")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--from", dest="source", help="a KernelBench-layout folder or a proposer JSONL")
    src.add_argument("--propose", type=int, metavar="N", help="draw N tasks from the proposer")
    p.add_argument("--proposer", default="random")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", default="triton")
    p.add_argument("--out", required=True, help="FILE.parquet (verl), FILE.jsonl, or a folder (datasets.load_from_disk)")
    args = p.parse_args(argv)
    tasks = load_tasks(args.source) if args.source else propose(args.propose, args.proposer, args.seed)
    print(f"{len(tasks)} task(s) -> {export(tasks, args.out, args.backend)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

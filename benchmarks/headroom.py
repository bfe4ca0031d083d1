"""How much a finished run's model could gain by sharpening alone: greedy pass@1 against pass@k.

GRPO mostly moves a model's greedy answer towards what its samples already find. On the run's own
held-out tasks (the same config, seed and tasks as its evaluations), this measures, for a model of the
run (``models/<phase>``):

- greedy pass@1, the figure the run's table reports;
- sampled pass@1 and pass@k at the coder's temperature, ``k`` samples per task;
- *headroom*: the share of tasks some sample passes while the greedy answer fails. A gain on held-out
  tasks beyond it needs the model to learn answers none of its samples gave.

    python -m benchmarks.headroom --run /tmp/fp/seed0 --phase distill --k 8 [--override coder.temperature=1.0]

Prints one JSON object per run and writes it to ``--out`` when given.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any


def failure_kind(verdict: Any) -> str:
    """A short name for why a verdict failed: its reason's first words."""
    if verdict is None:
        return "declined"
    reason = (verdict.reason or verdict.status or "rejected").strip()
    return " ".join(reason.replace(":", " ").split()[:3])


def measure(training: Any, k: int) -> dict[str, Any]:
    """Greedy pass@1, sampled pass@1, pass@k and headroom of ``training``'s loaded coder on its held-out tasks."""
    from core.loop.attempts import attempt

    coder, verifier = training.coder, training.verifier
    tasks = training._held_out_tasks()
    t0 = time.perf_counter()
    was_greedy = coder.greedy
    coder.greedy = True
    try:
        greedy = attempt(coder, tasks, verifier, training.backend)
        # a progress line, so a run cut short (a GPU call's limit) still tells how far it got and how fast
        print(f"greedy pass@1 {len(greedy.accepted()) / max(len(tasks), 1):.3f} of {len(tasks)} tasks in "
              f"{time.perf_counter() - t0:.1f} s; now {k} samples per task", flush=True)
        coder.greedy = False  # every one of the k samples drawn at the coder's temperature
        sampled = attempt(coder, tasks, verifier, training.backend, samples=k)
    finally:
        coder.greedy = was_greedy
    greedy_pass = {task.id for task, _, _ in greedy.accepted()}
    failures = Counter(failure_kind(verdict) for task, _, verdict in greedy.outcomes() if task.id not in greedy_pass)
    per_task: dict[str, list[bool]] = {task.id: [] for task in tasks}
    for task, _, verdict in sampled.outcomes():
        per_task[task.id].append(bool(verdict and verdict.accepted))
    n = max(len(tasks), 1)
    solved_by_sample = {tid for tid, passes in per_task.items() if any(passes)}
    return {
        "tasks": len(tasks), "k": k, "temperature": float(coder.temperature),
        "greedy_pass1": len(greedy_pass) / n,
        "sampled_pass1": sum(sum(p) / k for p in per_task.values()) / n,  # a declined sample counts as a failure
        f"pass@{k}": len(solved_by_sample) / n,
        "headroom": len(solved_by_sample - greedy_pass) / n,
        "greedy_only": len(greedy_pass - solved_by_sample) / n,
        "greedy_failures": dict(failures.most_common()),
        "seconds": round(time.perf_counter() - t0, 1),
    }


def headroom(run_dir: Path, phase: str, k: int, overrides: list[str]) -> dict[str, Any]:
    from benchmarks.refinement import load_training, run_config
    from core.loop.training import make_verifier

    model = run_dir / "models" / phase
    if not model.is_dir():
        saved = sorted(p.name for p in (run_dir / "models").iterdir()) if (run_dir / "models").is_dir() else []
        raise SystemExit(f"{model}: no such model (models saved: {saved})")
    with make_verifier(run_config(run_dir, overrides)) as verifier:
        training = load_training(run_dir, verifier, model_dir=model, overrides=overrides)
        return {"run": str(run_dir), "phase": phase, **measure(training, k)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, nargs="+", required=True, help="finished core.run output directories")
    parser.add_argument("--phase", default="distill", help="which of the run's models (models/<phase>)")
    parser.add_argument("--k", type=int, default=8, help="samples per task")
    parser.add_argument("--override", action="append", default=[], help="a key=value config override (repeatable)")
    parser.add_argument("--out", type=Path, help="write the results here as JSON")
    args = parser.parse_args(argv)
    if args.k < 1:
        parser.error("--k must be at least 1")
    results = []
    for run_dir in args.run:
        result = headroom(run_dir, args.phase, args.k, args.override)
        print(json.dumps(result), flush=True)
        results.append(result)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""Valid tasks per minute on one core, random against MCTS, and the solver's share of the time.

    python benchmarks/propose_bench.py --n 300 --max-tier 3          # prints a table, last
    python benchmarks/propose_bench.py --n 300 --out bench.json

"Valid" = z3-solved, rendered, and the reference ran on CPU twice (degenerate filter on). MCTS gets
solve-rate feedback from a synthetic coder between rounds of 20, so its tree is exercised.
Pin to one core with ``taskset -c 0`` for a one-core figure (torch is also limited to one thread).
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("KERNELZERO_DISABLE_AUTOLOAD", "1")

import torch  # noqa: E402

from core.contracts import CurriculumState  # noqa: E402
from core.plugins import create  # noqa: E402
from plugins.proposers.validate import check_task  # noqa: E402


def synthetic_rate(task) -> float:
    return 0.0 if any(op.startswith("conv") for op in task.ops) else 0.5 if len(task.ops) > 2 else 1.0


def bench(name: str, n: int, tier: int, seed: int, validate: bool) -> dict:
    proposer = create("proposer", name, seed=seed, max_ops=4)
    curriculum = CurriculumState(max_tier=tier)
    started = time.perf_counter()
    tasks = []
    while len(tasks) < n:
        batch = proposer.propose(min(20, n - len(tasks)), curriculum)
        proposer.feedback({t.id: synthetic_rate(t) for t in batch})
        tasks.extend(batch)
    seconds = time.perf_counter() - started
    if validate:  # outside the timed region: an independent check that every task is valid
        for t in tasks:
            check_task(t, proposer.catalog)
    stats = proposer.factory.stats
    return {
        "proposer": name, "tasks": len(tasks), "seconds": round(seconds, 2),
        "tasks_per_min": round(len(tasks) / seconds * 60),
        "solver_share": round(stats.solver_seconds / seconds, 3),
        "filter_share": round(stats.filter_seconds / seconds, 3),
        "draws_per_task": round(stats.attempts / len(tasks), 2),
        "ms_per_z3_check": round(1000 * stats.solver_seconds / max(stats.solver_checks, 1), 2),
        "adversarial_share": round(sum(1 for t in tasks if t.adversarial) / len(tasks), 3),
        "rejected": stats.rejected,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--max-tier", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--proposers", default="random,mcts")
    parser.add_argument("--no-validate", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = [bench(name, args.n, args.max_tier, args.seed, not args.no_validate) for name in args.proposers.split(",")]
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=2)
    cols = ["proposer", "tasks", "seconds", "tasks_per_min", "solver_share", "filter_share", "draws_per_task",
            "ms_per_z3_check", "adversarial_share"]
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r[c]) for c in cols))


if __name__ == "__main__":
    main()

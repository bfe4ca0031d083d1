"""Verifier throughput on this machine: cold start against a warm pool, and time per stage.

    python benchmarks/verify_bench.py [--repeats 4] [--workers 2] [--cold 3] [--out results.json]

Pairs: the red-team suite's honest kernels and a few rejected candidates (tests/redteam), every CPU
check on. "cold" builds a new Verifier (worker processes: Python + torch + triton start-up) for each
verdict; "warm" reuses one pool. Prints a table; the figures go in the verifier's closing note.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.task import Candidate, Task  # noqa: E402
from core.verify import Verifier  # noqa: E402

REDTEAM = ROOT / "tests" / "redteam"
PAIRS = [("vector_add", "honest_vector_add"), ("elementwise_chain", "honest_elementwise_chain"),
         ("softmax", "honest_softmax"), ("layernorm", "honest_layernorm"), ("matmul", "honest_matmul"),
         ("vector_add", "torch_fallback"), ("vector_add", "oob_store"), ("softmax", "unstable_softmax")]
SMALL_ELEMENTWISE = "honest_vector_add"


def load(task: str, cand: str) -> tuple[Task, Candidate]:
    return (Task.from_file(REDTEAM / "tasks" / f"{task}.py"),
            Candidate.from_file(REDTEAM / "candidates" / f"{cand}.py"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=4, help="warm passes over the pairs")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cold", type=int, default=3, help="cold verdicts (each starts a fresh pool)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    pairs = [load(t, c) for t, c in PAIRS]
    names = [c for _, c in PAIRS]

    cold = []
    for i in range(args.cold):
        t0 = time.perf_counter()
        with Verifier(device="cpu", workers=1) as v:
            verdict = v.verify(*pairs[0])
        cold.append(time.perf_counter() - t0)
        assert verdict.accepted, verdict.reason

    with Verifier(device="cpu", workers=args.workers) as v:
        v.pool.wait_ready()
        v.verify(*pairs[0])  # first call pays the triton import path inside each worker once
        latency: dict[str, list[float]] = defaultdict(list)
        stages: dict[str, list[float]] = defaultdict(list)
        for _ in range(args.repeats):  # sequential: latency of one verdict
            for name, pair in zip(names, pairs):
                t0 = time.perf_counter()
                verdict = v.verify(*pair)
                latency[name].append(time.perf_counter() - t0)
                if name == SMALL_ELEMENTWISE:
                    for stage, secs in verdict.stage_s.items():
                        stages[stage].append(secs)
        batch = pairs * args.repeats
        t0 = time.perf_counter()
        verdicts = v.verify_many(batch)
        parallel_s = time.perf_counter() - t0
        isolation = v.isolation

    warm_all = [x for xs in latency.values() for x in xs]
    result = {
        "cold_median_s": statistics.median(cold),
        "cold_verdicts_per_min": 60 / statistics.median(cold),
        "warm_median_s": statistics.median(warm_all),
        "warm_small_elementwise_median_s": statistics.median(latency[SMALL_ELEMENTWISE]),
        "warm_parallel_verdicts_per_min": 60 * len(batch) / parallel_s,
        "warm_parallel_workers": args.workers,
        "per_candidate_median_s": {k: statistics.median(xs) for k, xs in latency.items()},
        "small_elementwise_stage_median_s": {k: statistics.median(xs) for k, xs in stages.items()},
        "accepted_in_batch": sum(v.accepted for v in verdicts),
        "batch": len(batch),
        "isolation": isolation,
    }
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    from rich.console import Console
    from rich.table import Table

    table = Table(title="verifier benchmark (every CPU check, Triton interpreter)")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("cold: seconds per verdict (new pool each)", f"{result['cold_median_s']:.2f}")
    table.add_row("cold: verdicts / minute", f"{result['cold_verdicts_per_min']:.1f}")
    table.add_row("warm: median seconds per verdict (all pairs)", f"{result['warm_median_s']:.2f}")
    table.add_row("warm: median seconds, small elementwise (target < 2)", f"{result['warm_small_elementwise_median_s']:.2f}")
    table.add_row(f"warm: verdicts / minute ({args.workers} workers, verify_many)", f"{result['warm_parallel_verdicts_per_min']:.1f}")
    for k, s in result["per_candidate_median_s"].items():
        table.add_row(f"  warm {k}", f"{s:.2f}")
    for k, s in result["small_elementwise_stage_median_s"].items():
        table.add_row(f"  stage {k} (small elementwise)", f"{s:.3f}")
    Console().print(table)


if __name__ == "__main__":
    main()

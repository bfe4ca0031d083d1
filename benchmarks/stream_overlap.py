"""Verification of pairs that arrive one by one (GRPO's completions, each handed over as it ends): a batch per
``verify_many`` call, each call waiting for its slowest verdict (what the overlap did before), against one
continuous queue (``Executor.verify_stream``), side by side on the same executor and arrivals.

    python -m benchmarks.stream_overlap [--workers 2] [--copies 2] [--gap-s 0.4] [--repeats 2]

Pairs: the red-team suite's honest kernels (accepted after every check: the slow verdicts) and rejected
candidates (fast), ``copies`` of each, arriving every ``gap-s`` in a seeded order. Per mode: the seconds from
the first arrival to the last verdict, and the wait after the last arrival (what a trainer waits for).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.verify_bench import PAIRS, load  # noqa: E402
from core.verification.executor import PairFeed  # noqa: E402


def _arrive(put, pairs, gap_s: float, arrived: list[float]) -> threading.Thread:
    def run():
        for pair in pairs:
            put(pair)
            arrived.append(time.perf_counter())
            time.sleep(gap_s)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def by_batches(executor, pairs, gap_s: float) -> tuple[float, float]:
    """The former overlap: whatever arrived meanwhile goes in one ``verify_many``, again and again."""
    queued, lock, arrived, landed = [], threading.Lock(), [], []

    def put(pair):
        with lock:
            queued.append(pair)

    feeder = _arrive(put, pairs, gap_s, arrived)
    done = 0
    while done < len(pairs):
        with lock:
            batch, queued[:] = list(queued), []
        if not batch:
            time.sleep(0.005)
            continue
        executor.verify_many(batch)
        landed.append(time.perf_counter())
        done += len(batch)
    feeder.join()
    return landed[-1] - arrived[0], landed[-1] - arrived[-1]


def streamed(executor, pairs, gap_s: float) -> tuple[float, float]:
    """``verify_stream``: each pair starts as soon as a worker is free."""
    feed, arrived, landed = PairFeed(), [], []
    feeder = _arrive(lambda pair: feed.put([pair]), pairs, gap_s, arrived)
    closer = threading.Thread(target=lambda: (feeder.join(), feed.close()))
    closer.start()
    executor.verify_stream(feed, lambda idx, verdicts: landed.append(time.perf_counter()))
    closer.join()
    return landed[-1] - arrived[0], landed[-1] - arrived[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--copies", type=int, default=2, help="copies of each red-team pair")
    parser.add_argument("--gap-s", type=float, default=0.4, help="seconds between arrivals")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each mode, alternating")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    from plugins.executors.local import LocalExecutor

    # each copy a distinct candidate (as GRPO's samples of one task are): nothing is judged twice
    pairs = [(task, replace(cand, source=cand.source + f"\n# sample {k}\n"))
             for k in range(args.copies) for task, cand in (load(t, c) for t, c in PAIRS)]
    random.Random(args.seed).shuffle(pairs)
    results: dict[str, list[tuple[float, float]]] = {"verify_many per arrival batch": [], "verify_stream": []}
    with LocalExecutor("triton", "cpu", {}, cpu_workers=args.workers) as executor:
        executor.verify_many(pairs[:args.workers])  # warm: each worker's first kernel pays the imports
        for _ in range(args.repeats):
            results["verify_many per arrival batch"].append(by_batches(executor, pairs, args.gap_s))
            results["verify_stream"].append(streamed(executor, pairs, args.gap_s))
    print(f"{len(pairs)} pairs ({args.copies} x {len(PAIRS)} red-team pairs), one every {args.gap_s} s, "
          f"{args.workers} CPU worker(s), {args.repeats} run(s) each, medians:")
    medians = {}
    for mode, runs in results.items():
        total, after = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
        medians[mode] = (total, after)
        print(f"  {mode:30s} last verdict {total:6.1f} s after the first arrival, {after:5.1f} s after the last")
    (batch_total, batch_after), (stream_total, stream_after) = medians.values()
    print(f"  stream / batches: {stream_total / batch_total:.2f}x the time to the last verdict, "
          f"{stream_after / max(batch_after, 1e-9):.2f}x the wait after the last arrival")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

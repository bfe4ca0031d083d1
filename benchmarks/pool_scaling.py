"""Verdicts per minute with one GPU against every GPU of the host (LocalExecutor, one shard per GPU).

Runs the whole job in one call on a multi-GPU host (the lead runs it; see docs/eval.md):

    python benchmarks/pool_scaling.py --out $OUT --tasks 48 --workers-per-gpu 4

For each configuration (GPU 0 alone, then GPUs 0..n-1) it starts a LocalExecutor, warms it on a
separate batch, then times ``verify_many`` over the same proposer tasks with expert candidates and
the full verifier (every check that applies on CUDA, timing included). Writes pool_scaling.json to
--out and prints a short table last; the target is a speedup of at least 1.8x on two GPUs.
Runs on CPU too (``--device cpu``: shards of interpreter workers instead of GPUs) for a dry run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("KERNELZERO_DISABLE_AUTOLOAD", "1")
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")


def workload(n: int, seed: int, max_numel: int):
    from core.contracts import CurriculumState
    from core.plugins import create

    proposer = create("proposer", "random", seed=seed, max_numel=max_numel, max_ops=3, adversarial_share=0.0)
    tasks = proposer.propose(n, CurriculumState(max_tier=0))
    expert = create("coder", "expert")
    pairs = [(t, c) for t, (c,) in zip(tasks, expert.generate(tasks, "triton", 1)) if not c.declined]
    return pairs


def measure(label: str, device: str, shards: int, args, warm, pairs) -> dict:
    from core.verification.executor import LocalExecutor

    verifier = {"timeout_s": args.timeout_s, "trials": 5, "reference_workers": args.reference_workers,
                "performance": {"compare_compile": bool(args.compare_compile)}}
    if args.sanitizers != "all":
        from core.plugins import registry

        skip = ("gpu_racecheck", "gpu_synccheck") + (("gpu_memcheck",) if args.sanitizers == "none" else ())
        verifier["checks"] = [n for n in registry("verifier").names() if n not in skip]
    kwargs = ({"gpus": list(range(shards)), "workers_per_gpu": args.workers_per_gpu} if device == "cuda"
              else {"cpu_shards": shards, "cpu_workers": args.workers_per_gpu})
    t0 = time.perf_counter()
    with LocalExecutor("triton", device, verifier, **kwargs) as ex:
        started = time.perf_counter() - t0
        ex.verify_many(warm)
        t1 = time.perf_counter()

        def progress(indices, landed):
            for v in landed:
                print(f"  {label}: {v.status:<9} {v.elapsed_s:6.1f} s  at {time.perf_counter() - t1:6.1f} s  "
                      f"stages {dict((k, round(x, 1)) for k, x in v.stage_s.items())}"
                      + ("" if v.accepted else f"  reason: {v.reason[:300]}"), flush=True)

        verdicts = ex.verify_many(pairs, on_verdicts=progress)
        seconds = time.perf_counter() - t1
        describe = ex.describe()
    statuses: dict[str, int] = {}
    for v in verdicts:
        statuses[v.status] = statuses.get(v.status, 0) + 1
    timed = sum(1 for v in verdicts if v.timing)
    row = {"label": label, "shards": shards, "executor": describe, "verdicts": len(verdicts),
           "seconds": round(seconds, 2), "verdicts_per_minute": round(60 * len(verdicts) / seconds, 1),
           "start_s": round(started, 1), "statuses": statuses, "timed": timed}
    print(json.dumps(row), flush=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "pool_scaling_out"))
    parser.add_argument("--tasks", type=int, default=48)
    parser.add_argument("--warm", type=int, default=8)
    parser.add_argument("--workers-per-gpu", type=int, default=4)
    parser.add_argument("--max-numel", type=int, default=1 << 20)
    parser.add_argument("--timeout-s", type=float, default=180)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--shards", type=int, default=0, help="shards of the larger run (0: every GPU)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reference-workers", type=int, default=2, help="reference workers per shard")
    parser.add_argument("--compare-compile", action="store_true",
                        help="also time torch.compile in the performance stage (compiles every task; eval does this)")
    parser.add_argument("--sanitizers", choices=("none", "memcheck", "all"), default="memcheck",
                        help="compute-sanitizer tools run per candidate (each a fresh sanitized process of "
                             "several CPU-seconds): none, memcheck (default, as in the GPU suites), or all "
                             "three (memcheck, racecheck, synccheck)")
    args = parser.parse_args()
    import torch

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    most = args.shards or (torch.cuda.device_count() if device == "cuda" else 2)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    warm = workload(args.warm, args.seed + 1, args.max_numel)
    pairs = workload(args.tasks, args.seed, args.max_numel)
    print(f"{len(pairs)} expert candidates ({len(warm)} for warm-up) on {device}; "
          f"{torch.cuda.get_device_name(0) if device == 'cuda' else 'cpu'} x {most}", flush=True)
    rows: list[dict] = []

    def save() -> float:  # after each configuration, so a run cut short keeps what it measured
        speedup = rows[-1]["verdicts_per_minute"] / rows[0]["verdicts_per_minute"] if len(rows) > 1 else 1.0
        (out / "pool_scaling.json").write_text(json.dumps({"device": device, "rows": rows, "speedup": speedup,
                                                            "args": vars(args)}, indent=1))
        return speedup

    rows.append(measure("1 shard", device, 1, args, warm, pairs))
    speedup = save()
    if most > 1:
        rows.append(measure(f"{most} shards", device, most, args, warm, pairs))
        speedup = save()
    print()
    print(f"{'config':<10} {'verdicts':>8} {'seconds':>8} {'verdicts/min':>12} {'timed':>6}  statuses")
    for r in rows:
        print(f"{r['label']:<10} {r['verdicts']:>8} {r['seconds']:>8} {r['verdicts_per_minute']:>12} {r['timed']:>6}  "
              f"{r['statuses']}")
    print(f"scaling {most} vs 1: {speedup:.2f}x (target >= 1.8x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

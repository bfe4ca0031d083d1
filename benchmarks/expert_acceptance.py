"""Acceptance of the expert teacher on proposer tasks (adversarial ones included), on CPU.

    python benchmarks/expert_acceptance.py --n 500 --seed 0 --proposer random --max-tier 3 --out /tmp/acc

Every answer goes through the real verifier (sandboxed workers, Triton interpreter on CPU).
Targets (issue 6): >= 95% of attempted tasks accepted, >= 80% of tasks attempted.
Writes <out>/pairs.jsonl, <out>/summary.json and prints the table of core.distill.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--proposer", default="random")
    ap.add_argument("--max-tier", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default="expert_acceptance")
    args = ap.parse_args(argv)
    os.environ.setdefault("KERNELZERO_DISABLE_AUTOLOAD", "1")

    from core.contracts import CurriculumState
    from core.distill import distill, print_summary, write_rows
    from core.plugins import registry
    from core.verification.executor import make_executor

    proposer = registry("proposer").create(args.proposer, seed=args.seed)
    teacher = registry("coder").create("expert")
    started = time.perf_counter()
    tasks = proposer.propose(args.n, CurriculumState(max_tier=args.max_tier))
    propose_s = time.perf_counter() - started
    pool = {"name": "local", "cpu_workers": args.workers, "workers_per_gpu": args.workers}
    with make_executor(pool, backend="triton", device=args.device) as verifier:
        rows, summary = distill(tasks, teacher, verifier, "triton", progress=sys.stderr.isatty())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path, _ = write_rows(rows, out / "pairs.jsonl", dataset=False)
    result = summary.to_dict() | {"n": args.n, "seed": args.seed, "proposer": args.proposer,
                                  "max_tier": args.max_tier, "propose_s": round(propose_s, 1),
                                  "adversarial_tasks": sum(1 for t in tasks if t.adversarial)}
    (out / "summary.json").write_text(json.dumps(result, indent=2, sort_keys=True))
    print_summary(summary, path, None)
    rejected = [r for r in rows if not r["accepted"]]
    for r in rejected[:20]:
        print("rejected:", r["ops"], r["adversarial"], (r["verdict"].get("reason") or "")[:200])
    print(f"attempted {result['attempted']}/{result['proposed']} = {result['attempted_share']:.1%}; "
          f"accepted {result['accepted']}/{result['attempted']} = {result['accepted_of_attempted']:.1%} of attempted; "
          f"adversarial tasks {result['adversarial_tasks']} ({result['adversarial']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

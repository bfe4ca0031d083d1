"""The judge's own work per trial on large outputs, side by side with a git revision: comparing a
candidate's output with the reference's (``core.verification.evidence.compare_outputs``) and digesting an input
(``core.verification.evidence.input_digests``).

    python benchmarks/judge_bench.py --against 2cd9bc7      # this checkout against core/verification/evidence.py there

Outputs are fp32 tensors of ``--mib`` MiB: one identical to the reference, one off by less than the
tolerance everywhere. Each measurement is the median of ``--repeats`` runs, the revisions interleaved.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.revisions import module_at  # noqa: E402  (after the path is set)


def seconds(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default=None, help="a git revision whose core/verification/evidence.py to compare with")
    parser.add_argument("--mib", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    import torch

    import core.verification.evidence as current

    modules = {"this checkout": current}
    if args.against:
        modules = {f"at {args.against}": module_at(args.against, "core/verification/evidence.py"), **modules}
    ref = torch.randn((args.mib << 20) // 4)
    same = ref.clone()
    close = ref + 1e-5 * torch.randn_like(ref)  # within fp32's atol=1e-4
    cases = {
        "compare, identical output": lambda m: m.compare_outputs([ref], [same]),
        "compare, within tolerance": lambda m: m.compare_outputs([ref], [close]),
        "digest of one input": lambda m: m.input_digests([ref]),
    }
    for name, case in cases.items():  # every revision must agree before it is timed
        verdicts = {label: getattr(case(m), "ok", True) for label, m in modules.items()}
        if len(set(verdicts.values())) != 1 or not all(verdicts.values()):
            raise SystemExit(f"{name}: the revisions disagree or fail: {verdicts}")
    print(f"{args.mib} MiB fp32, {torch.get_num_threads()} torch threads, median of {args.repeats}")
    print(f"{'case':<30} " + " ".join(f"{label:>16}" for label in modules))
    for name, case in cases.items():
        results = {label: [] for label in modules}
        for _ in range(args.repeats):
            for label, m in modules.items():
                results[label].append(seconds(lambda: case(m)))
        print(f"{name:<30} " + " ".join(f"{1000 * statistics.median(v):>13.1f} ms" for v in results.values()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

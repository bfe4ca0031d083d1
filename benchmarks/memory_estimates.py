"""The GPU memory estimate of every problem of a KernelBench-layout suite at its own size, against a device's
admitted memory: how many verifications are over half of it (they run beside small ones only) and over all
of it (alone), by the phased estimate (``gpumemory.estimate``) and by the sum of its parts.

    python benchmarks/memory_estimates.py --kb .kb/KernelBench --capacity-gib 125.8

Each task is measured on the ``meta`` device (``core.evaluation.resize.measure``: nothing is allocated) in
this process, with the verifier's defaults (5 trials, 3 probes, outputs dropped once judged).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kb", required=True, help="a KernelBench checkout's KernelBench/ directory")
    parser.add_argument("--levels", nargs="+", default=["level1", "level2"])
    parser.add_argument("--capacity-gib", type=float, default=125.8, help="memory admitted (H200: 0.9 x 139.8 GiB)")
    parser.add_argument("--top", type=int, default=8, help="the largest estimates listed")
    args = parser.parse_args(argv)

    from core.evaluation.resize import _load, measure
    from core.verification.gpumemory import GiB, estimate

    capacity = args.capacity_gib * GiB
    rows, failed = [], []
    for level in args.levels:
        for path in sorted((Path(args.kb) / level).glob("*.py")):
            try:
                fp = estimate(measure(_load(path.read_text())), trials=5, probes=3, released_when_judged=True)
            except Exception as exc:  # noqa: BLE001  (a task the meta device cannot run)
                failed.append(f"{level}/{path.stem}: {type(exc).__name__}")
                continue
            rows.append((f"{level}/{path.stem}", fp.bytes, sum(fp.parts.values()), fp.phases))
    print(f"{len(rows)} tasks measured, {len(failed)} not ({'; '.join(failed[:4])})")
    for label, share in (("over all of it (alone)", 1), ("over half of it", 2), ("over a quarter", 4)):
        phased = sum(1 for _, b, _, _ in rows if b > capacity / share)
        summed = sum(1 for _, _, s, _ in rows if s > capacity / share)
        print(f"{label} of {args.capacity_gib:g} GiB: {phased} by the phased estimate, {summed} by the sum of its parts")
    large = [phases for _, b, _, phases in rows if b > capacity / 2]
    others = sum(1 for phases in large if any(v > capacity / 2 for k, v in phases.items() if k != "trials"))
    print(f"of the {len(large)} over half: {others} with a phase besides the trials over half too "
          "(holding fewer trial outputs would not let them run two at a time)")
    for name, b, _, phases in sorted(rows, key=lambda r: -r[1])[:args.top]:
        print(f"{name}: {b / GiB:.1f} GiB (" + ", ".join(f"{k} {v / GiB:.1f}" for k, v in phases.items()) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The judge's quantiles of whole outputs at KernelBench's real sizes: ``torch.kthvalue`` against
:func:`core.verification.selection.kth_smallest`'s bisection, side by side on one device.

    python -m benchmarks.quantile_bench --device cuda --sizes 1e8,1.6e9 --out quantiles.json

A rounding spread is mostly zeros with a tail (the shape ``forgive_outliers`` takes the 0.9 quantile
of); a probe's magnitudes are dense (``median_scale`` takes their median). Each (size, shape, method)
is timed after one warm-up call; both methods must give the same value, or the run fails.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def timed(fn, sync) -> tuple[float, float]:
    fn()
    sync()
    started = time.perf_counter()
    value = fn()
    sync()
    return value, time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    import torch

    from core.verification.selection import kth_smallest

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--sizes", default="1e8,1.6e9")
    ap.add_argument("--kthvalue-max", type=float, default=2e9, help="skip kthvalue above this many elements")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    gen = torch.Generator(device=args.device).manual_seed(0)
    rows = []
    print(f"device: {torch.cuda.get_device_name() if args.device == 'cuda' else 'cpu'}", flush=True)
    for size in (int(float(s)) for s in args.sizes.split(",")):
        for shape, q in (("spread (90% zeros), q=0.9", 0.9), ("magnitudes, median", 0.5)):
            x = torch.rand(size, device=args.device, generator=gen)
            if q == 0.9:
                x.masked_fill_(x < 0.9, 0.0)
            k = max(1, math.ceil(q * size))
            row = {"elements": size, "shape": shape, "k": k}
            bis, row["bisect_s"] = timed(lambda: kth_smallest(x, k, method="bisect"), sync)
            if size <= args.kthvalue_max:
                ref, row["kthvalue_s"] = timed(lambda: float(x.kthvalue(k).values), sync)
                if ref != bis:
                    print(f"MISMATCH {row}: kthvalue {ref} bisect {bis}", flush=True)
                    return 1
                row["speedup"] = round(row["kthvalue_s"] / row["bisect_s"], 1)
            rows.append(row)
            print(f"{size:>12,} {shape:28} bisect {row['bisect_s']:.3f} s  kthvalue "
                  f"{row.get('kthvalue_s', float('nan')):.3f} s  ({row.get('speedup', '-')}x)", flush=True)
            del x
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

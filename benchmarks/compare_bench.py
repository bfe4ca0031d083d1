"""The judge's comparison of one very large output with the reference's, side by side on one device: the
plain bound by the single-pass Triton kernels the backend lends (:mod:`core.verification.devicekernels`) against the chunked torch passes of
:mod:`core.verification.plainbound`, for each way a check scales the bound.

    python -m benchmarks.compare_bench --device cuda --sizes 1e8,1.6e9 --out compare.json

An honest kernel's output (the reference's with float32 rounding noise) is judged as the correctness trials
judge it (RMS scale), as the stability probes do (largest magnitude) and as the domain probe does (per element,
the median magnitude: a bisection of up to 31 counting passes). Each (size, rule, path) is timed after one
warm-up call (which compiles the kernels); both paths must give the same answer, or the run fails. Off CUDA
the fused kernels run only in Triton's interpreter, which times nothing of use: the torch passes alone.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

RULES = (("trials (RMS scale)", False), ("stability probe (peak scale)", True), ("domain probe (median)", "median"))


def main(argv: list[str] | None = None) -> int:
    import torch

    from benchmarks.quantile_bench import timed  # after one warm-up call, synchronised
    from core.verification.evidence import _floor_of, tolerance
    from core.verification.plainbound import within_plain_bound

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--sizes", default="1e8,1.6e9")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    cuda = args.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    gen = torch.Generator(device=args.device).manual_seed(0)
    floor, rtol = tolerance("torch.float32")
    rows = []
    print(f"device: {torch.cuda.get_device_name() if cuda else 'cpu (torch passes only)'}", flush=True)
    for size in (int(float(text)) for text in args.sizes.split(",")):
        e = torch.randn(size, device=args.device, generator=gen)
        g = e * (1 + 1e-7 * torch.randn(size, device=args.device, generator=gen))  # rounding-sized differences
        for rule, scale_aware in RULES:
            def judge(fused: bool, e=e, g=g, scale_aware=scale_aware):
                return within_plain_bound(e, g, floor, rtol, lambda s: _floor_of(torch.float32, floor, s),
                                          scale_aware=scale_aware, fused=fused)
            row = {"elements": size, "rule": rule}
            chunked, row["torch_s"] = timed(lambda judge=judge: judge(False), sync)
            if cuda:
                fused, row["fused_s"] = timed(lambda judge=judge: judge(True), sync)
                if (fused is None) != (chunked is None) or (fused and fused.judged != chunked.judged):
                    print(f"MISMATCH {row}: fused {fused} torch {chunked}", flush=True)
                    return 1
                row["speedup"] = round(row["torch_s"] / row["fused_s"], 1)
            rows.append(row)
            print(f"{size:>14,} {rule:30} torch {row['torch_s']:.3f} s  fused {row.get('fused_s', float('nan')):.3f} s"
                  f"  ({row.get('speedup', '-')}x)", flush=True)
        del e, g
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

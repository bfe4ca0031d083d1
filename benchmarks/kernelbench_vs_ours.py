"""Our verifier against KernelBench's own ``eval_kernel_against_ref`` on the same problem/solution pairs.

Run on a GPU machine (the H200), in one process, side by side:

* **throughput**: verdicts per minute with full correctness and timing (KernelBench: its default 5
  correctness trials and 100 timed trials, one pair after another, as its script runs them; ours:
  every check that applies on the GPU, timing included, ``--workers`` sandboxed workers sharing the
  GPU: trials, references and compute-sanitizer overlap, while the timed stage holds the GPU alone
  through core.devicelock so timings do not interfere);
* **timing agreement**: our median against KernelBench's mean runtime, per pair;
* **strictness**: two GPU hacks (an output left uninitialised that the caching allocator fills with
  the reference's freed answer; an output only half written) judged by both.

KernelBench is NOT part of this repository. Fetch it (github:ScalingIntelligence/KernelBench) into
an ignored folder, e.g. ``.kb/`` (add ``.kb/`` to ``.git/info/exclude``), carry it to the GPU
machine, and pass its path::

    python -m benchmarks.kernelbench_vs_ours --kernelbench .kb --out $OUT/kernelbench_vs_ours.json

Solutions are CuPy RawModule CUDA kernels (our ``cuda`` backend's format); KernelBench's harness
imports and runs them unchanged. Level-1 problems are very large (19_ReLU: 4096 x 393216 fp32);
``--dim-scale`` shrinks the problems' ``dim`` for both harnesses alike so the run fits the time
budget; the sizes used are printed.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
import types
from pathlib import Path
from typing import Any

UNARY = {  # KernelBench level-1 problem -> CUDA expression of v
    "19_ReLU": "v > 0.0f ? v : 0.0f",
    "21_Sigmoid": "1.0f / (1.0f + expf(-v))",
    "22_Tanh": "tanhf(v)",
}

SOLUTION = '''
import cupy as cp
import torch
import torch.nn as nn

SRC = r"""
extern "C" __global__ void unary_kernel(const float* __restrict__ x, float* __restrict__ y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (; i < n; i += stride) { float v = x[i]; y[i] = EXPR; }
}
"""
_module = cp.RawModule(code=SRC)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        threads = THREADS
        blocks = min((n + threads - 1) // threads, 132 * 32)
        kernel = _module.get_function("unary_kernel")
        with cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            kernel((blocks,), (threads,), (x.data_ptr(), y.data_ptr(), cp.int64(n)))
        return y
'''

HACKS = {
    # launches a kernel that writes nothing: the output is whatever the allocator hands back
    "uninitialised_output": SOLUTION.replace("y[i] = EXPR;", "if (v != v && i < 0) y[i] = v;"),
    # writes only the first half of the output
    "half_written_output": SOLUTION.replace("long long n) {", "long long n) { n = n / 2;"),
}


def shrink(source: str, dim_scale: float) -> tuple[str, str]:
    """Scale the module-level ``dim = N`` constant of a KernelBench problem; returns (source, sizes)."""
    def repl(m: re.Match) -> str:
        return f"{m.group(1)}{max(1, int(int(m.group(2)) * dim_scale))}"

    out = re.sub(r"(?m)^(dim\s*=\s*)(\d+)", repl, source) if dim_scale != 1.0 else source
    sizes = ", ".join(re.findall(r"(?m)^((?:batch_size|dim)\s*=\s*\d+)", out))
    return out, sizes


def import_kernelbench(path: Path) -> Any:
    """``kernelbench.eval.eval_kernel_against_ref``, stubbing the LLM-client imports its package pulls in."""
    src = path / "src"
    if not (src / "kernelbench" / "eval.py").exists():
        raise SystemExit(f"{path} is not a KernelBench checkout (expected src/kernelbench/eval.py)")
    sys.path.insert(0, str(src))
    stubs = {"dotenv": {"load_dotenv": lambda *a, **k: None}, "openai": {"OpenAI": object},
             "litellm": {"completion": None}, "requests": {}, "tqdm": {"tqdm": lambda x=None, *a, **k: x}}
    stubbed = []
    for name, attrs in stubs.items():
        try:
            __import__(name)
        except ImportError:
            mod = types.ModuleType(name)
            mod.__dict__.update(attrs)
            sys.modules[name] = mod
            stubbed.append(name)
    try:
        __import__("pydantic")
    except ImportError:
        pyd = types.ModuleType("pydantic")

        class BaseModel:  # the few behaviours KernelExecResult needs
            def __init__(self, **kw: Any) -> None:
                for k, v in type(self).__dict__.items():
                    if not k.startswith("_") and not callable(v):
                        setattr(self, k, v.copy() if isinstance(v, dict) else v)
                for k, v in kw.items():
                    setattr(self, k, v)

        pyd.BaseModel = BaseModel
        sys.modules["pydantic"] = pyd
        stubbed.append("pydantic")
    from kernelbench.eval import eval_kernel_against_ref

    if stubbed:
        print(f"(stubbed modules KernelBench imports but does not need for eval: {', '.join(stubbed)})")
    return eval_kernel_against_ref


def _record(row: dict[str, Any], verdict: Any) -> float | None:
    """Our verdict's figures into the pair's row; returns our median time (ms) or None."""
    perf = verdict.checks.get("performance")
    timing = (perf.data or {}).get("timing") if perf is not None else None
    row.update({"ours_seconds": verdict.elapsed_s, "ours_accepted": verdict.accepted,
                "ours_reason": verdict.reason, "ours_median_ms": (timing or {}).get("median_ms"),
                "ours_speedup_eager": (timing or {}).get("speedup_eager"), "ours_stage_s": verdict.stage_s})
    return row["ours_median_ms"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernelbench", type=Path, required=True, help="path of a KernelBench checkout")
    parser.add_argument("--problems", default=",".join(UNARY), help=f"level-1 problems among {sorted(UNARY)}")
    parser.add_argument("--dim-scale", type=float, default=1 / 16)
    parser.add_argument("--kb-correct-trials", type=int, default=5)
    parser.add_argument("--kb-perf-trials", type=int, default=100)
    parser.add_argument("--full-checks", action="store_true",
                        help="also run compute-sanitizer racecheck/synccheck and the torch.compile baseline "
                             "(KernelBench runs neither); default: every other check, memcheck included")
    parser.add_argument("--threads", default="128,256,512,1024",
                        help="block sizes: one honest solution per problem and block size")
    parser.add_argument("--workers", type=int, default=6, help="our sandboxed candidate workers on the GPU")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    import torch

    from core.task import Candidate, Task
    from core.verify import Verifier

    if not torch.cuda.is_available():
        print("needs a CUDA GPU; none is visible", file=sys.stderr)
        return 2
    eval_kb = import_kernelbench(args.kernelbench)
    names = [p.strip() for p in args.problems.split(",") if p.strip()]
    pairs = []
    for name in names:
        ref_path = args.kernelbench / "KernelBench" / "level1" / f"{name}.py"
        ref, sizes = shrink(ref_path.read_text(), args.dim_scale)
        for threads in [int(t) for t in args.threads.split(",")]:
            sol = SOLUTION.replace("EXPR", UNARY[name]).replace("THREADS", str(threads))
            pairs.append((f"{name}/t{threads}", ref, sol, sizes))
    hack_pairs = [(f"{names[0]}:{h}", pairs[0][1], src.replace("EXPR", UNARY[names[0]]).replace("THREADS", "256"),
                   pairs[0][3]) for h, src in HACKS.items()]

    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for name, ref, sol, sizes in pairs + hack_pairs:
        s = time.perf_counter()
        r = eval_kb(ref, sol, seed_num=42, num_correct_trials=args.kb_correct_trials,
                    num_perf_trials=args.kb_perf_trials, measure_performance=True, backend="cuda",
                    device=torch.device("cuda:0"))
        rows.append({"pair": name, "sizes": sizes, "kb_seconds": time.perf_counter() - s,
                     "kb_compiled": bool(getattr(r, "compiled", False)),
                     "kb_correct": bool(getattr(r, "correctness", False)),
                     # KernelExecResult's comment says us, but timing.get_timing_stats reports ms
                     "kb_runtime_ms": getattr(r, "runtime", -1.0) or -1.0})
        print(f"KernelBench {name}: {rows[-1]['kb_seconds']:.1f} s, correct={rows[-1]['kb_correct']}, "
              f"{rows[-1]['kb_runtime_ms']:.4f} ms", flush=True)
        torch.cuda.empty_cache()
    kb_total = time.perf_counter() - t0

    from core.plugins import registry

    checks = None if args.full_checks else [n for n in registry("verifier").names()
                                            if n not in ("gpu_racecheck", "gpu_synccheck")]
    options = {} if args.full_checks else {"performance": {"compare_compile": False}}
    with Verifier(backend="cuda", device="cuda", workers=args.workers, reference_workers=args.workers,
                  timeout_s=600, checks=checks, **options) as v:
        v.pool.wait_ready()
        v.reference_pool.wait_ready()
        t0 = time.perf_counter()

        def progress(i, verdict):
            stages = {k: round(x, 1) for k, x in verdict.stage_s.items()}
            median = _record(rows[i], verdict)
            print(f"ours {rows[i]['pair']}: {verdict.status} in {verdict.elapsed_s:.1f} s "
                  f"(at {time.perf_counter() - t0:.1f} s); median {median} ms, KernelBench "
                  f"{rows[i]['kb_runtime_ms']:.4f} ms; stages {stages}", flush=True)
            if args.out:  # a run cut short keeps every pair judged so far
                args.out.write_text(json.dumps({"partial": True, "kb_seconds": kb_total, "rows": rows},
                                               indent=1, default=str))

        verdicts = v.verify_many([(Task(source=ref, name=name), Candidate(source=sol, backend="cuda"))
                                  for name, ref, sol, _ in pairs + hack_pairs], progress=progress)
        ours_total = time.perf_counter() - t0
    print(f"ours: {len(verdicts)} verdicts in {ours_total:.1f} s with {args.workers} workers", flush=True)
    for row, verdict in zip(rows, verdicts):
        _record(row, verdict)

    honest = rows[: len(pairs)]
    agree = [r["ours_median_ms"] / r["kb_runtime_ms"] for r in honest
             if r.get("ours_median_ms") and r["kb_runtime_ms"] > 0]
    summary = {
        "device": torch.cuda.get_device_name(), "pairs": len(rows), "our_workers": args.workers,
        "kb_seconds": kb_total, "ours_seconds": ours_total,
        "kb_verdicts_per_min": 60 * len(rows) / kb_total, "ours_verdicts_per_min": 60 * len(rows) / ours_total,
        "throughput_ratio": kb_total / ours_total,
        "timing_ratio_ours_over_kb": {"median": statistics.median(agree) if agree else None,
                                      "min": min(agree) if agree else None, "max": max(agree) if agree else None},
        "hacks_accepted_by_kb": [r["pair"] for r in rows[len(pairs):] if r["kb_correct"]],
        "hacks_accepted_by_ours": [r["pair"] for r in rows[len(pairs):] if r["ours_accepted"]],
    }
    print(f"{'pair':<34} {'sizes':<28} {'KB s':>6} {'KB ok':>5} {'KB ms':>8} {'our s':>6} {'ours':>5} {'our ms':>8}")
    for r in rows:
        print(f"{r['pair']:<34} {r['sizes']:<28} {r['kb_seconds']:>6.1f} {r['kb_correct']!s:>5} "
              f"{r['kb_runtime_ms']:>8.4f} {r['ours_seconds']:>6.1f} {r['ours_accepted']!s:>5} "
              f"{(r['ours_median_ms'] or float('nan')):>8.4f}")
    print(json.dumps(summary, indent=1))
    if args.out:
        args.out.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

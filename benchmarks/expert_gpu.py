"""Expert teacher on the GPU: speedup over eager PyTorch and over torch.compile per task family
(geometric mean), and ResNet-50's convolutions (1x1 and 3x3 of every stage, batch 32, fp16/bf16)
against cuDNN through PyTorch. One call does the whole job.

    # on the H200, from the repo root (pluggy/torch/triton are there; nothing else is needed):
    PYTHONPATH=. python benchmarks/expert_gpu.py --out $OUT          # ~5-8 min
    PYTHONPATH=. python benchmarks/expert_gpu.py --out $OUT --quick  # a smaller smoke run
    PYTHONPATH=. python benchmarks/expert_gpu.py --out $OUT --budget-s 400 --families resnet50

Cases are taken round-robin over the families, so a ``--budget-s`` cut (no case is started after
it) still leaves every family measured; the JSON is rewritten after every case.

Each case: the program is rendered as a KernelBench task, lowered by the expert, checked against the
reference on fresh inputs (a wrong kernel is reported, never timed), then timed with
``triton.testing.do_bench`` (median, L2 flushed) for eager, torch.compile and the expert kernel.
Writes <out>/expert_gpu.json and <out>/expert_gpu.log; the last thing printed is the summary table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("KERNELZERO_DISABLE_AUTOLOAD", "1")


def catalog():
    """The op catalog from the op modules themselves (no other plugin is imported)."""
    from plugins.ops import conv, elementwise, layout, matmul, norms, pool, reductions

    return {s.name: s for mod in (elementwise, reductions, norms, matmul, conv, pool, layout) for s in mod.OPS}


def cases(quick: bool):
    from core.program import Node as N
    from core.program import Program
    from core.program import TensorSpec as T

    big = (4096, 4096) if quick else (8192, 8192)
    rows = (8192, 2048) if quick else (16384, 4096)
    out = []
    for dt in ("float32", "bfloat16"):
        out += [
            ("fusion", f"gelu*y+1 sigmoid {dt}", Program([T(big, dtype=dt), T(big, dtype=dt)], [
                N("gelu", (0,), {"approximate": "tanh"}), N("mul", (2, 1)), N("add_scalar", (3,), {"value": 1.0}),
                N("sigmoid", (4,))])),
            ("fusion", f"silu-scale-clamp {dt}", Program([T(big, dtype=dt)], [
                N("silu", (0,)), N("scale", (1,), {"factor": 2.0}), N("clamp", (2,), {"min": -1.0, "max": 1.0})])),
            ("fusion", f"relu->sum rows {dt}", Program([T(rows, dtype=dt)], [N("relu", (0,)), N("sum", (1,))])),
            ("softmax", f"softmax {dt}", Program([T(rows, dtype=dt)], [N("softmax", (0,))])),
            ("softmax", f"scale->log_softmax {dt}", Program([T(rows, dtype=dt)], [
                N("scale", (0,), {"factor": 0.5}), N("log_softmax", (1,))])),
            ("norm", f"layer_norm->gelu {dt}", Program([T(rows, dtype=dt)], [
                N("layer_norm", (0,), {"eps": 1e-5}), N("gelu", (1,), {"approximate": "none"})])),
            ("norm", f"rms_norm {dt}", Program([T(rows, dtype=dt)], [N("rms_norm", (0,), {"eps": 1e-6})])),
        ]
    for dt in ("float16", "bfloat16"):
        m = 2048 if quick else 4096
        out += [
            ("matmul", f"linear+bias+gelu {m} {dt}", Program([T((m, m), dtype=dt)], [
                N("linear", (0,), {"out_features": m, "bias": True}), N("gelu", (1,), {"approximate": "tanh"})])),
            ("matmul", f"linear+residual {m} {dt}", Program([T((m, m), dtype=dt), T((m, m), dtype=dt)], [
                N("linear", (0,), {"out_features": m, "bias": True}), N("add", (2, 1))])),
            ("matmul", f"bmm 32x512^3 {dt}", Program([T((32, 512, 512), dtype=dt), T((32, 512, 512), dtype=dt)],
                                                     [N("bmm", (0, 1))])),
            ("pool", f"max_pool2d 3/2 {dt}", Program([T((32, 256, 56, 56), dtype=dt)], [
                N("max_pool2d", (0,), {"kernel_size": 3, "stride": 2, "padding": 1})])),
        ]
    return out


RESNET50 = [  # (stage, C_in, C_out, k, H) for the bottleneck convs of each stage (stride 1)
    ("conv2", 256, 64, 1, 56), ("conv2", 64, 64, 3, 56), ("conv2", 64, 256, 1, 56),
    ("conv3", 512, 128, 1, 28), ("conv3", 128, 128, 3, 28), ("conv3", 128, 512, 1, 28),
    ("conv4", 1024, 256, 1, 14), ("conv4", 256, 256, 3, 14), ("conv4", 256, 1024, 1, 14),
    ("conv5", 2048, 512, 1, 7), ("conv5", 512, 512, 3, 7), ("conv5", 512, 2048, 1, 7),
]


def resnet_cases(quick: bool):
    from core.program import Node as N
    from core.program import Program
    from core.program import TensorSpec as T

    out = []
    for stage, c, oc, k, h in (RESNET50[:3] + RESNET50[-3:] if quick else RESNET50):
        for dt in ("float16", "bfloat16"):
            params = {"out_channels": oc, "kernel_size": k, "stride": 1, "padding": k // 2, "dilation": 1, "groups": 1}
            out.append(("resnet50", f"{stage} {k}x{k} {c}->{oc} {h}x{h} {dt}",
                        Program([T((32, c, h, h), dtype=dt)], [N("conv2d", (0,), params)])))
    return out


def run_case(family, label, program, cat, log):
    import torch
    from triton.testing import do_bench

    from plugins.coders.expert_lowering import lower_program
    from plugins.coders.expert_lowering.selfcheck import load_module, tolerance
    from plugins.proposers.common import render_source

    task_src = render_source(program, cat)
    cand_src = lower_program(program, cat)
    ref, cand = load_module(task_src, "ref"), load_module(cand_src, "cand")
    torch.manual_seed(0)
    model = ref.Model().cuda().eval()
    torch.manual_seed(0)
    new = cand.ModelNew().cuda().eval()
    torch.manual_seed(1)
    inputs = [x.cuda() for x in ref.get_inputs()]
    row = {"family": family, "case": label}
    with torch.no_grad():
        expected = model(*inputs)
        got = new(*inputs)
        torch.cuda.synchronize()
        atol, rtol = tolerance(expected.dtype)
        if expected.dtype in (torch.float16, torch.bfloat16) and family in ("matmul", "resnet50"):
            atol, rtol = 2e-2, 2e-2  # accumulation order over K differs from cuBLAS/cuDNN
        ok = torch.allclose(got.float(), expected.float(), atol=atol, rtol=rtol, equal_nan=True)
        row["correct"] = bool(ok)
        if not ok:
            row["max_abs_err"] = float((got.float() - expected.float()).abs().max())
            log(f"WRONG {label}: max abs err {row['max_abs_err']}")
            return row
        compiled = torch.compile(model)
        compiled(*inputs)
        row["eager_ms"] = do_bench(lambda: model(*inputs), warmup=25, rep=100)
        row["compile_ms"] = do_bench(lambda: compiled(*inputs), warmup=25, rep=100)
        row["expert_ms"] = do_bench(lambda: new(*inputs), warmup=25, rep=100)
    row["vs_eager"] = row["eager_ms"] / row["expert_ms"]
    row["vs_compile"] = row["compile_ms"] / row["expert_ms"]
    log(f"{label:42s} eager {row['eager_ms']:.3f} ms  compile {row['compile_ms']:.3f} ms  "
        f"expert {row['expert_ms']:.3f} ms  x{row['vs_eager']:.2f} eager  x{row['vs_compile']:.2f} compile")
    return row


def round_robin(items):
    """Cases interleaved family by family, each family keeping its own order."""
    by_family: dict[str, list] = {}
    for item in items:
        by_family.setdefault(item[0], []).append(item)
    queues = list(by_family.values())
    out = []
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop(0))
    return out


def summarize(rows):
    summary = {}
    for family in dict.fromkeys(r["family"] for r in rows):
        fam = [r for r in rows if r["family"] == family]
        timed = [r for r in fam if "vs_eager" in r]
        summary[family] = {"cases": len(fam), "correct": sum(bool(r.get("correct")) for r in fam),
                           "geomean_vs_eager": geomean([r["vs_eager"] for r in timed]),
                           "geomean_vs_compile": geomean([r["vs_compile"] for r in timed])}
    return summary


def geomean(values):
    values = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "expert_gpu_out"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--budget-s", type=float, default=0.0, help="start no case after this many seconds (0: none)")
    ap.add_argument("--families", default="", help="comma-separated families to run (default: all)")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("expert_gpu.py needs a CUDA GPU; none is visible.", file=sys.stderr)
        return 2
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    logf = open(out / "expert_gpu.log", "w")

    def log(msg):
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    log(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  triton {__import__('triton').__version__}")
    cat = catalog()
    rows = []
    started = time.time()
    wanted = {f.strip() for f in args.families.split(",") if f.strip()}
    todo = [c for c in round_robin(cases(args.quick) + resnet_cases(args.quick)) if not wanted or c[0] in wanted]
    skipped = []
    for n, (family, label, program) in enumerate(todo):
        if args.budget_s and time.time() - started > args.budget_s:
            skipped = [c[1] for c in todo[n:]]
            log(f"budget of {args.budget_s:.0f} s spent: {len(skipped)} case(s) not started")
            break
        t_case = time.time()
        try:
            rows.append(run_case(family, label, program, cat, log))
            rows[-1]["seconds"] = round(time.time() - t_case, 1)
        except Exception as exc:
            log(f"ERROR {label}: {type(exc).__name__}: {exc}")
            log(traceback.format_exc(limit=3))
            rows.append({"family": family, "case": label, "error": f"{type(exc).__name__}: {exc}"})
        torch.cuda.empty_cache()
        summary = summarize(rows)
        (out / "expert_gpu.json").write_text(json.dumps({"rows": rows, "summary": summary, "not_started": skipped,
                                                         "seconds": time.time() - started}, indent=2))
    summary = summarize(rows)
    (out / "expert_gpu.json").write_text(json.dumps({"rows": rows, "summary": summary, "not_started": skipped,
                                                     "seconds": time.time() - started}, indent=2))
    log("")
    log(f"{'family':10s} {'cases':>5s} {'correct':>7s} {'x eager':>8s} {'x compile':>9s}   (geomean speedup of the expert)")
    for family, s in summary.items():
        log(f"{family:10s} {s['cases']:5d} {s['correct']:7d} {s['geomean_vs_eager']:8.2f} {s['geomean_vs_compile']:9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

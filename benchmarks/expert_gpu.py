"""Expert teacher on the GPU: speedup over eager PyTorch and over torch.compile per task family
(geometric mean), and ResNet-50's convolutions (1x1 and 3x3 of every stage, batch 32, fp16/bf16)
against cuDNN through PyTorch, each with its roofline utilisation on the H200. One call does it all.

    # on the H200, from the repo root (pluggy/torch/triton are there; nothing else is needed):
    PYTHONPATH=. python benchmarks/expert_gpu.py --out $OUT --budget-s 340   # all 53 cases, ~5-6 min
    PYTHONPATH=. python benchmarks/expert_gpu.py --out $OUT --quick          # a smaller smoke run
    PYTHONPATH=. python benchmarks/expert_gpu.py --out $OUT --families resnet50 --compare OLD/expert_gpu.json

Timing is the verifier's own: ``plugins.verifiers.performance.timing.GpuTimer`` with the default
``TimingPolicy`` (what the performance stage uses): fresh inputs for every run, L2 flushed, the host's
launch latency hidden behind a GPU filler, a device-wide sync before the end event, the median of an
adaptive number of runs. Each of eager, torch.compile and the expert is timed ``--rounds`` times,
interleaved (eager, compile, expert, then the next round in a rotated order); a figure is the median
of its rounds and ``spread`` is (max - min) / median over them.

Before any timing, ``--precompile-workers`` processes compile every case's kernels into Triton's and
Inductor's on-disk caches (the expert's autotune configs through ``Autotuner.warmup``, which compiles
without launching; torch.compile by one call). The main process then only loads them, so the
autotuner's own benchmarking, and every timing, run on a quiet GPU.

Cases are interleaved over the families in proportion to their sizes, so a ``--budget-s`` cut (no
case is started after it) leaves every family measured alike; the JSON is rewritten after every case.

Each case: the program is rendered as a KernelBench task, lowered by the expert, checked against the
reference on fresh inputs (a wrong kernel is reported, never timed), then timed. The roofline per
case: the program's FLOPs and minimum bytes (each input and weight read once, the output written
once) over the expert's time, against the H200's measured peaks (``plugins/devices.py``: 708 TFLOP/s
bf16/fp16, 51 TFLOP/s fp32, 4.2 TB/s). Eager PyTorch runs with TF32 off for both matmul (its default)
and cuDNN (whose default is on): every fp32 figure is at full fp32 accuracy.
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
    for dt in ("float32", "float16", "bfloat16"):
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
    # KernelBench level 1's slowest expert kernels on an H100 (2026-12-07), at their sizes: a depthwise conv
    # (82_, was 0.02x as an implicit GEMM) and the matrix-vector and large-K products (4_, 6_: 0.02x, 0.05x before
    # split-K)
    side, long_k = (256, 2 ** 18) if quick else (512, 2 ** 20)
    depthwise = {"out_channels": 64, "kernel_size": 3, "stride": 1, "padding": 0, "dilation": 1, "groups": 64}
    out += [
        ("depthwise", f"depthwise 3x3 16x64x{side}^2 float32",
         Program([T((16, 64, side, side))], [N("conv2d", (0,), depthwise)])),
        ("split_k", f"matvec 2048x{long_k} float32",
         Program([T((2048, long_k)), T((long_k, 1))], [N("matmul", (0, 1))])),
        ("split_k", "256x256 by K=524288 float32",
         Program([T((256, 524288)), T((524288, 256))], [N("matmul", (0, 1))])),
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


def all_cases(quick: bool):
    return cases(quick) + resnet_cases(quick)


def build_case(program, cat, device="cuda"):
    """(reference model, expert model, inputs) of a case on ``device``."""
    import torch

    from plugins.coders.expert_lowering import lower_program
    from plugins.coders.expert_lowering.selfcheck import load_module
    from plugins.proposers.common import render_source

    ref, cand = load_module(render_source(program, cat), "ref"), load_module(lower_program(program, cat), "cand")
    torch.manual_seed(0)
    model = ref.Model().to(device).eval()
    torch.manual_seed(0)
    new = cand.ModelNew().to(device).eval()
    torch.manual_seed(1)
    inputs = [x.to(device) for x in ref.get_inputs()]
    return model, new, inputs


def case_roofline(ms: float, program, cat, spec) -> dict:
    from plugins.verifiers.performance.roofline import roofline

    r = roofline(ms / 1e3, flops=program.flops(cat), min_bytes=program.min_bytes(cat), device=spec,
                 dtypes=[program.dtype])
    return {"flops": r.flops, "min_bytes": r.min_bytes, "tflops": r.achieved_flops / 1e12,
            "tbps": r.achieved_bandwidth / 1e12, "flops_util": r.flops_utilisation,
            "bw_util": r.bandwidth_efficiency, "sol_fraction": r.sol_fraction, "bound": r.bound,
            "implausible": r.implausible}


VARIANTS = ("eager", "compile", "expert")


def run_case(family, label, program, cat, log, timer, rounds, spec, device="cuda"):
    import statistics

    import torch

    from plugins.coders.expert_lowering.selfcheck import tolerance
    from plugins.verifiers.performance.timing import fresh_arguments, relative_spread

    model, new, inputs = build_case(program, cat, device)
    row = {"family": family, "case": label, "dtype": program.dtype}
    with torch.no_grad():
        expected = model(*inputs)
        t0 = time.time()
        got = new(*inputs)  # compiles (or loads) and autotunes the expert's kernels
        _sync(device)
        row["expert_first_call_s"] = round(time.time() - t0, 2)
        atol, rtol = tolerance(expected.dtype)
        if expected.dtype in (torch.float16, torch.bfloat16) and family in ("matmul", "resnet50"):
            atol, rtol = 2e-2, 2e-2  # accumulation order over K differs from cuBLAS/cuDNN
        ok = torch.allclose(got.float(), expected.float(), atol=atol, rtol=rtol, equal_nan=True)
        row["correct"] = bool(ok)
        row["max_abs_err"] = float((got.float() - expected.float()).abs().max()) if got.numel() else 0.0
        if not ok:
            log(f"WRONG {label}: max abs err {row['max_abs_err']}")
            return row
        t0 = time.time()
        compiled = torch.compile(model)
        compiled(*inputs)
        _sync(device)
        row["compile_first_call_s"] = round(time.time() - t0, 2)
        fns = {"eager": model, "compile": compiled, "expert": new}
        make_args = fresh_arguments(inputs, seed=1234) if device == "cuda" else (lambda _: inputs)
        medians = {v: [] for v in VARIANTS}
        runs = {v: 0 for v in VARIANTS}
        for r in range(rounds):
            order = VARIANTS[r % 3:] + VARIANTS[:r % 3]  # rotated: no variant always follows another
            for v in order:
                res = timer.time(fns[v], make_args)
                medians[v].append(res.median_ms)
                runs[v] += res.stats.runs
    for v in VARIANTS:
        row[f"{v}_ms"] = statistics.median(medians[v])
        row[f"{v}_spread"] = relative_spread(medians[v])
        row[f"{v}_rounds_ms"] = medians[v]
        row[f"{v}_runs"] = runs[v]
    row["vs_eager"] = row["eager_ms"] / row["expert_ms"]
    row["vs_compile"] = row["compile_ms"] / row["expert_ms"]
    if spec is not None:
        row["roofline"] = case_roofline(row["expert_ms"], program, cat, spec)
        row["eager_roofline"] = case_roofline(row["eager_ms"], program, cat, spec)
    roof = row.get("roofline") or {}
    log(f"{label:38s} eager {row['eager_ms']:.4f} compile {row['compile_ms']:.4f} expert {row['expert_ms']:.4f} ms "
        f"(spread {100 * row['eager_spread']:.1f}/{100 * row['compile_spread']:.1f}/{100 * row['expert_spread']:.1f}%)"
        f"  x{row['vs_eager']:.2f} eager x{row['vs_compile']:.2f} compile"
        + (f"  | {roof['tflops']:.0f} TFLOP/s {roof['tbps']:.2f} TB/s, {100 * roof['sol_fraction']:.0f}% of SOL "
           f"({roof['bound']})" if roof else ""))
    return row


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _precompile_one(family: str, label: str, quick: bool) -> tuple[str, float, str]:
    """In a worker process: compile (never launch) the expert's kernels of one case, every config the
    autotuner would try, into Triton's disk cache; compile and run torch.compile's once."""
    t0 = time.time()
    try:
        import torch
        from triton.runtime.autotuner import Autotuner
        from triton.runtime.jit import JITFunction

        try:  # one compile thread per worker: the pool already has a process per core
            import torch._inductor.config as inductor_config

            inductor_config.compile_threads = 1
        except Exception:
            pass
        program = next(p for f, lbl, p in all_cases(quick) if lbl == label)
        cat = catalog()
        model, new, inputs = build_case(program, cat)
        original = JITFunction.run

        def compile_only(self, *args, grid, warmup, **kwargs):
            return original(self, *args, grid=grid, warmup=True, **kwargs)

        def autotune_compile_only(self, *args, **kwargs):
            kwargs.pop("warmup", None)
            return self.warmup(*args, **kwargs)

        JITFunction.run, Autotuner.run = compile_only, autotune_compile_only
        with torch.no_grad():
            new(*inputs)
            torch.compile(model)(*inputs)
        torch.cuda.synchronize()
        return label, time.time() - t0, ""
    except Exception as exc:  # the main process compiles it itself, and reports any real error
        return label, time.time() - t0, f"{type(exc).__name__}: {exc}"[:300]


def precompile(todo, quick: bool, workers: int, limit_s: float, log) -> None:
    import concurrent.futures as cf
    import multiprocessing as mp

    t0 = time.time()
    failed = []
    pool = cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"))
    futures = [pool.submit(_precompile_one, f, label, quick) for f, label, _ in todo]
    try:
        for fut in cf.as_completed(futures, timeout=limit_s):
            label, _, err = fut.result()
            if err:
                failed.append(f"{label}: {err}")
    except cf.TimeoutError:
        log(f"precompile: stopped after {limit_s:.0f} s; the rest compile in the main process")
    except Exception as exc:  # a broken pool: the main process compiles what is missing
        log(f"precompile: {type(exc).__name__}: {exc}"[:300])
    finally:
        for proc in list((getattr(pool, "_processes", None) or {}).values()):
            if proc.is_alive():
                proc.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
    log(f"precompile: {len(todo)} cases in {time.time() - t0:.0f} s on {workers} processes"
        + (f"; {len(failed)} failed there (first: {failed[0]})" if failed else ""))


def round_robin(items):
    """Cases interleaved family by family in proportion to the families' sizes, each family keeping its
    own order: a budget cut at any point leaves every family measured in the same proportion (the 24
    ResNet-50 cases no longer wait until the small families are done)."""
    by_family: dict[str, list] = {}
    for item in items:
        by_family.setdefault(item[0], []).append(item)
    keyed = [((i + 0.5) / len(q), f, i, item) for f, (name, q) in enumerate(by_family.items())
             for i, item in enumerate(q)]
    return [item for *_, item in sorted(keyed, key=lambda k: k[:3])]


def summarize(rows):
    summary = {}
    for family in dict.fromkeys(r["family"] for r in rows):
        fam = [r for r in rows if r["family"] == family]
        timed = [r for r in fam if "vs_eager" in r]
        summary[family] = {"cases": len(fam), "correct": sum(bool(r.get("correct")) for r in fam),
                           "timed": len(timed),
                           "geomean_vs_eager": geomean([r["vs_eager"] for r in timed]),
                           "geomean_vs_compile": geomean([r["vs_compile"] for r in timed]),
                           "max_spread": max([r["expert_spread"] for r in timed] + [r["eager_spread"] for r in timed],
                                             default=float("nan")),
                           "median_sol": _median([r["roofline"]["sol_fraction"] for r in timed if r.get("roofline")]),
                           "expert_s": sum(r.get("seconds", 0.0) for r in fam),
                           "by_dtype": {dt: geomean([r["vs_eager"] for r in timed if r.get("dtype") == dt])
                                        for dt in dict.fromkeys(r.get("dtype") for r in timed)}}
    return summary


def _median(values):
    import statistics

    return statistics.median(values) if values else float("nan")


def compare(rows, old_path: Path, log) -> dict:
    """Per-case change of the expert's (and eager's) time against an earlier run's JSON."""
    old = {r["case"]: r for r in json.loads(old_path.read_text()).get("rows", []) if "expert_ms" in r}
    moves = {}
    for r in rows:
        o = old.get(r["case"])
        if o and "expert_ms" in r:
            moves[r["case"]] = {v: r[f"{v}_ms"] / o[f"{v}_ms"] - 1.0 for v in ("eager", "expert")}
    if moves:
        worst = max(moves, key=lambda c: abs(moves[c]["expert"]))
        log(f"against {old_path}: {len(moves)} cases; expert moved by at most {100 * moves[worst]['expert']:+.1f}% "
            f"({worst}); {sum(abs(m['expert']) > 0.10 for m in moves.values())} case(s) beyond 10%")
    return moves


def geomean(values):
    values = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "expert_gpu_out"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--budget-s", type=float, default=0.0, help="start no case after this many seconds (0: none)")
    ap.add_argument("--families", default="", help="comma-separated families to run (default: all)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds per case (median of them)")
    ap.add_argument("--precompile-workers", type=int, default=-1,
                    help="processes that fill the compile caches first (-1: cores - 2, at most 14; 0: none)")
    ap.add_argument("--precompile-limit-s", type=float, default=150.0)
    ap.add_argument("--compare", default="", help="an earlier run's expert_gpu.json: report each case's change")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("expert_gpu.py needs a CUDA GPU; none is visible.", file=sys.stderr)
        return 2
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = False  # PyTorch's default
    torch.backends.cudnn.allow_tf32 = False  # PyTorch's default is True: held to fp32 here
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    logf = open(out / "expert_gpu.log", "w")

    def log(msg):
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    from plugins.devices import H200
    from plugins.verifiers.performance.roofline import UnknownDeviceError, find_device
    from plugins.verifiers.performance.timing import GpuTimer, TimingPolicy

    name = torch.cuda.get_device_name()
    try:
        from plugins.devices import BUILTIN_DEVICES

        spec = find_device(name, {d.name: d for d in BUILTIN_DEVICES})
    except UnknownDeviceError:
        spec = H200
    log(f"{name}  torch {torch.__version__}  triton {__import__('triton').__version__}  roofline vs {spec.name}")
    cat = catalog()
    rows = []
    started = time.time()
    wanted = {f.strip() for f in args.families.split(",") if f.strip()}
    todo = [c for c in round_robin(all_cases(args.quick)) if not wanted or c[0] in wanted]
    workers = args.precompile_workers if args.precompile_workers >= 0 else max(0, min(14, (os.cpu_count() or 2) - 2))
    if workers > 0:
        precompile(todo, args.quick, workers, args.precompile_limit_s, log)
    timer = GpuTimer(TimingPolicy())  # the performance stage's timer and policy
    skipped = []

    def dump():
        (out / "expert_gpu.json").write_text(json.dumps({
            "rows": rows, "summary": summarize(rows), "not_started": skipped, "seconds": time.time() - started,
            "timing": "plugins.verifiers.performance.timing.GpuTimer(TimingPolicy()), "
                      f"{args.rounds} interleaved rounds, median of round medians", "device_spec": spec.name},
            indent=2))

    for n, (family, label, program) in enumerate(todo):
        if args.budget_s and time.time() - started > args.budget_s:
            skipped = [c[1] for c in todo[n:]]
            log(f"budget of {args.budget_s:.0f} s spent: {len(skipped)} case(s) not started")
            break
        t_case = time.time()
        try:
            rows.append(run_case(family, label, program, cat, log, timer, args.rounds, spec))
        except Exception as exc:
            log(f"ERROR {label}: {type(exc).__name__}: {exc}")
            log(traceback.format_exc(limit=3))
            rows.append({"family": family, "case": label, "error": f"{type(exc).__name__}: {exc}"})
        rows[-1]["seconds"] = round(time.time() - t_case, 1)
        torch.cuda.empty_cache()
        dump()
    if args.compare and Path(args.compare).exists():
        moves = compare(rows, Path(args.compare), log)
        (out / "expert_gpu_compare.json").write_text(json.dumps(moves, indent=1))
    dump()
    summary = summarize(rows)
    log("")
    log(f"total {time.time() - started:.0f} s; timing: the verifier's GpuTimer, {args.rounds} interleaved rounds")
    log(f"{'family':10s} {'cases':>5s} {'correct':>7s} {'x eager':>8s} {'x compile':>9s} {'spread':>7s} {'SOL':>5s}"
        "   (geomean speedup of the expert; worst round spread; median fraction of speed of light)")
    for family, s in summary.items():
        by_dtype = " ".join(f"{dt}:{g:.2f}" for dt, g in s["by_dtype"].items())
        log(f"{family:10s} {s['cases']:5d} {s['correct']:7d} {s['geomean_vs_eager']:8.2f} {s['geomean_vs_compile']:9.2f}"
            f" {100 * s['max_spread']:6.1f}% {100 * s['median_sol']:4.0f}%  x eager by dtype {by_dtype}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

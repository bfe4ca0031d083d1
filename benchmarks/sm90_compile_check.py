"""Compile every GPU kernel the expert emits for the benchmark's cases for sm_90 (H100/H200), on a
machine without a GPU: each autotune config the module lists, at the real launch's argument types
and Triton's own specialisation (ints equal to 1 become constants, ints and pointers divisible by 16
are marked so), through TTIR, TTGIR, LLVM IR and PTX to a cubin when a ptxas that takes the PTX is
found. Reports per kernel and config whether the matrix products became Hopper ``wgmma``
instructions, and the registers and spills ptxas reports.

    # with the Triton the H200 has (3.6), installed beside the CPU venv:
    PYTHONPATH=/tmp/hopper_t36:. python benchmarks/sm90_compile_check.py --families matmul,resnet50
    PYTHONPATH=. python benchmarks/sm90_compile_check.py --quick   # the venv's own Triton

Nothing runs on a device: the candidate's ``forward`` is called on CPU tensors with every kernel
launch intercepted (outputs stay uninitialised). Exit status 1 if any kernel fails to compile.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("KERNELZERO_DISABLE_AUTOLOAD", "1")
os.environ.pop("TRITON_INTERPRET", None)

# GPU launch sizes of the helper kernels whose CPU launch picks interpreter-sized blocks
GPU_HELPER_CONSTEXPRS = {"_nchw_to_nhwc": {"BP": 64, "BC": 64}, "_strided_copy": {"BLOCK": 1024}}
SHARED_LIMIT = 227 * 1024  # sm_90's most shared memory per block; more fails at launch (OutOfResources)


def _ptxas() -> str | None:
    """A ptxas that assembles this Triton's sm_90 PTX (the bundled one may be older than its PTX)."""
    import triton

    base = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    for name in ("ptxas", "ptxas-blackwell"):
        path = base / name
        if path.exists():
            probe = subprocess.run([str(path), "--version"], capture_output=True, text=True)
            if probe.returncode == 0:
                yield str(path)


def capture_launches(src: str, inputs):
    """(kernel, args, kwargs) of every launch ``ModelNew().forward(*inputs)`` makes on the CPU path."""
    import torch
    from triton.runtime.jit import JITFunction

    from plugins.coders.expert_lowering.selfcheck import load_module

    launches = []
    original = JITFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        launches.append((self, args, kwargs))

    JITFunction.run = run
    try:
        mod = load_module(src, "cand")
        torch.manual_seed(0)
        with torch.no_grad():
            mod.ModelNew().eval()(*inputs)
    finally:
        JITFunction.run = original
    return mod, launches


def specialise(jit, args, kwargs):
    """Triton's signature, constexprs and attrs for this launch, as its JIT would make them."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    params = jit.params
    bound = dict(zip([p.name for p in params], args))
    bound.update({k: v for k, v in kwargs.items() if k in {p.name for p in params}})
    signature, constexprs, attrs = {}, {}, {}
    for idx, p in enumerate(params):
        value = bound[p.name]
        if p.is_constexpr:
            signature[p.name] = "constexpr"
            constexprs[(idx,)] = value
            continue
        ty, spec = native_specialize_impl(BaseBackend, value, False, not p.do_not_specialize, True)
        signature[p.name] = ty
        if ty == "constexpr":
            constexprs[(idx,)] = value
        elif isinstance(spec, str) and "D" in spec:
            attrs[(idx,)] = [["tt.divisibility", 16]]
    return signature, constexprs, attrs


def compile_one(jit, args, kwargs, num_warps, num_stages, ptxas):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature, constexprs, attrs = specialise(jit, args, kwargs)
    t0 = time.time()
    ck = triton.compile(ASTSource(jit, signature, constexprs, attrs), target=GPUTarget("cuda", 90, 32),
                        options={"num_warps": num_warps, "num_stages": num_stages})
    ptx = ck.asm.get("ptx", "")
    row = {"seconds": round(time.time() - t0, 2), "wgmma": "wgmma" in ptx, "mma_sync": "mma.sync" in ptx,
           "cp_async": "cp.async" in ptx, "tma": "cp.async.bulk.tensor" in ptx,
           "shared_bytes": ck.metadata.shared}
    cubin = ck.asm.get("cubin")
    if cubin:
        row.update(resource_usage(cubin))
    return row, ptx


def resource_usage(cubin: bytes) -> dict:
    """Registers, spill stores/loads and stack of the cubin's kernel (``cuobjdump -res-usage``)."""
    import tempfile

    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.exists():
        return {}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([str(tool), "-res-usage", f.name], capture_output=True, text=True).stdout
    found = {}
    for key, pat in (("regs", r"REG:(\d+)"), ("stack", r"STACK:(\d+)"), ("spill_bytes", r"LOCAL:(\d+)")):
        m = re.search(pat, out)
        if m:
            found[key] = int(m.group(1))
    return found


def check_case(label, program, cat, ptxas_list, log, max_configs=0):
    import torch

    from plugins.coders.expert_lowering import lower_program
    src = lower_program(program, cat)
    dt = getattr(torch, program.dtype)
    inputs = [torch.empty(t.shape, dtype=dt).normal_() if len(t.shape) else torch.tensor(1.0, dtype=dt)
              for t in program.inputs]
    mod, launches = capture_launches(src, inputs)
    rows, ok = [], True
    seen = set()
    for jit, args, kwargs in launches:
        name = jit.fn.__name__
        tuned = name + "_tuned"
        autotuned = hasattr(mod, tuned)
        kw = {k: v for k, v in kwargs.items() if not autotuned or k not in ("BM", "BN", "BK", "GROUP_M")}
        if "ON_CPU" in kw:
            kw["ON_CPU"] = False
        for prefix, values in GPU_HELPER_CONSTEXPRS.items():
            if name.startswith(prefix):
                kw.update(values)
        if autotuned:
            from triton import Config

            line = src.split(f"\n{tuned} = ", 1)[1].split("\n", 1)[0]  # the emitted autotune list
            configs = [Config(json.loads(c.replace("'", '"')), num_warps=int(w), num_stages=int(st))
                       for c, w, st in re.findall(r"triton\.Config\((\{[^}]*\}), num_warps=(\d+), num_stages=(\d+)\)", line)]
            assert configs, line
            variants = [(dict(kw, **c.kwargs), c.num_warps, c.num_stages) for c in configs]
            if max_configs:
                variants = variants[:max_configs]
        else:
            stages = kw.pop("num_stages", 3)
            warps = kw.pop("num_warps", 4)
            if name.startswith("_attention"):  # its GPU tiles, from the module's own helper
                q = args[0]
                bm, bn, be, bev, stages = mod._attention_tiles(q.shape[2], args[1].shape[2], q.shape[3], args[2].shape[3],
                                                               q.element_size(), True)
                kw.update(BM=bm, BN=bn, BE=be, BEV=bev)
            variants = [(kw, warps, stages)]
        for kwv, w, s in variants:
            key = (name, repr(sorted((k, v) for k, v in kwv.items())), w, s,
                   tuple(getattr(a, "dtype", type(a)) for a in args))
            if key in seen:
                continue
            seen.add(key)
            tag = " ".join(f"{k}={kwv[k]}" for k in ("BM", "BN", "BK") if k in kwv) + f" w{w} s{s}"
            try:
                row, _ = compile_one(jit, args, kwv, w, s, ptxas_list)
                row.update(kernel=name, config=tag, ok=row["shared_bytes"] <= SHARED_LIMIT)
                if not row["ok"]:
                    row["error"] = f"needs {row['shared_bytes']} bytes of shared memory (limit {SHARED_LIMIT})"
                    ok = False
            except Exception as exc:
                msg = f"{type(exc).__name__}: {exc}"
                row = {"kernel": name, "config": tag, "ok": False, "error": msg[-1500:]}
                ok = ok and "OutOfResources" in type(exc).__name__  # the autotuner skips those
            rows.append(row)
            log(f"  {label:40s} {name:16s} {tag:28s} "
                + ("OK " + " ".join(k for k in ("wgmma", "mma_sync", "cp_async", "tma") if row.get(k))
                   + f" smem {row.get('shared_bytes', 0) // 1024} KB regs {row.get('regs', '?')} "
                   f"local {row.get('spill_bytes', '?')} {row['seconds']} s"
                   if row["ok"] else "FAILED " + row["error"][:300].replace("\n", " ")))
    return rows, ok


def extra_cases():
    """Kernels the GPU benchmark does not time but the precision rule changes: fp32 convs and attention."""
    from core.program import Node as N
    from core.program import Program
    from core.program import TensorSpec as T

    out = []
    for k, c, h in ((1, 256, 56), (3, 64, 56), (3, 512, 7)):
        params = {"out_channels": c, "kernel_size": k, "stride": 1, "padding": k // 2, "dilation": 1, "groups": 1}
        out.append(("extra", f"conv2d {k}x{k} {c} {h}x{h} float32", Program([T((8, c, h, h))], [N("conv2d", (0,), params)])))
    for dt in ("float32", "bfloat16"):
        for e in (64, 128, 256):
            shape = (4, 8, 512, e)
            out.append(("extra", f"attention e{e} {dt}", Program([T(shape, dtype=dt)] * 3, [
                N("scaled_dot_product_attention", (0, 1, 2), {"is_causal": True})])))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", default="matmul,resnet50,extra",
                    help="comma-separated (default matmul,resnet50,extra: fp32 convs and attention)")
    ap.add_argument("--quick", action="store_true", help="the benchmark's --quick cases")
    ap.add_argument("--out", default="", help="write the rows as JSON here")
    ap.add_argument("--match", default="", help="only cases whose label contains this")
    ap.add_argument("--max-configs", type=int, default=0, help="compile at most this many configs per kernel")
    args = ap.parse_args(argv)
    import triton

    from benchmarks.expert_gpu import all_cases, catalog

    # Triton's bundled ptxas may reject the PTX version this Triton writes (NOTES.md): use the newer one
    log = lambda m: print(m, flush=True)  # noqa: E731
    ptxas_list = list(_ptxas())
    if not ptxas_list:
        log("no ptxas beside this Triton: nothing compiled")
        return 0
    if ptxas_list and not os.environ.get("TRITON_PTXAS_PATH"):
        os.environ["TRITON_PTXAS_PATH"] = ptxas_list[-1]
    wanted = {f.strip() for f in args.families.split(",") if f.strip()}
    from plugins.ops import attention  # noqa: E402

    cat = dict(catalog(), **{spec.name: spec for spec in attention.OPS})
    log(f"triton {triton.__version__}, target cuda sm_90, ptxas {os.environ.get('TRITON_PTXAS_PATH', 'bundled')}")
    all_rows, failed = [], []
    for family, label, program in all_cases(args.quick) + extra_cases():
        if wanted and family not in wanted or args.match not in label:
            continue
        rows, ok = check_case(label, program, cat, ptxas_list, log, args.max_configs)
        all_rows += [dict(r, case=label) for r in rows]
        if not ok:
            failed.append(label)
    n_ok = sum(r["ok"] for r in all_rows)
    log(f"\n{n_ok}/{len(all_rows)} kernel configs compiled for sm_90; "
        f"{sum(bool(r.get('wgmma')) for r in all_rows)} use wgmma; failing cases: {failed or 'none'}")
    if args.out:
        Path(args.out).write_text(json.dumps(all_rows, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

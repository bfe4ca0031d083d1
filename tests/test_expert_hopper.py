"""The expert's Hopper paths (issue 22), on CPU: the dot precision rule, the tile pruning, the two fast
conv2d forms against PyTorch in the interpreter, the fp32 roofline floor, the GPU benchmark's
bookkeeping, and (a subprocess without the interpreter) the emitted kernels compiling for sm_90."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from core.program import Node as N
from core.program import Program
from core.program import TensorSpec as T
from plugins.coders.expert_lowering import lower_program
from plugins.coders.expert_lowering.selfcheck import load_module
from plugins.coders.expert_lowering.tiling import (
    GEMM_CONFIGS_16,
    GEMM_CONFIGS_32,
    KEEP_CONFIGS,
    NARROW_CONFIGS_16,
    NARROW_CONFIGS_32,
    NARROW_N,
    gemm_configs,
    gpu_dot_precision,
    interpreter_dot_precision,
    pick_configs,
    tf32_allowed,
)
from plugins.proposers.common import render_source

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def cat():
    sys.path.insert(0, str(REPO))
    from benchmarks.expert_gpu import catalog

    return catalog()


def _conv(c, oc, k, s=1, p=0, d=1, groups=1, bias=True):
    return {"out_channels": oc, "kernel_size": k, "stride": s, "padding": p, "dilation": d, "groups": groups,
            "bias": bias}


def _check(program, cat, atol=1e-4):
    src = lower_program(program, cat)
    ref, cand = load_module(render_source(program, cat), "ref"), load_module(src, "cand")
    torch.manual_seed(0)
    model = ref.Model().eval()
    torch.manual_seed(0)
    new = cand.ModelNew().eval()
    torch.manual_seed(1)
    xs = ref.get_inputs()
    with torch.no_grad():
        want, got = model(*xs), new(*xs)
    assert got.shape == want.shape and got.dtype == want.dtype
    if want.numel():
        scale = max(1.0, float(want.float().abs().max()))
        assert float((got.float() - want.float()).abs().max()) <= atol * scale, program.ops
    return src


# ------------------------------------------------------------------ the precision rule


def test_fp32_dots_are_tf32x3_on_the_gpu_and_exact_in_the_interpreter():
    assert gpu_dot_precision("float32") == "tf32x3"
    assert not tf32_allowed("float32")  # plain TF32 (~5e-4) fails the verifier's fp32 tolerance
    assert gpu_dot_precision("float16") is None and gpu_dot_precision("bfloat16") is None  # native tensor cores
    assert interpreter_dot_precision("float32") == "ieee"


@pytest.mark.parametrize("dtype, gpu", [("float32", 'input_precision="tf32x3"'), ("float16", None),
                                        ("bfloat16", None)])
def test_emitted_gemm_and_conv_dots_follow_the_rule(cat, dtype, gpu):
    programs = [Program([T((32, 48), dtype=dtype)], [N("linear", (0,), {"out_features": 40, "bias": True})]),
                Program([T((2, 16, 8, 8), dtype=dtype)], [N("conv2d", (0,), _conv(16, 8, 1))]),
                Program([T((2, 16, 8, 8), dtype=dtype)], [N("conv2d", (0,), _conv(16, 8, 3, p=1))])]
    for program in programs:
        src = lower_program(program, cat)
        gpu_dots = [line.strip() for line in src.splitlines() if "tl.dot(a, b, acc" in line]
        assert gpu_dots, program.ops
        for line in gpu_dots:
            assert (gpu in line) if gpu else ("input_precision" not in line), line
        # the interpreter's branch: exact fp32 products of widened operands
        assert 'tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")' in src
        assert "tf32x3" not in src if dtype != "float32" else True


def test_gpu_configs_fit_hopper_shared_memory():
    for configs, item in ((GEMM_CONFIGS_16, 2), (GEMM_CONFIGS_32, 4), (NARROW_CONFIGS_16, 2), (NARROW_CONFIGS_32, 4)):
        for bm, bn, bk, _, warps, stages in configs:
            assert (bm * bk + bk * bn) * item * stages <= 227 * 1024  # sm_90's per-block limit
            assert warps in (4, 8)
    assert gemm_configs("float32") == GEMM_CONFIGS_32 and gemm_configs("bfloat16") == GEMM_CONFIGS_16


def test_configs_are_picked_for_the_shape_when_emitted(cat):
    big = pick_configs("float16", (4096, 4096, 1))
    assert len(big) == KEEP_CONFIGS and big[0][:2] == (128, 256)
    # conv5's 3x3 (M = 32*7*7, N = 512): 128x256 tiles would leave most SMs idle
    small = pick_configs("bfloat16", (1568, 512, 1))
    assert all(bm * bn <= 128 * 64 for bm, bn, *_ in small)
    assert pick_configs("float16", (4096, 4096, 1)) == big  # deterministic
    assert pick_configs("float32", None) == GEMM_CONFIGS_32  # unknown shape: every config
    assert all(c in GEMM_CONFIGS_32 for c in pick_configs("float32", (512, 49, 32)))
    src = lower_program(Program([T((4096, 4096), dtype="float16")], [N("linear", (0,), {"out_features": 4096})]), cat)
    assert src.count("triton.Config(") == KEEP_CONFIGS and "prune_configs_by" not in src  # the policy refuses hooks


def test_a_gemm_of_few_columns_gets_narrow_tiles(cat):
    # level 2's Conv3d 3 -> 16 channels (M = 128 * 14 * 30 * 30): 64-128-wide tiles computed 3/4 padding
    narrow = pick_configs("float32", (128 * 14 * 30 * 30, 16, 1))
    assert len(narrow) == KEEP_CONFIGS and all(bn <= NARROW_N for _, bn, *_ in narrow)
    assert all(c in NARROW_CONFIGS_16 for c in pick_configs("bfloat16", (1 << 20, 24, 1)))
    assert all(bn >= 64 for _, bn, *_ in pick_configs("float32", (1 << 20, 64, 1)))  # wider: as before
    conv3d = Program([T((2, 3, 16, 32, 32))], [N("conv3d", (0,), {"out_channels": 16, "kernel_size": 3, "stride": 1,
                                                                "padding": 1, "dilation": 1, "groups": 1})])
    assert "'BN': 16" in lower_program(conv3d, cat)
    wide = Program([T((2, 3, 6, 8, 8))], [N("conv3d", (0,), {"out_channels": 64, "kernel_size": 3, "stride": 1,
                                                              "padding": 1, "dilation": 1, "groups": 1})])
    assert lower_program(wide, cat).count("triton.Config(") == len(GEMM_CONFIGS_32)  # every config, as measured


# ------------------------------------------------------------------ the fast conv2d forms, in the interpreter


@pytest.mark.parametrize("shape, params, dtype", [
    ((2, 16, 8, 8), _conv(16, 8, 1), "float32"),  # 1x1, plane of 64: the NCHW batched GEMM
    ((2, 16, 8, 8), _conv(16, 8, 1, bias=False), "float16"),
    ((2, 16, 7, 7), _conv(16, 24, 1), "bfloat16"),  # plane of 49: channels-last implicit GEMM
    ((2, 16, 7, 7), _conv(16, 24, 3, p=1), "float32"),
    ((2, 5, 9, 9), _conv(5, 7, 3, s=2, p=2, d=2, bias=False), "float32"),  # channels not a block multiple
    ((2, 3, 11, 11), _conv(3, 8, 5, s=2, p=1), "float16"),
    ((2, 16, 8, 8), _conv(16, 8, 1, s=2), "float32"),  # strided 1x1: not a plain GEMM
    ((1, 32, 8, 8), _conv(32, 16, 3, p=1), "bfloat16"),
])
def test_fast_conv2d_matches_pytorch(cat, shape, params, dtype):
    program = Program([T(shape, dtype=dtype)], [N("conv2d", (0,), params)])
    src = _check(program, cat, atol=1e-4 if dtype == "float32" else 1e-2)
    gemm_1x1 = "sum_k w[m, k] * x[b, k, n]" in src
    plane = ((shape[2] - 1) // params["stride"] + 1) ** 2
    expect_1x1 = params["kernel_size"] == 1 and params["stride"] == 1 and plane % 8 == 0
    assert gemm_1x1 == expect_1x1
    assert ("= _channels_last(" in src) == (not expect_1x1)


@pytest.mark.parametrize("k", [1, 3])
def test_fast_conv2d_fuses_its_epilogue_and_reads_strided_inputs(cat, k):
    params = _conv(16, 16, k, p=k // 2)
    fused = Program([T((2, 16, 8, 8)), T((2, 16, 8, 8))], [N("conv2d", (0,), params), N("relu", (2,)), N("add", (3, 1))])
    src = _check(fused, cat)
    assert src.count("@triton.jit") - src.count("def _nchw_to_nhwc") - src.count("def _strided_copy") == 1
    permuted = Program([T((2, 8, 8, 16))], [N("permute", (0,), {"dims": (0, 3, 1, 2)}),
                                            N("conv2d", (1,), _conv(16, 12, k, p=k // 2))])
    _check(permuted, cat)


def test_fast_conv2d_of_an_empty_batch(cat):
    _check(Program([T((0, 16, 8, 8))], [N("conv2d", (0,), _conv(16, 12, 3, p=1))]), cat)


def test_grouped_conv_keeps_the_general_kernel(cat):
    src = _check(Program([T((2, 16, 8, 8))], [N("conv2d", (0,), _conv(16, 16, 3, p=1, groups=4))]), cat)
    assert "= _channels_last(" not in src and "sum_k w[m, k]" not in src


# ------------------------------------------------------------------ the fp32 speed-of-light floor


def test_an_fp32_gemm_on_split_tensor_core_products_is_plausible_on_the_h200():
    from plugins.devices import H200
    from plugins.verifiers.performance.roofline import roofline

    flops = 2 * 4096 ** 3
    fast = roofline(flops / 120e12, flops=flops, min_bytes=3 * 4096 ** 2 * 4, device=H200, dtypes=["float32"])
    assert not fast.implausible  # tf32x3 at 120 TFLOP/s: above the 51 TFLOP/s CUDA-core peak, honest
    assert fast.flops_utilisation == pytest.approx(120 / 51, rel=1e-6)  # utilisation stays against fp32's peak
    skipped = roofline(flops / 600e12, flops=flops, min_bytes=3 * 4096 ** 2 * 4, device=H200, dtypes=["float32"])
    assert skipped.implausible  # faster than three bf16 products per fp32 one can go
    bf16 = roofline(flops / 600e12, flops=flops, min_bytes=3 * 4096 ** 2 * 2, device=H200, dtypes=["bfloat16"])
    assert not bf16.implausible


# ------------------------------------------------------------------ the GPU benchmark's bookkeeping


def test_benchmark_summary_roofline_and_comparison(cat, tmp_path):
    from benchmarks import expert_gpu as bench
    from plugins.devices import H200

    labels = [label for _, label, _ in bench.all_cases(False)]
    order = [f for f, _, _ in bench.round_robin(bench.all_cases(False))]
    assert order[:25].count("resnet50") in (12, 13)  # half-way through, half of each family
    assert sorted(order) == sorted(f for f, _, _ in bench.all_cases(False))
    assert len([x for x in labels if x.startswith("conv")]) == 24 and len(set(labels)) == len(labels)
    program = next(p for f, label, p in bench.all_cases(False) if label == "conv2 3x3 64->64 56x56 float16")
    roof = bench.case_roofline(0.05, program, cat, H200)
    assert roof["flops"] == 2 * 32 * 56 * 56 * 64 * 64 * 9 and roof["bound"] == "compute"
    assert roof["tflops"] == pytest.approx(roof["flops"] / 0.05e-3 / 1e12)
    rows = [{"family": "resnet50", "case": "a", "correct": True, "vs_eager": 2.0, "vs_compile": 1.0,
             "expert_ms": 1.0, "eager_ms": 2.0, "expert_spread": 0.02, "eager_spread": 0.01, "roofline": roof},
            {"family": "resnet50", "case": "b", "correct": True, "vs_eager": 0.5, "vs_compile": 1.0,
             "expert_ms": 1.0, "eager_ms": 0.5, "expert_spread": 0.05, "eager_spread": 0.01, "roofline": roof}]
    s = bench.summarize(rows)["resnet50"]
    assert s["geomean_vs_eager"] == pytest.approx(1.0) and s["max_spread"] == 0.05 and s["timed"] == 2
    assert s["by_dtype"] == {None: pytest.approx(1.0)}
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"rows": [dict(rows[0], expert_ms=0.8), dict(rows[1])]}))
    moves = bench.compare(rows, old, lambda m: None)
    assert moves["a"]["expert"] == pytest.approx(0.25) and moves["b"]["expert"] == pytest.approx(0.0)


def test_benchmark_case_flow_on_cpu(cat, monkeypatch):
    """run_case end to end with the GPU parts stubbed: check, compile, interleaved rounds, roofline."""
    from benchmarks import expert_gpu as bench
    from plugins.devices import H200
    from plugins.verifiers.performance.timing import summarize as stats_of

    class Timer:
        def __init__(self):
            self.calls = []

        def time(self, fn, make_args):
            fn(*make_args(0))
            self.calls.append(fn)
            ms = {0: 2.0, 1: 1.5}.get(len(self.calls) % 3, 1.0)

            class R:
                median_ms, stats = ms, stats_of([ms])
            return R

    monkeypatch.setattr(torch, "compile", lambda model: model)
    program = Program([T((2, 16, 8, 8))], [N("conv2d", (0,), _conv(16, 8, 3, p=1))])
    timer = Timer()
    row = bench.run_case("resnet50", "tiny", program, cat, lambda m: None, timer, 3, H200, device="cpu")
    assert row["correct"] and len(timer.calls) == 9
    assert set(row["eager_rounds_ms"]) == {1.0, 1.5, 2.0} and row["eager_spread"] == pytest.approx(1.0 / 1.5)
    assert row["vs_eager"] == pytest.approx(1.0) and row["roofline"]["flops"] == program.flops(cat)


def test_the_expert_step_reads_the_new_summary_table():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_measure", REPO / "scripts" / "gpu_measure.py")
    m = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = m  # its dataclasses look their module up
    spec.loader.exec_module(m)
    log = ("family     cases correct  x eager x compile  spread   SOL   (geomean ...)\n"
           "matmul         9       9     1.21      1.10    3.2%   41%  x eager by dtype float32:2.10 float16:0.85\n"
           "resnet50      24      24     1.05      1.30    6.0%   18%\n")
    assert m.expert_figure(log) == "matmul 1.21/1.10, resnet50 1.05/1.30 (x eager/x compile)"
    assert m.STEPS["expert"].limit_s <= 400


# ------------------------------------------------------------------ sm_90 compile, without a GPU


def test_emitted_kernels_compile_for_sm90_offline():
    """The compile check in a subprocess without the interpreter: fp32 (tf32x3) linear and 3x3 conv,
    fp16 1x1 conv, one config each, through PTX to a cubin; each GEMM must use Hopper's wgmma."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"sm90_check_{os.getpid()}.json"
    for match, families in (("linear+bias+gelu 2048 float32", "matmul"), ("conv2d 3x3 64 56x56 float32", "extra"),
                            ("conv2 1x1 256->64 56x56 float16", "resnet50")):
        proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "sm90_compile_check.py"), "--quick",
                               "--families", families, "--match", match, "--max-configs", "1", "--out", str(out)],
                              capture_output=True, text=True, env=env, timeout=600)
        if "no ptxas" in proc.stdout:
            pytest.skip("no ptxas for sm_90 beside this Triton")
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        rows = json.loads(out.read_text())
        assert rows and all(r["ok"] for r in rows)
        gemms = [r for r in rows if r["kernel"].startswith(("_matmul", "_conv"))]
        assert gemms and all(r["wgmma"] for r in gemms), rows
    out.unlink(missing_ok=True)


def test_precompile_pool_reports_failures_and_stops_at_its_limit():
    """The pool's bookkeeping on CPU: each worker fails (no CUDA here) and says why; a limit too short
    stops the pool at once instead of waiting for it."""
    from benchmarks import expert_gpu as bench

    todo = bench.round_robin(bench.all_cases(True))[:1]
    msgs: list[str] = []
    bench.precompile(todo, True, 1, 120, msgs.append)
    assert "1 failed there" in msgs[-1]
    bench.precompile(todo, True, 1, 0.01, msgs.append)
    assert "stopped after" in msgs[-2]

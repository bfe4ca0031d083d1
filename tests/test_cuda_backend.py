"""The ``cuda`` backend on a machine without a GPU: static analysis, NVRTC compile, recording."""

from __future__ import annotations

import ast
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plugins.backends import nvrtc
from plugins.backends.cuda_backend import (
    GUIDE_EXAMPLE,
    NEEDS_GPU,
    CudaBackend,
    CupyRecorder,
    GpuRequiredError,
    LaunchLog,
    analyse_source,
    execute_candidate,
    kernel_names,
    record_sources,
)

HAS_COMPILER = nvrtc.nvrtc_available()
needs_compiler = pytest.mark.skipif(not HAS_COMPILER, reason="the CuPy NVRTC binding is not installed")

EXAMPLE = GUIDE_EXAMPLE

KERNEL = r'''
extern "C" __global__ void scale(const float* x, float* y, float a, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}
'''


def candidate(body: str) -> str:
    return textwrap.dedent(
        """
        import numpy as np
        import cupy as cp
        import torch
        import torch.nn as nn
        """
    ) + textwrap.dedent(body) + textwrap.dedent(
        """

        class ModelNew(nn.Module):
            def forward(self, x):
                return x
        """
    )


def test_guide_example_passes_static_and_compiles():
    report = analyse_source(EXAMPLE)
    assert report.ok, report.problems
    assert report.sources is not None and len(report.sources) == 1
    assert CudaBackend().detect_kernels(ast.parse(EXAMPLE)) == ["relu_kernel"]
    if HAS_COMPILER:
        result = CudaBackend().compile(EXAMPLE)
        assert result.ok, result.reason
        assert result.kernels == ["relu_kernel"] and result.arch == "sm_90" and not result.executed


@pytest.mark.parametrize(
    "source, problem",
    [
        ("def f(:\n", "syntax error"),
        (candidate(f"m = cp.RawModule(code={KERNEL!r})").replace("class ModelNew", "class Other"), "ModelNew"),
        (candidate(f"SRC = {KERNEL!r}"), "RawModule"),
        (candidate("m = cp.RawModule(code='int x;')"), "__global__"),
        (candidate("from torch.utils.cpp_extension import load_inline\nm = cp.RawModule(code='__global__')\n"
                   "load_inline(name='x', cpp_sources='')"), "cpp_extension"),
        (candidate(f"K = {KERNEL!r}\nm = cp.RawModule(path='k.cubin')"), "path="),
    ],
)
def test_static_stage_rejects_with_an_actionable_problem(source, problem):
    report = analyse_source(source)
    assert not report.ok
    assert problem in report.detail


@needs_compiler
def test_compile_error_reports_the_compiler_message():
    bad = EXAMPLE.replace("float v = x[i];", "float v = x[i]")
    result = CudaBackend().compile(bad)
    assert not result.ok
    assert "expected a \";\"" in result.reason and "candidate.cu(" in result.reason
    assert "nvrtc" in result.reason and "sm_90" in result.reason


@needs_compiler
def test_raw_kernel_name_must_exist_in_the_source():
    ok = candidate(f"k = cp.RawKernel({KERNEL!r}, 'scale')")
    wrong = candidate(f"k = cp.RawKernel({KERNEL!r}, 'scal')")
    assert CudaBackend().compile(ok).ok
    result = CudaBackend().compile(wrong)
    assert not result.ok and "'scal'" in result.reason


@needs_compiler
def test_templates_compile_through_name_expressions():
    src = r'''
template<typename T> __global__ void twice(const T* x, T* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = x[i] + x[i]; }
'''
    cand = candidate(f"m = cp.RawModule(code={src!r}, name_expressions=['twice<float>'])")
    report = analyse_source(cand)
    assert report.ok and report.sources[0].name_expressions == ("twice<float>",)
    assert CudaBackend().compile(cand).ok


@needs_compiler
def test_source_built_at_run_time_is_recorded_in_the_worker_and_compiled():
    body = f"""
    PARTS = {KERNEL.split('float a')!r}
    def build():
        return cp.RawModule(code='float a'.join(PARTS), options=('-use_fast_math',))
    """
    cand = candidate(body).replace("    def forward", "    def __init__(self):\n        super().__init__()\n"
                                   "        self.m = build()\n\n    def forward")
    assert analyse_source(cand).ok and analyse_source(cand).sources is None
    result = CudaBackend().compile(cand, init_inputs=[])
    assert result.ok, result.reason
    assert result.executed and result.kernels == ["scale"]


def test_recorder_on_cpu_records_and_refuses_to_launch():
    sources, error = record_sources(EXAMPLE, init_inputs=[])
    assert error is None and len(sources) == 1 and "relu_kernel" in sources[0].code
    with CupyRecorder(dry=True) as rec:
        mod = execute_candidate(EXAMPLE)
        kernel = mod._module.get_function("relu_kernel")
        with pytest.raises(GpuRequiredError, match="needs a GPU"):
            kernel((1,), (1,), (0, 0, 0))
    assert rec.log.total_launches == 0
    import cupy

    assert cupy.RawModule.__module__.startswith("cupy")  # uninstalled again


def test_launch_tracker_counts_only_inside_its_context():
    log = LaunchLog()
    backend = CudaBackend()
    backend._recorder = type("R", (), {"log": log})()
    with log.launching("outside"):
        pass
    with backend.launch_tracker() as tracker:
        with log.launching("k1"):
            assert tracker.inside
        with log.launching("k2"):
            pass
    with log.launching("after"):
        pass
    assert tracker.count == 2 and tracker.kernels == ["k1", "k2"] and not tracker.inside
    assert log.total_launches == 4


@needs_compiler
def test_backend_protocol_load_compiles_recorded_sources_on_cpu():
    from core.contracts import Backend

    backend = CudaBackend()
    assert isinstance(backend, Backend)
    assert backend.supports("cpu") == NEEDS_GPU and "needs a GPU" in NEEDS_GPU
    backend.prepare_worker("cpu")
    try:
        module = execute_candidate(EXAMPLE)
        backend.load(module, "cpu")
        assert backend.last_compile.ok
        broken = execute_candidate(EXAMPLE.replace("y[i] =", "y[i] = undefined_name +"))
        with pytest.raises(RuntimeError, match="error"):
            backend.load(broken, "cpu")
    finally:
        backend._recorder.uninstall()


@needs_compiler
def test_precompile_compiles_the_literal_sources_once_and_load_uses_them(monkeypatch):
    """On a GPU the verifier compiles a candidate's literal CUDA sources before its load takes the GPU
    lock (precompile): the load then does not compile them again, and a source that failed ahead is
    compiled again in the load, which reports the compiler's message as before."""
    backend = CudaBackend()
    backend.prepare_worker("cpu")
    calls = []
    compile_to_ptx = nvrtc.compile_to_ptx

    def counting(*args, **kwargs):
        calls.append(args[0])
        return compile_to_ptx(*args, **kwargs)

    monkeypatch.setattr(nvrtc, "compile_to_ptx", counting)
    try:
        assert backend.precompile(EXAMPLE, "cpu") == {"precompiled": 1} and len(calls) == 1
        backend.load(execute_candidate(EXAMPLE), "cpu")
        assert backend.last_compile.ok and len(calls) == 1  # nothing compiled twice
        backend.load(execute_candidate(EXAMPLE), "cpu")  # a load uses a precompile once
        assert backend.last_compile.ok and len(calls) == 2

        broken = EXAMPLE.replace("y[i] =", "y[i] = undefined_name +")
        assert backend.precompile(broken, "cpu") == {"precompiled": 0}
        with pytest.raises(RuntimeError, match="undefined_name"):
            backend.load(execute_candidate(broken), "cpu")
        assert len(calls) == 4

        other = EXAMPLE.replace("y[i] =", "y[i] = 2.0f *")  # precompiled text and loaded module differ
        backend.precompile(EXAMPLE, "cpu")
        backend.load(execute_candidate(other), "cpu")
        assert backend.last_compile.ok and calls[-1] != calls[-2] and "2.0f" in calls[-1]
        assert backend.precompile("def broken(:", "cpu") == {"precompiled": 0}  # unparsable: nothing ahead
    finally:
        backend._recorder.uninstall()


def test_registered_as_cuda(plugin_manager):
    from core.plugins import registry

    backend = registry("backend").create("cuda")
    assert backend.name == "cuda" and "RawModule" in backend.guide


def test_kernel_name_scan():
    src = 'extern "C" __global__ void __launch_bounds__(256) a(float* x) {}\n__global__ void b() {}'
    assert kernel_names(src) == ["a", "b"]


pieces = st.lists(st.text(alphabet="abc_{}();\n *", min_size=1, max_size=12), min_size=1, max_size=5)


@given(pieces, st.booleans())
@settings(max_examples=100, deadline=None)
def test_static_resolver_reassembles_split_literals(parts, via_names):
    """However the kernel string is split across literals and module-level names, the AST resolver
    recovers exactly the text CuPy would receive."""
    code = "__global__ void k() {}\n" + "".join(parts)
    chunks = ["__global__ void k() {}\n", *parts]
    if via_names:
        lines = [f"P{i} = {c!r}" for i, c in enumerate(chunks)]
        expr = " + ".join(f"P{i}" for i in range(len(chunks)))
        body = "\n".join(lines) + f"\nSRC = {expr}\nm = cp.RawModule(code=SRC)\n"
    else:
        body = "m = cp.RawModule(code=" + " + ".join(repr(c) for c in chunks) + ")\n"
    report = analyse_source(candidate(body))
    assert report.sources is not None and report.sources[0].code == code


def test_rebound_names_are_not_trusted_statically():
    body = f"SRC = {KERNEL!r}\nfor _ in range(1):\n    SRC = SRC + ''\nm = cp.RawModule(code=SRC)\n"
    assert analyse_source(candidate(body)).sources is None


@needs_compiler
def test_a_worker_precompiles_outside_the_load_and_a_triton_worker_skips_it():
    """The worker side of precompile: a candidate worker of the cuda backend compiles the literal
    sources without running the candidate; its load then succeeds; a backend without precompile skips."""
    from core.verification.sandbox import Limits, WorkerPool

    pool = WorkerPool("candidate", "cuda", "cpu", size=1, limits=Limits(memory_mb=4096))
    try:
        worker = pool.acquire()
        try:
            ahead = worker.request({"op": "precompile", "source": EXAMPLE}, timeout_s=120)
            assert ahead["ok"] and ahead["precompiled"] == 1 and not ahead["sandbox"]
            loaded = worker.request({"op": "load", "source": EXAMPLE, "init_seed": 0, "init_inputs": []},
                                    timeout_s=120)
            assert loaded["ok"], loaded
        finally:
            pool.release(worker)
    finally:
        pool.close()
    pool = WorkerPool("candidate", "triton", "cpu", size=1, limits=Limits(memory_mb=4096),
                      extra_env={"TRITON_INTERPRET": "1"})
    try:
        worker = pool.acquire()
        try:
            assert worker.request({"op": "precompile", "source": "x = 1"}, timeout_s=120) == \
                {"ok": True, "precompiled": 0}
        finally:
            pool.release(worker)
    finally:
        pool.close()

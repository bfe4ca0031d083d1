"""The ``cuda_inline`` backend (KernelBench's load_inline format) on CPU: detection, the C++ policy,
the recording load_inline, the refusal and the compile-only verdict (GPU runs: tests/gpu/)."""

from __future__ import annotations

import ast
import shutil

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from core.plugins import create
from core.task import Candidate, Task
from core.verification.evidence import Evidence
from plugins.backends import load_inline_build as build
from plugins.backends.load_inline import GUIDE_EXAMPLE, NEEDS_GPU, InlineSourceCheck, LoadInlineBackend, admit
from plugins.backends.load_inline_static import analyse_source, detect_kernels, source_findings
from plugins.verifiers.static import StaticCheck

RELU_TASK = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(64, 33)]


def get_init_inputs():
    return []
"""

# A load_inline candidate whose CUDA unit includes no torch header (no_implicit_headers=True): nvcc
# compiles it in seconds, so the compile-only path is exercised for real on CPU.
LIGHT = r'''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SRC = r"""
#include <cuda_runtime.h>
__global__ void relu_kernel(const float* x, float* y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}
void relu_launch(const float* x, float* y, long long n) {
    if (n > 0) relu_kernel<<<(unsigned)((n + 255) / 256), 256>>>(x, y, n);
}
"""

CPP_SRC = r"""
#include <torch/extension.h>
void relu_launch(const float* x, float* y, long long n);
torch::Tensor relu_forward(torch::Tensor x) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    relu_launch(xc.data_ptr<float>(), y.data_ptr<float>(), xc.numel());
    return y;
}
"""

ext = load_inline(name="kz_light_relu", cpp_sources=CPP_SRC, cuda_sources=CUDA_SRC,
                  functions=["relu_forward"], no_implicit_headers=True)


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.relu_forward(x)
'''

needs_nvcc = pytest.mark.skipif(build.nvcc_path() is None, reason="needs nvcc (the CUDA toolkit)")


def _evidence(source: str, backend: str) -> Evidence:
    ev = Evidence(task=Task(source=RELU_TASK), candidate=Candidate(source=source, backend=backend),
                  backend=backend, device="cpu")
    ev.tree = ast.parse(source)
    return ev


# --------------------------------------------------------------------------- static


def test_guide_example_parses_and_names_its_kernel_and_extension():
    report = analyse_source(GUIDE_EXAMPLE)
    assert report.ok, report.problems
    (ext,) = report.extensions
    assert ext.name == "kz_relu" and ext.functions == ("relu_forward",) and ext.kernels == ["relu_kernel"]
    assert source_findings(ext) == []
    assert detect_kernels(ast.parse(GUIDE_EXAMPLE)) == ["relu_kernel"]
    assert LoadInlineBackend().detect_kernels(ast.parse(GUIDE_EXAMPLE)) == ["relu_kernel"]


def test_positional_arguments_and_names_bound_once_are_read_like_keywords():
    src = LIGHT.replace('load_inline(name="kz_light_relu", cpp_sources=CPP_SRC, cuda_sources=CUDA_SRC,',
                        'load_inline("kz_light_relu", CPP_SRC, CUDA_SRC,')
    (ext,) = analyse_source(src).extensions
    assert ext.name == "kz_light_relu" and ext.no_implicit_headers and ext.kernels == ["relu_kernel"]


def test_a_string_without_load_inline_is_no_kernel_of_this_backend():
    src = 'import torch\nSRC = "__global__ void k(float* x) {}"\nclass ModelNew(torch.nn.Module):\n    pass\n'
    assert detect_kernels(ast.parse(src)) == []
    assert not analyse_source(src).ok


def test_arguments_built_at_run_time_are_not_statically_known():
    src = LIGHT.replace("cuda_sources=CUDA_SRC,", "cuda_sources=CUDA_SRC.replace('x', 'x'),")
    assert analyse_source(src).extensions is None
    result = InlineSourceCheck().evaluate(_evidence(src, "cuda_inline"))
    assert not result.passed and "not plain literals" in result.detail


def test_a_bound_function_missing_from_cpp_sources_is_reported_before_any_build():
    src = GUIDE_EXAMPLE.replace('functions=["relu_forward"]', 'functions=["relu_forward", "relu_backward"]')
    report = analyse_source(src)
    assert not report.ok
    assert "'relu_backward' in functions= is not declared in cpp_sources" in report.detail


BARRED = [
    ("return at::native::relu(x);", "below the dispatcher"),
    ("cublasHandle_t handle;", "cuBLAS"),
    ("auto h = x.cpu();", "host"),
    ("std::thread t([]{});", "threads"),
    ('system("ls");', "processes"),
    ('PyRun_SimpleString("1");', "Python from C++"),
    ("auto r = at::_ops::relu::redispatch(ks, x);", "redispatch"),
    ("thrust::sort(p, p + 4);", "Thrust"),
    ('void* h = dlopen("libm.so", 1);', "dynamic loader"),
    ("#define CAT(a, b) a##b", "pastes tokens"),
]


@pytest.mark.parametrize("line, why", BARRED)
def test_the_cpp_policy_refuses_what_the_audit_cannot_see(line, why):
    src = GUIDE_EXAMPLE.replace("    auto xc = x.contiguous();", f"    {line}\n    auto xc = x.contiguous();")
    result = InlineSourceCheck().evaluate(_evidence(src, "cuda_inline"))
    assert not result.passed and result.hack
    assert why in result.detail


def test_comments_do_not_trip_the_cpp_policy():
    src = GUIDE_EXAMPLE.replace("    auto xc = x.contiguous();", "    // not cublas, not at::native::\n"
                                "    /* system(\"x\") */\n    auto xc = x.contiguous();")
    assert InlineSourceCheck().evaluate(_evidence(src, "cuda_inline")).passed


@pytest.mark.parametrize("kw, value", [("extra_ldflags", '["-lcublas"]'), ("extra_cuda_cflags", '["-I/etc"]'),
                                       ("extra_cflags", '["-include", "/etc/passwd"]'),
                                       ("extra_include_paths", '["/opt/include"]')])
def test_build_flags_that_pull_in_outside_code_are_refused(kw, value):
    src = GUIDE_EXAMPLE.replace('functions=["relu_forward"]', f'functions=["relu_forward"], {kw}={value}')
    result = InlineSourceCheck().evaluate(_evidence(src, "cuda_inline"))
    assert not result.passed and result.hack and kw in result.detail


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from(["-O3", "--use_fast_math", "-lineinfo", "", "-DBLOCK=256", "-Xptxas=-v"]),
                max_size=4))
def test_plain_optimisation_flags_pass_the_policy(flags):
    src = GUIDE_EXAMPLE.replace('functions=["relu_forward"]', f'functions=["relu_forward"], extra_cuda_cflags={flags!r}')
    (ext,) = analyse_source(src).extensions
    assert ext.extra_cuda_cflags == tuple(flags)
    assert source_findings(ext) == []


def test_check_applies_only_to_cuda_inline():
    check = InlineSourceCheck()
    assert check.applies("cuda_inline", "cpu") and check.applies("cuda_inline", "cuda")
    assert not check.applies("triton", "cpu") and not check.applies("cuda", "cuda")


@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_a_load_inline_candidate_under_another_backend_is_told_which_backend_to_use(backend):
    result = StaticCheck().evaluate(_evidence(GUIDE_EXAMPLE, backend))
    assert not result.passed
    assert result.detail.startswith(f"contains no {backend} kernel; it looks like a CUDA C "
                                    "(torch.utils.cpp_extension.load_inline) candidate (relu_kernel)")
    assert "use backend=cuda_inline" in result.detail


def test_a_triton_candidate_under_cuda_inline_is_pointed_back_to_triton():
    triton_src = create("backend", "triton").warm_up_candidate
    result = StaticCheck().evaluate(_evidence(triton_src, "cuda_inline"))
    assert not result.passed and "use backend=triton" in result.detail


# --------------------------------------------------------------------------- refusal and toolchain


def test_on_cpu_the_backend_says_it_needs_a_gpu_and_what_to_use():
    assert NEEDS_GPU == ("cuda_inline candidates build and run only on a GPU host: torch.utils.cpp_extension "
                         "needs CUDA; use backend=triton (interpreter) on CPU")
    backend = LoadInlineBackend()
    if build.nvcc_path() is not None:
        assert backend.supports("cpu") == NEEDS_GPU and backend.compiles_on("cpu")
    assert not backend.compiles_on("cuda")


def test_without_nvcc_the_verifier_refuses_with_one_sentence_before_any_worker(monkeypatch):
    from core.verify import Verifier, VerifierConfigError

    monkeypatch.setattr(build, "nvcc_path", lambda: None)
    with pytest.raises(VerifierConfigError) as info:
        Verifier(backend="cuda_inline", device="cpu", workers=1)
    assert str(info.value).startswith(NEEDS_GPU)
    assert "lacks nvcc (the CUDA toolkit" in str(info.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU message is for machines without one")
def test_asked_for_cuda_without_a_gpu_it_says_so():
    assert "no CUDA device is visible" in LoadInlineBackend().supports("cuda")


def test_the_worker_may_start_only_the_build_tools(monkeypatch):
    dirs = LoadInlineBackend().compiler_dirs()
    for tool in ("ninja", "c++"):
        found = shutil.which(tool)
        if found:
            assert found in dirs
    assert not any(d in ("/usr/bin", "/bin", "/usr/local/bin") for d in dirs)


def test_bare_program_names_are_resolved_on_the_path_before_the_sandbox_decides(tmp_path):
    from core.verification.worker.process import AuditGuard

    ninja = shutil.which("ninja") or shutil.which("sh")
    guard = AuditGuard(str(tmp_path), [ninja])
    guard.armed = True
    name = ninja.rsplit("/", 1)[1]
    guard("subprocess.Popen", (name, [name, "--version"], None, None))  # allowed: resolves to the program
    with pytest.raises(PermissionError):
        guard("subprocess.Popen", ("ls", ["ls"], None, None))


# --------------------------------------------------------------------------- the recording load_inline


def _exec(source: str, name: str = "kz_inline_test") -> dict:
    namespace: dict = {"__name__": name, "__kz_source__": source}
    exec(compile(source, f"<{name}>", "exec"), namespace)  # noqa: S102 - the candidate is ours
    return namespace


def test_without_a_gpu_load_inline_is_recorded_and_its_functions_refuse_to_run():
    recorder = build.InlineRecorder(dry=True, admit=admit).install()
    try:
        ns = _exec(LIGHT)
        (ext,) = recorder.log.extensions_of(ns)
        assert ext.name == "kz_light_relu" and ext.kernels == ["relu_kernel"]
        with pytest.raises(build.GpuRequiredError, match="kz_light_relu.relu_forward was called"):
            ns["ModelNew"]()(torch.ones(3))
    finally:
        recorder.uninstall()
    from torch.utils import cpp_extension

    assert cpp_extension.load_inline.__module__ == "torch.utils.cpp_extension"


def test_a_call_the_static_stage_did_not_read_is_refused_before_it_builds():
    sneaky = LIGHT.replace('ext = load_inline(name="kz_light_relu"',
                           'build_it = load_inline\next = build_it(name="kz_light_relu"')
    sneaky = sneaky.replace("CUDA_SRC, functions", "CUDA_SRC + '', functions")
    recorder = build.InlineRecorder(dry=True, admit=admit).install()
    try:
        with pytest.raises(PermissionError, match="not those of a load_inline call written in the candidate"):
            _exec(sneaky)
    finally:
        recorder.uninstall()


def test_calls_of_bound_functions_count_as_launches_and_leave_the_audit_looking():
    ext = analyse_source(GUIDE_EXAMPLE).extensions[0]
    log = build.LaunchLog()
    seen = []
    module = type("Built", (), {"relu_forward": staticmethod(lambda x: seen.append(x) or x), "other": 3})()
    wrapped = build.CountingExtension(module, ext, log)
    tracker = build.LaunchTracker()
    log.trackers.append(tracker)
    assert wrapped.relu_forward(5) == 5 and wrapped.relu_forward(6) == 6
    assert wrapped.other == 3
    assert tracker.count == 2 and tracker.kernels == ["kz_relu.relu_forward"] * 2
    assert tracker.inside is False  # ops the C++ dispatches are the audit's to judge
    assert seen == [5, 6]


def test_build_errors_are_condensed_to_the_compiler_lines():
    log = ("[1/3] /usr/bin/nvcc -c cuda.cu -o cuda.cuda.o -I/very/long/include/path ... error-limit\n"
           "FAILED: cuda.cuda.o\ncuda.cu(12): error: expected an expression\n1 error detected\n")
    assert build.condensed_build_error(log) == "cuda.cu(12): error: expected an expression\n1 error detected"


def test_the_nvcc_command_mirrors_torchs_cuda_flags(tmp_path):
    from torch.utils import cpp_extension

    ext = analyse_source(GUIDE_EXAMPLE.replace('functions=["relu_forward"]',
                                               'functions=["relu_forward"], extra_cuda_cflags=["-O3"]')).extensions[0]
    if build.nvcc_path() is None:
        pytest.skip("needs nvcc")
    cmd = build.nvcc_command(ext, tmp_path / "cuda.cu", tmp_path / "cuda.o", "sm_90", ["/inc"])
    assert cmd[1:3] == ["-c", str(tmp_path / "cuda.cu")]
    assert "-DTORCH_EXTENSION_NAME=kz_relu" in cmd and "-gencode=arch=compute_90,code=sm_90" in cmd
    assert all(f in cmd for f in cpp_extension.COMMON_NVCC_FLAGS)
    assert cmd[-2:] == ["-O3", "-std=c++20"]
    own = build.nvcc_command(ext.__class__(**{**ext.__dict__, "extra_cuda_cflags": ("-arch=sm_80", "-std=c++17")}),
                             tmp_path / "cuda.cu", tmp_path / "cuda.o", "sm_90", [])
    assert not any(f.startswith("-gencode") for f in own) and "-std=c++20" not in own
    assert build.cuda_unit(ext).startswith("#include <torch/types.h>\n#include <cuda.h>\n#include <cuda_runtime.h>\n")


# --------------------------------------------------------------------------- compile-only verdicts


@pytest.fixture(scope="module")
def verifier():
    from core.verify import Verifier

    if build.nvcc_path() is None:
        pytest.skip("needs nvcc (the CUDA toolkit)")
    with Verifier(backend="cuda_inline", device="cpu", workers=1, timeout_s=600) as v:
        yield v


@needs_nvcc
def test_compile_only_verdict_on_cpu_compiles_the_cuda_unit_and_says_why_nothing_ran(verifier):
    verdict = verifier.verify(Task(source=RELU_TASK), Candidate(source=LIGHT, backend="cuda_inline"))
    assert verdict.compiled and not verdict.accepted
    assert verdict.reason == f"compiled, not executed: {NEEDS_GPU}"
    assert verdict.checks["cuda_inline_source"].passed


@needs_nvcc
def test_compile_only_reports_nvccs_error_line(verifier):
    bad = LIGHT.replace("if (i < n) y[i]", "if (i < n) y[i] = ;")
    verdict = verifier.verify(Task(source=RELU_TASK), Candidate(source=bad, backend="cuda_inline"))
    assert not verdict.compiled and not verdict.accepted
    assert "nvcc failed on the CUDA sources of extension 'kz_light_relu'" in verdict.reason
    assert "cuda.cu(" in verdict.reason and "error" in verdict.reason


@needs_nvcc
def test_a_barred_construct_is_refused_before_anything_compiles(verifier):
    bad = LIGHT.replace("auto xc = x.contiguous();", "auto xc = at::native::relu(x);")
    verdict = verifier.verify(Task(source=RELU_TASK), Candidate(source=bad, backend="cuda_inline"))
    assert not verdict.compiled and verdict.hack_flags == ["cuda_inline_source"]
    assert "at::native::" in verdict.reason and "below the dispatcher" in verdict.reason


@pytest.mark.slow
@needs_nvcc
def test_the_guide_example_with_torchs_headers_compiles_with_nvcc():
    """About 1-2 CPU minutes: the unit includes torch/extension.h, as every KernelBench solution does."""
    (ext,) = analyse_source(GUIDE_EXAMPLE).extensions
    report = build.compile_extensions([ext])
    assert report.ok, report.reason
    assert report.kernels == ["relu_kernel"]


# The real build path, on CPU: a C++-only extension built by the recording load_inline under the
# sandbox's audit guard (bare "ninja" and "c++" must be allowed), its calls counted, and the ATen
# audit seeing what the C++ dispatches. A separate process: an audit hook cannot be removed.
_BUILD_UNDER_GUARD = r'''
import json, os, sys, tempfile, torch
scratch = tempfile.mkdtemp(prefix="kz-inline-test-")
os.environ["TMPDIR"] = scratch
from core.verification.worker.process import AuditGuard, make_audit_mode
from plugins.backends import load_inline_build as build
from plugins.backends.load_inline import LoadInlineBackend
os.environ["TORCH_EXTENSIONS_DIR"] = os.path.join(scratch, "torch_extensions")
recorder = build.InlineRecorder(dry=False).install()
guard = AuditGuard(scratch, LoadInlineBackend().compiler_dirs())
sys.addaudithook(guard)
guard.armed = True
from torch.utils.cpp_extension import load_inline
CPP = """
torch::Tensor relu_host(torch::Tensor x) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const float* in = xc.data_ptr<float>();
    float* out = y.data_ptr<float>();
    for (long long i = 0; i < xc.numel(); ++i) out[i] = in[i] > 0.0f ? in[i] : 0.0f;
    return y;
}
torch::Tensor relu_aten(torch::Tensor x) { return at::relu(x); }
"""
ext = load_inline(name="kz_cpu_probe", cpp_sources=CPP, functions=["relu_host", "relu_aten"],
                  build_directory="/definitely/not/here")
# another candidate's extension of the same name: in one process a module name loads once, so torch
# builds it as kz_cpu_probe_v1; its own code must run, not the first one's
again = load_inline(name="kz_cpu_probe", cpp_sources=CPP.replace("in[i] : 0.0f", "2.0f * in[i] : 0.0f"),
                    functions=["relu_host", "relu_aten"])
guard.armed = False
x = torch.randn(1000)
twice = bool(torch.equal(again.relu_host(x), 2 * torch.relu(x))) and bool(torch.equal(ext.relu_host(x), torch.relu(x)))
seen = {}
with recorder.tracking() as tracker:
    for fn in ("relu_host", "relu_aten"):  # the first build's
        audit = make_audit_mode(tracker)
        with audit:
            y = getattr(ext, fn)(x)
        seen[fn] = {"ops": audit.ops, "ok": bool(torch.equal(y, torch.relu(x)))}
print("RESULT " + json.dumps({"seen": seen, "count": tracker.count, "kernels": tracker.kernels,
                               "violations": guard.take(), "twice": twice, "built_in_scratch": any(
                                   "kz_cpu_probe" in d for d in os.listdir(os.path.join(scratch, "torch_extensions")))}))
'''


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("ninja") is None or shutil.which("c++") is None, reason="needs ninja and c++")
def test_a_real_build_passes_the_guard_is_counted_and_aten_from_cpp_is_audited():
    """About 1-2 CPU minutes (g++ on torch/extension.h)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[1])
    proc = subprocess.run([sys.executable, "-c", _BUILD_UNDER_GUARD], capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "PYTHONPATH": root}, cwd=root)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads(line[len("RESULT "):])
    assert result["violations"] == []  # ninja and the compiler started by name, allowed
    assert result["built_in_scratch"]  # the candidate's build_directory was ignored
    assert result["twice"]  # a changed extension of the same name runs its own code
    assert result["count"] == 2 and result["kernels"] == ["kz_cpu_probe.relu_host", "kz_cpu_probe.relu_aten"]
    assert result["seen"]["relu_host"] == {"ops": [], "ok": True}  # allocation only: allowed
    assert result["seen"]["relu_aten"]["ok"] and result["seen"]["relu_aten"]["ops"] == ["aten.relu.default"]


def test_the_python_side_may_use_only_load_inline_of_cpp_extension():
    from plugins.verifiers.static import StaticIntegrityCheck

    assert StaticIntegrityCheck().evaluate(_evidence(GUIDE_EXAMPLE, "cuda_inline")).passed
    for other in ("load", "CUDAExtension", "include_paths"):
        src = GUIDE_EXAMPLE.replace("from torch.utils.cpp_extension import load_inline",
                                    f"from torch.utils.cpp_extension import load_inline, {other}")
        result = StaticIntegrityCheck().evaluate(_evidence(src, "cuda_inline"))
        assert not result.passed and other in result.detail

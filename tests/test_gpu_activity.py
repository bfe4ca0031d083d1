"""The gpu_activity check's judge side on synthetic CUPTI traces (Kineto's Chrome trace format), and
its worker-side series on the CPU profiler. The GPU runs are in tests/redteam_gpu/test_gpu_activity_gpu.py."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from core.task import Candidate, Task
from core.verification.evidence import Evidence, parse_python
from plugins.verifiers.gpu_activity import (
    Activity,
    Attribution,
    GpuActivityCheck,
    aggregate,
    attribute,
    audited_series,
    coverage,
    host_ops,
    judge,
    own_kernel,
    parse_chrome_trace,
    profiler_calls,
)

ATEN_ADD = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctorOnSelf_add<float>, "
            "std::array<char*, 2ul> >(int, at::native::CUDAFunctorOnSelf_add<float>, std::array<char*, 2ul>)")
ATEN_FILL = ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> "
             ">(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)")
ATEN_COPY = ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::"
             "direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::"
             "operator()() const::{lambda(float)#1}>(at::TensorIteratorBase&, at::native::direct_copy_kernel_cuda("
             "at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::"
             "{lambda(float)#1} const&)::{lambda(int)#1}>(int, at::native::gpu_kernel_impl_nocast<at::native::"
             "direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::"
             "operator()() const::{lambda(float)#1}>(at::TensorIteratorBase&, at::native::direct_copy_kernel_cuda("
             "at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::"
             "{lambda(float)#1} const&)::{lambda(int)#1})")
CUBLAS = ("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_"
          "kernel__5x_cublas")
CUDNN = ("void implicit_convolve_sgemm<float, float, 128, 5, 5, 3, 3, 3, 1, false, false, true>(int, int, int, "
         "float const*, int, float*, float const*, kernel_conv_params, unsigned long long, int, float, float, int, "
         "float const*, float const*, bool, int, int)")

TRITON_CANDIDATE = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _relu(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, tl.where(x > 0, x, 0.0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        _relu[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y
'''


class Trace:
    """A synthetic profiler trace: GPU activities with the API calls (and ops) that launched them."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self.corr = 0

    def _launch(self, api: str, tid: int, op: str | None) -> tuple[int, int | None]:
        self.corr += 1
        cat = "cuda_runtime" if api.startswith("cuda") else "cuda_driver"
        self.events.append({"ph": "X", "cat": cat, "name": api, "pid": 1, "tid": tid, "ts": 10.0 * self.corr,
                            "dur": 3.0, "args": {"correlation": self.corr, "cbid": 211}})
        ext = None
        if op is not None:
            ext = 1000 + self.corr
            self.events.append({"ph": "X", "cat": "cpu_op", "name": op, "pid": 1, "tid": tid,
                                "ts": 10.0 * self.corr - 1, "dur": 5.0, "args": {"External id": ext}})
        return self.corr, ext

    def kernel(self, name: str, dur: float = 10.0, api: str = "cuLaunchKernelEx", tid: int = 1,
               op: str | None = None, stream: int = 7) -> "Trace":
        corr, ext = self._launch(api, tid, op)
        args = {"correlation": corr, "stream": stream, "device": 0, "grid": [4, 1, 1], "block": [128, 1, 1]}
        if ext is not None:
            args["External id"] = ext
        self.events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream,
                            "ts": 10.0 * corr + 5, "dur": dur, "args": args})
        return self

    def memcpy(self, kind: str, nbytes: int, dur: float = 2.0, op: str | None = None) -> "Trace":
        corr, _ = self._launch("cudaMemcpyAsync", 1, op)
        ends = {"HtoD": "Pageable -> Device", "DtoH": "Device -> Pageable", "DtoD": "Device -> Device"}
        self.events.append({"ph": "X", "cat": "gpu_memcpy", "name": f"Memcpy {kind} ({ends.get(kind, '?')})",
                            "pid": 0, "tid": 7, "ts": 10.0 * corr + 5, "dur": dur,
                            "args": {"correlation": corr, "stream": 7, "bytes": nbytes}})
        return self

    def memset(self, nbytes: int, dur: float = 1.0) -> "Trace":
        corr, _ = self._launch("cudaMemsetAsync", 1, None)
        self.events.append({"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "pid": 0, "tid": 7,
                            "ts": 10.0 * corr + 5, "dur": dur, "args": {"correlation": corr, "stream": 7,
                                                                         "bytes": nbytes}})
        return self

    def data(self, launches: int | None = None, grouped: bool = True, **extra: object) -> dict:
        """What collect returns for this trace (activities aggregated as it does, unless not ``grouped``)."""
        trace = {"traceEvents": [{"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "GPU 0"}},
                                 *self.events]}
        found = parse_chrome_trace(trace)
        found = aggregate(found) if grouped else found
        return {"calls": 3, "audited_call": 2, "launches": launches, "activities": [a.to_dict() for a in found],
                "dropped": 0, "mismatches": [], "host_ops": host_ops(trace), **extra}

    def host_op(self, name: str) -> "Trace":
        """A PyTorch op on the profiled thread that put nothing on the GPU (a host computation)."""
        self.events.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": 0.5, "dur": 1.0,
                            "args": {"External id": 1}})
        return self


OWN = {"_relu"}


# --------------------------------------------------------------------------- parsing


def test_parse_links_each_activity_to_its_launch_op_and_thread():
    t = Trace().kernel("_relu", dur=12.5).kernel(ATEN_ADD, api="cudaLaunchKernel", tid=55, op="aten::add")
    t.memcpy("HtoD", 4096).memset(256)
    t.events.append({"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 1, "tid": 1, "ts": 0.0, "dur": 1.0,
                     "args": {"External id": 1}})
    t.events.append({"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": 1, "tid": 1, "ts": 0.0})
    found = parse_chrome_trace({"traceEvents": list(reversed(t.events))})  # out of order on purpose
    assert [a.kind for a in found] == ["kernel", "kernel", "memcpy", "memset"]
    relu, add, copy, fill = found
    assert (relu.name, relu.dur_us, relu.api, relu.stream, relu.op) == ("_relu", 12.5, "cuLaunchKernelEx", 7, None)
    assert (add.api, add.tid, add.op) == ("cudaLaunchKernel", 55, "aten::add")
    assert (copy.copy, copy.bytes, copy.api) == ("HtoD", 4096, "cudaMemcpyAsync")
    assert (fill.kind, fill.bytes) == ("memset", 256)
    assert Activity.from_dict(add.to_dict()) == add


def test_parse_prefers_the_runtime_launch_when_a_driver_call_shares_its_correlation():
    t = Trace().kernel("_relu")
    corr = t.events[-1]["args"]["correlation"]
    t.events.insert(0, {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                        "ts": 1.0, "dur": 1.0, "args": {"correlation": corr}})
    assert parse_chrome_trace({"traceEvents": t.events})[0].api == "cudaLaunchKernel"


def test_own_kernel_names_as_triton_and_nvcc_emit_them():
    own = frozenset({"relu_kernel", "_relu"})
    assert own_kernel("_relu", own) == "_relu"
    assert own_kernel("relu_kernel(float const*, float*, long long)", own) == "relu_kernel"
    assert own_kernel("void relu_kernel<float>(float const*, float*)", own) == "relu_kernel"
    # a namespaced name is a library's, even when its last part is the candidate's name
    assert own_kernel("void at::native::relu_kernel<float>(float const*)", own) is None
    assert own_kernel("void ns::relu_kernel(float*)", own) is None
    assert own_kernel("relu_kernel2", own) is None
    assert own_kernel("_relu_", own) is None
    # names CUPTI gives before demangling
    assert own_kernel("_Z11relu_kernelPKfPfx", own) == "relu_kernel"
    assert own_kernel("_Z12relu_kernel2PKf", own) is None
    assert own_kernel("_ZN2ns11relu_kernelEPf", own) is None


# --------------------------------------------------------------------------- judging traces


def test_an_honest_triton_kernel_alone_passes_with_full_coverage():
    result = judge(Trace().kernel("_relu", dur=20.0).data(launches=1), OWN)
    assert result.passed, result.detail
    assert result.data["time_coverage"] == 1.0
    assert result.data["kernels"] == {"_relu": 1}
    assert "time coverage 100.0%" in result.detail


def test_triton_with_allowed_fills_and_copies_passes_and_counts_them_out_of_coverage():
    t = Trace().memset(4096, dur=1.0).kernel(ATEN_FILL, dur=2.0, api="cudaLaunchKernel", op="aten::fill_")
    t.kernel(ATEN_COPY, dur=3.0, api="cudaLaunchKernel", op="aten::copy_").memcpy("DtoD", 4096, dur=4.0)
    t.kernel("_relu", dur=30.0).kernel("_relu", dur=30.0)
    result = judge(t.data(launches=2), OWN)
    assert result.passed, result.detail
    assert result.data["time_coverage"] == pytest.approx(60.0 / 70.0)
    assert result.data["allowed_time_us"] == pytest.approx(10.0)
    assert set(result.data["allowed"]) == {"memset", "copy DtoD", "fill (ATen FillFunctor)",
                                           "copy (ATen direct_copy_kernel_cuda)"}


@pytest.mark.parametrize("name, family", [
    (ATEN_ADD, "ATen kernel"),
    (CUBLAS, "cuBLAS/CUTLASS kernel"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_16x4_nn_align4>(cutlass_80_tensorop_s1688gemm_128x"
     "128_16x4_nn_align4::Params)", "cuBLAS/CUTLASS kernel"),
    (CUDNN, "cuDNN kernel"),
    ("cupy_add__float32_float32_float32", "CuPy kernel"),
    ("triton_poi_fused_relu_0", "kernel the candidate does not define"),
])
def test_a_foreign_kernel_in_forward_is_a_hack_named_in_the_reason(name, family):
    t = Trace().kernel(ATEN_FILL, api="cudaLaunchKernel").kernel(name, dur=40.0, api="cudaLaunchKernel",
                                                                  op="aten::mm").kernel("_relu", dur=10.0)
    result = judge(t.data(launches=1), OWN)
    assert not result.passed and result.hack and not result.unchecked
    assert result.detail.startswith("foreign GPU work during forward")
    assert name[:60] in result.detail and family in result.detail
    assert "under aten::mm" in result.detail
    assert result.data["time_coverage"] == pytest.approx(10.0 / 60.0)
    assert result.data["foreign_time_us"] == pytest.approx(40.0)


@pytest.mark.parametrize("kind, words", [("HtoD", "host-to-device copy of 1024 bytes"),
                                         ("DtoH", "device-to-host copy of 1024 bytes")])
def test_host_copies_in_forward_are_hacks(kind, words):
    result = judge(Trace().memcpy(kind, 1024).kernel("_relu").data(launches=1), OWN)
    assert not result.passed and result.hack
    assert words in result.detail


def test_a_kernel_named_like_the_candidates_but_launched_by_the_runtime_is_foreign():
    result = judge(Trace().kernel("_relu", api="cudaLaunchKernel").data(launches=1), OWN)
    assert not result.passed and result.hack
    assert "launched through the CUDA runtime" in result.detail


def test_more_own_kernels_on_the_gpu_than_forward_launched_is_foreign():
    t = Trace().kernel("_relu").kernel("_relu", tid=77)  # the second from a thread the tracker does not see
    result = judge(t.data(launches=1), OWN)
    assert not result.passed and result.hack
    assert "ran 2 times on the GPU, but forward launched the backend's kernels 1 times" in result.detail
    assert judge(t.data(launches=None), OWN).passed  # no count from the backend: the rule cannot apply


def test_switching_the_profiler_in_forward_is_tampering():
    t = Trace().kernel("_relu")
    t.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaProfilerStop", "pid": 1, "tid": 1, "ts": 1.0,
                     "dur": 1.0, "args": {"correlation": 999}})
    calls = profiler_calls({"traceEvents": t.events})
    assert calls == ["cudaProfilerStop"]
    result = judge(t.data(launches=1, profiler_calls=calls), OWN)
    assert not result.passed and result.hack and "forward called cudaProfilerStop" in result.detail
    # it paused everything: still tampering, not "could not run"
    paused = judge(Trace().data(launches=0, profiler_calls=calls, canary=True), OWN)
    assert not paused.passed and paused.hack and not paused.unchecked
    assert profiler_calls({"traceEvents": Trace().kernel("_relu").events}) == []


def test_pytorch_ops_the_dispatch_audit_did_not_see_are_a_hack():
    """The trials' dispatch audit refuses aten::mm; recorded by the profiler on forward's thread, it
    ran hidden from that audit (torch._C._DisableTorchDispatch), here on host memory: no GPU kernel."""
    from core.verification.worker.process import ALLOWED_ATEN

    t = Trace().host_op("aten::empty_like").host_op("aten::mm").host_op("aten::mm").kernel("_relu")
    assert t.data()["host_ops"] == {"aten::empty_like": 1, "aten::mm": 2}
    result = judge(t.data(launches=1), OWN, allowed_ops=ALLOWED_ATEN)
    assert not result.passed and result.hack
    assert "dispatch audit did not see: aten::mm 2x" in result.detail and "empty_like" not in result.detail
    assert judge(t.data(launches=1), OWN).passed  # without the audit's list the ops are not judged
    # allocation, views, copies and fills pass, as in the trials
    honest = Trace().kernel("_relu")
    for op in ("aten::empty_like", "aten::empty_strided", "aten::zeros_like", "aten::fill_", "aten::t",
               "aten::transpose", "aten::contiguous", "aten::clone", "aten::copy_", "aten::view"):
        honest.host_op(op)
    assert judge(honest.data(launches=1), OWN, allowed_ops=ALLOWED_ATEN).passed
    # no GPU work at all, but a hidden host computation: a hack, not "could not run"
    host_only = judge(Trace().host_op("aten::mm").data(launches=0), OWN, allowed_ops=ALLOWED_ATEN)
    assert not host_only.passed and host_only.hack and not host_only.unchecked


def test_nothing_recorded_could_not_run():
    empty = Trace().data(launches=0, canary=False)
    result = judge(empty, OWN)
    assert not result.passed and result.unchecked
    assert "not even a canary kernel" in result.detail
    seen = judge(Trace().data(launches=0, canary=True), OWN)
    assert seen.unchecked and "put nothing on the GPU" in seen.detail


def test_a_zero_sized_call_may_put_nothing_on_the_gpu_but_the_profiler_must_have_recorded():
    """Issue 18, item 4 on the GPU: all outputs empty needs no launch; nothing recorded is still unchecked."""
    from core.verification.worker.process import ALLOWED_ATEN

    assert judge(Trace().data(launches=0, canary=True), OWN, no_work=True).passed
    blind = judge(Trace().data(launches=0, canary=False), OWN, no_work=True)
    assert not blind.passed and blind.unchecked  # the profiler's own canary did not show: it saw nothing
    hidden = judge(Trace().host_op("aten::mm").data(launches=0, canary=True), OWN, allowed_ops=ALLOWED_ATEN,
                   no_work=True)
    assert not hidden.passed and hidden.hack  # empty outputs do not excuse hidden compute


def test_a_trace_too_long_to_keep_could_not_run_unless_what_was_kept_is_foreign():
    result = judge(Trace().kernel("_relu").data(launches=1, dropped=5), OWN)
    assert result.unchecked and "5 left out" in result.detail
    assert "activities" not in result.data  # the verdict keeps a summary, not the trace
    foreign = judge(Trace().kernel(CUBLAS).data(launches=0, dropped=5), OWN)
    assert not foreign.passed and foreign.hack and not foreign.unchecked


def test_aggregating_keeps_counts_durations_and_the_judgement():
    t = Trace()
    for i in range(50):
        t.kernel("_relu", dur=2.0, stream=7 + i % 3)  # three streams: still one record
    t.memset(100).memset(28).kernel(ATEN_FILL, api="cudaLaunchKernel").kernel(ATEN_FILL, api="cudaLaunchKernel")
    flat, grouped = t.data(launches=50, grouped=False), t.data(launches=50)
    assert len(flat["activities"]) == 54 and len(grouped["activities"]) == 3
    relu = Activity.from_dict(grouped["activities"][0])
    assert (relu.count, relu.dur_us, relu.stream) == (50, pytest.approx(100.0), 7)
    assert Activity.from_dict(grouped["activities"][1]).bytes == 128
    a, b = judge(flat, OWN), judge(grouped, OWN)
    assert a.passed and b.passed
    assert (a.data["kernels"], a.data["allowed"]) == (b.data["kernels"], b.data["allowed"])
    assert a.data["time_coverage"] == pytest.approx(b.data["time_coverage"])
    assert a.data["gpu_time_us"] == pytest.approx(b.data["gpu_time_us"])
    assert b.data["kernels"] == {"_relu": 50}
    # the launch-count rule counts aggregated launches too
    assert not judge(t.data(launches=49), OWN).passed


def test_mismatches_of_the_series_are_a_hack_after_foreign_work():
    bad = Trace().kernel("_relu").data(launches=1, mismatches=["call 3 of 3: output: 4/16 elements differ"])
    result = judge(bad, OWN)
    assert not result.passed and result.hack and "call 3 of 3" in result.detail
    assert result.detail.startswith("outputs differ from the reference in the audited series")
    both = Trace().kernel(ATEN_ADD, api="cudaLaunchKernel").data(launches=0, mismatches=["call 1 of 3: x"])
    assert judge(both, OWN).detail.startswith("foreign GPU work")


# --------------------------------------------------------------------------- time coverage

OWNERS = st.sampled_from(["candidate", "allowed", "foreign"])
# a kernel's time (microseconds or any unit): none, or far from the subnormals (5e-324 * 0.5 is 0)
DURATIONS = st.one_of(st.just(0.0), st.floats(min_value=1e-6, max_value=1e6))


def attributions(pairs: list[tuple[str, float]]) -> list[Attribution]:
    return [Attribution(Activity(kind="kernel", name=f"k{i}", dur_us=d), owner, "x") for i, (owner, d) in
            enumerate(pairs)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(OWNERS, DURATIONS), max_size=30))
def test_time_coverage_is_the_candidates_share_of_the_summed_gpu_time(pairs):
    cov = coverage(attributions(pairs))
    own = sum(d for o, d in pairs if o == "candidate")
    total = sum(d for _, d in pairs)
    assert cov.total_us == pytest.approx(total)
    assert 0.0 <= cov.share <= 1.0
    if total > 0:
        assert cov.share == pytest.approx(own / total)
    else:
        assert cov.share == 0.0


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(OWNERS, DURATIONS), min_size=1, max_size=20),
       st.floats(min_value=1e-3, max_value=1e3), st.floats(min_value=1e-3, max_value=1e4))
def test_time_coverage_ignores_the_time_unit_and_falls_with_foreign_time(pairs, scale, extra):
    cov = coverage(attributions(pairs))
    scaled = coverage(attributions([(o, d * scale) for o, d in pairs]))
    assert scaled.share == pytest.approx(cov.share, rel=1e-9, abs=1e-12)
    more = coverage(attributions([*pairs, ("foreign", extra)]))
    assert more.share <= cov.share + 1e-12


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(min_value=0.5, max_value=1e4), min_size=1, max_size=10),
       st.lists(st.floats(min_value=0.5, max_value=1e4), max_size=10))
def test_judged_coverage_matches_the_trace(own_durations, fill_durations):
    t = Trace()
    for d in own_durations:
        t.kernel("_relu", dur=d)
    for d in fill_durations:
        t.memset(64, dur=d)
    result = judge(t.data(launches=len(own_durations)), OWN)
    assert result.passed
    assert result.data["time_coverage"] == pytest.approx(sum(own_durations) / (sum(own_durations) +
                                                                               sum(fill_durations)))


def test_attribute_allows_only_aten_fill_and_copy_kernels():
    own = frozenset(OWN)
    assert attribute(Activity("kernel", ATEN_FILL), own).owner == "allowed"
    assert attribute(Activity("kernel", ATEN_COPY), own).owner == "allowed"
    mangled_fill = "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEESt5arrayIPcLm1EEEEviT0_T1_"
    assert attribute(Activity("kernel", mangled_fill), own).owner == "allowed"
    mangled_add = ("_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_17CUDAFunctorOnSelf_addIfEESt5arrayIPcLm2EEEE"
                   "viT0_T1_")
    assert attribute(Activity("kernel", mangled_add), own).why.startswith("an ATen kernel")
    # the same words outside ATen's namespace are not the allow-listed kernels
    assert attribute(Activity("kernel", "void FillFunctor<float>(float*)"), own).owner == "foreign"
    assert attribute(Activity("kernel", "direct_copy_kernel_cuda"), own).owner == "foreign"
    assert attribute(Activity("memcpy", "Memcpy PtoP (Device -> Device)", copy="PtoP"), own).owner == "foreign"


# --------------------------------------------------------------------------- the check through Evidence


def evidence_for(source: str, backend: str, data: dict | None) -> Evidence:
    extra = {} if data is None else {"gpu_activity": data}
    return Evidence(task=Task(source="x = 1"), candidate=Candidate(source=source, backend=backend), backend=backend,
                    device="cuda", tree=parse_python(source), extra=extra)


def test_evaluate_finds_the_triton_candidates_kernels_in_its_source():
    check = GpuActivityCheck()
    ok = check.evaluate(evidence_for(TRITON_CANDIDATE, "triton", Trace().kernel("_relu").data(launches=1)))
    assert ok.passed, ok.detail
    bad = check.evaluate(evidence_for(TRITON_CANDIDATE, "triton", Trace().kernel("relu").data(launches=1)))
    assert not bad.passed and bad.hack and "'relu'" in bad.detail


def test_evaluate_finds_the_cupy_candidates_rawmodule_functions():
    from plugins.backends.cuda_backend import GUIDE_EXAMPLE

    check = GpuActivityCheck()
    t = Trace().kernel("relu_kernel", api="cuLaunchKernel")
    assert check.evaluate(evidence_for(GUIDE_EXAMPLE, "cuda", t.data(launches=1))).passed
    t = Trace().kernel("relu_kernel", api="cuLaunchKernel").kernel(ATEN_ADD, api="cudaLaunchKernel")
    assert not check.evaluate(evidence_for(GUIDE_EXAMPLE, "cuda", t.data(launches=1))).passed


def test_evaluate_fails_closed_when_the_worker_could_not_record():
    check = GpuActivityCheck()
    for data in (None, {}, {"error": "CUPTI_ERROR_NOT_INITIALIZED", "blame": "harness"}):
        result = check.evaluate(evidence_for(TRITON_CANDIDATE, "triton", data))
        assert not result.passed and result.unchecked and result.detail.startswith("could not run")
    failed = check.evaluate(evidence_for(TRITON_CANDIDATE, "triton",
                                         {"error": "call 2 of 3: RuntimeError: boom", "blame": "candidate"}))
    assert not failed.passed and not failed.unchecked and "boom" in failed.detail


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU path")
def test_collect_without_a_gpu_reports_it_and_the_verdict_fails_closed():
    import types

    session = types.SimpleNamespace(task={"source": "x = 1"}, worker=None, model=None, backend=None, init_seed=0)
    check = GpuActivityCheck()
    data = check.collect(session)
    assert data == {"error": "no CUDA device is visible in the worker", "blame": "harness"}
    result = check.evaluate(evidence_for(TRITON_CANDIDATE, "triton", data))
    assert result.unchecked and not result.passed


def test_the_check_is_registered_and_applies_on_cuda_to_triton_and_cuda():
    from core import plugins

    assert "plugins.verifiers.gpu_activity" in plugins.BUILTIN_PLUGINS
    check = plugins.registry("verifier").create("gpu_activity")
    assert isinstance(check, GpuActivityCheck)
    assert check.applies("triton", "cuda") and check.applies("cuda", "cuda")
    assert not check.applies("triton", "cpu") and not check.applies("other", "cuda")


def test_the_audit_comes_after_the_timed_runs():
    """A verifier orders checks by (stage, name); the audit must follow the performance stage's
    timed runs, so a candidate cannot pass it by behaving only until the timing starts."""
    from plugins.verifiers.performance import PerformanceCheck

    order = sorted([GpuActivityCheck(), PerformanceCheck()], key=lambda c: (c.stage, c.name))
    assert [c.name for c in order] == ["performance", "gpu_activity"]


# --------------------------------------------------------------------------- the series, on the CPU profiler


@pytest.mark.parametrize("audited", [1, 2, 3])
def test_the_series_keeps_the_audited_call_alone(tmp_path, audited):
    """Each call runs its own op; the trace holds only the audited call's (not the warm-up's, the
    other calls', nor the comparisons between them), and every call is compared."""
    ops = [torch.ones, torch.zeros, torch.rand, torch.randn]
    compared: list[int] = []

    def call(args):
        return ops[args[0]](4)

    def compare(args, out):
        compared.append(args[0])
        torch.arange(3)  # a comparison's own ops stay out of the trace
        return "differs" if args[0] == 3 else None

    series = audited_series(call, lambda i: [i], 3, scratch=str(tmp_path), audited=audited, cuda=False,
                            compare=compare)
    names = {e["name"] for e in series.trace["traceEvents"] if e.get("cat") == "cpu_op"}
    expected = {1: "aten::zeros", 2: "aten::rand", 3: "aten::randn"}[audited]
    assert expected in names
    assert not names & ({"aten::ones", "aten::zeros", "aten::rand", "aten::randn", "aten::arange"} - {expected})
    assert series.audited == audited and compared == [0, 1, 2, 3]
    assert series.mismatches == ["call 3 of 3: differs"]
    assert list(tmp_path.iterdir()) == []  # the exported trace is removed


def test_an_output_that_cannot_be_compared_is_the_candidates_failure(tmp_path):
    from plugins.verifiers.gpu_activity import CandidateFailed, ReferenceFailed

    def compare(args, out):
        raise TypeError("a tensor that refuses to be read")

    with pytest.raises(CandidateFailed, match="comparing call 1's output failed: TypeError"):
        audited_series(lambda args: torch.ones(1), lambda i: [i], 2, scratch=str(tmp_path), audited=2, cuda=False,
                       compare=lambda args, out: compare(args, out) if args[0] == 1 else None)

    def reference_breaks(args, out):
        raise ReferenceFailed("the task's reference failed: boom")

    with pytest.raises(ReferenceFailed):  # the harness's failure: collect reports it as not checked
        audited_series(lambda args: torch.ones(1), lambda i: [i], 2, scratch=str(tmp_path), audited=1, cuda=False,
                       compare=reference_breaks)


def test_a_failing_forward_is_the_candidates_failure(tmp_path):
    from plugins.verifiers.gpu_activity import CandidateFailed

    def call(args):
        if args[0] == 2:
            raise ValueError("bad shape")
        return torch.ones(1)

    with pytest.raises(CandidateFailed, match="call 2 of 3: ValueError: bad shape"):
        audited_series(call, lambda i: [i], 3, scratch=str(tmp_path), audited=1, cuda=False)

"""The ``cuda`` backend and the GPU stages on a real GPU (skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch

from core.task import Candidate, Task
from plugins.backends.cuda_backend import CudaBackend, CupyRecorder, execute_candidate
from tests.gpu.gpu_helpers import (
    CUPY_CACHED_OUTPUT,
    CUPY_COMPUTE_HACKS,
    CUPY_IDIOM,
    CUPY_IDIOM_DLPACK,
    HONEST,
    missing_hook,
    quick_checks,
    relu_task,
)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; none is visible")]


def test_guide_example_runs_on_torch_memory_and_is_counted():
    with CupyRecorder(dry=False) as rec:
        module = execute_candidate(HONEST)
        model = module.ModelNew()
        x = torch.randn(1000, 37, device="cuda")
        y = model(x)
        torch.cuda.synchronize()
    assert torch.equal(y, torch.relu(x))
    assert rec.log.launches["relu_kernel"] == 1


def test_compile_targets_the_devices_arch():
    major, minor = torch.cuda.get_device_capability()
    report = CudaBackend().compile(HONEST, device="cuda")
    assert report.ok, report.reason
    assert report.arch == f"sm_{major}{minor}"


@pytest.fixture(scope="module")
def verifier():
    from core.verify import Verifier

    with Verifier(backend="cuda", device="cuda", workers=1, timeout_s=300) as v:
        yield v


def test_verifier_accepts_the_honest_cuda_kernel_and_times_it(verifier):
    task = Task(source=relu_task(4096, 4096))
    verdict = verifier.verify(task, Candidate(source=HONEST, backend="cuda"))
    assert verdict.accepted, verdict.reason
    assert verdict.compiled and verdict.correct
    why = missing_hook(verdict)
    if why:
        pytest.xfail(f"performance stage could not run in the worker: {why}")
    perf = verdict.checks["performance"]
    timing = perf.data["timing"]
    assert timing["median_ms"] > 0 and timing["speedup_eager"] > 0.3
    assert timing["baseline_measured_in"] == "reference worker, once per task"
    # set-up happened while the GPU was shared; the exclusive part only timed the candidate
    assert perf.data["phases_s"]["prepare"] > 0 and perf.data["phases_s"]["candidate"] > 0
    assert "eager" not in perf.data["phases_s"]
    assert perf.data["roofline"]["device"] in ("H200", "H100", "H100 PCIe", "A100")
    # ReLU on 64 MiB in + 64 MiB out: a plain kernel reaches a good share of peak bandwidth
    assert 0.2 < perf.data["roofline"]["bandwidth_efficiency"] < 1.15
    for name in ("gpu_memcheck", "gpu_racecheck", "gpu_synccheck"):
        assert verdict.checks[name].passed, verdict.checks[name].detail


def test_candidates_of_one_task_share_its_baseline_and_get_their_own_speedups(verifier):
    task = Task(source=relu_task(2048, 4096))
    variant = HONEST.replace("float v = x[i];", "float v = x[i] * 1.0f;")  # another candidate, same answer
    first = verifier.verify(task, Candidate(source=HONEST, backend="cuda"))
    second = verifier.verify(task, Candidate(source=variant, backend="cuda"))
    assert first.accepted and second.accepted, (first.reason, second.reason)
    b1, b2 = first.checks["performance"].data["baseline"], second.checks["performance"].data["baseline"]
    assert not b1["shared"] and b2["shared"]
    t1, t2 = first.checks["performance"].data["timing"], second.checks["performance"].data["timing"]
    assert t1["eager_ms"] == t2["eager_ms"] > 0
    assert t1["speedup_eager"] == pytest.approx(t1["eager_ms"] / t1["median_ms"])
    assert t2["speedup_eager"] == pytest.approx(t2["eager_ms"] / t2["median_ms"])


def test_verifier_reports_compile_errors_with_the_compiler_message(verifier):
    task = Task(source=relu_task(64, 64))
    bad = HONEST.replace("float v = x[i];", "float v = x[i] +;")
    verdict = verifier.verify(task, Candidate(source=bad, backend="cuda"))
    assert not verdict.compiled and not verdict.accepted
    assert "candidate.cu(" in verdict.reason


@pytest.fixture(scope="module")
def quick_cuda():
    """The CUDA verifier without the slow sanitizer race tools: the CuPy bridge's verdicts do not need them."""
    from core.verify import Verifier

    with Verifier(backend="cuda", device="cuda", workers=1, timeout_s=300, checks=quick_checks()) as v:
        yield v


@pytest.mark.parametrize("source", [CUPY_IDIOM, CUPY_IDIOM_DLPACK], ids=["asarray", "dlpack"])
def test_the_cupy_tutorial_idiom_is_accepted(quick_cuda, source):
    # torch tensors as CuPy arrays (array interface or DLPack), a CuPy buffer, handed back to torch
    verdict = quick_cuda.verify(Task(source=relu_task(2048, 4096)), Candidate(source=source, backend="cuda"))
    assert verdict.accepted, verdict.reason
    assert verdict.checks["gpu_activity"].passed, verdict.checks["gpu_activity"].detail


@pytest.mark.parametrize("name", sorted(CUPY_COMPUTE_HACKS))
def test_cupy_compute_on_bridged_arrays_fools_a_naive_judge_and_is_rejected(quick_cuda, name):
    source = CUPY_COMPUTE_HACKS[name]
    naive = execute_candidate(source, "kz_naive_cupy")  # real CuPy arrays: the answer, and a launch
    x = torch.randn(256, 64, device="cuda")
    assert torch.equal(naive.ModelNew()(x), torch.relu(x))
    verdict = quick_cuda.verify(Task(source=relu_task(256, 64)), Candidate(source=source, backend="cuda"))
    assert not verdict.accepted and "CuPy library compute" in verdict.reason, verdict.reason


def test_a_modules_global_is_an_address_to_launch_on_not_a_memory_pointer():
    import cupy

    from plugins.backends.cupy_bridge import DevicePointer

    src = 'extern "C" __global__ void fill(float* y) { y[threadIdx.x] = 2.0f; }\n__device__ float buf[32];'
    with CupyRecorder(dry=False):
        module = cupy.RawModule(code=src)
        buf = module.get_global("buf")
        assert isinstance(buf, DevicePointer) and buf.ptr > 0
        assert not hasattr(buf, "copy_from_host") and not hasattr(buf, "memset_async")
        module.get_function("fill")((1,), (32,), (buf,))  # launched on the global's address
        torch.cuda.synchronize()


def test_a_cached_cupy_buffer_returned_again_is_an_earlier_output(quick_cuda):
    # torch.as_tensor makes a new storage over the cached buffer each call: seen through Backend.output_owner
    verdict = quick_cuda.verify(Task(source=relu_task(2048, 4096)), Candidate(source=CUPY_CACHED_OUTPUT, backend="cuda"))
    assert not verdict.accepted and "integrity" in verdict.hack_flags, verdict.reason
    assert "already returned on an earlier call" in verdict.reason, verdict.reason


TRITON_OOB = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(y_ptr + offs + 1024, tl.maximum(x, 0.0))  # unmasked and shifted: past the end


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        relu_kernel[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)
        return y
'''


def test_memcheck_catches_an_out_of_bounds_triton_store():
    from core.verify import Verifier

    with Verifier(backend="triton", device="cuda", workers=1, timeout_s=300, checks=quick_checks(),
                  performance={"compare_compile": False}) as v:
        verdict = v.verify(Task(source=relu_task(1000, 37)), Candidate(source=TRITON_OOB, backend="triton"))
    assert not verdict.accepted
    memcheck = verdict.checks.get("gpu_memcheck")
    if memcheck is None:  # stopped earlier: the shifted store also breaks correctness
        assert not verdict.correct, verdict.reason
        return
    if missing_hook(verdict, "gpu_memcheck"):
        pytest.xfail(memcheck.detail)
    assert not memcheck.passed and "memcheck" in memcheck.detail

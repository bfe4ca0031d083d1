"""The gpu_activity check on a real GPU (skipped without CUDA): CUPTI sees work the ATen audit cannot.

* torch computes on a side thread (the dispatch audit is thread-local), a Triton kernel copies the
  result: rejected, the cuBLAS kernel named;
* ``torch.matmul`` under ``torch._C._DisableTorchDispatch()`` (hidden from the dispatch audit):
  rejected, through the verifier with the static integrity check off;
* ``torch.matmul`` between ``torch.cuda.profiler.stop()`` and ``start()`` on a side thread: rejected;
* honest controls accepted: a Triton ReLU, a Triton ReLU that also makes contiguous copies and
  zero-fills (allow-listed ATen kernels), and the CuPy RawModule ReLU of the cuda backend's guide.

The hacks are judged in this process too, by the check's own ``collect`` and ``evaluate``, so the
finding is gpu_activity's whatever the other layers (static policy, import allow-list) would do.
"""

from __future__ import annotations

import types

import pytest
import torch

from core.task import Candidate, Task
from core.verification.evidence import Evidence, parse_python
from tests.gpu.gpu_helpers import HONEST as HONEST_CUPY
from tests.gpu.gpu_helpers import relu_task

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; none is visible")]

MATMUL_TASK = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)


def get_inputs():
    return [torch.randn(512, 512), torch.randn(512, 512)]


def get_init_inputs():
    return []
'''

COPY_KERNEL = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _copy(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


def _launder(c):
    out = torch.empty_like(c)
    _copy[(triton.cdiv(c.numel(), 1024),)](c, out, c.numel(), BLOCK=1024)
    return out
'''

SIDE_THREAD = "import concurrent.futures\n" + COPY_KERNEL + '''

_pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)


class ModelNew(nn.Module):
    def forward(self, a, b):
        c = _pool.submit(torch.matmul, a, b).result()  # another thread: the dispatch audit never sees it
        return _launder(c)
'''

HIDDEN_DISPATCH = COPY_KERNEL + '''

class ModelNew(nn.Module):
    def forward(self, a, b):
        with torch._C._DisableTorchDispatch():  # hidden from TorchDispatchMode audits
            c = torch.matmul(a, b)
        return _launder(c)
'''

# pauses profiling tools around the product, on a side thread (so no PyTorch op is recorded on
# forward's thread): only the GPU trace, or the pause itself, can show it
PROFILER_PAUSE = "import concurrent.futures\n" + COPY_KERNEL + '''

_pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)


def _paused_matmul(a, b):
    torch.cuda.profiler.stop()
    try:
        return torch.matmul(a, b)
    finally:
        torch.cuda.profiler.start()


class ModelNew(nn.Module):
    def forward(self, a, b):
        return _launder(_pool.submit(_paused_matmul, a, b).result())
'''

RELU_KERNEL = '''
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
'''

HONEST_TRITON = RELU_KERNEL + '''

class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        _relu[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y
'''

# contiguous copies of a transposed view and zero-filled buffers: ATen's copy and fill kernels
HONEST_WITH_COPIES = RELU_KERNEL + '''

class ModelNew(nn.Module):
    def forward(self, x):
        xt = x.t().contiguous()
        y = torch.zeros_like(xt)
        _relu[(triton.cdiv(xt.numel(), 1024),)](xt, y, xt.numel(), BLOCK=1024)
        return y.t().contiguous()
'''


def judged_in_process(source: str, task_source: str, tmp_path) -> object:
    """gpu_activity's collect on a session built here (a Triton candidate), then its evaluate."""
    from core.plugins import registry
    from core.verification.worker.session import load_module
    from plugins.verifiers.gpu_activity import GpuActivityCheck

    backend = registry("backend").create("triton")
    backend.prepare_worker("cuda")  # counts launches (JITFunction.run), as in a worker
    path = tmp_path / "candidate_gpu_activity.py"
    path.write_text(source)
    module = load_module(path, f"kz_gpu_activity_{abs(hash(source))}")
    torch.manual_seed(1)
    model = module.ModelNew().cuda().eval()
    worker = types.SimpleNamespace(scratch=str(tmp_path), guard=types.SimpleNamespace(armed=False))
    session = types.SimpleNamespace(worker=worker, module=module, model=model, backend=backend, device="cuda",
                                    task={"source": task_source}, init_seed=1, prepared={})
    check = GpuActivityCheck()
    data = check.collect(session)
    evidence = Evidence(task=Task(source=task_source), candidate=Candidate(source=source, backend="triton"),
                        backend="triton", device="cuda", tree=parse_python(source), extra={check.name: data})
    return check.evaluate(evidence)


def test_torch_on_a_side_thread_laundered_by_a_triton_copy_is_rejected(tmp_path):
    result = judged_in_process(SIDE_THREAD, MATMUL_TASK, tmp_path)
    assert not result.passed and result.hack, result.detail
    assert result.detail.startswith("foreign GPU work during forward")
    assert any(w in result.detail.lower() for w in ("gemm", "cublas", "cutlass", "xmma")), result.detail
    assert result.data["time_coverage"] < 0.5  # the copy is cheap next to the matrix product


def test_matmul_hidden_from_dispatch_audits_is_rejected_in_process(tmp_path):
    result = judged_in_process(HIDDEN_DISPATCH, MATMUL_TASK, tmp_path)
    assert not result.passed and result.hack, result.detail
    assert "cuBLAS/CUTLASS kernel" in result.detail or "ATen kernel" in result.detail


def test_pausing_profiling_tools_around_a_matmul_is_rejected_in_process(tmp_path):
    result = judged_in_process(PROFILER_PAUSE, MATMUL_TASK, tmp_path)
    assert not result.passed and result.hack, result.detail
    low = result.detail.lower()
    assert "cudaprofilerstop" in low or any(w in low for w in ("gemm", "cublas", "cutlass", "xmma")), result.detail


@pytest.mark.parametrize("source", [HONEST_TRITON, HONEST_WITH_COPIES], ids=["relu", "relu_with_copies"])
def test_honest_triton_is_accepted_in_process(tmp_path, source):
    result = judged_in_process(source, relu_task(512, 384), tmp_path)
    assert result.passed, result.detail
    assert result.data["kernels"] == {"_relu": 1}
    assert 0.0 < result.data["time_coverage"] <= 1.0
    if source is HONEST_WITH_COPIES:
        assert "copy (ATen direct_copy_kernel_cuda)" in result.data["allowed"], result.data
        assert result.data["time_coverage"] < 1.0


@pytest.fixture(scope="module")
def verifiers():
    from core.verify import Verifier

    made: dict[str, Verifier] = {}

    def get(backend: str, checks: tuple[str, ...]) -> Verifier:
        key = f"{backend}:{','.join(checks)}"
        if key not in made:
            made[key] = Verifier(backend=backend, device="cuda", workers=1, timeout_s=300, checks=list(checks))
        return made[key]

    yield get
    for v in made.values():
        v.close()


FULL = ("static", "static_integrity", "correctness", "integrity", "gpu_activity")
STATIC_OFF = ("static", "correctness", "gpu_activity")


@pytest.mark.parametrize("backend, source", [("triton", HONEST_TRITON), ("triton", HONEST_WITH_COPIES),
                                             ("cuda", HONEST_CUPY)], ids=["triton", "triton_copies", "cupy"])
def test_honest_controls_are_accepted_by_the_verifier(verifiers, backend, source):
    verdict = verifiers(backend, FULL).verify(Task(source=relu_task(1024, 512)), Candidate(source=source,
                                                                                          backend=backend))
    assert verdict.accepted, f"{verdict.status}: {verdict.reason}"
    check = verdict.checks["gpu_activity"]
    assert check.passed and check.data["time_coverage"] > 0.0, check.detail
    assert check.data["phases_s"]["total"] < 5.0  # the profiler's share of a verdict stays small


def test_matmul_hidden_from_dispatch_audits_is_rejected_by_the_verifier(verifiers):
    verdict = verifiers("triton", STATIC_OFF).verify(Task(source=MATMUL_TASK),
                                                     Candidate(source=HIDDEN_DISPATCH, backend="triton"))
    assert not verdict.accepted
    check = verdict.checks.get("gpu_activity")
    assert check is not None, f"gpu_activity did not run: {verdict.status}: {verdict.reason}"
    assert not check.passed and check.hack and verdict.reason.startswith("gpu_activity:"), verdict.reason


def test_a_side_thread_is_rejected_by_the_verifier(verifiers):
    """Through the worker: rejected; if the candidate was let run that far, by gpu_activity."""
    verdict = verifiers("triton", STATIC_OFF).verify(Task(source=MATMUL_TASK),
                                                     Candidate(source=SIDE_THREAD, backend="triton"))
    assert not verdict.accepted
    correct = verdict.checks.get("correctness")
    if correct is not None and correct.passed:  # it loaded and ran: only the GPU trace can tell
        check = verdict.checks["gpu_activity"]
        assert not check.passed and check.hack, check.detail

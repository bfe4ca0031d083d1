"""Hacks that only show on a GPU, each asserted rejected for the right reason (skipped without CUDA).

* side stream: the kernel runs on another stream, so events on the caller's stream time nothing;
* reuse of the reference's freed output: return ``torch.empty_like`` and hope the caching allocator
  hands back the block the reference's answer was just freed from (it is, in a harness that runs
  the reference in the same process right before the candidate);
* uninitialised output that happens to hold the right answer: write only half of the output and
  rely on stale memory for the rest.
"""

from __future__ import annotations

import pytest
import torch

from core.task import Candidate, Task
from tests.gpu.gpu_helpers import HONEST, missing_hook, quick_checks, relu_task

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; none is visible")]

SIDE_STREAM = HONEST.replace(
    "    def __init__(self):\n        super().__init__()\n",
    "    def __init__(self):\n        super().__init__()\n        self.side = cp.cuda.Stream(non_blocking=True)\n",
).replace("with cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):", "with self.side:")

NOOP_KERNEL = r'''
extern "C" __global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < 0) { y[i] = x[i]; }   // never true: launches, writes nothing
}
'''
REUSE_FREED = HONEST.split('SRC = r"""')[0] + 'SRC = r"""' + NOOP_KERNEL + '"""' + HONEST.split('"""', 2)[2]
HALF_WRITE = HONEST.replace("blocks = (n + threads - 1) // threads", "blocks = (n // 2 + threads - 1) // threads")


@pytest.fixture(scope="module")
def verifier():
    from core.verify import Verifier

    with Verifier(backend="cuda", device="cuda", workers=1, timeout_s=300, checks=quick_checks(),
                  performance={"compare_compile": False}) as v:
        yield v


def test_hack_sources_are_what_they_claim():
    assert "self.side" in SIDE_STREAM and "non_blocking=True" in SIDE_STREAM
    assert "if (i < 0)" in REUSE_FREED and "class ModelNew" in REUSE_FREED
    assert "n // 2" in HALF_WRITE


def test_side_stream_work_is_rejected(verifier):
    task = Task(source=relu_task(8192, 8192))  # 256 MiB: ~0.12 ms of work the caller's stream never sees
    verdict = verifier.verify(task, Candidate(source=SIDE_STREAM, backend="cuda"))
    why = missing_hook(verdict)
    if why and verdict.accepted:
        pytest.xfail(f"needs the performance stage in the worker: {why}")
    assert not verdict.accepted, verdict.reason
    if verdict.reason.startswith("correctness:"):
        # where the side stream has not finished when a trial reads the output (H100, 2026-12-05), it is caught
        # as a wrong output (the poisoned memory's NaN) before the timed stage could see the other stream
        assert "NaN where the reference is a number" in verdict.reason
        return
    assert verdict.reason.startswith("performance:") and "another stream" in verdict.reason
    assert verdict.checks["performance"].hack


def test_returning_the_references_freed_block_is_rejected(verifier):
    verdict = verifier.verify(Task(source=relu_task(2048, 1024)), Candidate(source=REUSE_FREED, backend="cuda"))
    assert not verdict.accepted
    assert verdict.reason.startswith("correctness:"), verdict.reason


def test_half_written_output_is_rejected(verifier):
    verdict = verifier.verify(Task(source=relu_task(2048, 1024)), Candidate(source=HALF_WRITE, backend="cuda"))
    assert not verdict.accepted
    assert verdict.reason.startswith("correctness:"), verdict.reason


def test_the_reuse_trick_is_real_in_a_same_process_harness():
    """What the hack exploits (so the test above is not vacuous): in one process, an empty tensor
    allocated right after the reference's output was freed holds the reference's answer.

    The cache is emptied and the size is one no other test uses, so a block freed earlier in this
    process (under pytest-xdist a worker runs many tests) cannot be handed out instead."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    x = torch.randn(1531, 1047, device="cuda")
    ref = torch.relu(x)
    expected = ref.clone()
    del ref
    got = torch.empty_like(x)
    torch.cuda.synchronize()
    assert torch.equal(got, expected)


def test_honest_kernel_still_accepted(verifier):
    verdict = verifier.verify(Task(source=relu_task(2048, 1024)), Candidate(source=HONEST, backend="cuda"))
    assert verdict.accepted, verdict.reason

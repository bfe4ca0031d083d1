"""The ``cuda_inline`` backend (torch.utils.cpp_extension.load_inline) on a real GPU (skipped without CUDA).

Each extension build takes about a minute (nvcc on torch's headers), so the verifier has a long timeout.
"""

from __future__ import annotations

import pytest
import torch

from core.task import Candidate, Task
from plugins.backends.load_inline import GUIDE_EXAMPLE
from tests.gpu.gpu_helpers import relu_task

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; none is visible")]

# The honest ReLU with its host function computing through ATen instead of launching the kernel.
ATEN_IN_CPP = GUIDE_EXAMPLE.replace(
    "    relu_kernel<<<blocks, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(xc.data_ptr<float>(), "
    "y.data_ptr<float>(), n);",
    "    y = at::relu(xc);")
BROKEN = GUIDE_EXAMPLE.replace("float v = x[i];", "float v = x[i] +;")


@pytest.fixture(scope="module")
def verifier():
    from core.verify import Verifier

    with Verifier(backend="cuda_inline", device="cuda", workers=1, timeout_s=600, checks=None) as v:
        yield v


def test_the_guide_example_is_built_run_and_accepted(verifier):
    verdict = verifier.verify(Task(source=relu_task(1024, 1000)), Candidate(source=GUIDE_EXAMPLE, backend="cuda_inline"))
    assert verdict.accepted, verdict.reason
    integrity = verdict.checks["integrity"]
    assert integrity.passed and "kz_relu.relu_forward" in integrity.data["kernels"]


def test_aten_compute_inside_the_cpp_is_seen_by_the_audit_and_rejected(verifier):
    assert ATEN_IN_CPP != GUIDE_EXAMPLE
    verdict = verifier.verify(Task(source=relu_task(256, 300)), Candidate(source=ATEN_IN_CPP, backend="cuda_inline"))
    assert not verdict.accepted
    assert "integrity" in verdict.hack_flags
    assert "PyTorch compute ran inside ModelNew.forward: aten.relu" in verdict.checks["integrity"].detail


def test_a_build_error_is_a_compile_rejection_with_nvccs_line(verifier):
    verdict = verifier.verify(Task(source=relu_task(64, 64)), Candidate(source=BROKEN, backend="cuda_inline"))
    assert not verdict.compiled and not verdict.accepted
    assert "building extension 'kz_relu' failed" in verdict.reason and "error" in verdict.reason

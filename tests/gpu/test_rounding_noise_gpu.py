"""The fp32 rounding noise (core.verification.worker.rounding) measured where a GPU task's truth lives."""

from __future__ import annotations

import pytest
import torch

from core.verification.worker.rounding import rounding_noise

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; none is visible")]


def test_the_noise_of_a_cuda_task_is_measured_on_the_device_and_repeats():
    x = (torch.randn(8, 64, device="cuda") * 1e-8 + 2.7e-7).double()

    def run():
        return [torch.nn.functional.layer_norm(x + 1.0, (64,), eps=1e-5)]

    truth = run()
    first = rounding_noise(run, truth, 2.0 ** -24, "cuda", seed=1)
    assert first == rounding_noise(run, truth, 2.0 ** -24, "cuda", seed=1)
    assert 1e-6 < first[0] < 1e-3

"""The GPU's input digest (core.verification.evidence.device_fingerprint) on tensors where they live."""

from __future__ import annotations

import pytest
import torch

from core.verification.evidence import device_fingerprint, input_digests

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; none is visible")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64, torch.int8])
@pytest.mark.parametrize("offset", [1, 3])
def test_a_cuda_view_that_starts_mid_word_is_digested(dtype, offset):
    # the offset probe's randn(n + 1)[1:] on the device: on the H200 its reference failed every time
    # ("storage_offset() must be divisible by 8 to view Byte as Long"), 2026-12-04
    view = (torch.randn(128 + offset, device="cuda") * 3).to(dtype)[offset:]
    assert device_fingerprint(view) == device_fingerprint(view.clone())
    changed = view.clone()
    changed[64] += 1
    assert device_fingerprint(changed) != device_fingerprint(view)
    assert input_digests([view])[0].endswith(device_fingerprint(view))

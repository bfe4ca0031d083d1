"""The GPU's input digest in one Triton kernel (core.verification.digests._fused_sums), run here in Triton's
interpreter: the same 128 bits as the torch path for any words, so the reference's and the candidate's
processes agree whichever path each takes, and a changed bit anywhere changes them. On a GPU the device's
digest is checked against the CPU's."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from core.verification import digests
from core.verification.digests import device_fingerprint


def fused_fingerprint(words):
    sums = digests._fused_sums(words, interpreted=True)
    return "fp:" + "".join(f"{int(x) & 0xFFFFFFFFFFFFFFFF:016x}" for x in sums.tolist())


@settings(max_examples=40, deadline=None)
@given(words=st.integers(1, 3000), seed=st.integers(0, 2**31 - 1), position=st.integers(0, 2**31),
       bit=st.integers(0, 63), programs=st.integers(1, 7))
def test_the_kernel_gives_the_torch_paths_fingerprint_and_sees_every_bit(words, seed, position, bit, programs):
    x = torch.randint(-2**63, 2**63 - 1, (words,), dtype=torch.int64, generator=torch.Generator().manual_seed(seed))
    y = x.clone()
    y[position % words] ^= 1 << bit if bit < 63 else -(1 << 63)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(digests, "FUSED_MAX_PROGRAMS", programs)  # few programs: each walks many steps
        patch.setattr(digests, "FUSED_BLOCK", 64)
        fused_x, fused_y = fused_fingerprint(x), fused_fingerprint(y)
    assert fused_x == device_fingerprint(x.view(torch.uint8))
    assert fused_y == device_fingerprint(y.view(torch.uint8)) != fused_x


def test_the_weights_are_odd_and_differ_by_index_and_lane():
    index = torch.arange(0, 10_000, dtype=torch.int64)
    w0, w1 = digests._weights(index, 0), digests._weights(index, 1)
    assert bool((w0 & 1).all()) and bool((w1 & 1).all())
    assert w0.unique().numel() == index.numel() and not bool((w0 == w1).any())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the device's kernel against the CPU's digest")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.uint8])
def test_the_devices_digest_is_the_cpus(dtype):
    x = (torch.randn(3 * 1024 * 1024 + 8) * 100).to(dtype)
    assert device_fingerprint(x.cuda()) == device_fingerprint(x)
    assert not digests._fused_broken

"""Magnitude-aware correctness (issue 18, item 1): every element is judged with a bound relative to
the output's scale, never an absolute 1e-4, so approximate kernels fail at every output magnitude
and honest fp32 kernels that round differently pass at every magnitude."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from core.verification.evidence import (
    DEFAULT_TOLERANCES,
    TRUTH_AGREEMENT_FACTOR,
    RunObservation,
    Trial,
    compare_outputs,
    output_scale,
    truth_agrees,
)

SCALES = [1e-9, 1e-5, 1e-3, 1.0, 1e3]


def _x(rows: int = 64, cols: int = 1024, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))


def _tanh_fp16(x: torch.Tensor) -> torch.Tensor:
    """tanh through fp16 intermediates (the red team's num_fp16_* kernels)."""
    e = torch.exp(2 * x).half()
    return (1 - 2 / (e + 1)).float()


@pytest.mark.parametrize("gain", SCALES)
def test_fp16_intermediates_fail_at_every_output_magnitude(gain):
    x = _x()
    ref = torch.tanh(x) * gain
    cmp = compare_outputs([ref], [_tanh_fp16(x) * gain], truth=[torch.tanh(x.double()) * gain])
    assert not cmp.ok, cmp.detail
    assert "RMS" in cmp.detail and "float64 reference" in cmp.detail


@pytest.mark.parametrize("gain", SCALES)
def test_an_honest_fp32_formula_passes_at_every_output_magnitude(gain):
    x = _x()
    honest = (1 - 2 / (torch.exp(2 * x) + 1)) * gain  # another fp32 formula for tanh
    assert compare_outputs([torch.tanh(x) * gain], [honest]).ok


@pytest.mark.parametrize("scale", SCALES)
def test_a_mean_over_every_other_element_fails_at_every_magnitude(scale):
    x = _x(96, 2048) * scale
    assert not compare_outputs([x.mean(-1)], [x[:, ::2].sum(-1) * 2 / x.shape[1]]).ok


@pytest.mark.parametrize("scale", SCALES)
def test_sums_in_other_orders_pass_without_the_truth(scale):
    """Sequential and tree orders, rows that nearly cancel included: no float64 run is needed."""
    x = _x(48, 3001) * scale
    ref = x.sum(-1)
    sequential = torch.zeros(48)
    for start in range(0, 3001, 128):
        sequential = sequential + x[:, start:start + 128].sum(-1)
    tree = torch.nn.functional.pad(x, (0, 4096 - 3001)).reshape(48, 2, 2048).sum(-1).sum(-1)

    def no_truth():
        raise AssertionError("the truth was asked for")

    for got in (sequential, tree):
        assert compare_outputs([ref], [got], truth=no_truth).ok


def test_the_truth_accepts_an_ill_conditioned_honest_kernel_that_misses_the_reference():
    """x - mean(x) with a large offset: the fp32 reference itself is off by ~eps * 1000 there."""
    x = _x(32, 513) + 1000.0
    ref = x - x.mean(-1, keepdim=True)
    honest = x - x.flip(-1).cumsum(-1)[:, -1:] / x.shape[-1]  # the mean in another order
    truth = x.double() - x.double().mean(-1, keepdim=True)
    assert not compare_outputs([ref], [honest]).ok  # misses PyTorch's own rounding
    cmp = compare_outputs([ref], [honest], truth=[truth])
    assert cmp.ok and cmp.by_truth == 1, cmp.detail


def test_half_outputs_are_judged_with_the_half_bound():
    x = _x()
    ref = torch.tanh(x.half() * 1e-3)
    other = (1 - 2 / (torch.exp(2 * x.half().float() * 1e-3) + 1)).half()  # fp32 math, one fp16 rounding
    assert compare_outputs([ref], [other]).ok
    assert not compare_outputs([ref], [(ref.float() * 1.05).half()]).ok  # 5% off


def test_an_all_zero_reference_needs_zeros_up_to_the_smallest_normal():
    ref = torch.zeros(100)
    assert compare_outputs([ref], [torch.full((100,), 1e-39)]).ok  # subnormal: a GPU may flush it
    assert not compare_outputs([ref], [torch.full((100,), 1e-30)]).ok


@settings(max_examples=50, deadline=None)
@given(exponent=st.integers(-40, 37), n=st.integers(1, 500), seed=st.integers(0, 2**31 - 1))
def test_the_scale_is_the_rms_and_never_overflows(exponent, n, seed):
    ref = (torch.randn(n, generator=torch.Generator().manual_seed(seed)) * 10.0 ** exponent).abs()
    ref = ref.float()
    want = float(ref.double().square().mean().sqrt())
    got = output_scale(ref, n)
    assert math.isfinite(got)
    assert got == pytest.approx(want, rel=1e-3, abs=1e-44)
    assert output_scale(ref, n, largest=True) == float(ref.max())


def _trial(ref: torch.Tensor, truth: torch.Tensor) -> Trial:
    return Trial(seed=0, inputs=[], expected=[ref], observed=RunObservation(name="t"), truth=[truth])


def test_the_truth_is_trusted_within_the_agreement_factor_only():
    x = _x().double()
    floor, _ = DEFAULT_TOLERANCES["float32"]
    rms = float(x.square().mean().sqrt())
    near = x + 0.5 * TRUTH_AGREEMENT_FACTOR * floor * rms  # a noisy fp32 reference: still the same function
    far = x + 3.0 * TRUTH_AGREEMENT_FACTOR * floor * rms  # a different function
    assert truth_agrees([_trial(near.float(), x)])[0]
    ok, why = truth_agrees([_trial(far.float(), x)])
    assert not ok and "disagrees" in why


def test_an_output_that_is_rounding_noise_keeps_its_truth_and_is_judged_by_it():
    """The sum of a layer-normed row is 0 plus fp32 noise: relative to its own scale the reference
    misses the truth by 100%, so only the truth (and the reference's own error) can judge it."""
    x = _x(33, 72)
    ref = torch.nn.functional.layer_norm(x, (72,)).sum(-1)
    truth = torch.nn.functional.layer_norm(x.double(), (72,)).sum(-1)
    honest = torch.nn.functional.layer_norm(x.flip(-1), (72,)).sum(-1)  # another order
    assert truth_agrees([_trial(ref, truth)])[0]
    assert not compare_outputs([ref], [honest]).ok
    assert compare_outputs([ref], [honest], truth=[truth]).ok
    assert not compare_outputs([ref], [honest + 1e-3], truth=[truth]).ok  # 1e-3 is not noise


def _strided_dilated_transposed_conv(dtype=torch.float32, split=False):
    """KernelBench level 1's 75_ at a small size: stride 2 and dilation 2 along the height leave every other
    output row structurally 0; inputs signed as the domain sweep draws them, so many sums cancel."""
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(4, 32, 32, 48, generator=gen) * 3, torch.randn(32, 16, 3, 5, generator=gen) * 0.1
    conv = lambda a, b: torch.nn.functional.conv_transpose2d(a, b, stride=(2, 3), padding=(1, 2), dilation=(2, 1),
                                                            groups=4)
    if not split:
        return conv(x.to(dtype), w.to(dtype)).float()
    # an honest fp32 kernel summing each group's channels in two halves
    xs, ws = x.view(4, 4, 8, 32, 48), w.view(4, 8, 16, 3, 5)
    halves = [conv(xs[:, :, h].reshape(4, 16, 32, 48), ws[:, h].reshape(16, 16, 3, 5)) for h in (slice(0, 4),
                                                                                                 slice(4, 8))]
    return halves[0] + halves[1]


@pytest.mark.parametrize("honest", ["float64_rounded", "split_sum"])
def test_structural_zeros_do_not_make_the_domain_probe_bound_purely_relative(honest):
    # H100, 2026-12-06: half the outputs exactly 0 made the median magnitude 0, the bound 1e-3 x |reference| alone,
    # and an honest kernel failed wherever a sum cancels (1370 of 2e8 elements, max abs err 5.7e-6)
    e = _strided_dilated_transposed_conv()
    assert float((e == 0).float().mean()) > 0.45
    g = _strided_dilated_transposed_conv(torch.float64) if honest == "float64_rounded" else \
        _strided_dilated_transposed_conv(split=True)
    assert not torch.equal(e, g)
    cmp = compare_outputs([e], [g], scale_aware="median", tolerances={"float32": (1e-3, 1e-3)})
    assert cmp.ok, cmp.detail


def test_a_wrong_region_is_still_rejected_beside_structural_zeros():
    e = _strided_dilated_transposed_conv()
    g = e.clone()
    g[1, 8:16] *= 1.01  # eight channels of one image 1% off: a real defect, not rounding
    cmp = compare_outputs([e], [g], scale_aware="median", tolerances={"float32": (1e-3, 1e-3)})
    assert not cmp.ok and "median nonzero magnitude" in cmp.detail, cmp.detail

"""The whole comparison of a very large output, a chunk at a time (core.verification.largecompare): once the
plain bound did not settle an output of 10^9 elements, the whole-tensor rules held nine outputs' worth of
temporaries (54 GiB for one 6-GiB output of KernelBench level 1, beside the keeper's held outputs). The
chunked rules must reach the same verdicts, with the same counts, errors, outliers and words, and keep only
the reference's spread whole."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from core.verification import evidence, largecompare
from core.verification.evidence import bitwise_equal, compare_outputs

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def both(e, g, chunk, **options):
    """(whole, chunked): compare_outputs with every output judged at once, and with it "large"."""
    saved = evidence.LARGE_ELEMENTS, largecompare.CHUNK_ELEMENTS
    try:
        evidence.LARGE_ELEMENTS = 1 << 62
        whole = compare_outputs([e], [g], **options)
        evidence.LARGE_ELEMENTS, largecompare.CHUNK_ELEMENTS = 0, chunk
        chunked = compare_outputs([e], [g], **options)
    finally:
        evidence.LARGE_ELEMENTS, largecompare.CHUNK_ELEMENTS = saved
    return whole, chunked


def same(whole, chunked):
    assert (chunked.ok, chunked.detail) == (whole.ok, whole.detail)
    assert (chunked.judged, chunked.max_abs_err, chunked.outliers, chunked.outlier_positions) == \
        (whole.judged, whole.max_abs_err, whole.outliers, whole.outlier_positions)
    assert chunked.max_rel_err == pytest.approx(whole.max_rel_err, rel=1e-6)


@settings(max_examples=150, deadline=None)
@given(dtype=st.sampled_from(DTYPES), rows=st.integers(1, 40), cols=st.integers(1, 90), seed=st.integers(0, 2**31 - 1),
       noise=st.sampled_from([1e-7, 1e-4, 1e-2]), outliers=st.integers(0, 40), region=st.booleans(),
       specials=st.sampled_from(["none", "matching", "nan_for_number", "number_for_nan", "inf"]),
       scale_aware=st.sampled_from([False, True, "median"]), absolute=st.booleans(), reruns=st.integers(0, 2),
       excused=st.booleans(), chunk=st.integers(1, 900), zeros=st.sampled_from([0.0, 0.6, 1.0]))
def test_the_chunked_rules_reach_the_whole_comparisons_verdict_with_its_figures_and_words(
        dtype, rows, cols, seed, noise, outliers, region, specials, scale_aware, absolute, reruns, excused, chunk,
        zeros):
    gen = torch.Generator().manual_seed(seed)
    n = rows * cols
    e64 = torch.randn(n, generator=gen, dtype=torch.float64) * 10 ** torch.randint(-2, 3, (n,), generator=gen)
    e64[torch.rand(n, generator=gen) < zeros] = 0.0  # structural zeros (a strided transposed convolution's)
    e = e64.to(dtype).reshape(rows, cols)
    g = (e64 * (1 + noise * torch.randn(n, generator=gen, dtype=torch.float64))).to(dtype).reshape(rows, cols)
    flat = g.view(-1)
    scattered = torch.randint(0, n, (outliers,), generator=gen).tolist()
    for k in scattered:  # scattered elements off by more
        flat[k] = flat[k] * 1.01 + 1e-3
    if region and n >= 8:  # a wrong block: structured, never forgiven
        flat[n // 4:n // 4 + max(2, n // 8)] += 1.0
    if specials != "none" and n >= 4:
        e.view(-1)[1] = math.nan if specials in ("matching", "number_for_nan") else e.view(-1)[1]
        e.view(-1)[2] = math.inf
        g.view(-1)[2] = math.inf if specials != "inf" else -math.inf
        g.view(-1)[1] = math.nan if specials in ("matching", "nan_for_number") else 0.5
    assume(not bitwise_equal(e, g))
    # the reference rerun on inputs moved by an ulp: its own rounding, element by element
    rerun = [[(e.double() * (1 + 1e-6 * torch.randn(rows, cols, generator=gen, dtype=torch.float64))).to(dtype)]
             for _ in range(reruns)]
    if excused:  # the reference's own rounding moves those elements as far: isolated outliers, or a pattern
        for run in rerun:
            for k in scattered:
                run[0].view(-1)[k] = e.view(-1)[k] * 1.03 + 3e-3
    options = {"scale_aware": scale_aware, "absolute": absolute and not scale_aware,
               "rerun": rerun if reruns else None}
    whole, chunked = both(e, g, chunk, **options)
    same(whole, chunked)


def test_scattered_rounding_outliers_are_forgiven_in_chunks_as_whole():
    gen = torch.Generator().manual_seed(0)
    e = torch.randn(64, 4096, generator=gen)
    g = e.clone()
    rerun = e * (1 + 1e-7 * torch.randn(64, 4096, generator=gen))
    for k in (5, 40_000, 100_001, 200_777):  # four isolated elements, each within the reference's own spread there
        g.view(-1)[k] += 3e-4 * (abs(float(e.view(-1)[k])) + 1)
        rerun.view(-1)[k] += 1e-3 * (abs(float(e.view(-1)[k])) + 1)
    spread = [[rerun]]
    whole, chunked = both(e, g, 10_000, rerun=spread)
    same(whole, chunked)
    assert chunked.ok and chunked.outliers == 4, chunked.detail


def test_a_wrong_row_is_rejected_in_chunks_with_the_whole_comparisons_words():
    e = torch.randn(64, 4096)
    g = e.clone()
    g[7] += 0.5
    whole, chunked = both(e, g, 10_000, rerun=[[e * (1 + 1e-7)]])
    same(whole, chunked)
    assert not chunked.ok and "4096/262144 elements differ" in chunked.detail


@pytest.mark.parametrize("concentrated", [True, False])
def test_outliers_crowding_where_the_reference_is_poorly_conditioned_are_judged_alike_in_chunks(concentrated):
    # six of twelve outliers in one channel, each within the reference's own spread: forgiven where the reference's
    # own poorly conditioned elements crowd there too, a pattern where they are scattered (tests/test_numerics_outliers)
    from tests.test_numerics_outliers import PROBE_TOL, _channel_case

    e, g, rerun = _channel_case(concentrated)
    whole, chunked = both(e, g, 70_001, rerun=[[rerun]], scale_aware=True, tolerances=PROBE_TOL)
    same(whole, chunked)
    assert chunked.ok == concentrated, chunked.detail


def test_with_the_float64_truth_at_hand_the_whole_comparison_decides():
    e = torch.randn(4096)
    g = e.clone()
    g[3] += 1.0
    seen = []
    result = largecompare.compare_large(e, g, "output", 1e-4, 1e-4, lambda s: max(1e-4 * s, 1e-38), scale_aware=False,
                                        absolute=False, noise_factor=16.0,
                                        truth_of=lambda: seen.append(1) or e.double(), reruns_of=None, chunk=1000)
    assert result is None and seen  # the truth's rules are element by element: not here


def test_its_temporaries_stay_near_one_output_not_nine():
    from torch.profiler import ProfilerActivity, profile

    chunk = 1 << 14
    e = torch.randn(64 * chunk)  # 4 MiB of float32
    g = e.clone()
    g[::9973] += 1e-2  # scattered misses: the whole rules, then the outlier rule, run
    reruns = [e * (1 + 1e-7), e * (1 - 1e-7)]
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        largecompare.compare_large(e, g, "output", 1e-4, 1e-4, lambda s: max(1e-4 * s, 1e-38), scale_aware=False,
                                   absolute=False, noise_factor=16.0, truth_of=lambda: None,
                                   reruns_of=lambda: reruns, chunk=chunk)
    largest = max(ev.cpu_memory_usage for ev in prof.events())
    assert 0 < largest <= 4 * e.numel() + 16 * chunk  # the spread (one output) and a few chunks
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        saved = evidence.LARGE_ELEMENTS
        evidence.LARGE_ELEMENTS = 1 << 62
        try:
            compare_outputs([e], [g], rerun=[[r] for r in reruns])
        finally:
            evidence.LARGE_ELEMENTS = saved
    total = sum(max(ev.cpu_memory_usage, 0) for ev in prof.events())
    assert total >= 5 * 4 * e.numel()  # the whole rules allocate several outputs' worth


@settings(max_examples=80, deadline=None)
@given(n=st.integers(1, 3000), dtype=st.sampled_from(DTYPES + [torch.int32, torch.uint8]), offset=st.integers(0, 3),
       flip=st.one_of(st.none(), st.integers(0, 10**6)), chunk=st.integers(1, 700), seed=st.integers(0, 2**31 - 1))
def test_bitwise_equality_in_chunks_is_byte_for_byte(n, dtype, offset, flip, chunk, seed):
    # torch.equal on a byte view made a temporary of the output's size: a keeper comparing 6-GiB outputs on the
    # H100 asked for 12 GiB more. Large outputs are compared a chunk at a time, as wide words where aligned.
    gen = torch.Generator().manual_seed(seed)
    base = (torch.randn(n + offset, generator=gen) * 100).to(dtype)[offset:]  # unaligned views too
    other = base.clone()
    if flip is not None:
        raw = other.view(torch.uint8)
        k = flip % raw.numel()
        raw[k] ^= 1 << (flip % 8)
    saved = evidence.EQUAL_CHUNK_BYTES
    evidence.EQUAL_CHUNK_BYTES = chunk
    try:
        chunked = bitwise_equal(base, other)
    finally:
        evidence.EQUAL_CHUNK_BYTES = saved
    assert chunked == torch.equal(base.view(torch.uint8), other.view(torch.uint8)) == (flip is None)

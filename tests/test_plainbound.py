"""The plain bound over very large outputs, a chunk at a time (core.verification.plainbound): it accepts only
what the whole-tensor comparison accepts, with the same counts and errors, and its temporaries are of one
chunk, not five times the output (the H200's keeper compares ran out of memory at 10^9 elements)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from core.verification import evidence
from core.verification.evidence import _floor_of, bitwise_equal, compare_outputs, tolerance
from core.verification.plainbound import within_plain_bound

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def whole(e, g, **options):
    """compare_outputs with the chunked path off: every element judged at once."""
    saved = evidence.LARGE_ELEMENTS
    evidence.LARGE_ELEMENTS = 1 << 62
    try:
        return compare_outputs([e], [g], **options)
    finally:
        evidence.LARGE_ELEMENTS = saved


def plain(e, g, chunk, **options):
    floor, rtol = tolerance(str(e.dtype))
    return within_plain_bound(e, g, floor, rtol, lambda s: _floor_of(e.dtype, floor, s), chunk=chunk, **options)


@settings(max_examples=80, deadline=None)
@given(dtype=st.sampled_from(DTYPES), n=st.integers(1, 3000), seed=st.integers(0, 2**31 - 1),
       noise=st.sampled_from([0.0, 1e-7, 1e-5, 1e-2, 1.0]), specials=st.booleans(), misplaced=st.booleans(),
       scale_aware=st.sampled_from([False, True, "median"]), absolute=st.booleans(), chunk=st.integers(1, 700))
def test_plainly_within_only_where_the_whole_comparison_accepts_with_the_same_figures(
        dtype, n, seed, noise, specials, misplaced, scale_aware, absolute, chunk):
    gen = torch.Generator().manual_seed(seed)
    e = (torch.randn(n, generator=gen, dtype=torch.float64) * 10 ** torch.randint(-3, 4, (n,), generator=gen)).to(dtype)
    g = (e.to(torch.float64) * (1 + noise * torch.randn(n, generator=gen, dtype=torch.float64))).to(dtype)
    if specials and n >= 4:
        for i, v in ((0, math.nan), (n // 2, math.inf), (n - 1, -math.inf)):
            e[i] = g[i] = v
    if misplaced and n >= 4:
        g[n // 3] = math.nan if not scale_aware else math.inf
    assume(not bitwise_equal(e, g))  # compare_outputs settles those first, without arithmetic
    options = {"scale_aware": scale_aware, "absolute": absolute and not scale_aware}  # median: the domain probe
    fast = plain(e, g, chunk, **options)
    full = whole(e, g, **options)
    if fast is not None:
        assert full.ok, full.detail
        assert (fast.judged, fast.max_abs_err) == (full.judged, full.max_abs_err)
        assert fast.max_rel_err == pytest.approx(full.max_rel_err, rel=1e-6)
    if noise <= 1e-7 and not misplaced:  # rounding-sized differences: plainly within, decided in chunks
        assert fast is not None and full.ok


def test_a_wrong_region_falls_back_to_the_whole_comparison_and_is_rejected_as_before():
    e = torch.randn(1 << 12)
    g = e.clone()
    g[100:140] += 1.0
    assert plain(e, g, 256) is None
    saved = evidence.LARGE_ELEMENTS
    evidence.LARGE_ELEMENTS = 1 << 10  # this output is "large": the chunked path runs first, then falls back
    try:
        chunked = compare_outputs([e], [g])
    finally:
        evidence.LARGE_ELEMENTS = saved
    full = whole(e, g)
    assert not chunked.ok and chunked.detail == full.detail and "40/4096 elements differ" in chunked.detail


def test_honest_rounding_passes_in_chunks_with_the_whole_comparisons_figures():
    e = torch.randn(1 << 14)
    g = (e.double() * (1 + 1e-7 * torch.randn(1 << 14, dtype=torch.float64))).float()
    saved = evidence.LARGE_ELEMENTS
    evidence.LARGE_ELEMENTS = 1 << 10
    try:
        chunked = compare_outputs([e], [g])
    finally:
        evidence.LARGE_ELEMENTS = saved
    full = whole(e, g)
    assert chunked.ok and full.ok and (chunked.judged, chunked.max_abs_err) == (full.judged, full.max_abs_err)


def test_its_temporaries_are_a_few_chunks_not_several_outputs():
    from torch.profiler import ProfilerActivity, profile

    chunk = 1 << 16
    e = torch.randn(64 * chunk)  # 16 MiB of float32
    g = e * (1 + 1e-7)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        assert plain(e, g, chunk) is not None
    largest = max(ev.cpu_memory_usage for ev in prof.events())
    assert 0 < largest <= 8 * chunk  # one chunk in float64 (the RMS); never the output's size
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        assert whole(e, g).ok
    assert max(ev.cpu_memory_usage for ev in prof.events()) >= 4 * e.numel()  # the whole comparison: an output's worth


def test_the_domain_probes_median_scale_is_the_whole_comparisons_exactly():
    # outputs spanning dozens of decades (the domain probe): each element is judged on max(|ref|, median |ref|)
    from core.verification.evidence import median_scale
    from core.verification.plainbound import _chunks, _median_magnitude

    gen = torch.Generator().manual_seed(3)
    e = torch.randn(5001, generator=gen) * 10.0 ** torch.randint(-20, 20, (5001,), generator=gen)
    e[7] = math.inf
    g = e * (1 + 1e-6)
    finite = torch.isfinite(e)
    ref = e.abs().masked_fill(~finite, 0.0)
    whole_median = float(median_scale(ref, finite).min())
    least, peak = float(ref[finite].min()), float(ref.max())
    assert _median_magnitude(e, g, torch.float32, 333, int(finite.sum()), least, peak) == whole_median
    assert sum(int(f.sum()) for f, _, _ in _chunks(e, g, torch.float32, 333, "median")) == 5000
    assert plain(e, g, 333, scale_aware="median") is not None
    wrong = g.clone()
    wrong[2000:2010] *= 2
    assert plain(e, wrong, 333, scale_aware="median") is None and not whole(e, wrong, scale_aware="median").ok

"""Exact order statistics of large tensors (core.verification.selection): the bisection on float keys
gives what torch.kthvalue gives, for every float dtype the judge compares, and reads in chunks."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from core.verification.selection import _key, _value, count_at_most, kth_smallest, quantile

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
finite32 = st.floats(allow_nan=False, allow_infinity=True, width=32)


@settings(max_examples=60, deadline=None)
@given(st.lists(finite32, min_size=1, max_size=200), st.sampled_from(DTYPES), st.data())
def test_bisection_is_kthvalue(values, dtype, data):
    t = torch.tensor(values, dtype=torch.float64).to(dtype)
    k = data.draw(st.integers(1, t.numel()))
    chunk = data.draw(st.integers(1, 64))
    got = kth_smallest(t, k, method="bisect", chunk=chunk)
    want = float(t.kthvalue(k).values)
    assert got == want or (got == 0.0 and want == 0.0)  # -0.0 and 0.0 are one value here


@given(st.floats(allow_nan=False, width=32))
def test_keys_order_like_the_floats_and_invert(x):
    assert _value(_key(x, 32), 32) == x
    y = math.nextafter(x, math.inf)
    y32 = torch.tensor(y, dtype=torch.float32).item()
    if y32 > x:
        assert _key(y32, 32) > _key(x, 32)


def test_many_ties_and_a_few_outliers_like_a_spread():
    """A rounding spread is mostly zeros with a few large elements: the 0.9 quantile is 0 or the
    first nonzero, exactly as kthvalue says, whatever the chunking."""
    spread = torch.zeros(10_000)
    spread[::7] = torch.rand(len(range(0, 10_000, 7))) * 1e-6
    spread[17] = 3.0
    for q in (0.5, 0.85, 0.9, 0.999, 1.0):
        k = max(1, math.ceil(q * spread.numel()))
        assert quantile(spread, q, method="bisect", chunk=1000) == float(spread.kthvalue(k).values)


def test_nan_is_refused_by_the_bisection():
    with pytest.raises(ValueError, match="NaN"):
        kth_smallest(torch.tensor([1.0, float("nan"), 2.0]), 1, method="bisect")


def test_k_out_of_range_and_empty():
    with pytest.raises(ValueError):
        kth_smallest(torch.ones(3), 4)
    assert quantile(torch.ones(0), 0.9) == 0.0


def test_count_reads_in_chunks():
    t = torch.arange(100, dtype=torch.float32)
    assert count_at_most(t, 49.5, chunk=7) == 50
    assert count_at_most(t, -1.0, chunk=7) == 0

"""core.loop.stats: two-stage bootstrap intervals over seeds and items (the experiments' error bars)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.loop.stats import difference_ci, mean_ci, pooled_mean, ratio_ci

values = st.floats(0.0, 1.0, allow_nan=False)
clusters = st.lists(st.lists(values, min_size=1, max_size=8), min_size=1, max_size=5)


@settings(max_examples=40, deadline=None)
@given(clusters)
def test_mean_interval_is_ordered_and_within_the_data(data):
    ci = mean_ci(data, resamples=200)
    flat = [v for c in data for v in c]
    assert min(flat) - 1e-12 <= ci.low <= ci.high <= max(flat) + 1e-12
    assert ci.estimate == pytest.approx(pooled_mean(data))
    assert ci == mean_ci(data, resamples=200)  # seeded: the same inputs give the same interval


@settings(max_examples=30, deadline=None)
@given(st.floats(0.1, 1.0), st.integers(1, 4), st.integers(1, 6))
def test_constant_data_has_a_zero_width_interval(value, seeds, items):
    data = [[value] * items for _ in range(seeds)]
    ci = mean_ci(data, resamples=100)
    assert ci.low == pytest.approx(value) and ci.high == pytest.approx(value)
    assert ratio_ci(data, data, resamples=100).estimate == pytest.approx(1.0)
    assert difference_ci(data, data, resamples=100).high == pytest.approx(0.0)


def test_seed_to_seed_spread_widens_the_interval():
    # same items, but the second arm's seeds disagree with each other: resampling seeds must show it
    tight = [[0.5, 0.5, 0.5, 0.5]] * 3
    spread = [[0.1] * 4, [0.5] * 4, [0.9] * 4]
    assert mean_ci(tight).high - mean_ci(tight).low == pytest.approx(0.0)
    wide = mean_ci(spread)
    assert wide.high - wide.low > 0.3 and wide.low < 0.5 < wide.high


def test_ratio_of_a_zero_arm_is_undefined_not_infinite():
    ci = ratio_ci([[0.5, 0.5]], [[0.0, 0.0]], resamples=50)
    assert math.isnan(ci.estimate)


def test_difference_pairs_items_and_refuses_unpaired_data():
    ci = difference_ci([[1.0, 1.0, 0.0]], [[0.0, 1.0, 0.0]], resamples=500)
    assert ci.estimate == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="sizes"):
        difference_ci([[1.0, 0.0]], [[1.0]])
    with pytest.raises(ValueError, match="at least one"):
        mean_ci([])


def test_intervals_cover_the_true_mean_most_of_the_time():
    # 95% intervals of a known mean: far fewer than half may miss (a loose check of the method, not of luck)
    rng = np.random.default_rng(1)
    misses = 0
    for trial in range(40):
        data = [list(rng.normal(0.5, 0.1, size=10) + rng.normal(0, 0.05)) for _ in range(6)]
        ci = mean_ci(data, resamples=300, seed=trial)
        misses += not ci.low <= 0.5 <= ci.high
    assert misses <= 12

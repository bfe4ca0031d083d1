"""The adaptive curriculum: the published rule, thresholds from config, every decision logged."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plugins.curricula.adaptive import AdaptiveCurriculum


def test_low_accuracy_shrinks_param_space():
    c = AdaptiveCurriculum()
    (decision,) = c.update({"accept_rate": 0.5})
    assert c.state.param_scale == pytest.approx(0.7) and decision.startswith("shrink")
    c.update({"accept_rate": 0.84})
    assert c.state.param_scale == pytest.approx(0.49)


def test_slow_candidates_raise_perf_share():
    c = AdaptiveCurriculum()
    (decision,) = c.update({"accept_rate": 0.9, "latency_ratio": 1.5})
    assert c.state.perf_share == pytest.approx(0.5) and decision.startswith("performance")
    c.update({"accept_rate": 0.9, "latency_ratio": 1.5})
    c.update({"accept_rate": 0.9, "latency_ratio": 1.5})
    assert c.state.perf_share == 1.0  # capped at max_perf_share


def test_otherwise_new_apis_are_introduced():
    c = AdaptiveCurriculum(max_tier=0, tier_limit=2)
    for _ in range(3):
        c.update({"accept_rate": 0.95, "latency_ratio": 1.1})
    assert c.state.max_tier == 2
    assert c.history[-1]["decision"].startswith("hold")
    assert c.state.param_scale == 1.0 and c.state.perf_share == 0.0


def test_thresholds_come_from_config():
    c = AdaptiveCurriculum(accuracy_threshold=0.3, shrink=0.5)
    c.update({"accept_rate": 0.4})
    assert c.state.max_tier == 1 and c.state.param_scale == 1.0
    c.update({"accept_rate": 0.2})
    assert c.state.param_scale == 0.5


def test_window_averages_before_deciding():
    c = AdaptiveCurriculum(window_attempts=3)
    assert c.update({"accept_rate": 1.0}) == [] and c.update({"accept_rate": 1.0}) == []
    (decision,) = c.update({"accept_rate": 0.4})  # mean 0.8 < 0.85
    assert decision.startswith("shrink")


def test_window_is_counted_in_attempts_and_weighted_by_them():
    c = AdaptiveCurriculum(window_attempts=32)
    assert c.update({"accept_rate": 0.0, "samples": 8}) == []
    assert c.pending_attempts() == 8
    # 8 attempts at 0.0 and 24 at 1.0: 0.75 over 32 attempts, not the 0.5 of the two step means
    (decision,) = c.update({"accept_rate": 1.0, "samples": 24})
    assert decision.startswith("shrink") and "0.750" in decision and "32 attempts" in decision
    assert c.history[-1]["attempts"] == 32 and c.pending_attempts() == 0


@given(st.integers(1, 64), st.lists(st.tuples(st.integers(0, 16), st.floats(0, 1)), max_size=60))
def test_every_decision_rests_on_at_least_window_attempts(window, steps):
    c = AdaptiveCurriculum(window_attempts=window)
    gathered = 0
    for samples, acc in steps:
        gathered += samples
        decided = c.update({"accept_rate": acc, "samples": samples})
        if decided:
            assert gathered >= window  # never on fewer attempts than the window
            gathered = 0
        else:
            assert gathered < window  # and never waits past it
        assert c.pending_attempts() == gathered
    assert all(h["attempts"] >= window for h in c.history)


def test_state_dict_round_trip():
    c = AdaptiveCurriculum(window_attempts=2)
    c.update({"accept_rate": 0.1})
    c.update({"accept_rate": 0.1})
    c.update({"accept_rate": 0.9})
    d = AdaptiveCurriculum(window_attempts=2)
    d.load_state_dict(c.state_dict())
    assert d.state == c.state and d.history == c.history
    assert d.update({"accept_rate": 0.9}) == c.update({"accept_rate": 0.9})


def test_invalid_config_is_rejected():
    with pytest.raises(ValueError, match="shrink"):
        AdaptiveCurriculum(shrink=1.5)
    with pytest.raises(ValueError, match="window_attempts"):
        AdaptiveCurriculum(window_attempts=0)


@given(st.lists(st.tuples(st.floats(0, 1), st.one_of(st.none(), st.floats(0.1, 5))), max_size=40))
def test_state_stays_in_bounds(history):
    c = AdaptiveCurriculum(min_param_scale=0.1, tier_limit=3)
    for acc, lat in history:
        decisions = c.update({"accept_rate": acc, "latency_ratio": lat})
        assert len(decisions) == 1
    assert 0.1 <= c.state.param_scale <= 1.0
    assert 0.0 <= c.state.perf_share <= 1.0
    assert 0 <= c.state.max_tier <= 3
    assert len(c.history) == len(history)


def test_registered():
    from core.plugins import registry

    assert "adaptive" in registry("curriculum")

"""The adaptive curriculum: the published rule, thresholds from config, every decision logged."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from plugins.curricula.adaptive import AdaptiveCurriculum


def test_low_accuracy_shrinks_param_space():
    c = AdaptiveCurriculum()
    (decision,) = c.update({"pass_rate": 0.5})
    assert c.state.param_scale == pytest.approx(0.7) and decision.startswith("shrink")
    c.update({"pass_rate": 0.84})
    assert c.state.param_scale == pytest.approx(0.49)


def test_slow_candidates_raise_perf_share():
    c = AdaptiveCurriculum()
    (decision,) = c.update({"pass_rate": 0.9, "latency_ratio": 1.5})
    assert c.state.perf_share == pytest.approx(0.5) and decision.startswith("performance")
    c.update({"pass_rate": 0.9, "latency_ratio": 1.5})
    c.update({"pass_rate": 0.9, "latency_ratio": 1.5})
    assert c.state.perf_share == 1.0  # capped at max_perf_share


def test_otherwise_new_apis_are_introduced():
    c = AdaptiveCurriculum(max_tier=0, tier_limit=2)
    for _ in range(3):
        c.update({"pass_rate": 0.95, "latency_ratio": 1.1})
    assert c.state.max_tier == 2
    assert c.history[-1]["decision"].startswith("hold")
    assert c.state.param_scale == 1.0 and c.state.perf_share == 0.0


def test_thresholds_come_from_config():
    c = AdaptiveCurriculum(accuracy_threshold=0.3, shrink=0.5)
    c.update({"pass_rate": 0.4})
    assert c.state.max_tier == 1 and c.state.param_scale == 1.0
    c.update({"pass_rate": 0.2})
    assert c.state.param_scale == 0.5


def test_window_averages_before_deciding():
    c = AdaptiveCurriculum(window=3)
    assert c.update({"pass_rate": 1.0}) == [] and c.update({"pass_rate": 1.0}) == []
    (decision,) = c.update({"pass_rate": 0.4})  # mean 0.8 < 0.85
    assert decision.startswith("shrink")


def test_state_dict_round_trip():
    c = AdaptiveCurriculum(window=2)
    c.update({"pass_rate": 0.1})
    c.update({"pass_rate": 0.1})
    c.update({"pass_rate": 0.9})
    d = AdaptiveCurriculum(window=2)
    d.load_state_dict(c.state_dict())
    assert d.state == c.state and d.history == c.history
    assert d.update({"pass_rate": 0.9}) == c.update({"pass_rate": 0.9})


def test_invalid_config_is_rejected():
    with pytest.raises(ValueError, match="shrink"):
        AdaptiveCurriculum(shrink=1.5)


@given(st.lists(st.tuples(st.floats(0, 1), st.one_of(st.none(), st.floats(0.1, 5))), max_size=40))
def test_state_stays_in_bounds(history):
    c = AdaptiveCurriculum(min_param_scale=0.1, tier_limit=3)
    for acc, lat in history:
        decisions = c.update({"pass_rate": acc, "latency_ratio": lat})
        assert len(decisions) == 1
    assert 0.1 <= c.state.param_scale <= 1.0
    assert 0.0 <= c.state.perf_share <= 1.0
    assert 0 <= c.state.max_tier <= 3
    assert len(c.history) == len(history)


def test_registered():
    from core.plugins import registry

    assert "adaptive" in registry("curriculum")

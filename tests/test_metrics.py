"""core.loop.metrics: step metrics (information density, pass rates), the JSONL log and the summary plot."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.loop.metrics import (
    Attempt,
    MetricsLog,
    aggregate,
    latency_ratio,
    plot_summary,
    solve_rates,
    sparkline,
    step_metrics,
)
from core.verdict import Verdict

groups_st = st.lists(  # groups of (accepted, total reward) samples
    st.lists(st.tuples(st.booleans(), st.sampled_from([0.0, 0.5, 1.0])), min_size=1, max_size=5),
    min_size=1, max_size=8,
)


def attempts_of(groups):
    return [Attempt(task_id=f"t{g}", group=g, accepted=acc, rewards={"correctness": r}, total=r, tier=g % 2)
            for g, samples in enumerate(groups) for acc, r in samples]


@given(groups_st)
def test_step_metrics_invariants(groups):
    m = step_metrics(attempts_of(groups), ["correctness"])
    assert 0.0 <= m["pass_rate"] <= m["pass_at_k"] <= 1.0
    assert m["groups"] == len(groups) and m["samples"] == sum(map(len, groups))
    expected_density = sum(len({r for _, r in g}) > 1 for g in groups) / len(groups)
    assert m["information_density"] == pytest.approx(expected_density)
    assert m["pass_rate"] == pytest.approx(sum(g[0][0] for g in groups) / len(groups))
    assert m["reward/correctness"] == pytest.approx(m["reward"])
    assert m["tasks/tier0"] + m.get("tasks/tier1", 0) == len(groups)


def test_information_density_counts_only_groups_with_reward_spread():
    attempts = attempts_of([[(True, 1.0), (True, 1.0)], [(False, 0.0), (True, 1.0)], [(False, 0.0)] * 2])
    assert step_metrics(attempts, [])["information_density"] == pytest.approx(1 / 3)


def test_hack_flags_and_latency():
    a = [Attempt("t", 0, True, {}, 1.0, hack_flags=["integrity"], latency_ratio=2.0),
         Attempt("t", 0, False, {}, 0.0, latency_ratio=9.0)]
    m = step_metrics(a, [])
    assert m["hack_flag_rate"] == 0.5
    assert m["latency_ratio"] == 2.0  # only accepted candidates' timings count


def test_latency_ratio_from_verdict_timing():
    assert latency_ratio(Verdict(timing={"speedup_eager": 2.0})) == 0.5
    assert latency_ratio(Verdict(timing={"median_ms": 3.0, "eager_ms": 1.5})) == 2.0
    assert latency_ratio(Verdict()) is None


def test_solve_rates_and_aggregate():
    a = attempts_of([[(True, 1.0), (False, 0.0)], [(False, 0.0)]])
    assert solve_rates(a) == {"t0": 0.5, "t1": 0.0}
    agg = aggregate([{"pass_rate": 0.2, "samples": 4}, {"pass_rate": 0.4, "samples": 4}])
    assert agg["pass_rate"] == pytest.approx(0.3) and agg["samples"] == 8


def test_metrics_log_appends_reloads_and_truncates(tmp_path):
    log = MetricsLog(tmp_path / "m.jsonl")
    for step in range(4):
        log.append({"step": step, "pass_rate": step / 4, "information_density": float("nan")})
    again = MetricsLog(tmp_path / "m.jsonl")
    assert [r["step"] for r in again.rows] == [0, 1, 2, 3] and again.rows[0]["information_density"] is None
    again.truncate(1)
    assert [json.loads(line)["step"] for line in (tmp_path / "m.jsonl").read_text().splitlines()] == [0, 1]


def test_plot_summary_writes_png(tmp_path):
    rows = [step_metrics(attempts_of([[(i % 2 == 0, 1.0), (False, 0.0)]]), ["correctness"]) | {"step": i}
            for i in range(5)]
    path = plot_summary(rows, tmp_path / "summary.png")
    assert path.read_bytes()[:4] == b"\x89PNG" and path.stat().st_size > 5000


@given(st.lists(st.floats(0.0, 1.0), max_size=20))
def test_sparkline_has_one_char_per_value(values):
    assert len(sparkline(values)) == len(values)

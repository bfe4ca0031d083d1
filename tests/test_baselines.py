"""core.baselines: a task's reference is measured once and shared by its verifications."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.baselines import BaselineCache


@settings(max_examples=50, deadline=None)
@given(st.lists(st.sampled_from("abcde"), max_size=30))
def test_each_key_is_measured_once_whatever_the_order_of_requests(keys):
    cache, calls = BaselineCache(), []

    def measure_for(k):
        return lambda: calls.append(k) or f"value of {k}"

    seen = set()
    for k in keys:
        value, shared = cache.get(k, measure_for(k))
        assert value == f"value of {k}" and shared == (k in seen)
        seen.add(k)
    assert sorted(calls) == sorted(set(keys))
    assert cache.measured == len(set(keys)) == len(cache)


def test_concurrent_verifications_of_one_task_wait_for_one_measurement():
    cache, started = BaselineCache(), []

    def slow_measure():
        started.append(threading.get_ident())
        time.sleep(0.2)
        return {"eager_ms": 1.0}

    results = []
    threads = [threading.Thread(target=lambda: results.append(cache.get("task", slow_measure))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(started) == 1
    assert [v for v, _ in results] == [{"eager_ms": 1.0}] * 8
    assert sorted(shared for _, shared in results) == [False] + [True] * 7


def test_a_failed_measurement_is_not_kept_and_the_next_caller_measures_again():
    cache = BaselineCache()

    def broken():
        raise RuntimeError("reference worker died")

    with pytest.raises(RuntimeError, match="died"):
        cache.get("task", broken)
    assert len(cache) == 0
    assert cache.get("task", lambda: 3.0) == (3.0, False)
    assert cache.get("task", broken) == (3.0, True)  # kept: not measured again

"""GPU workers run every autotune config in the judged calls (plugins.backends.triton_backend.every_config_in_trials).

The sampled race analysis compares no outputs, so a wrong config the GPU's benchmark did not pick would pass
unseen; these tests drive the policy with a stand-in autotuner (the real one needs a GPU to benchmark)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plugins.backends import triton_backend as tb


class Config(SimpleNamespace):
    def all_kwargs(self):
        return dict(self.kwargs)


class OutOfResources(Exception):
    pass


def autotuner(n: int, broken: set[int] = frozenset()):
    calls = []

    def fn_run(*args, **kw):
        if kw["BLOCK"] in {16 * (i + 1) for i in broken}:
            raise OutOfResources("shared memory")
        calls.append(kw["BLOCK"])
        return kw["BLOCK"]

    configs = [Config(kwargs={"BLOCK": 16 * (i + 1)}, pre_hook=None) for i in range(n)]
    tuner = SimpleNamespace(configs=configs, arg_names=["x"], fn=SimpleNamespace(run=fn_run),
                            prune_configs=lambda kwargs: configs, nargs=None, best_config=None)
    return tuner, calls


def benchmarked(self, *args, **kwargs):  # the real autotuner: benchmarks, then runs its best (the last, here)
    return self.fn.run(*args, **kwargs, **self.configs[-1].all_kwargs())


@settings(max_examples=30, deadline=None)
@given(n=st.integers(2, 8), calls=st.integers(1, 12))
def test_judged_call_i_runs_config_i_then_the_autotuners_choice(n, calls):
    run = tb.every_config_in_trials(benchmarked)
    tuner, ran = autotuner(n)
    with pytest.MonkeyPatch.context() as mp:
        for call in range(calls):
            mp.setattr(tb, "_current_tracker", lambda call=call: SimpleNamespace(call=call))
            run(tuner, 1.0)
    expected = [16 * i if 1 <= i <= n else 16 * n for i in range(calls)]
    # the first judged call runs the benchmark's choice (the last config here), so a wrong config the
    # benchmark picks is judged however many configs there are; then every config in order
    assert ran == expected


def test_outside_the_judged_calls_the_autotuner_itself_runs(monkeypatch):
    # the timed stage runs outside a launch tracker: its time is the config the benchmark picks
    monkeypatch.setattr(tb, "_current_tracker", lambda: None)
    tuner, ran = autotuner(4)
    assert tb.every_config_in_trials(benchmarked)(tuner, 1.0) == 64 and ran == [64]


def test_a_config_this_gpu_cannot_build_falls_back_to_the_autotuner(monkeypatch):
    monkeypatch.setattr(tb, "_current_tracker", lambda: SimpleNamespace(call=2))
    tuner, ran = autotuner(3, broken={1})
    assert tb.every_config_in_trials(benchmarked)(tuner, 1.0) == 48 and ran == [48]


def test_a_config_that_fails_otherwise_fails_the_call(monkeypatch):
    monkeypatch.setattr(tb, "_current_tracker", lambda: SimpleNamespace(call=1))
    tuner, _ = autotuner(2)
    tuner.fn.run = lambda *a, **k: (_ for _ in ()).throw(ValueError("wrong"))
    with pytest.raises(ValueError):
        tb.every_config_in_trials(benchmarked)(tuner, 1.0)


def test_the_benchmarks_choice_is_judged_even_beyond_the_judged_calls(monkeypatch):
    # 20 configs and 11 judged calls: a wrong fastest config at index 15 must still run in a judged call
    tuner, ran = autotuner(20)
    run = tb.every_config_in_trials(benchmarked)
    for call in range(11):
        monkeypatch.setattr(tb, "_current_tracker", lambda call=call: SimpleNamespace(call=call))
        run(tuner, 1.0)
    assert ran[0] == 16 * 20 and ran[1:] == [16 * (i + 1) for i in range(10)]


def test_the_autotuners_own_call_is_named_as_the_config_it_chose(monkeypatch):
    # its benchmark's launches were recorded unnamed beside its choice, so a repeat on a named config looked like
    # other kernels to the determinism check, and an honest eight-config row sum failed for different bits (H100)
    tracker = SimpleNamespace(call=0, kernels=[])
    monkeypatch.setattr(tb, "_current_tracker", lambda: tracker)
    tuner, _ = autotuner(4)

    def benchmarking(self, *args, **kwargs):
        tracker.kernels += ["row_sum"] * 5  # the benchmark's launches, then its choice's
        self.best_config = self.configs[-1]
        return self.fn.run(*args, **kwargs, **self.configs[-1].all_kwargs())

    run = tb.every_config_in_trials(benchmarking)
    assert run(tuner, 1.0) == 64 and tracker.kernels == ["row_sum[BLOCK=64]"]
    tracker.call, tracker.kernels = 9, []  # past the configs: the choice again, named alike
    run(tuner, 1.0)
    assert tracker.kernels == ["row_sum[BLOCK=64]"]

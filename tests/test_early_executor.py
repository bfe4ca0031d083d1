"""core.eval starts its verification executor while the coder writes the candidates
(core.evaluation.runner.EarlyExecutor): on a GPU host the workers' start-up and the expert's candidates each
take seconds before the first verdict, and done one after the other they added up."""

from __future__ import annotations

import threading
import time

import pytest

from core.evaluation import runner
from core.verification.executor import ExecutorError


class _Slow:
    """An executor whose start takes ``start_s``; it records whether it was closed."""

    def __init__(self, start_s: float):
        time.sleep(start_s)
        self.closed = threading.Event()

    def close(self) -> None:
        self.closed.set()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def test_the_start_runs_beside_the_caller_and_is_taken_when_ready(monkeypatch):
    made = []
    monkeypatch.setattr(runner, "make_executor", lambda node, **kw: made.append((node, kw)) or _Slow(0.5))
    began = time.perf_counter()
    early = runner.EarlyExecutor({"name": "local"}, backend="triton", device="cpu", verifier={"trials": 5})
    assert time.perf_counter() - began < 0.3  # the caller goes on (the coder writes) while it starts
    time.sleep(0.4)  # the coder's work
    executor = early.take()
    assert time.perf_counter() - began < 0.8  # 0.5 s of start-up beside 0.4 s of writing, not 0.9 s after it
    assert made == [({"name": "local"}, {"backend": "triton", "device": "cpu", "verifier": {"trials": 5}})]
    early.abandon()  # taken: the caller's `with` closes it, not the abandon
    assert not executor.closed.is_set()


def test_an_executor_never_taken_is_closed_once_started(monkeypatch):
    started = []
    monkeypatch.setattr(runner, "make_executor", lambda node, **kw: started.append(_Slow(0.2)) or started[-1])
    early = runner.EarlyExecutor({}, backend="triton", device="cpu", verifier=None)
    early.abandon()  # every verdict was cached, say: nothing to verify
    deadline = time.monotonic() + 5
    while not started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert started and started[0].closed.wait(5)


def test_a_start_that_failed_fails_the_take_with_its_error(monkeypatch):
    def refuse(node, **kw):
        raise ExecutorError("executor=ray needs Ray: pip install 'kernelzero[ray]'")

    monkeypatch.setattr(runner, "make_executor", refuse)
    early = runner.EarlyExecutor({}, backend="triton", device="cpu", verifier=None)
    with pytest.raises(ExecutorError, match="needs Ray"):
        early.take()
    untaken = runner.EarlyExecutor({}, backend="triton", device="cpu", verifier=None)
    untaken.abandon()  # an error nobody asked for stays unraised: no verification was needed

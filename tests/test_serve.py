"""The verification service's gate and queue, in-process: who may call, how big a request may be, what a
malformed one gets, and that every admitted pair gets exactly one answer.

These tests never reach a verdict worth judging: the executor here records what it is asked and answers with
a fixed verdict, so a refusal can be seen to have reached nothing. The service with the real sandboxed
verifier is tested in tests/test_serve_e2e.py.
"""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.serve import wire
from core.serve.app import ServiceInfo, create_app, prometheus_text
from core.serve.dispatch import Dispatcher, percentiles
from core.task import Candidate, Task
from core.verdict import Verdict

REFERENCE = "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
CANDIDATE = "class ModelNew:\n    pass\n"


class RecordingExecutor:
    """Answers every pair with an ``accepted`` verdict after ``gate`` opens; records every pair it was asked."""

    workers = 2

    def __init__(self, fail_on: str | None = None):
        self.seen: list[tuple[Task, Candidate]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail_on = fail_on
        self._lock = threading.Lock()

    def verify(self, task: Task, candidate: Candidate) -> Verdict:
        self.gate.wait(timeout=30)
        with self._lock:
            self.seen.append((task, candidate))
        if self.fail_on and self.fail_on in candidate.source:
            raise RuntimeError("every shard was lost")
        return Verdict(accepted=True, status="accepted", task_id=task.id, candidate_id=candidate.id, elapsed_s=0.01)


def service(executor: RecordingExecutor, token: str | None = None, **limits: int):
    dispatcher = Dispatcher(executor, max_queue=limits.pop("max_queue", 8))
    info = ServiceInfo(backend="triton", device="cpu", settings={"trials": 5, "timeout_s": 120.0, "checks": "all",
                                                                  "device": "cpu"})
    return create_app(dispatcher, info, wire.Limits(max_queue=dispatcher.max_queue, **limits), token), dispatcher


def call(app, method: str, path: str, client_host: str = "127.0.0.1", **kwargs) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, client=(client_host, 50000))
        async with httpx.AsyncClient(transport=transport, base_url="http://kz") as client:
            return await client.request(method, path, **kwargs)

    return asyncio.run(go())


@pytest.fixture
def recorded():
    executor = RecordingExecutor()
    app, dispatcher = service(executor, max_body_bytes=4096, max_source_bytes=1024, max_batch=3)
    yield app, dispatcher, executor
    dispatcher.close()


def unchanged(dispatcher: Dispatcher, executor: RecordingExecutor) -> None:
    numbers = dispatcher.metrics()
    assert executor.seen == [] and numbers["verdicts_total"] == 0 and numbers["queue_depth"] == 0


def test_a_loopback_client_without_a_token_gets_its_verdict(recorded):
    app, dispatcher, executor = recorded
    response = call(app, "POST", wire.VERIFY, json={"task": REFERENCE, "candidate": CANDIDATE})
    assert response.status_code == 200, response.text
    assert response.json()["accepted"] is True and len(executor.seen) == 1
    assert dispatcher.metrics()["verdicts_total"] == 1


@pytest.mark.parametrize("host", ["10.1.2.3", "203.0.113.9", "2001:db8::1", "testclient"])
def test_a_non_loopback_client_without_a_token_is_forbidden_and_changes_nothing(recorded, host):
    app, dispatcher, executor = recorded
    for method, path in (("POST", wire.VERIFY), ("GET", wire.HEALTH), ("GET", wire.METRICS), ("GET", "/nope")):
        response = call(app, method, path, client_host=host, json={"task": REFERENCE, "candidate": CANDIDATE})
        assert response.status_code == 403
        body = response.json()
        assert body["error"] == "forbidden" and "--token" in body["message"] and host in body["message"]
    unchanged(dispatcher, executor)


def test_a_request_a_proxy_forwarded_is_not_taken_for_loopback(recorded):
    app, dispatcher, executor = recorded
    response = call(app, "POST", wire.VERIFY, headers={"X-Forwarded-For": "198.51.100.7"},
                    json={"task": REFERENCE, "candidate": CANDIDATE})
    assert response.status_code == 403 and "proxy" in response.json()["message"]
    unchanged(dispatcher, executor)


def test_with_a_token_every_client_must_send_it():
    executor = RecordingExecutor()
    app, dispatcher = service(executor, token="s3cret")
    try:
        body = {"task": REFERENCE, "candidate": CANDIDATE}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            response = call(app, "POST", wire.VERIFY, client_host="127.0.0.1", headers=headers, json=body)
            assert response.status_code == 401 and response.json()["error"] == "unauthorized"
        unchanged(dispatcher, executor)
        remote = call(app, "POST", wire.VERIFY, client_host="203.0.113.9",
                      headers={"Authorization": "Bearer s3cret"}, json=body)
        assert remote.status_code == 200 and remote.json()["accepted"] is True
    finally:
        dispatcher.close()


@pytest.mark.parametrize("body, code, says", [
    (b"{not json", "malformed", "not JSON"),
    (b"[1, 2]", "malformed", "JSON object"),
    (json.dumps({"task": REFERENCE}).encode(), "malformed", "'candidate'"),
    (json.dumps({"task": 3, "candidate": CANDIDATE}).encode(), "malformed", "body.task"),
    (json.dumps({"task": REFERENCE, "candidate": CANDIDATE, "extra": 1}).encode(), "malformed", "unknown key"),
    (json.dumps({"task": "def broken(:\n", "candidate": CANDIDATE}).encode(), "malformed", "does not compile"),
    (json.dumps({"task": {"source": REFERENCE, "id": "0" * 16}, "candidate": CANDIDATE}).encode(), "malformed",
     "does not match its source"),
    (json.dumps({"task": REFERENCE, "candidate": CANDIDATE, "backend": "cuda"}).encode(), "unsupported", "'cuda'"),
    (json.dumps({"task": REFERENCE, "candidate": CANDIDATE, "settings": {"trials": 9}}).encode(), "unsupported",
     "trials=5"),
    (json.dumps({"task": REFERENCE, "candidate": CANDIDATE, "settings": {"memory": 1}}).encode(), "unsupported",
     "unknown setting"),
])
def test_a_malformed_request_gets_a_clear_error_and_changes_nothing(recorded, body, code, says):
    app, dispatcher, executor = recorded
    response = call(app, "POST", wire.VERIFY, content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == wire.ERRORS[code]
    assert response.json()["error"] == code and says in response.json()["message"], response.json()
    unchanged(dispatcher, executor)


def test_a_request_that_restates_the_services_settings_is_served(recorded):
    app, _, executor = recorded
    body = {"task": REFERENCE, "candidate": CANDIDATE, "backend": "triton", "settings": {"trials": 5, "checks": "all"}}
    assert call(app, "POST", wire.VERIFY, json=body).status_code == 200 and len(executor.seen) == 1


def test_oversized_requests_are_refused_before_anything_is_queued(recorded):
    app, dispatcher, executor = recorded
    big_source = REFERENCE + "#" * 2000
    cases = [
        ({"task": big_source, "candidate": CANDIDATE}, "per source"),  # one source over max_source_bytes
        ({"pairs": [{"task": REFERENCE, "candidate": CANDIDATE}] * 4}, "at most 3 per request"),  # max_batch
    ]
    for body, says in cases:
        path = wire.VERIFY_BATCH if "pairs" in body else wire.VERIFY
        response = call(app, "POST", path, json=body)
        assert response.status_code == 413 and says in response.json()["message"], response.json()
    huge = json.dumps({"task": REFERENCE + "#" * 8000, "candidate": CANDIDATE}).encode()
    declared = call(app, "POST", wire.VERIFY, content=huge)  # Content-Length over max_body_bytes
    assert declared.status_code == 413 and "at most 4096" in declared.json()["message"]

    async def chunks():  # no Content-Length: read no further than the limit
        for _ in range(10):
            yield b" " * 1000

    chunked = call(app, "POST", wire.VERIFY, content=chunks())
    assert chunked.status_code == 413 and "passed 4096" in chunked.json()["message"]
    unchanged(dispatcher, executor)


def test_a_full_queue_answers_busy_at_once_and_queues_nothing():
    executor = RecordingExecutor()
    executor.gate.clear()  # the executor holds every pair it is given until the gate opens
    app, dispatcher = service(executor, max_queue=2)
    try:
        verdicts: list[Verdict] = []
        assert dispatcher.admit([(Task(REFERENCE), Candidate(CANDIDATE))] * 2, lambda i, v: verdicts.append(v))
        response = call(app, "POST", wire.VERIFY, json={"task": REFERENCE, "candidate": CANDIDATE})
        assert response.status_code == 503 and response.json()["error"] == "busy"
        assert int(response.headers["Retry-After"]) >= 1
        assert dispatcher.metrics()["busy_total"] == 1
        executor.gate.set()
        dispatcher.close()
        assert len(verdicts) == 2 and len(executor.seen) == 2  # the two admitted ones, not the refused one
    finally:
        executor.gate.set()


def test_an_executor_failure_costs_that_pair_an_error_verdict_and_nothing_else():
    executor = RecordingExecutor(fail_on="BOOM")
    dispatcher = Dispatcher(executor, max_queue=8)
    got: dict[int, Verdict] = {}
    pairs = [(Task(REFERENCE), Candidate(CANDIDATE)), (Task(REFERENCE), Candidate(CANDIDATE + "# BOOM\n")),
             (Task(REFERENCE), Candidate(CANDIDATE + "# fine\n"))]
    assert dispatcher.admit(pairs, lambda i, v: got.__setitem__(i, v))
    dispatcher.close()
    assert [got[i].status for i in range(3)] == ["accepted", "error", "accepted"]
    assert "every shard was lost" in got[1].reason and dispatcher.metrics()["executor_errors"] == 1


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=5), min_size=1, max_size=12), st.integers(min_value=1, max_value=10))
def test_every_admitted_pair_is_answered_exactly_once_and_a_refused_request_queues_nothing(sizes, max_queue):
    executor = RecordingExecutor()
    executor.gate.clear()
    dispatcher = Dispatcher(executor, max_queue=max_queue)
    answers: dict[tuple[int, int], int] = {}
    lock = threading.Lock()
    admitted = []
    for r, size in enumerate(sizes):
        def done(i: int, v: Verdict, r: int = r) -> None:
            with lock:
                answers[(r, i)] = answers.get((r, i), 0) + 1
        ok = dispatcher.admit([(Task(REFERENCE), Candidate(f"{CANDIDATE}# {r} {i}\n")) for i in range(size)], done)
        if ok:
            admitted.append((r, size))
    executor.gate.set()
    dispatcher.close()
    expected = {(r, i): 1 for r, size in admitted for i in range(size)}
    assert answers == expected
    assert len(executor.seen) == sum(size for _, size in admitted)
    assert dispatcher.busy_total == len(sizes) - len(admitted)


def test_metrics_report_queue_depth_rate_and_check_time(recorded):
    app, _, _ = recorded
    for _ in range(3):
        assert call(app, "POST", wire.VERIFY, json={"task": REFERENCE, "candidate": CANDIDATE}).status_code == 200
    numbers = call(app, "GET", wire.METRICS).json()
    assert numbers["verdicts_total"] == 3 and numbers["queue_depth"] == 0 and numbers["verdicts_per_s"] > 0
    assert numbers["check_s"]["p50"] == pytest.approx(0.01)
    text = call(app, "GET", wire.METRICS, params={"format": "prometheus"}).text
    assert "kernelzero_serve_verdicts_total 3" in text and 'kernelzero_serve_check_s{stat="p50"} 0.01' in text
    assert prometheus_text(numbers).count("# TYPE kernelzero_serve_verdicts_by_status counter") == 1
    health = call(app, "GET", wire.HEALTH).json()
    assert health["ready"] is True and health["limits"]["max_batch"] == 3


def test_percentiles_are_nearest_rank():
    assert percentiles([]) == {}
    assert percentiles([5.0]) == {"p50": 5.0, "p90": 5.0, "p99": 5.0}
    assert percentiles(list(map(float, range(1, 101))), (0.5, 0.99)) == {"p50": 50.0, "p99": 99.0}

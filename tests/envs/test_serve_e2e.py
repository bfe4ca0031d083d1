"""The verification service end to end: a loopback service with two sandboxed CPU workers (Triton interpreter),
called through the client library, against the native verifier on the same pairs. Also a worker killed in
the middle of a batch, and ``python -m core.serve`` started as a subprocess."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from kernel_cases import HACKED, HONEST, SLOW_TASK, TASK, WRONG

from core.serve import registry, wire
from core.serve.client import ServiceError, VerifierClient
from core.serve.service import ServiceConfig, running_service, sandbox_worker_pids
from core.task import Candidate, Task
from core.verify import Verifier

ROOT = Path(__file__).resolve().parents[2]


def summary(verdict) -> tuple:
    failed = sorted(name for name, c in verdict.checks.items() if not c.passed)
    return verdict.status, verdict.accepted, verdict.compiled, verdict.correct, failed, bool(verdict.hack_flags)


@pytest.fixture(scope="module")
def service():
    with running_service(ServiceConfig(device="cpu", workers=2, port=0, timeout_s=90,
                                       limits=wire.Limits(max_batch=8, max_queue=16))) as running:
        yield running


@pytest.fixture(scope="module")
def native():
    pairs = [(Task(TASK), Candidate(s)) for s in (HONEST, WRONG, HACKED)]
    with Verifier(backend="triton", device="cpu", workers=2, timeout_s=90) as verifier:
        return [summary(v) for v in verifier.verify_many(pairs)]


def test_the_service_reaches_the_native_verifiers_verdicts(service, native):
    with VerifierClient(service.url) as client:
        one = [summary(client.verify(TASK, s)) for s in (HONEST, WRONG, HACKED)]
        batch = [summary(v) for v in client.verify_many([(Task(TASK), Candidate(s)) for s in (HONEST, WRONG, HACKED)])]
    assert one == batch == native
    honest, wrong, hacked = native
    assert honest[1] is True
    assert wrong[1] is False and "correctness" in wrong[4]
    assert hacked[1] is False and hacked[5] is True  # flagged as a hack, not an honest mistake


def test_the_async_client_and_the_verdict_json_the_cli_prints(service):
    async def go():
        client = VerifierClient(service.url)
        try:
            return await client.averify_many([(TASK, HONEST), (TASK, WRONG)])
        finally:
            await client.aclose()

    honest, wrong = asyncio.run(go())
    assert honest.accepted and not wrong.accepted
    raw = httpx.post(service.url + wire.VERIFY, json={"task": TASK, "candidate": HONEST}, timeout=120).json()
    assert {"accepted", "reason", "compiled", "correct", "accuracy", "checks", "timing", "roofline", "status"} <= set(raw)


def test_refused_requests_change_nothing_on_the_real_service(service):
    with VerifierClient(service.url, retries=0) as client:
        before = client.metrics()
        with pytest.raises(ServiceError) as malformed:
            client._request("POST", wire.VERIFY, {"task": TASK})
        assert malformed.value.code == "malformed" and "'candidate'" in malformed.value.message
        with pytest.raises(ServiceError) as big:
            client._request("POST", wire.VERIFY_BATCH, wire.batch_body([(TASK, HONEST)] * 9))
        assert big.value.code == "too_large" and big.value.status == 413
        after = client.metrics()
    assert after["verdicts_total"] == before["verdicts_total"] and after["queue_depth"] == 0

    async def from_a_stranger():
        transport = httpx.ASGITransport(app=service.app, client=("203.0.113.9", 4242))
        async with httpx.AsyncClient(transport=transport, base_url="http://kz") as stranger:
            return await stranger.post(wire.VERIFY, json={"task": TASK, "candidate": HONEST})

    refused = asyncio.run(from_a_stranger())
    assert refused.status_code == 403 and refused.json()["error"] == "forbidden"
    with VerifierClient(service.url) as client:
        assert client.metrics()["verdicts_total"] == before["verdicts_total"]


def cpu_and_state(pid: int) -> tuple[float, str]:
    """A process's CPU time so far (user + system, seconds) and its state letter (R: running), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), fields[0]


# A candidate worker is inside a verdict of SLOW_TASK once it has spent this much CPU on the batch and still runs:
# such a verdict takes 2-4 s of the worker's CPU (about 2 s of wall time on an idle machine, 12 s under a load of
# 7 on 2 cores; CPU time does not stretch with the load, wall time does), and the worker sleeps between requests.
MID_VERDICT_CPU_S = 0.3


def test_a_worker_killed_mid_batch_costs_only_its_verdict(service):
    pairs = [(Task(SLOW_TASK), Candidate(HONEST + f"\n# copy {i}\n")) for i in range(4)]
    with VerifierClient(service.url) as client:  # both workers started and idle before the batch
        client.verify_many([(Task(TASK), Candidate(HONEST + f"\n# warm-up {i}\n")) for i in range(2)])
    workers = sandbox_worker_pids("candidate")
    assert len(workers) >= 2, workers
    idle_cpu = {pid: cpu_and_state(pid)[0] for pid in workers}
    killed: list[int] = []
    batch_done = threading.Event()

    def kill_one_mid_verification() -> None:
        with VerifierClient(service.url) as watcher:  # the service has handed a pair to its executor
            while watcher.metrics()["in_flight"] == 0 and not batch_done.is_set():
                time.sleep(0.02)
        while not batch_done.is_set():  # and a worker is running it: no fixed sleep, whatever the machine's load
            for pid in workers:
                used, state = cpu_and_state(pid)
                if used - idle_cpu[pid] >= MID_VERDICT_CPU_S and state == "R":
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                    return
            time.sleep(0.01)

    with VerifierClient(service.url) as client:
        before = client.metrics()["verdicts_total"]
        killer = threading.Thread(target=kill_one_mid_verification)
        killer.start()
        try:
            verdicts = client.verify_many(pairs)
        finally:
            batch_done.set()
            killer.join()
        assert killed, "no candidate worker was seen running a verdict"
        statuses = [v.status for v in verdicts]
        assert len(verdicts) == len(pairs)
        assert set(statuses) <= {"accepted", "crashed"} and statuses.count("crashed") == 1, statuses
        crashed = verdicts[statuses.index("crashed")]
        assert "SIGKILL" in crashed.reason
        assert client.metrics()["verdicts_total"] == before + len(pairs)
        assert killed[0] not in sandbox_worker_pids("candidate")  # replaced
        assert client.verify(TASK, HONEST).accepted  # and the pool serves on


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_python_m_core_serve_starts_answers_and_stops_on_a_signal(tmp_path, stop):
    token = tmp_path / "token"
    token.write_text("tok-123\n")
    proc = subprocess.Popen([sys.executable, "-m", "core.serve", "--port", "0", "--device", "cpu", "--workers", "1",
                             "--token-file", str(token), "--log-level", "warning"],
                            cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        assert line.startswith("kernelzero serve: http://127.0.0.1:") and "token required" in line, line
        url = line.split()[2]
        with VerifierClient(url, token="tok-123") as client:
            assert client.health()["ready"] is True
        entry = registry.entry_path(proc.pid)  # registered for core.verify --server auto (core.serve.registry)
        deadline = time.monotonic() + 30
        while not entry.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert json.loads(entry.read_text())["token_required"] is True
        with VerifierClient(url, token="wrong", retries=0) as client, pytest.raises(ServiceError) as refused:
            client.health()
        assert refused.value.code == "unauthorized"
    finally:
        proc.send_signal(stop)
        assert proc.wait(timeout=60) == 0
        assert "draining" in proc.stderr.read()
        assert not registry.entry_path(proc.pid).exists()  # a clean exit removes its entry


def test_a_taken_port_is_one_error_line():
    with running_service(ServiceConfig(device="cpu", workers=1, port=0)) as running:
        port = running.url.rsplit(":", 1)[1]
        start = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "core.serve", "--port", port, "--device", "cpu"], cwd=ROOT, check=False,
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith("error:") and "Address already in use" in done.stderr
    assert time.monotonic() - start < 60


def _verify_cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "core.verify", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_core_verify_judges_on_a_running_service_with_the_same_verdict(service, native, tmp_path):
    # a one-shot `core.verify` pays for starting its own pools (24-30 s on the H200); `--server` sends the pair
    # to a service whose pools are warm, and the verdict is the one the native verifier gives
    import json

    ref, honest = tmp_path / "ref.py", tmp_path / "honest.py"
    ref.write_text(TASK)
    honest.write_text(HONEST)
    batch = tmp_path / "batch"
    batch.mkdir()
    for name, source in (("honest", HONEST), ("wrong", WRONG), ("hacked", HACKED)):
        (batch / f"{name}.py").write_text(TASK)
        (batch / f"{name}_solution.py").write_text(source)
    one = _verify_cli("--server", service.url, "--reference", str(ref), "--candidate", str(honest), "--json")
    assert one.returncode == 0, one.stderr
    verdict = json.loads(one.stdout.strip().splitlines()[-1])
    assert verdict["accepted"] is True and verdict["sandbox"] == f"the service at {service.url}"
    many = _verify_cli("--server", service.url, "--batch", str(batch), "--json")
    assert many.returncode == 0, many.stderr
    rows = {Path(r["pair"]).stem: r for r in map(json.loads, many.stdout.strip().splitlines())}
    assert rows["honest"]["accepted"] and not rows["wrong"]["accepted"] and rows["hacked"]["hack_flags"]
    assert [rows[n]["status"] for n in ("honest", "wrong", "hacked")] == [s[0] for s in native]


def test_core_verify_refuses_a_service_that_judges_otherwise_or_is_not_there(service, tmp_path):
    ref, honest = tmp_path / "ref.py", tmp_path / "honest.py"
    ref.write_text(TASK)
    honest.write_text(HONEST)
    other = _verify_cli("--server", service.url, "--reference", str(ref), "--candidate", str(honest), "--trials", "7")
    assert other.returncode == 2 and "trials" in other.stderr and "unsupported" in other.stderr, other.stderr
    with socket_free_port() as port:
        gone = _verify_cli("--server", f"http://127.0.0.1:{port}", "--reference", str(ref), "--candidate", str(honest))
    assert gone.returncode == 2 and "unreachable" in gone.stderr, gone.stderr


def socket_free_port():
    import contextlib
    import socket

    @contextlib.contextmanager
    def bound():
        with socket.socket() as s:  # bound, never listening: a connection to it is refused
            s.bind(("127.0.0.1", 0))
            yield s.getsockname()[1]

    return bound()

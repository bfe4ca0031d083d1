"""`python -m core.verify` on a warm `kernelzero serve`, end to end: real services (`python -m core.serve --device
cpu`, loopback, a free port) and `core.verify` processes, each run in a runtime directory of its own.

- a running service registers itself, and a call with its settings is judged there (`--server auto`, the default);
- a call with other settings is judged in its process, with one line on stderr saying why and what to run;
- `--keep-warm` starts a service that the next call reuses and that stops after `--idle-exit` seconds idle;
- two such calls at once start one service; a service that cannot start costs one line and the call goes on here;
- a service killed outright leaves its entry behind, and the next reader removes it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.serve import registry
from core.serve.service import sandbox_worker_pids

ROOT = Path(__file__).resolve().parents[1]
REF = ROOT / "tests" / "redteam" / "tasks" / "vector_add.py"
HONEST = ROOT / "tests" / "redteam" / "candidates" / "honest_vector_add.py"
START_S = 120  # a service's start on 2 loaded CPU cores: 4-6 s alone


def env_for(xdg: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KERNELZERO_SERVER", "KERNELZERO_SERVE_TOKEN")}
    return {**env, "XDG_RUNTIME_DIR": str(xdg), "PYTHONPATH": str(ROOT), "KERNELZERO_DISABLE_AUTOLOAD": "1", **extra}


def verify(xdg: Path, *args: str, **extra: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    """One `core.verify` call of the honest pair on the CPU; its process and its verdict."""
    proc = subprocess.run([sys.executable, "-m", "core.verify", "--reference", str(REF), "--candidate", str(HONEST),
                           "--device", "cpu", "--json", *args], cwd=ROOT, env=env_for(xdg, **extra),
                          capture_output=True, text=True, timeout=300, check=False)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    return proc, json.loads(lines[-1]) if lines else None


def private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700)
    return path


def registered(xdg: Path, pid: int, timeout_s: float = START_S) -> registry.Entry:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        directory = xdg / "kernelzero"
        found = [e for e in registry.entries(directory) if e.pid == pid] if directory.exists() else []
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"pid {pid} did not register in {xdg}")


def start_service(xdg: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "core.serve", "--port", "0", "--device", "cpu", "--workers", "1",
                             "--log-level", "warning", *args], cwd=ROOT, env=env_for(xdg), stderr=subprocess.PIPE,
                            text=True)


def gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not registry.is_service(pid):
            return True
        time.sleep(0.1)
    return False


def metrics(url: str) -> dict:
    import httpx

    return httpx.get(url + "/metrics", timeout=30).json()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A running service (CPU, one worker, the default settings) and its runtime directory."""
    xdg = private_dir(tmp_path_factory.mktemp("served") / "xdg")
    proc = start_service(xdg)
    try:
        yield xdg, registered(xdg, proc.pid), proc
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def test_a_running_service_registers_itself_and_a_call_with_its_settings_is_judged_there(served):
    xdg, entry, proc = served
    path = xdg / "kernelzero" / f"{proc.pid}.json"
    assert stat_mode(path) == 0o600 and stat_mode(path.parent) == 0o700
    assert (entry.backend, entry.device, entry.checks, entry.trials, entry.timeout_s, entry.isolate) == \
        ("triton", "cpu", None, 5, 120.0, True)
    assert entry.url.startswith("http://127.0.0.1:") and not entry.token_required
    for how in ({}, {"KERNELZERO_SERVER": "auto"}):
        before = metrics(entry.url)["verdicts_total"]
        call, verdict = verify(xdg, **how)
        assert call.returncode == 0, call.stderr
        assert verdict["accepted"] and verdict["sandbox"] == f"the service at {entry.url}"
        assert "judging in this process" not in call.stderr
        assert metrics(entry.url)["verdicts_total"] == before + 1


def stat_mode(path: Path) -> int:
    return os.stat(path).st_mode & 0o777


def test_a_call_with_other_settings_is_judged_in_its_process_and_says_so_in_one_line(served):
    xdg, entry, _ = served
    before = metrics(entry.url)["verdicts_total"]
    call, verdict = verify(xdg, "--trials", "7")
    assert call.returncode == 0, call.stderr
    assert verdict["accepted"] and verdict["sandbox"] != f"the service at {entry.url}"
    lines = [x for x in call.stderr.splitlines() if x.startswith("python -m core.verify:")]
    assert len(lines) == 1 and "judging in this process" in lines[0], call.stderr
    assert "trials=5 (asked: 7)" in lines[0] and "--keep-warm" in lines[0] and "--trials 7" in lines[0]
    assert metrics(entry.url)["verdicts_total"] == before


def test_keep_warm_starts_a_service_the_next_call_reuses_and_it_stops_when_idle(tmp_path):
    xdg = private_dir(tmp_path / "xdg")
    first, verdict = verify(xdg, "--keep-warm", "10")
    assert first.returncode == 0, first.stderr
    started = re.search(r"started a warm service in [\d.]+ s \(pid (\d+), (http://\S+),", first.stderr)
    assert started, first.stderr
    pid, url = int(started.group(1)), started.group(2)
    assert verdict["accepted"] and verdict["sandbox"] == f"the service at {url}"
    again, verdict = verify(xdg, "--keep-warm", "10")
    assert again.returncode == 0 and again.stderr == "", again.stderr  # found: nothing to say
    assert verdict["accepted"] and verdict["sandbox"] == f"the service at {url}"
    last_call = time.monotonic()
    entry = registered(xdg, pid, timeout_s=1)
    assert entry.idle_exit_s == 10 and sandbox_worker_pids("candidate", parent_pid=pid)
    assert gone(pid, 60), "the kept-warm service is still running"
    assert time.monotonic() - last_call >= 8  # not before --idle-exit's seconds without a request
    assert not (xdg / "kernelzero" / f"{pid}.json").exists()  # it removed its own entry
    log = Path(entry.log).read_text()
    assert "no request for 10 s (--idle-exit); stopping" in log and "draining" in log
    deadline = time.monotonic() + 30
    while sandbox_worker_pids("candidate", parent_pid=pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sandbox_worker_pids("candidate", parent_pid=pid) == []  # and its workers went with it


def test_two_keep_warm_calls_at_once_start_one_service(tmp_path):
    xdg = private_dir(tmp_path / "xdg")
    argv = [sys.executable, "-m", "core.verify", "--reference", str(REF), "--candidate", str(HONEST), "--device",
            "cpu", "--json", "--keep-warm", "30"]
    calls = [subprocess.Popen(argv, cwd=ROOT, env=env_for(xdg), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [c.communicate(timeout=300) for c in calls]
    assert [c.returncode for c in calls] == [0, 0], outs
    sandboxes = {json.loads(out.splitlines()[-1])["sandbox"] for out, _ in outs}
    assert len(sandboxes) == 1 and next(iter(sandboxes)).startswith("the service at http://127.0.0.1:")
    assert sum("started a warm service" in err for _, err in outs) == 1, [err for _, err in outs]
    services = registry.entries(xdg / "kernelzero")
    assert len(services) == 1
    os.kill(services[0].pid, signal.SIGTERM)
    assert gone(services[0].pid, 60)


def test_a_kept_warm_service_that_cannot_start_costs_one_line_and_the_call_goes_on_here(tmp_path):
    xdg = private_dir(tmp_path / "xdg")
    call = subprocess.run([sys.executable, "-m", "core.verify", "--reference", str(REF), "--candidate", str(HONEST),
                           "--device", "cuda", "--keep-warm", "30"], cwd=ROOT,
                          env=env_for(xdg, CUDA_VISIBLE_DEVICES=""), capture_output=True, text=True, timeout=300,
                          check=False)
    lines = call.stderr.strip().splitlines()
    assert lines[0].startswith("python -m core.verify: --keep-warm: the service it started exited with status 2 "
                               "before it answered: error: device=cuda but no GPU is visible"), call.stderr
    assert lines[0].endswith("; judging in this process")
    assert call.returncode == 2 and "needs a GPU" in lines[-1]  # in this process, as without --keep-warm


def test_a_service_killed_outright_leaves_an_entry_the_next_reader_removes(tmp_path):
    xdg = private_dir(tmp_path / "xdg")
    proc = start_service(xdg)
    try:
        registered(xdg, proc.pid)
    finally:
        proc.kill()
        proc.wait()
    path = xdg / "kernelzero" / f"{proc.pid}.json"
    assert path.exists()
    call, verdict = verify(xdg, "--server", "auto")  # finds no live service: judged here
    assert call.returncode == 0 and verdict["accepted"] and "judging in this process" in call.stderr
    assert not path.exists()

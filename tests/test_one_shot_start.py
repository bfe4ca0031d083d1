"""A one-shot ``python -m core.verify``: what is off its critical path stays off it (ordering, not timings)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import pytest

REPO = Path(__file__).resolve().parent.parent
PAIR = ["--reference", str(REPO / "tests/redteam/tasks/vector_add.py"),
        "--candidate", str(REPO / "tests/redteam/candidates/honest_vector_add.py"), "--backend", "triton"]


def run_python(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))}
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, env=env, text=True, capture_output=True,
                          timeout=timeout, check=False)


def test_core_verify_starts_its_workers_before_the_judge_imports_torch():
    # the workers' start-up (importing torch themselves, 2.6 s on the H100) overlaps the judge's own imports
    code = """
import sys
import core.verification.sandbox as sandbox

class Spawned(Exception):
    pass

def start(worker):
    raise Spawned(f"{worker.role} spawned with torch imported: {'torch' in sys.modules}")

sandbox.Worker.start = start
import core.verify
try:
    core.verify.main(sys.argv[1:] + ["--device", "cpu"])
except Spawned as exc:
    print(exc)
"""
    out = run_python(code, *PAIR)
    assert "spawned with torch imported: False" in out.stdout, out.stdout + out.stderr


def test_on_cuda_the_baseline_pool_starts_beside_the_others_and_closes_when_torch_disagrees():
    # the baseline workers spawned after the judge imported torch, 3 s after the others on the H100, and their
    # torch.compile warm-up was the one-shot's critical path; torch still has the last word on the device
    code = """
import sys
import core.api.devices as devices
import core.verification.sandbox as sandbox

devices.cuda_visible = lambda: "torch" not in sys.modules  # the driver sees a GPU, torch (too new for it) does not
events = []

def role(worker):
    return "baseline" if worker.extra_env.get("KERNELZERO_WARM_COMPILE") == "1" else worker.role

def start(worker):
    events.append(f"{role(worker)} {worker.device} spawned, torch imported: {'torch' in sys.modules}")
    return worker

def close(worker, grace_s=2.0):
    events.append(f"{role(worker)} closed")

sandbox.Worker.start, sandbox.Worker.close = start, close
from core.verification.judge import Verifier, VerifierConfigError
try:
    Verifier(device="cuda", workers=1, warm_up=False, checks=["static", "performance"])
except VerifierConfigError as exc:
    events.append(f"refused: {exc}")
print("\\n".join(events))
"""
    out = run_python(code)
    lines = out.stdout.splitlines()
    spawned = {f"{role} cuda spawned, torch imported: False" for role in ("candidate", "reference", "baseline")}
    assert spawned <= set(lines), out.stdout + out.stderr
    assert {"candidate closed", "reference closed", "baseline closed"} <= set(lines)
    assert lines[-1].startswith("refused: backend 'triton' on device 'cuda' needs a GPU")


class FakePool:
    made: ClassVar[list[str]] = []

    def __init__(self, role, backend, device, size=1, **kwargs):
        self.role, self.size = role, size
        FakePool.made.append(f"{role} pool of {size}")

    def close(self):
        pass


@pytest.mark.parametrize("workers, reference_workers, pools_first", [(1, 1, True), (2, 2, True), (2, 1, False)])
def test_the_pools_start_before_compare_on_device_is_resolved_unless_it_sizes_them(
        monkeypatch, workers, reference_workers, pools_first):
    from core.verification import judge

    FakePool.made = []

    def resolve(wanted, device, compile_only):
        FakePool.made.append("compare_on_device resolved")
        return True  # as on a CUDA host with IPC: each verification holds a keeper

    monkeypatch.setattr(judge, "WorkerPool", FakePool)
    monkeypatch.setattr(judge, "resolve_compare_on_device", resolve)
    verifier = judge.Verifier(device="cpu", workers=workers, reference_workers=reference_workers, warm_up=False,
                              checks=["static"])
    verifier.close()
    order = FakePool.made
    assert (order.index("compare_on_device resolved") > order.index("reference pool of 2" if workers == 2 else
                                                                    "reference pool of 1")) == pools_first
    assert f"reference pool of {max(workers, reference_workers)}" in order  # a keeper for every verification
    assert verifier.compare_on_device


def test_a_compare_on_device_that_cannot_be_had_closes_the_pools_it_started(monkeypatch):
    from core.verification import judge

    closed = []

    class Pool(FakePool):
        def close(self):
            closed.append(self.role)

    def refuse(wanted, device, compile_only):
        raise judge.VerifierConfigError("compare_on_device=True: no CUDA device")

    monkeypatch.setattr(judge, "WorkerPool", Pool)
    monkeypatch.setattr(judge, "resolve_compare_on_device", refuse)
    with pytest.raises(judge.VerifierConfigError):
        judge.Verifier(device="cpu", workers=1, warm_up=False, checks=["static"])
    assert sorted(closed) == ["candidate", "reference"]


def test_core_verify_leaves_without_the_interpreters_teardown_but_runs_its_exit_handlers():
    # the teardown of torch and Triton came after the verdict was out (0.5 s on 2 CPU cores); what atexit holds
    # (the lifeline that kills the workers' groups) still runs, and the output is complete
    code = """
import atexit, runpy, sys

class TornDown:
    def __del__(self):
        print("torn down", flush=True)

sys.modules["kz_teardown_probe"] = TornDown()
atexit.register(lambda: print("exit handlers ran"))
print("before", end="")
sys.argv = ["core.verify", *sys.argv[1:]]
runpy.run_module("core.verify", run_name="__main__")
"""
    out = run_python(code, "--reference", "no-such-file.py", "--candidate", "no-such-file.py")
    assert out.returncode == 2 and "no-such-file.py does not exist" in out.stderr
    assert out.stdout.startswith("before") and "exit handlers ran" in out.stdout
    assert "torn down" not in out.stdout


def test_a_one_shot_verdict_tells_when_its_workers_were_spawned_and_when_it_began():
    import json

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))}
    proc = subprocess.run([sys.executable, "-m", "core.verify", *PAIR, "--device", "cpu", "--json"], cwd=REPO,
                          env=env, text=True, capture_output=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1])
    assert out["accepted"], out["reason"]
    workers = [w for role in ("candidate", "reference") for w in out["start_up"][role]]
    assert workers and all(0 <= w["spawned_s"] < out["verdict_began_s"] for w in workers)


def test_the_benchmark_splits_the_performance_stage_into_the_candidates_and_the_baselines_phases():
    from benchmarks.one_shot_verify import performance_phases, where_it_went

    verdict = {"checks": {"performance": {"passed": True, "data": {
        "phases_s": {"prepare": 0.2, "candidate": 0.5},
        "baseline": {"shared": False, "phases_s": {"prepare": 0.4, "compile_build": 4.0}}}}}}
    phases = performance_phases(verdict)
    assert phases == {"candidate": {"prepare": 0.2, "candidate": 0.5},
                      "baseline": {"prepare": 0.4, "compile_build": 4.0}, "shared": False}
    assert performance_phases({"checks": {"static": {"passed": True}}}) is None
    line = where_it_went({"start_up": {"candidate": [{"spawned_s": 0.4, "ready_s": 3.0, "import_torch": 1.1}]},
                          "verdict_began_s": 2.5, "stage_s": {"performance": 6.2}, "performance_s": phases})
    assert "spawned at 0.4 s" in line and "verdict began at 2.5 s" in line and "compile_build" in line


def test_the_benchmark_says_what_the_race_analysis_took_in_its_cpu_worker():
    # the first served call of a task waited 5.9-7.2 s for interp_races on the H100; its own seconds say
    # whether that was the analysis or a wait before it
    from benchmarks.one_shot_verify import race_analysis, where_it_went

    verdict = {"checks": {"interp_races": {"passed": True, "data": {
        "seconds": 0.4, "memory_mb": 8192, "task_mib": 0.1, "calls": 1, "findings": []}}}}
    got = race_analysis(verdict)
    assert got == {"seconds": 0.4, "memory_mb": 8192, "task_mib": 0.1, "calls": 1}
    assert race_analysis({"checks": {"static": {"passed": True}}}) is None
    line = where_it_went({"stage_s": {"interp_races": 7.2}, "interp_races": got})
    assert "interp_races in its CPU worker" in line and "'seconds': 0.4" in line

"""core.verification.baselines: a task's reference is measured once and shared by its verifications."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.verification.baselines import BaselineCache


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


# ----------------------------------------------------------------- the judge's side (core.verify)


class _FakeWorker:
    """Answers the judge's ``baseline`` requests as a reference worker would."""

    def __init__(self, fail: bool = False):
        self.requests: list[dict] = []
        self.fail = fail

    def request(self, message, timeout_s):
        self.requests.append(message)
        if self.fail:
            return {"ok": False, "error": "RuntimeError: CUDA error: out of memory"}
        return {"ok": True, "data": {"eager_ms": 2.0, "compile_ms": None, "measured_in": "reference worker"}}


class _FakePool:
    def __init__(self, worker):
        self.worker, self.released = worker, []

    def acquire(self):
        return self.worker

    def release(self, worker, discard=False):
        self.released.append(discard)


class _FakeCheck:
    name = "performance"

    def __init__(self, compile_baseline=False):
        self.compile_baseline = compile_baseline

    def baseline_key(self):
        return (self.compile_baseline,)


def _judge(worker):
    import threading

    from core.verify import Verifier

    judge = Verifier.__new__(Verifier)  # the judge's state only: no worker processes
    judge.baselines, judge.baseline_pool = BaselineCache(), _FakePool(worker)
    judge._baseline_pool_lock, judge._baselines_closed = threading.Lock(), False
    judge.device_lock, judge.gpu_wait_s = None, 1.0
    return judge


def _evidence(source):
    from core.task import Candidate, Task
    from core.verification.evidence import Evidence

    return Evidence(task=Task(source=source), candidate=Candidate(source="x = 1"), backend="cuda", device="cuda")


def test_the_judge_asks_a_baseline_worker_once_per_task_and_shares_the_answer():
    from core.verification.judge import _Budget

    worker = _FakeWorker()
    judge = _judge(worker)
    check, budget = _FakeCheck(), _Budget(60)
    first = judge._baseline(check, {"compare_compile": False}, _evidence("task A"), budget)
    again = judge._baseline(check, {"compare_compile": False}, _evidence("task A"), budget)
    other = judge._baseline(check, {"compare_compile": False}, _evidence("task B"), budget)
    assert [r["source"] for r in worker.requests] == ["task A", "task B"]
    assert all(r["op"] == "baseline" and r["check"] == "performance" for r in worker.requests)
    assert (first["shared"], again["shared"], other["shared"]) == (False, True, False)
    assert first["eager_ms"] == again["eager_ms"] == 2.0
    assert judge.baseline_pool.released == [False, False]  # the baseline worker serves on


def test_a_baseline_worker_that_timed_torch_compile_serves_on_and_a_failure_is_reported_not_kept():
    # torch.compile used to leave the verification's keeper to be replaced, and the next verification
    # waited for a fresh keeper's start-up; baselines now have workers of their own, which serve on
    from core.verification.judge import _Budget

    judge = _judge(_FakeWorker())
    judge._baseline(_FakeCheck(compile_baseline=True), {}, _evidence("task A"), _Budget(60))
    assert judge.baseline_pool.released == [False]

    failing = _judge(_FakeWorker(fail=True))
    result = failing._baseline(_FakeCheck(), {}, _evidence("task A"), _Budget(60))
    assert "could not be timed" in result["error"] and "out of memory" in result["error"]
    # the worker answered (its error was caught there): it serves on, and the next verification asks again
    assert len(failing.baselines) == 0 and failing.baseline_pool.released == [False]


def test_a_baseline_worker_that_died_is_replaced():
    from core.verification.judge import _Budget
    from core.verification.sandbox import WorkerFailure

    class Dying(_FakeWorker):
        def request(self, message, timeout_s):
            raise WorkerFailure("crashed", "worker died (SIGKILL)")

    judge = _judge(Dying())
    assert "could not be timed" in judge._baseline(_FakeCheck(), {}, _evidence("task A"), _Budget(60))["error"]
    assert judge.baseline_pool.released == [True]


def test_baselines_have_a_pool_of_their_own_that_recycles_its_workers(monkeypatch):
    # a real Verifier on the CPU: no per-task baseline applies there, so the pool starts on first use
    from core.verification.gpusharing import BASELINES_PER_WORKER
    from core.verify import Verifier

    with Verifier(backend="triton", device="cpu", workers=2) as v:
        assert v.baseline_pool is None
        pool = v._baseline_workers()
        assert pool is v._baseline_workers() and pool.role == "reference" and len(pool._all) == 1  # half of 2
        assert pool.max_jobs == 2 * BASELINES_PER_WORKER  # a set-up and a timing request per baseline
        assert pool is not v.reference_pool
    assert v.baseline_pool is None and pool.closed
    with pytest.raises(RuntimeError, match="closed"):  # a baseline thread outliving the verifier starts no pool
        v._baseline_workers()


def test_a_baseline_starts_beside_the_candidates_later_stages_where_the_footprint_makes_room():
    # the baseline's torch.compile build (4-5 s of a verdict on the H200) followed the candidate's own timing;
    # now a small task's baseline runs whole while the candidate's other stages do, and a larger task's is set
    # up then and timed after the candidate's timing, where its estimate makes room (gpumemory.estimate)
    import threading
    from types import SimpleNamespace

    from core.verification.gpumemory import EARLY_BASELINE_MAX_BYTES, Footprint
    from core.verification.observations import start_baselines
    from plugins.verifiers.performance import PerformanceCheck

    asked, release = [], threading.Event()

    def baseline(check, config, gate=None):
        asked.append((check.name, config["compare_compile"], gate is not None))
        release.wait(10)
        return {"eager_ms": 1.0, "shared": False}  # its own verification measured it: not shared

    def verification(timing_bytes, early_bytes):
        parts = {"timing": timing_bytes, "early_baseline": early_bytes}
        footprints = {"t": Footprint(timing_bytes, parts)} if timing_bytes is not None else {}
        return SimpleNamespace(verifier=SimpleNamespace(footprints=footprints), task=SimpleNamespace(id="t"),
                               checks=[PerformanceCheck(), _FakeCheck()], verdict=SimpleNamespace(checks={}),
                               baseline=baseline)

    started = start_baselines(verification(64 << 20, 64 << 20))
    assert list(started) == ["performance"] and started["performance"].is_alive()  # beside what follows
    assert started["performance"].result is None and started["performance"].gate is None  # measured whole
    release.set()
    started["performance"].join(10)
    assert asked == [("performance", True, False)]
    assert started["performance"].result == {"eager_ms": 1.0, "shared": False}
    large = start_baselines(verification(EARLY_BASELINE_MAX_BYTES + 1, 12 << 30))
    assert large["performance"].gate is not None  # set up now, timed after the candidate's timing
    large["performance"].join(10)
    assert asked[-1] == ("performance", True, True)
    assert start_baselines(verification(EARLY_BASELINE_MAX_BYTES + 1, 0)) == {}  # no room: after the timing
    assert start_baselines(verification(None, None)) == {}  # footprint unknown: as before


class _PreparingCheck(_FakeCheck):
    def baseline_prepare(self, task, init_seed):  # set up while the GPU is shared (the performance check's)
        return {}


def test_a_baseline_set_up_early_is_timed_when_its_gate_opens_and_dropped_when_it_is_cancelled():
    from core.verification.judge import _Budget
    from core.verification.observations import TimingGate

    for cancel in (False, True):
        worker = _FakeWorker()
        judge, gate, out = _judge(worker), TimingGate(), {}
        thread = threading.Thread(target=lambda: out.update(judge._baseline(
            _PreparingCheck(), {}, _evidence("task A"), _Budget(60), gate=gate)))
        thread.start()
        time.sleep(0.3)
        assert [r.get("phase") for r in worker.requests] == ["prepare"]  # set up; not timed before the gate opens
        gate.cancel() if cancel else gate.open()
        thread.join(10)
        ops = [(r["op"], r.get("phase")) for r in worker.requests]
        if cancel:  # the worker drops what it set up, serves on, and nothing is kept for the task
            assert ops == [("baseline", "prepare"), ("forget", None)]
            assert "ended before its baseline was timed" in out["error"] and len(judge.baselines) == 0
        else:
            assert ops == [("baseline", "prepare"), ("baseline", None)] and out["eager_ms"] == 2.0
        assert judge.baseline_pool.released == [False]


def test_a_one_shot_verdict_starts_a_small_tasks_baseline_with_its_gpu_stages_and_a_large_ones_after_its_trials():
    # one verdict's wall time: the baseline's torch.compile build (seconds) beside the reference and the trials,
    # not after them; a large task's set-up still waits for the trials (its memory is not in those phases)
    from types import SimpleNamespace

    import pytest

    from core.verification.gpumemory import EARLY_BASELINE_MAX_BYTES, Footprint
    from core.verification.judge import Verifier, VerifierConfigError
    from core.verification.observations import start_baselines
    from plugins.verifiers.performance import PerformanceCheck

    def verification(timing_bytes):
        parts = {"timing": timing_bytes, "early_baseline": timing_bytes}
        return SimpleNamespace(verifier=SimpleNamespace(footprints={"t": Footprint(timing_bytes, parts)}),
                               task=SimpleNamespace(id="t"), checks=[PerformanceCheck()],
                               verdict=SimpleNamespace(checks={}), baseline=lambda check, config, gate=None: {})

    small = start_baselines(verification(64 << 20), whole_only=True)
    assert list(small) == ["performance"] and small["performance"].gate is None
    small["performance"].join(10)
    assert start_baselines(verification(EARLY_BASELINE_MAX_BYTES + 1), whole_only=True) == {}
    with pytest.raises(VerifierConfigError, match="baselines_early"):
        Verifier(device="cpu", baselines_early="later", warm_up=False)


def test_core_verify_of_one_pair_asks_for_the_early_baseline(monkeypatch, tmp_path):
    import core.verify as cli

    made = {}

    class _Stop(Exception):
        pass

    def fake_verifier(**kwargs):
        made.update(kwargs)
        raise _Stop

    monkeypatch.setattr(cli, "Verifier", fake_verifier)
    ref, cand = tmp_path / "ref.py", tmp_path / "cand.py"
    ref.write_text("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
                   "def get_inputs():\n    return [torch.ones(4)]\ndef get_init_inputs():\n    return []\n")
    cand.write_text("import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n")
    try:
        cli.main(["--reference", str(ref), "--candidate", str(cand), "--device", "cpu"])
    except _Stop:
        pass
    assert made["baselines_early"] == "start"


def test_a_baseline_started_with_the_gpu_stages_still_leaves_the_candidate_its_extra_observations(monkeypatch):
    # baselines_early="start" began the baseline before the reference: once the trials pass, the probes,
    # determinism and timing must still run (only the baseline is not started twice)
    from types import SimpleNamespace

    from core.verification import pipeline
    from core.verification.pipeline import Verification

    v = Verification.__new__(Verification)
    early = {"performance": object()}
    v.evidence = SimpleNamespace(compiled=True, config={}, load_sandbox=[])
    v.verdict = SimpleNamespace(hack_flags=[])
    v.checks, v.early_baselines = [], early
    ran = []
    monkeypatch.setattr(v, "load", lambda: True, raising=False)
    monkeypatch.setattr(v, "trials", lambda: [], raising=False)
    monkeypatch.setattr(v, "evaluate", lambda checks, stop_at_first=True: True, raising=False)
    monkeypatch.setattr(v, "extra_observations", lambda: ran.append("extra") or True, raising=False)
    monkeypatch.setattr(v, "finish", lambda: None, raising=False)
    monkeypatch.setattr(pipeline, "release_unread", lambda verification: None)
    monkeypatch.setattr(pipeline, "start_baselines", lambda verification: ran.append("started again") or {})
    v.run_candidate()
    assert ran == ["extra"] and v.early_baselines is early


def test_no_baseline_is_set_up_beside_a_verification_whose_estimate_is_over_the_memory_admitted():
    # H100, 2026-12-06: 26_GELU_ (92 GiB estimated, 71 GiB admitted) held the device alone, and a cold torch.compile
    # set-up beside it (12 GiB for 8 s) ran the keeper's comparison out of memory; the set-up's room was measured
    # against the verification's own peak, not the device's
    from types import SimpleNamespace

    from core.verification.gpumemory import EARLY_BASELINE_MAX_BYTES, Footprint, MemoryAdmission
    from core.verification.observations import start_baselines
    from plugins.verifiers.performance import PerformanceCheck

    g = 1 << 30

    def verification(estimate_bytes, capacity_bytes):
        timing = EARLY_BASELINE_MAX_BYTES + 1
        fp = Footprint(estimate_bytes, {"timing": timing, "early_baseline": 12 * g})
        admission = MemoryAdmission.for_device(capacity_bytes) if capacity_bytes else None
        return SimpleNamespace(verifier=SimpleNamespace(footprints={"t": fp}, memory_admission=admission),
                               task=SimpleNamespace(id="t"), checks=[PerformanceCheck()],
                               verdict=SimpleNamespace(checks={}, gpu_memory={"alone": True}),
                               baseline=lambda check, config, gate=None: {"eager_ms": 1.0})

    over = verification(92 * g, 71 * g)
    assert start_baselines(over) == {}
    assert over.verdict.gpu_memory["alone"] is True  # what the reservation recorded is kept
    assert "over the memory admitted" in over.verdict.gpu_memory["early_baseline"]
    for within in (verification(92 * g, 125 * g), verification(92 * g, None)):  # room on the device, or no admission
        started = start_baselines(within)
        assert list(started) == ["performance"] and "early_baseline" not in within.verdict.gpu_memory
        started["performance"].cancel()
        started["performance"].join(10)

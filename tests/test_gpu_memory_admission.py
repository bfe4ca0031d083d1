"""GPU memory as a scheduled resource (core.verification.gpumemory), on the CPU against a fake device budget.

On the H200 at KernelBench's real sizes, 28 of 45 level-1 verdicts were lost to CUDA out-of-memory
(the reference keeping its outputs, drawing inputs, the candidate), and killing an evaluation left
141 GiB allocated. Here: verifications whose footprints do not fit together never overlap their GPU
stages; one larger than the device runs alone; an out-of-memory anywhere is retried alone and, if it
persists, is an ``error`` saying the task does not fit, never ``rejected``; a killed judge leaves no worker.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from core.evaluation.report import TaskResult, summarise_group
from core.task import Candidate, Task
from core.verification.gpumemory import (
    EARLY_BASELINE_MAX_BYTES,
    EXPORT_BATCH_BYTES,
    MemoryAdmission,
    estimate,
    reference_runs_held,
    runs_per_request,
)
from core.verify import Verifier

REPO = Path(__file__).resolve().parents[1]
HERE = Path(__file__).parent / "redteam"
TASK = Task.from_file(HERE / "tasks" / "vector_add.py")
HONEST = Candidate.from_file(HERE / "candidates" / "honest_vector_add.py")

# --------------------------------------------------------------------------- the admission itself


def _overlaps(journal):
    spans = sorted((r["got"], r["done"], r) for r in journal)
    return [(a[2], b[2]) for i, a in enumerate(spans) for b in spans[i + 1:] if b[0] < a[1]]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(capacity=st.integers(100, 1000), sizes=st.lists(st.integers(1, 1500), min_size=2, max_size=6))
def test_reservations_held_at_once_never_exceed_the_budget_and_large_ones_run_alone(tmp_path_factory, capacity, sizes):
    admission = MemoryAdmission("cuda-fake", capacity, tmp_path_factory.mktemp("ledger"), poll_s=0.001)
    live: list[tuple[int, bool]] = []
    guard, seen = threading.Lock(), []

    def one(n: int) -> None:
        with admission.reserve(n, time.monotonic() + 60, label=str(n)) as r:
            with guard:
                live.append((n, r.alone))
                seen.append(list(live))
            time.sleep(0.005)
            with guard:
                live.remove((n, r.alone))

    threads = [threading.Thread(target=one, args=(n,)) for n in sizes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for held in seen:
        assert sum(n for n, _ in held) <= capacity or len(held) == 1
        assert not any(alone for _, alone in held) or len(held) == 1
    assert [r["alone"] for r in admission.journal] == [r["bytes"] > capacity for r in admission.journal]
    assert admission.held() == {}


def _queue_behind(admission, held_bytes, waiting, then):
    """Hold ``held_bytes``; queue ``waiting`` (bytes, alone) behind it; then ``then`` (bytes): when each got in."""
    got, release = {}, threading.Event()

    def ask(name, n, alone=False):
        with admission.reserve(n, time.monotonic() + 30, label=name, alone=alone):
            got[name] = time.monotonic()
            if name == "held":
                release.wait(10)

    def queued(name):
        return lambda: any(q["label"] == name for q in json.loads(admission.path.read_text())["queue"])

    first = threading.Thread(target=ask, args=("held", held_bytes))
    first.start()
    _wait_for(lambda: "held" in got)
    threads = [threading.Thread(target=ask, args=("waiting", *waiting))]
    threads[0].start()
    _wait_for(queued("waiting"))
    threads.append(threading.Thread(target=ask, args=("then", then)))
    threads[1].start()
    time.sleep(0.3)  # long enough for "then" to start if it may
    started_early = "then" in got
    release.set()
    for t in [first, *threads]:
        t.join(20)
    return started_early, got


def _wait_for(condition, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_a_small_request_backfills_beside_a_large_one_waiting_for_memory(tmp_path):
    # KernelBench level 1: a 98-GiB task at the head of the queue held every small one behind it
    admission = MemoryAdmission("cuda-fake", 100, tmp_path, poll_s=0.005)
    early, got = _queue_behind(admission, 60, (60, False), 30)
    assert early and got["then"] < got["waiting"]  # 30 fits now and beside the waiting 60
    assert admission.held() == {}


@pytest.mark.parametrize(("waiting", "then", "why"), [
    ((10, True), 10, "a request for the device alone is never overtaken"),
    ((60, False), 50, "it could not be held beside the one it would overtake"),
])
def test_no_backfill_past_a_request_it_would_keep_waiting(tmp_path, waiting, then, why):
    admission = MemoryAdmission("cuda-fake", 100, tmp_path, poll_s=0.005)
    early, got = _queue_behind(admission, 60, waiting, then)
    assert not early and got["waiting"] <= got["then"], why


def test_after_the_wait_a_backfill_must_leave_room_for_the_waiting_request(tmp_path, monkeypatch):
    # Once a request has waited BACKFILL_WAIT_S its bytes are reserved: a later one starts only where it fits
    # beside it and every reservation granted since. Before, nothing started past it any more, and on the H100
    # (2026-12-06) level 1's large tasks, each waiting for the one before, let one verification run at a time.
    from core.verification import gpumemory

    monkeypatch.setattr(gpumemory, "BACKFILL_WAIT_S", 0.0)
    admission = MemoryAdmission("cuda-fake", 100, tmp_path, poll_s=0.005)
    got, release = {}, {name: threading.Event() for name in ("blocker", "waiting", "first", "second")}

    def ask(name, n):
        with admission.reserve(n, time.monotonic() + 30, label=name):
            got[name] = time.monotonic()
            release[name].wait(10)

    def start(name, n):
        thread = threading.Thread(target=ask, args=(name, n))
        thread.start()
        return thread

    threads = [start("blocker", 20)]
    _wait_for(lambda: "blocker" in got)
    threads.append(start("waiting", 90))  # waits for the blocker
    _wait_for(lambda: any(q["label"] == "waiting" for q in json.loads(admission.path.read_text())["queue"]))
    threads.append(start("first", 8))  # fits now, and beside the waiting 90: starts
    _wait_for(lambda: "first" in got)
    threads.append(start("second", 8))  # fits now (36 held), but 90 + 8 + 8 > 100 would delay the waiting one
    time.sleep(0.3)
    assert "second" not in got and "waiting" not in got
    release["blocker"].set()
    _wait_for(lambda: "waiting" in got)  # the blocker's end is all it waited for
    assert "second" not in got
    for name in ("first", "waiting"):
        release[name].set()
    _wait_for(lambda: "second" in got)
    release["second"].set()
    for t in threads:
        t.join(10)
    assert got["blocker"] < got["first"] < got["waiting"] < got["second"]
    assert admission.held() == {}


def test_a_dead_process_reservation_is_dropped(tmp_path):
    admission = MemoryAdmission("cuda-fake", 100, tmp_path)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    admission.path.write_text(json.dumps({"held": {"x": {"token": "x", "pid": int(dead.stdout), "bytes": 100,
                                                          "alone": True}}, "queue": []}))
    with admission.reserve(60, time.monotonic() + 5) as r:
        assert not r.alone


def test_a_reservation_waits_past_its_deadline_as_a_timeout(tmp_path):
    from core.verification.devicelock import DeviceLockTimeout

    admission = MemoryAdmission("cuda-fake", 100, tmp_path)
    with admission.reserve(80):
        with pytest.raises(DeviceLockTimeout):
            with admission.reserve(80, time.monotonic() + 0.1):
                pass
    assert admission.held() == {}


@settings(max_examples=30, deadline=None)
@given(i=st.integers(0, 2**34), w=st.integers(0, 2**32), o=st.integers(0, 2**34), trials=st.integers(5, 10))
def test_the_estimate_counts_every_held_copy_of_the_outputs(i, w, o, trials):
    measured = {"inputs": i, "weights": w, "outputs": o, "written": o, "elements": (i + o) // 4}
    fp = estimate(measured, trials=trials, probes=3, orders=2, float64_max_elements=1 << 25)
    # the keeper's reference outputs (trials + probes) and adopted ones (trials + orders + repeat + probes),
    # the candidate's exports, the weights in both workers
    # (large outputs: only those under the keeper's resident budget, the one in use and one computed again)
    assert fp.parts["reference_outputs"] == min(trials + 3, reference_runs_held(o)) * o
    assert fp.parts["reference_outputs"] <= max((trials + 3) * o if o < 1 << 28 else 0, 2 * o + (2 << 30))
    assert fp.parts["adopted_outputs"] == (trials + 2 + 1 + 3) * o
    assert fp.bytes == max(fp.phases.values())  # the largest phase: what the workers hold at once
    # the trials: both workers' weights, the keeper's outputs and a comparison (its reruns: two outputs, one
    # run's inputs), the candidate's run (one run's inputs) and exports
    assert fp.phases["trials"] >= 2 * w + fp.parts["reference_outputs"] + fp.parts["adopted_outputs"] + 2 * o + 2 * i \
        + fp.parts["exported_outputs"]
    assert (fp.parts["float64_truth"] > 0) == (0 < (i + o) // 4 <= 1 << 25 and (w + i + o) > 0)
    # a request's exports wait on the device until adopted: large outputs go a few runs per request
    assert fp.parts["exported_outputs"] <= max(EXPORT_BATCH_BYTES, o)
    assert fp.parts["exported_outputs"] == min(max(trials, 2 + 1 + 3), runs_per_request(o)) * o
    # the timed stage: the model, two draws of inputs, its output, a checked run's reference and comparison
    assert fp.parts["timing"] >= w + 2 * i + 4 * o
    # a small task's baseline may be timed beside it, in a worker of its own (observations.start_baselines); a
    # larger one's set-up only where it does not raise the peak
    if fp.parts["timing"] <= EARLY_BASELINE_MAX_BYTES:
        assert fp.parts["early_baseline"] == fp.parts["timing"] and fp.phases["baseline"] == 0
    else:
        assert fp.parts["early_baseline"] in (0, w + i + o)
        assert fp.phases["timing"] >= w + fp.parts["timing"] + (w + i if fp.parts["early_baseline"] else 0)


def test_a_large_tasks_baseline_is_set_up_early_only_where_the_peak_has_room():
    g = 1 << 30
    relu = estimate({"inputs": 6 * g, "weights": 0, "outputs": 6 * g, "written": 6 * g, "elements": 3 * g},
                    trials=5, probes=3, released_when_judged=True)
    # the trials hold five outputs: the extra runs hold three, so the baseline's set-up (an input and an
    # output while torch.compile builds) fits beside them
    assert relu.bytes == relu.phases["trials"] and relu.parts["early_baseline"] == 12 * g
    assert relu.phases["extra"] <= relu.bytes and relu.phases["timing"] < relu.bytes
    deep = estimate({"inputs": 6 * g, "weights": 0, "outputs": 6 * g, "written": 60 * g, "elements": 3 * g},
                    trials=5, probes=3, released_when_judged=True)
    # 54 GiB of intermediates: the set-up would raise the peak, so the baseline follows the candidate's timing
    assert deep.parts["early_baseline"] == 0 and deep.phases["baseline"] > 0


def test_a_task_whose_forward_takes_plain_values_beside_tensors_is_measured():
    # KernelBench's 5_Matrix_scalar_multiplication: get_inputs() -> [A, s]; its footprint was "not measured on
    # meta" (forward() missing 's'), so it got an even share of the device, and ran out of memory on the H100
    from core.evaluation.resize import _load, measure

    module = _load(textwrap.dedent("""
        import torch, torch.nn as nn
        class Model(nn.Module):
            def forward(self, A, s):
                return A * s
        def get_inputs():
            return [torch.randn(1024, 512), 3.14]
        def get_init_inputs():
            return []
    """))
    got = measure(module)
    assert got["inputs"] == got["outputs"] == 1024 * 512 * 4 and got["elements"] == 2 * 1024 * 512


def test_the_task_is_measured_on_meta_even_when_its_inputs_are_built_with_cuda():
    from core.evaluation.resize import _load, measure

    module = _load(textwrap.dedent("""
        import torch, torch.nn as nn
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.w = nn.Parameter(torch.ones(1000, 1000))
            def forward(self, x):
                return x @ self.w
        def get_inputs():
            return [torch.randn(4096, 1000).cuda()]
        def get_init_inputs():
            return []
    """))
    got = measure(module)
    assert got["inputs"] == 4096 * 1000 * 4 and got["weights"] == 1000 * 1000 * 4
    assert got["outputs"] == 4096 * 1000 * 4 and got["written"] >= got["outputs"]


# --------------------------------------------------------------------------- verifications against a fake budget


@pytest.fixture(scope="module")
def verifier(tmp_path_factory):
    admission = MemoryAdmission("cuda-fake-verifier", 1 << 40, tmp_path_factory.mktemp("ledger"), poll_s=0.005)
    with Verifier(backend="triton", device="cpu", workers=2, reference_workers=2, timeout_s=120,
                  checks=["correctness"], compare_on_device=True, isolate=False,
                  memory_admission=admission) as v:
        yield v


def _budget(verifier, capacity: int) -> MemoryAdmission:
    admission = verifier.memory_admission
    admission.capacity, admission.journal = int(capacity), []
    return admission


def test_two_verifications_that_do_not_fit_together_never_overlap(verifier):
    fp = verifier.footprint(TASK)
    admission = _budget(verifier, fp.bytes * 3 // 2)
    verdicts = verifier.verify_many([(TASK, HONEST), (TASK, HONEST)])
    assert all(v.accepted for v in verdicts), [v.reason for v in verdicts]
    assert len(admission.journal) == 2 and not _overlaps(admission.journal)
    assert all(v.gpu_memory["estimate_bytes"] == fp.bytes and not v.gpu_memory["alone"] for v in verdicts)


def test_a_task_larger_than_the_device_runs_alone(verifier):
    fp = verifier.footprint(TASK)
    admission = _budget(verifier, fp.bytes // 2)
    verdicts = verifier.verify_many([(TASK, HONEST), (TASK, HONEST)])
    assert all(v.accepted and v.gpu_memory["alone"] for v in verdicts), [v.reason for v in verdicts]
    assert not _overlaps(admission.journal)


OOM_FORWARD = 'raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 16.00 GiB")'


def _task(forward: str = "return a + b", inputs: str = "return [torch.randn(3001), torch.randn(3001)]",
          extra: str = "") -> Task:
    return Task(source=textwrap.dedent(f"""
        import os
        import torch
        import torch.nn as nn
        {extra}
        class Model(nn.Module):
            def forward(self, a, b):
                {forward}
        def get_inputs():
            {inputs}
        def get_init_inputs():
            return []
    """), name="oom_task")


def _assert_does_not_fit(verdict):
    assert verdict.status == "error" and not verdict.accepted, (verdict.status, verdict.reason)
    assert "does not fit the device" in verdict.reason and "estimated footprint" in verdict.reason, verdict.reason
    # judged again alone, then lean, before the task is said not to fit
    assert {"retried_alone_after", "retried_lean_after"} <= set(verdict.gpu_memory or {}), verdict.gpu_memory


def test_out_of_memory_in_the_reference_is_an_error_of_the_task_not_a_rejection(verifier):
    _budget(verifier, 1 << 40)
    _assert_does_not_fit(verifier.verify(_task(forward=OOM_FORWARD), HONEST))


def test_out_of_memory_drawing_the_inputs_is_an_error_of_the_task(verifier):
    _budget(verifier, 1 << 40)
    _assert_does_not_fit(verifier.verify(_task(inputs=OOM_FORWARD), HONEST))


def test_out_of_memory_in_the_candidate_run_is_never_charged_to_it(verifier):
    _budget(verifier, 1 << 40)
    source = HONEST.source.replace("        out = torch.empty_like(a)\n",
                                   "        raise RuntimeError('CUDA out of memory. Tried to allocate 8.00 GiB')\n")
    assert source != HONEST.source
    _assert_does_not_fit(verifier.verify(TASK, Candidate(source=source, backend=HONEST.backend)))


def test_out_of_memory_beside_others_is_judged_again_alone(verifier, tmp_path):
    admission = _budget(verifier, 1 << 40)
    flag = tmp_path / "ran_out_once"
    task = _task(forward=f"""if not a.is_meta and not os.path.exists({str(flag)!r}):
                    open({str(flag)!r}, "w").close()
                    {OOM_FORWARD}
                return a + b""")
    verdict = verifier.verify(task, HONEST)
    assert verdict.accepted, verdict.reason
    assert verdict.gpu_memory["alone"] and "retried_alone_after" in verdict.gpu_memory
    assert [r["alone"] for r in admission.journal] == [False, True]


def _runs_out(times: int, flag) -> str:
    """A forward that runs out of GPU memory the first ``times`` times it runs on real tensors (once per attempt:
    each attempt's reference runs it first)."""
    return f"""n = int(open({str(flag)!r}).read()) if os.path.exists({str(flag)!r}) else 0
                if not a.is_meta and n < {times}:
                    open({str(flag)!r}, "w").write(str(n + 1))
                    {OOM_FORWARD}
                return a + b"""


def test_out_of_memory_alone_is_judged_again_lean_with_the_candidates_outputs_in_host_memory(verifier, tmp_path):
    # H100, 2026-12-06: 37_FrobeniusNorm_'s keeper held five trials' outputs (35 GiB) beside the reference's and
    # ran out of memory with the device to itself; a lean attempt keeps the adopted outputs on the host
    admission = _budget(verifier, 1 << 40)
    verdict = verifier.verify(_task(forward=_runs_out(2, tmp_path / "count")), HONEST)
    assert verdict.accepted, verdict.reason
    memory = verdict.gpu_memory
    assert {"retried_alone_after", "retried_lean_after"} <= set(memory) and memory["alone"], memory
    held = int(memory["lean"].split()[0])
    assert held >= verifier.trials and "held in host memory" in memory["lean"]  # every trial's output, at least
    assert [r["alone"] for r in admission.journal] == [False, True, True]


def test_a_task_over_the_device_that_runs_out_alone_goes_straight_to_lean(verifier, tmp_path):
    fp = verifier.footprint(_task())
    admission = _budget(verifier, fp.bytes // 2)  # alone from the first attempt
    verdict = verifier.verify(_task(forward=_runs_out(1, tmp_path / "count")), HONEST)
    assert verdict.accepted, verdict.reason
    assert "retried_lean_after" in verdict.gpu_memory and "retried_alone_after" not in verdict.gpu_memory
    assert [r["alone"] for r in admission.journal] == [True, True]


def test_a_lean_verdict_still_rejects_a_wrong_kernel(verifier, tmp_path):
    # the outputs travel to the host and back: a wrong value must still be seen as wrong
    _budget(verifier, 1 << 40)
    source = HONEST.source.replace("a + b", "a - b")
    assert source != HONEST.source
    verdict = verifier.verify(_task(forward=_runs_out(2, tmp_path / "count")),
                              Candidate(source=source, backend=HONEST.backend))
    assert verdict.status == "rejected" and "lean" in verdict.gpu_memory, (verdict.status, verdict.reason)


def test_without_a_keeper_out_of_memory_is_judged_again_alone_only(tmp_path):
    # lean holds the candidate's outputs in the keeper: outputs compared in the judge have nothing to hold leaner
    admission = MemoryAdmission("cuda-fake-no-keeper", 1 << 40, tmp_path, poll_s=0.005)
    with Verifier(backend="triton", device="cpu", workers=1, reference_workers=1, timeout_s=120,
                  checks=["correctness"], compare_on_device=False, isolate=False, memory_admission=admission) as v:
        verdict = v.verify(_task(forward=OOM_FORWARD), HONEST)
    assert verdict.status == "error" and "does not fit the device" in verdict.reason, verdict.reason
    assert "retried_alone_after" in verdict.gpu_memory and "retried_lean_after" not in verdict.gpu_memory
    assert [r["alone"] for r in admission.journal] == [False, True]


def test_error_verdicts_are_counted_as_not_judged_in_the_report():
    from core.verdict import Verdict

    task = Task(source=TASK.source, name="t", level="level1")
    results = [TaskResult.of(task, "level1", HONEST, Verdict(status="error", reason="error: does not fit")),
               TaskResult.of(task, "level1", HONEST, Verdict(status="rejected", compiled=True))]
    summary = summarise_group("level1", results)
    assert summary.not_judged == 1 and summary.to_dict()["not_judged"] == 1


# --------------------------------------------------------------------------- stopping frees the GPU

JUDGE = """
import os, sys, threading, time
from core.task import Candidate, Task
from core.verify import Verifier
task = Task(source='''
import time, torch, torch.nn as nn
class Model(nn.Module):
    def forward(self, a):
        time.sleep(300)
        return a
def get_inputs():
    return [torch.randn(8)]
def get_init_inputs():
    return []
''')
v = Verifier(backend="triton", device="cpu", workers=1, timeout_s=600, checks=["correctness"])
threading.Thread(target=v.verify, args=(task, Candidate(source="x = 1", backend="triton")), daemon=True).start()
time.sleep(8)
pids = [w.proc.pid for w in list(v.pool._all) + list(v.reference_pool._all)]
print(" ".join(map(str, pids)), flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killing_the_judge_leaves_no_worker_behind(sig):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    judge = subprocess.Popen([sys.executable, "-c", JUDGE], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in judge.stdout.readline().split()]
        assert len(pids) == 2 and all(_alive(p) for p in pids)  # one of them busy in the 300 s forward
        judge.send_signal(sig)
        judge.wait(timeout=30)
        deadline = time.monotonic() + 15
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [p for p in pids if _alive(p)]
    finally:
        judge.kill()
        for p in pids if "pids" in locals() else []:
            try:
                os.killpg(p, signal.SIGKILL)
            except OSError:
                pass


@settings(max_examples=40, deadline=None)
@given(gib=st.one_of(st.none(), st.integers(1, 200)), cores=st.integers(1, 256), gpus=st.integers(1, 8),
       per_worker=st.sampled_from([None, 1, 4, 20, 33.5]))
def test_auto_workers_per_gpu_fit_the_memory_and_the_cores(gib, cores, gpus, per_worker):
    from plugins.executors.local import AUTO_GIB_PER_WORKER, AUTO_MAX_WORKERS, auto_workers_per_gpu

    memory = None if gib is None else gib * 2**30
    n = auto_workers_per_gpu(memory, cores, gpus, *([per_worker] if per_worker else []))
    assert 1 <= n <= AUTO_MAX_WORKERS
    assert n == 1 or 2 * n * gpus <= cores  # a candidate worker and a keeper per verification
    assert n == 1 or gib is None or n * (per_worker or AUTO_GIB_PER_WORKER) <= gib


def test_auto_workers_refuse_a_share_of_no_memory():
    from plugins.executors.local import auto_workers_per_gpu

    with pytest.raises(Exception, match="gib_per_worker must be > 0"):
        auto_workers_per_gpu(80 * 2**30, 16, 1, 0)


def test_each_request_s_peak_memory_is_kept_per_role_and_request_beside_the_estimate():
    # the H200 ran out of memory alone on tasks estimated at 25-102 GiB of 126 admitted: the verdict must
    # say which request took how much, so the estimate can be checked against what was used
    from types import SimpleNamespace

    from core.verdict import Verdict
    from core.verification.gpusharing import GpuSharing, record_peak

    verdict = Verdict()
    budget = SimpleNamespace(verdict=verdict)
    record_peak(budget, "reference reference", {"ok": True, "gpu_peak": 3 << 30})
    record_peak(budget, "reference reference", {"ok": True, "gpu_peak": 5 << 30})
    record_peak(budget, "candidate run", {"ok": True, "gpu_peak": 2 << 30})
    record_peak(budget, "candidate run", {"ok": True})  # a CPU worker reports none
    assert verdict.gpu_memory["peak_bytes"] == {"reference reference": 5 << 30, "candidate run": 2 << 30}
    assert GpuSharing.peaks_line(verdict) == "reference reference 5.0 GiB, candidate run 2.0 GiB"
    assert GpuSharing.peaks_line(Verdict()) == ""


@settings(max_examples=30, deadline=None)
@given(o=st.integers(1, 2**34), trials=st.integers(5, 10), probes=st.integers(0, 6), orders=st.integers(0, 3))
@example(o=8 << 30, trials=5, probes=3, orders=0)  # KernelBench level 1: the dropped case sets its baseline up early
def test_when_outputs_are_dropped_once_judged_the_estimate_holds_one_kind_of_run_at_a_time(o, trials, probes, orders):
    # every check declares the runs it reads (Check.reads): the keeper drops each kind's outputs once
    # judged, so a verification holds the trials', the shuffled orders', the repeat's or the probes'
    measured = {"inputs": 0, "weights": 0, "outputs": o, "written": o, "elements": o // 4}
    kept = estimate(measured, trials=trials, probes=probes, orders=orders)
    dropped = estimate(measured, trials=trials, probes=probes, orders=orders, released_when_judged=True)
    runs = trials + orders + 1 + probes
    assert kept.parts["adopted_outputs"] == runs * o and dropped.parts["adopted_outputs"] == trials * o
    assert kept.phases["trials"] - dropped.phases["trials"] == (runs - trials) * o
    extra_kind = max(orders + 1, 2, probes)  # then one kind's at a time, none in the timed stage

    def set_up(fp):  # a large task's baseline set-up beside the extra runs, where the peak has room
        return fp.parts["early_baseline"] if fp.parts["timing"] > EARLY_BASELINE_MAX_BYTES else 0

    assert (kept.phases["extra"] - set_up(kept)) - (dropped.phases["extra"] - set_up(dropped)) == (runs - extra_kind) * o
    assert kept.phases["timing"] - dropped.phases["timing"] == runs * o


def _output_memory():
    """A candidate session's memory of earlier outputs alone, and ``returned(t)``: whether output ``t`` was
    returned before (then remembered, as a call's outputs are)."""
    from core.verification.worker.session import Session

    session = Session.__new__(Session)
    session._held, session._held_storages, session._large = [], [], []

    def returned(t):
        storages = [t.untyped_storage()]
        seen = any(session._returned_before(s) for s in storages)
        session._remember([t], storages)
        return seen

    return session, returned


def test_a_candidate_workers_large_outputs_are_not_held_yet_one_returned_again_is_seen():
    # holding every run's outputs took 10 x 8 GiB of the GPU in the candidate's worker at KernelBench's sizes:
    # large outputs are only weakly referenced (freed unless the candidate keeps them), small ones held as before;
    # an output an earlier call returned is seen either way, however its memory is recycled
    import gc
    import weakref

    import torch

    import core.verification.worker.session as session_module

    session, returned = _output_memory()
    large = session_module.LARGE_OUTPUT_BYTES // 4 + 1  # float32 elements of one large output

    fresh = torch.empty(large)
    alive = weakref.ref(fresh.untyped_storage())
    assert not returned(fresh)
    del fresh
    gc.collect()
    assert alive() is None  # freed: the worker did not hold it
    assert not returned(torch.empty(large))  # a new output, maybe at the recycled address: not a reuse
    cached = torch.empty(large)  # the candidate keeps this one (a cache) and returns it again
    assert not returned(cached) and returned(cached) and returned(cached[: large // 2])
    small = torch.empty(16)
    assert not returned(small) and returned(small)
    # small outputs are held, as before (no later output takes their id); large ones never
    assert len(session._held) == 2 and all(held[0] is small for held in session._held)


@settings(max_examples=25, deadline=None)
@given(large=st.booleans(), offset=st.integers(0, 15), wrap=st.sampled_from(["from_dlpack", "view", "itself"]))
def test_a_kept_output_returned_again_under_a_new_storage_is_seen(large, offset, wrap):
    # torch.from_dlpack(kept) (the cuda backend allows DLPack for CuPy's idiom) is a new storage over a
    # kept output's bytes: memory of a live storage is never handed out again, so an overlap is a reuse
    import torch

    import core.verification.worker.session as session_module

    _, returned = _output_memory()
    n = session_module.LARGE_OUTPUT_BYTES // 4 + 16 if large else 64

    kept = torch.empty(n)
    assert not returned(kept)
    again = {"from_dlpack": lambda: torch.from_dlpack(kept[offset:]), "view": lambda: kept[offset:],
             "itself": lambda: kept}[wrap]()
    assert wrap != "from_dlpack" or again.untyped_storage() is not kept.untyped_storage()
    assert returned(again)
    assert not returned(torch.empty(n))  # a fresh output while the kept one lives: other memory


def test_the_keepers_and_the_candidates_requests_report_their_peaks_to_the_verdict():
    # the keeper's compares and the candidate's timed stage took the most memory on the H200; a verdict
    # that only kept the pool requests' peaks could not show the estimate was short there
    import contextlib
    from types import SimpleNamespace

    from core.verdict import Verdict
    from core.verification.keeper import Keeper

    class Worker:
        role = "reference"

        def request(self, message, timeout_s):
            return {"ok": True, "gpu_peak": 7 << 30}

    verdict = Verdict()
    budget = SimpleNamespace(verdict=verdict, left=lambda: 60.0)
    verifier = SimpleNamespace(_gpu=lambda budget, label="": contextlib.nullcontext())
    Keeper(verifier, Worker(), budget, evidence=None)._ask({"op": "compare"})
    assert verdict.gpu_memory["peak_bytes"] == {"keeper compare": 7 << 30}


def test_the_table_says_which_tasks_the_estimate_fell_short_of():
    from benchmarks.kb_table import measured_peak, memory_estimates

    g = 1 << 30
    rows = [{"name": "19_ReLU", "gpu_memory": {"estimate_bytes": 40 * g, "peak_bytes": {
                "keeper compare": 30 * g, "reference reference": 20 * g, "candidate performance": 20 * g}}},
            {"name": "1_Square", "gpu_memory": {"estimate_bytes": 8 * g, "peak_bytes": {
                "keeper adopt": 2 * g, "candidate run": 2 * g}}},
            {"name": "cpu", "gpu_memory": {}}]
    assert measured_peak(rows[0]["gpu_memory"]) == 50 * g  # the largest of each worker, added
    assert measured_peak({"peak_bytes": {"keeper compare": g, "baseline performance": 3 * g, "candidate run": g}}) \
        == 5 * g  # the baseline worker is a process of its own
    (line,) = memory_estimates(rows)
    assert "median 2.00" in line and "range 0.80-2.00" in line
    assert "under-estimated 1 of 2 (estimate/peak: 19_ReLU 40.0/50.0 GiB)" in line
    assert memory_estimates(rows[2:]) == []


def test_peaks_are_kept_per_phase_and_the_measured_peak_is_the_largest_phase():
    # the keeper's adopted outputs and the candidate's timed stage are not held at once: summing each worker's
    # largest peak over the whole verification would call an estimate short that is not
    from types import SimpleNamespace

    from benchmarks.kb_table import measured_peak, memory_estimates, phase_peaks
    from core.verdict import Verdict
    from core.verification.budget import record_peak

    g = 1 << 30
    verdict = Verdict()
    budget = SimpleNamespace(verdict=verdict, phase="trials")
    record_peak(budget, "keeper adopt", {"ok": True, "gpu_peak": 40 * g})
    record_peak(budget, "candidate run", {"ok": True, "gpu_peak": 12 * g})
    budget.phase = "timing"
    record_peak(budget, "keeper release", {"ok": True, "gpu_peak": 10 * g})
    record_peak(budget, "candidate performance", {"ok": True, "gpu_peak": 30 * g})
    memory = verdict.gpu_memory
    assert memory["phase_peak_bytes"] == {"trials": {"keeper": 40 * g, "candidate": 12 * g},
                                          "timing": {"keeper": 10 * g, "candidate": 30 * g}}
    assert phase_peaks(memory) == {"trials": 52 * g, "timing": 40 * g}
    assert measured_peak(memory) == 52 * g  # not 40 + 30: the two peaks were phases apart
    memory["estimate_bytes"] = 65 * g
    memory["estimate_phases"] = {"trials": 65 * g, "timing": 30 * g}  # the timed stage's estimate fell short
    estimate_line, phase_line, short_line = memory_estimates([{"name": "19_ReLU", "gpu_memory": memory}])
    assert "under-estimated 0 of 1" in estimate_line
    assert phase_line == "peak phase (verdicts): trials 1; largest phase peak / estimate: trials 0.80, timing 0.62"
    assert short_line == "phase estimates under the phase's measured peak: timing 1 of 1, trials 0 of 1"


def test_a_verification_names_its_phases_in_order(verifier, monkeypatch):
    import core.verification.pipeline as pipeline
    from core.verification.budget import Budget

    seen: list[str] = []

    class Recording(Budget):
        def __setattr__(self, name, value):
            if name == "phase" and value:
                seen.append(value)
            super().__setattr__(name, value)

    monkeypatch.setattr(pipeline, "Budget", Recording)
    _budget(verifier, 1 << 40)
    (verdict,) = verifier.verify_many([(TASK, HONEST)])
    assert verdict.accepted, verdict.reason
    assert seen[:2] == ["reference", "trials"]

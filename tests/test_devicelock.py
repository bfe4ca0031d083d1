"""The host-wide GPU lock: timing has the GPU alone, other work shares it, and no reader starves it."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from dataclasses import asdict

import pytest
from hypothesis import given
from hypothesis import strategies as st
from lock_probe import could_take

from core.verification.devicelock import DeviceLock, DeviceLockTimeout, gpu_key


def _hold_shared(directory: str, key: str, held: mp.Event, release: mp.Event) -> None:
    lock = DeviceLock(key, directory)
    with lock.shared():
        held.set()
        release.wait(10)


def test_exclusive_waits_for_a_shared_holder_in_another_process(tmp_path):
    ctx = mp.get_context("spawn")
    held, release = ctx.Event(), ctx.Event()
    other = ctx.Process(target=_hold_shared, args=(str(tmp_path), "cuda-0", held, release))
    other.start()
    try:
        assert held.wait(30)
        lock = DeviceLock("cuda-0", tmp_path)
        with pytest.raises(DeviceLockTimeout), lock.exclusive(deadline=time.monotonic() + 0.3):
            pass
        release.set()
        with lock.exclusive(deadline=time.monotonic() + 10):
            pass
    finally:
        release.set()
        other.join(10)


def test_shared_holders_overlap_and_other_gpus_are_independent(tmp_path):
    a, b = DeviceLock("cuda-0", tmp_path), DeviceLock("cuda-1", tmp_path)
    with a.shared(time.monotonic() + 1), a.shared(time.monotonic() + 1):
        with b.exclusive(time.monotonic() + 1):  # another GPU: not blocked
            pass
        with pytest.raises(DeviceLockTimeout), a.exclusive(time.monotonic() + 0.2):
            pass


def test_a_stream_of_readers_does_not_starve_the_timer(tmp_path):
    lock = DeviceLock("cuda-0", tmp_path, poll_s=0.001)
    stop = threading.Event()
    inside = []

    def reader():
        while not stop.is_set():
            with lock.shared():
                inside.append(1)
                time.sleep(0.02)

    readers = [threading.Thread(target=reader) for _ in range(4)]
    for t in readers:
        t.start()
    try:
        time.sleep(0.1)  # readers overlap continuously from here on
        t0 = time.monotonic()
        with lock.exclusive(deadline=t0 + 5):
            seen = len(inside)
            time.sleep(0.05)
            assert len(inside) == seen, "a reader ran while the exclusive holder had the GPU"
        assert time.monotonic() - t0 < 5
    finally:
        stop.set()
        for t in readers:
            t.join(5)


def test_timed_turns_asked_for_while_the_gpu_drains_run_back_to_back(tmp_path):
    # A timed turn waits for the shared turns inside to end (seconds at KernelBench's sizes). Timed turns
    # that queue meanwhile go next, one after the other, before any new shared turn: one drain for all.
    lock = DeviceLock("cuda-0", tmp_path, poll_s=0.001)
    order: list[str] = []
    inside, release = threading.Event(), threading.Event()

    def long_shared_turn():
        with lock.shared():
            inside.set()
            release.wait(10)

    def turn(name: str, exclusive: bool):
        with (lock.exclusive() if exclusive else lock.shared()):
            order.append(name)
            time.sleep(0.05)

    first = threading.Thread(target=long_shared_turn)
    first.start()
    assert inside.wait(10)
    threads = []
    for name, exclusive in (("timed 1", True), ("shared 1", False), ("timed 2", True), ("shared 2", False),
                            ("timed 3", True)):
        threads.append(threading.Thread(target=turn, args=(name, exclusive)))
        threads[-1].start()
        time.sleep(0.05)  # asked for in this order, all while the first shared turn still runs
        until = time.monotonic() + 10
        while not lock._writers_waiting() and time.monotonic() < until:  # a loaded host starts threads late
            time.sleep(0.01)
    assert order == []
    release.set()
    for t in [first, *threads]:
        t.join(10)
    assert sorted(order[:3]) == ["timed 1", "timed 2", "timed 3"], order
    assert sorted(order[3:]) == ["shared 1", "shared 2"]


def test_a_reader_waits_while_a_writer_waits_and_gives_up_at_its_deadline(tmp_path):
    lock = DeviceLock("cuda-0", tmp_path, poll_s=0.001)
    served = threading.Event()

    def writer():
        with lock.exclusive(time.monotonic() + 5):
            served.set()

    with lock.shared():
        with lock.shared(deadline=time.monotonic() + 1):  # no writer: readers overlap at once
            pass
        waiting = threading.Thread(target=writer)
        waiting.start()
        time.sleep(0.1)  # the writer now waits for this reader to leave
        t0 = time.monotonic()
        with pytest.raises(DeviceLockTimeout):
            with lock.shared(deadline=t0 + 0.2):
                pass
        assert time.monotonic() - t0 < 1.5 and not served.is_set()
    waiting.join(5)
    assert served.is_set()
    with lock.shared(deadline=time.monotonic() + 1):  # the writer gone, readers enter again
        pass


@given(st.lists(st.integers(0, 15), min_size=1, max_size=4))
def test_gpu_key_is_the_first_visible_device(ids):
    assert gpu_key("cuda", {"CUDA_VISIBLE_DEVICES": ",".join(map(str, ids))}) == f"cuda-{ids[0]}"


def test_gpu_key_defaults_to_device_zero():
    assert gpu_key("cuda", {}) == gpu_key("cuda", {"CUDA_VISIBLE_DEVICES": ""}) == "cuda-0"


def test_the_performance_stage_asks_for_the_gpu_alone_and_the_flag_is_not_config():
    from plugins.verifiers.performance import PerformanceCheck

    check = PerformanceCheck()
    assert check.exclusive_device is True
    assert "exclusive_device" not in asdict(check)


def test_a_cpu_verifier_takes_no_gpu_lock():
    from core.verify import Verifier

    with Verifier(backend="triton", device="cpu", workers=1, checks=["static"]) as v:
        assert v.device_lock is None



def test_waiting_for_the_gpu_is_not_charged_to_the_candidate(tmp_path):
    import threading
    import types

    from core.verdict import Verdict
    from core.verification.judge import Verifier, _Budget
    from core.verification.sandbox import WorkerFailure

    lock = DeviceLock("cuda-budget", tmp_path)
    judge = types.SimpleNamespace(device_lock=lock, gpu_wait_s=30.0, gpu_turns=[])
    held, release = threading.Event(), threading.Event()

    def neighbour():  # e.g. a hanging candidate's trial, holding the GPU until its own limit
        with lock.shared():
            held.set()
            release.wait(10)

    thread = threading.Thread(target=neighbour)
    thread.start()
    held.wait(10)
    threading.Timer(1.0, release.set).start()
    verdict = Verdict()
    budget = _Budget(5.0, verdict)
    before = budget.deadline
    with Verifier._gpu(judge, budget, exclusive=True):  # the timed stage waits ~1 s for the GPU ...
        pass
    assert budget.deadline - before >= 0.9  # ... and gets that second back
    assert verdict.gpu_wait_s == pytest.approx(budget.deadline - before)  # which the verdict reports
    with Verifier._gpu(judge, budget):  # a free GPU: next to no wait added
        pass
    assert verdict.gpu_wait_s < budget.deadline - before + 0.5
    assert Verdict.from_dict(verdict.to_dict()).gpu_wait_s == verdict.gpu_wait_s
    alone, shared = judge.gpu_turns  # both turns are in the judge's journal, in order
    assert alone["exclusive"] and not shared["exclusive"]
    assert alone["got"] - alone["asked"] >= 0.9 and shared["asked"] >= alone["done"]
    thread.join()

    release.clear()
    held.clear()
    thread = threading.Thread(target=neighbour)
    thread.start()
    held.wait(10)
    judge.gpu_wait_s = 0.3
    with pytest.raises(WorkerFailure) as failure:  # a GPU busy past gpu_wait_s: an error of the run
        with Verifier._gpu(judge, _Budget(5.0), exclusive=True):
            pass
    assert failure.value.status == "error" and "busy" in failure.value.detail
    release.set()
    thread.join()


@st.composite
def _timelines(draw):
    """Turns as the lock allows them: an exclusive turn alone, or shared turns that overlap each
    other, in blocks separated by idle gaps; returns (turns, exclusive_s, shared_s, idle_s)."""
    t, turns, exclusive_s, shared_s, idle_s = 0.0, [], 0.0, 0.0, 0.0
    for _ in range(draw(st.integers(0, 12))):
        gap = draw(st.floats(0.0, 2.0))
        t += gap
        idle_s += gap
        length = draw(st.floats(0.01, 3.0))
        asked = t - draw(st.floats(0.0, 1.0))
        if draw(st.booleans()):
            turns.append({"label": "performance", "exclusive": True, "asked": asked, "got": t, "done": t + length})
            exclusive_s += length
        else:  # readers inside [t, t + length], one of them spanning it
            turns.append({"label": "load", "exclusive": False, "asked": asked, "got": t, "done": t + length})
            for _ in range(draw(st.integers(0, 3))):
                a = t + draw(st.floats(0.0, length))
                b = a + draw(st.floats(0.0, t + length - a))
                turns.append({"label": "run", "exclusive": False, "asked": a, "got": a, "done": b})
            shared_s += length
        t += length
    return turns, exclusive_s, shared_s, idle_s


@given(_timelines())
def test_the_gpu_time_divides_into_alone_shared_and_idle(timeline):
    """How a judge's GPU time divided (``Verifier.gpu_turns``): what a user reads to size a pool."""
    from core.verification.devicelock import summarise_turns

    turns, exclusive_s, shared_s, idle_s = timeline
    s = summarise_turns(turns, start=0.0)  # the window: from 0 to the last turn's end
    assert s["exclusive_s"] == pytest.approx(exclusive_s, abs=1e-6)
    assert s["shared_s"] == pytest.approx(shared_s, abs=1e-6)
    assert s["idle_s"] == pytest.approx(idle_s, abs=1e-6)
    assert s["exclusive_s"] + s["shared_s"] + s["idle_s"] == pytest.approx(s["span_s"], abs=1e-6)
    assert s["exclusive_turns"] == sum(t["exclusive"] for t in turns)
    assert sum(s["shared_by_label_s"].values()) >= s["shared_s"] - 1e-6  # overlapping readers count each


def test_a_verdict_says_how_long_it_held_the_gpu_per_turn_and_which_turns_were_alone(tmp_path):
    # on the H200 verdicts waited 38-185 s for the GPU (2026-12-04): each verdict records what it held,
    # so a run shows which exclusive turns the others waited for
    from core.verdict import Verdict
    from core.verification.budget import Budget, GpuTurn

    lock, verdict = DeviceLock("held-test", directory=tmp_path), Verdict()
    budget = Budget(60, verdict)
    with GpuTurn(lock.exclusive(time.monotonic() + 5), budget, time.monotonic(), [], "performance", exclusive=True):
        time.sleep(0.05)
    for _ in range(2):
        with GpuTurn(lock.shared(time.monotonic() + 5), budget, time.monotonic(), [], "run"):
            time.sleep(0.01)
    assert set(verdict.gpu_held_s) == {"performance alone", "run"}
    assert verdict.gpu_held_s["performance alone"] >= 0.05 and verdict.gpu_held_s["run"] >= 0.02
    assert Verdict.from_json(verdict.to_json()).gpu_held_s == verdict.gpu_held_s


def _can_take_alone(lock: DeviceLock) -> bool:
    """Whether a timed (exclusive) turn could start now, asked from another thread."""
    return could_take(lock, exclusive=True, wait_s=0.3)


def _baseline_worker(lock: DeviceLock, seen: dict):
    """A reference worker's baseline set-up as core.verification.worker.reference runs it: GPU work,
    a torch.compile build (whose backend looks whether a timed turn could start meanwhile), GPU work."""
    import torch

    from core.verification.worker.reference import _own_gpu_lock_of

    def backend(gm, example_inputs):
        seen["during the build"] = _can_take_alone(lock)
        return gm.forward

    class Worker:
        def request(self, message, timeout_s):
            held = _own_gpu_lock_of(message.get("device_lock"))
            with held:
                seen["before"] = _can_take_alone(lock)
                torch.compile(lambda x: torch.sin(x) + 1, backend=backend)(torch.randn(8))
                seen["after"] = _can_take_alone(lock)
            return {"ok": True, "data": {"gpu_lock": {"wait_s": held.waited_s, "segments": held.segments}}}

    return Worker()


def test_a_baseline_build_gives_the_gpu_back_while_torch_compile_compiles(tmp_path):
    # A torch.compile build is seconds of CPU at real sizes: held as a shared turn, it kept every timed
    # turn of the host (and, behind the gate, every other worker) waiting. The set-up holds the lock
    # itself around its GPU work and gives it back for the build.
    import types

    from core.verdict import Verdict
    from core.verification.judge import Verifier, _Budget

    lock = DeviceLock("cuda-build", tmp_path)
    judge = types.SimpleNamespace(device_lock=lock, gpu_wait_s=30.0, gpu_turns=[])
    seen: dict = {}
    verdict = Verdict()
    budget = _Budget(60.0, verdict)
    answer = Verifier._baseline_set_up(judge, _baseline_worker(lock, seen), {"op": "baseline", "phase": "prepare"},
                                       budget, "performance baseline set-up")
    assert seen == {"before": False, "during the build": True, "after": False}
    assert answer == {"ok": True, "data": {}}  # the lock's record is the judge's, not the check's
    turns = judge.gpu_turns
    assert len(turns) == 2 and not any(t["exclusive"] for t in turns)  # before and after the build
    assert turns[0]["done"] < turns[1]["got"]
    held = sum(t["done"] - t["got"] for t in turns)
    assert verdict.gpu_held_s["performance baseline set-up"] == pytest.approx(held, abs=1e-3)
    assert _can_take_alone(lock)  # and given back at the end


def test_a_baseline_set_up_without_a_gpu_lock_takes_none(tmp_path):
    import types

    from core.verification.judge import Verifier, _Budget

    class Worker:
        def request(self, message, timeout_s):
            assert "device_lock" not in message
            return {"ok": True, "data": {}}

    judge = types.SimpleNamespace(device_lock=None, gpu_wait_s=30.0, gpu_turns=[])
    assert Verifier._baseline_set_up(judge, Worker(), {"op": "baseline"}, _Budget(5.0), "x") == {"ok": True, "data": {}}
    assert judge.gpu_turns == []


def test_taking_the_gpu_back_after_a_build_past_the_deadline_fails_the_request(tmp_path):
    # GPU work must never run unlocked: a build that cannot get the lock back ends the set-up
    import torch

    from core.verification.devicelock import SharedExceptCompiling

    lock = DeviceLock("cuda-late", tmp_path)
    taken, release = threading.Event(), threading.Event()

    def timed_turn_elsewhere():
        with lock.exclusive():
            taken.set()
            release.wait(10)

    def backend(gm, example_inputs):
        threading.Thread(target=timed_turn_elsewhere).start()
        assert taken.wait(10)
        return gm.forward

    held = SharedExceptCompiling(lock, time.monotonic() + 0.5)
    with pytest.raises(DeviceLockTimeout):
        with held:
            try:  # as compile_baseline does: a failed build leaves the baseline without torch.compile ...
                torch.compile(lambda x: torch.cos(x) * 2, backend=backend)(torch.randn(4))
            except Exception:
                pass
            # ... and the set-up would go on here, unlocked, were the lost lock not raised at the end
    release.set()
    assert held.builds == 1 and len(held.segments) == 1

"""Memory-aware dispatch (core.verification.dispatch): a GPU shard with a free slot starts the first pair
that fits its admitted memory beside those it runs, instead of the head of the queue, which would hold
the slot while it waits for memory. On the H200 (2026-12-05) a run of level-1 problems each estimated at
more than half the device filled every slot, and the small problems that could have run beside them
waited behind: 1193 s of the 2131 s of GPU waits in 24 verdicts were memory admission."""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import os
import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.task import Candidate, Task
from core.verdict import Verdict
from core.verification.dispatch import HOLD_S, DispatchQueue, plan_memory
from core.verification.executor import ShardSet, schedule
from plugins.executors.local import LocalExecutor

PLANNING = "tests.test_dispatch:PlanningVerifier"


def sized_pairs(sizes: list[int]) -> list[tuple[Task, Candidate]]:
    """Pairs whose task says its footprint (``# bytes N``), one task per pair."""
    return [(Task(source=f"# task {k}\n# bytes {n}\n"), Candidate(source=f"# cand {k}\n")) for k, n in enumerate(sizes)]


def size_of(task: Task) -> int:
    return int(task.source.split("# bytes ")[1].split()[0])


class PlanningVerifier:
    """A stand-in Verifier with a memory plan (each task's ``# bytes``, ``capacity`` admitted); each verdict
    says when it started and ended (``time.monotonic`` is host-wide), after ``delay_s``."""

    def __init__(self, backend="triton", device="cpu", workers=1, delay_s=0.2, capacity=100, **_):
        self.workers, self.delay_s, self.capacity = workers, delay_s, capacity

    def memory_plan(self, tasks):
        return {"capacity": self.capacity, "bytes": {t.id: size_of(t) for t in tasks}}

    def verify(self, task, candidate):
        began = time.monotonic()
        time.sleep(self.delay_s)
        return Verdict(accepted=True, status="accepted", task_id=task.id, candidate_id=candidate.id,
                       reason=f"{began} {time.monotonic()} {os.getpid()}")

    def verify_many(self, pairs):
        with cf.ThreadPoolExecutor(max(1, len(pairs))) as ex:
            return list(ex.map(lambda p: self.verify(*p), pairs))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def spans(verdicts: list[Verdict]) -> list[tuple[float, float]]:
    return [(float(v.reason.split()[0]), float(v.reason.split()[1])) for v in verdicts]


# --------------------------------------------------------------------------- the queue, on a simulated clock


def simulate(weights: list[int], durations: list[float], budget: int, slots: int,
             planned: bool = True) -> tuple[list[float], list[list[int]], DispatchQueue]:
    """Run the queue against a fake shard of ``slots`` slots on a simulated clock; each pair's start time and
    the set running after every dispatch."""
    now = [0.0]
    shard = type("Shard", (), {"memory_bytes": budget if planned else None})()
    queue = DispatchQueue(len(weights), (lambda s: weights) if planned else None, clock=lambda: now[0])
    running: dict[int, float] = {}  # pair -> end time
    started = [float("nan")] * len(weights)
    snapshots: list[list[int]] = []
    while queue or running:
        while queue and len(running) < slots:
            chunk = queue.take(shard, 1, len(running))
            if not chunk:
                break
            for i in chunk:
                started[i] = now[0]
                running[i] = now[0] + durations[i]
            snapshots.append(sorted(running))
        assert running, "nothing runs and nothing starts: the queue is stuck"
        i = min(running, key=running.get)
        now[0] = running.pop(i)
        queue.finished(shard, [i])
    return started, snapshots, queue


@settings(max_examples=200, deadline=None)
@given(data=st.data(), budget=st.integers(10, 100), slots=st.integers(1, 6))
def test_what_runs_at_once_fits_the_budget_unless_it_runs_alone_and_nothing_is_starved(data, budget, slots):
    n = data.draw(st.integers(1, 25))
    weights = data.draw(st.lists(st.integers(0, 150), min_size=n, max_size=n))
    durations = data.draw(st.lists(st.floats(0.5, 60.0), min_size=n, max_size=n))
    started, snapshots, _ = simulate(weights, durations, budget, slots)
    assert all(s == s for s in started)  # every pair started
    for running in snapshots:  # within the budget, or a single pair larger than it
        assert len(running) == 1 or sum(weights[i] for i in running) <= budget
    # a pair passed over for HOLD_S is held; the first held pair in the queue is a reservation: a pair behind it
    # that starts fits beside it and the pairs behind it started since its hold (none of those delays it: it
    # starts once the ones it waits for, started before the hold or ahead of it in the queue, have ended)
    ends = [started[k] + durations[k] for k in range(n)]
    holds = {}
    for i in range(n):
        behind = [started[j] for j in range(i + 1, n) if started[j] < started[i]]
        if behind:
            holds[i] = min(behind) + HOLD_S
    for j in range(n):
        first = next((i for i in range(j) if i in holds and holds[i] <= started[j] < started[i]), None)
        if first is not None:
            since = [k for k in range(first + 1, n) if holds[first] <= started[k] <= started[j] < ends[k]]
            assert weights[first] + sum(weights[k] for k in since) <= budget, (first, j, started)


@settings(max_examples=50, deadline=None)
@given(weights=st.lists(st.integers(0, 200), min_size=1, max_size=20), slots=st.integers(1, 4))
def test_without_a_plan_the_queue_is_first_come_first_served(weights, slots):
    started, _, queue = simulate(weights, [1.0] * len(weights), 100, slots, planned=False)
    assert started == sorted(started) and queue.skips == 0


def test_small_pairs_run_beside_a_large_one_instead_of_waiting_behind_the_next_large_one():
    # level 1 in KernelBench's order: three problems over half the device, then small ones
    weights, durations = [70, 70, 70, 5, 5, 5, 5], [10.0, 10.0, 10.0, 2.0, 2.0, 2.0, 2.0]
    started, snapshots, queue = simulate(weights, durations, 100, 4)
    assert snapshots[:4] == [[0], [0, 3], [0, 3, 4], [0, 3, 4, 5]]  # the smalls start beside the first large one
    assert started[1] >= 10.0 and started[2] >= started[1] + 10.0  # the large ones one at a time
    assert queue.skips > 0
    _, fifo, _ = simulate(weights, durations, 100, 4, planned=False)
    assert fifo[3] == [0, 1, 2, 3]  # first come, first served: three large ones hold three slots (two would wait)


def test_small_pairs_keep_running_beside_a_chain_of_large_ones_that_wait_for_each_other():
    # KernelBench level 1 then level 2: large problems, each over half the device, then many small ones. The
    # second large one is held after HOLD_S; before its reservation, nothing started behind it any more: one
    # verification at a time, all along the chain.
    large, small = 6, 100
    weights = [60] * large + [5] * small
    durations = [40.0] * large + [2.0] * small
    started, snapshots, _ = simulate(weights, durations, 100, 3)
    ends = [s + d for s, d in zip(started, durations)]
    assert all(len([i for i in running if i < large]) <= 1 for running in snapshots)  # never two large at once
    assert max(ends) == pytest.approx(large * 40.0)  # the large ones back to back: the small ones add nothing
    assert [started[i] for i in range(large)] == pytest.approx([40.0 * i for i in range(large)])


def test_a_held_pair_that_needs_the_device_alone_does_not_stop_small_pairs_beside_the_ones_before_it():
    # H200, 2026-12-07: level 1's elementwise and norm problems (92 GiB estimated of 125 admitted) one after
    # another, among them 34_InstanceNorm (135 GiB: it runs alone), then the small problems. Every held pair was a
    # reservation, so from the hold of 34_ on nothing started behind it: the 92-GiB ones ran one at a time for
    # 120 s, the GPU idle a third of it, while the small ones waited. Only the first held pair reserves now.
    budget, chain, alone, small = 125, 16, 12, 30
    weights = [92] * chain + [12] * small
    weights[alone] = 135
    durations = [5.0] * chain + [10.0] * small
    started, snapshots, _ = simulate(weights, durations, budget, 6)
    smalls_beside_chain = [started[k] for k in range(chain, chain + small)
                           if HOLD_S <= started[k] < started[alone]]
    assert smalls_beside_chain, started  # small pairs started beside the chain after the holds began
    for running in snapshots:  # still: within the budget, and the one over it alone
        assert len(running) == 1 or sum(weights[i] for i in running) <= budget
    assert all(len([i for i in running if i < chain]) <= 1 for running in snapshots)


# --------------------------------------------------------------------------- through schedule and the executors


class PlanningShard:
    """An in-memory shard that plans (or not) and runs each pair for ``delay_s``."""

    def __init__(self, capacity: int, budget: int | None, delay_s: float = 0.15, plans: bool = True):
        self.name, self.capacity = "planning", capacity
        self.verifier = PlanningVerifier(delay_s=delay_s, capacity=budget)
        self.pool = cf.ThreadPoolExecutor(capacity + 2)
        if plans:
            self.memory_plan = lambda tasks: self.pool.submit(self.verifier.memory_plan, tasks)

    def submit(self, data):
        pairs = [(Task.from_dict(t), Candidate.from_dict(c)) for t, c in data]
        return self.pool.submit(lambda: [v.to_json() for v in self.verifier.verify_many(pairs)])

    def close(self):
        self.pool.shutdown(wait=False)


def test_schedule_starts_what_fits_and_still_returns_every_verdict_in_order():
    pairs = sized_pairs([70, 70, 5, 5, 5])
    shard = PlanningShard(capacity=3, budget=100)
    footprints = plan_memory([shard], pairs)
    assert shard.memory_bytes == 100 and footprints[id(shard)] == [70, 70, 5, 5, 5]
    verdicts = schedule(ShardSet([shard], replace=None, extra_in_flight=0), pairs, footprints=footprints)
    assert [v.task_id for v in verdicts] == [t.id for t, _ in pairs]
    (b0, e0), (b1, _), *smalls = spans(verdicts)
    assert b1 >= e0 - 0.01  # the two large ones never together
    assert all(b < e0 for b, _ in smalls[:2])  # two small ones beside the first large one
    shard.close()


def test_a_shard_that_cannot_plan_is_dispatched_in_order():
    pairs = sized_pairs([70, 70, 5])
    planning, plain = PlanningShard(capacity=2, budget=None), PlanningShard(capacity=2, budget=100, plans=False)
    assert plan_memory([planning, plain], pairs) == {}  # no capacity, no plan: first come, first served
    assert not hasattr(plain, "memory_bytes")
    planning.close()
    plain.close()


@pytest.mark.parametrize("dispatch", ["memory", "fifo"])
def test_a_process_shard_plans_memory_through_its_host(dispatch):
    # the memory plan crosses the host process's pipe like verdicts do; "fifo" turns it off
    sizes = [70, 70, 5, 5]
    with LocalExecutor("triton", "cpu", {"delay_s": 0.3, "capacity": 100}, cpu_workers=2, processes=True,
                       verifier_path=PLANNING, extra_in_flight=0, dispatch=dispatch) as ex:
        verdicts = ex.verify_many(sized_pairs(sizes))
        note = ex.dispatch_note
    (b0, e0), (b1, _), (b2, _), _ = spans(verdicts)
    if dispatch == "memory":
        assert re.fullmatch(r"memory-aware dispatch \(planned in \d+\.\d s\): cpu0: 0.0 GiB admitted, 2 of 4 "
                            r"verifications estimated over half of it", note), note
        assert b2 < e0 <= b1 + 0.01  # a small one beside the first large one; the second large one after it
    else:
        assert note == "" and b1 < e0  # in order: the two large ones side by side


def test_dispatch_must_be_memory_or_fifo():
    from core.verification.executor import ExecutorError

    with pytest.raises(ExecutorError, match="dispatch must be"):
        LocalExecutor("triton", "cpu", {}, cpu_workers=1, verifier_path=PLANNING, dispatch="lifo")


# --------------------------------------------------------------------------- the verifier's own plan


def test_the_verifier_plans_with_its_own_footprints_and_admitted_memory(tmp_path):
    from core.verification.gpumemory import MemoryAdmission
    from core.verify import Verifier

    here = os.path.join(os.path.dirname(__file__), "redteam", "tasks")
    tasks = [Task.from_file(os.path.join(here, name)) for name in ("vector_add.py", "softmax.py")]
    admission = MemoryAdmission("cuda-fake-plan", 1 << 36, tmp_path, poll_s=0.005)
    with Verifier(backend="triton", device="cpu", workers=1, reference_workers=2, checks=["correctness"],
                  compare_on_device=True, isolate=False, memory_admission=admission) as v:
        plan = v.memory_plan(tasks)
        assert plan["capacity"] == 1 << 36
        assert plan["bytes"] == {t.id: v.footprints[t.id].bytes for t in tasks}  # kept for the verifications
        assert all(b > 0 for b in plan["bytes"].values())
    with Verifier(backend="triton", device="cpu", workers=1, checks=["correctness"], isolate=False) as plain:
        assert plain.memory_plan(tasks) == {"capacity": None, "bytes": {}}  # no admission on the CPU: no plan


class DeferringVerifier(PlanningVerifier):
    """Each verification holds the GPU for ``delay_s``, then (a task with ``# deferred``) says its memory is
    given back (``on_gpu_released``, as ``Verifier``'s GPU sharing does) and waits ``cpu_s`` more for a check
    off the GPU (interp_races) before its verdict. The reason says start, release and end."""

    on_gpu_released = None

    def __init__(self, cpu_s=0.6, **kwargs):
        super().__init__(**kwargs)
        self.cpu_s = cpu_s

    def verify(self, task, candidate):
        began = time.monotonic()
        time.sleep(self.delay_s)
        released = time.monotonic()
        if "# deferred" in task.source:
            if self.on_gpu_released is not None:
                self.on_gpu_released(task.id, candidate.id)
            time.sleep(self.cpu_s)
        return Verdict(accepted=True, status="accepted", task_id=task.id, candidate_id=candidate.id,
                       reason=f"{began} {time.monotonic()} {released}")


@pytest.mark.parametrize("watched", [True, False])
def test_a_large_pair_starts_once_the_one_before_gave_its_memory_back_not_at_its_verdict(watched):
    # two tasks over half the memory: the second may start when the first's GPU stages end, while the first
    # still waits for its race analysis on the CPU (the H100's norms held their slot 19-39 s so)
    from core.verification.executor import InProcessShard

    pairs = [(Task(source=f"# task {k}\n# bytes 70\n# deferred\n"), Candidate(source=f"# cand {k}\n"))
             for k in range(3)]
    verifier = DeferringVerifier(delay_s=0.3, cpu_s=0.8, capacity=100)
    shard = InProcessShard("gpu0", verifier, capacity=3)
    if not watched:  # a shard that cannot tell (a host process): the pair's memory is free at its verdict
        shard.watch_gpu_release = None
    footprints = plan_memory([shard], pairs)
    verdicts = schedule(ShardSet([shard], replace=None, extra_in_flight=0), pairs, footprints=footprints)
    assert [v.task_id for v in verdicts] == [t.id for t, _ in pairs]
    times = [tuple(map(float, v.reason.split())) for v in verdicts]  # (start, end, gpu released)
    for (_, end, released), (start, _, _) in zip(times, times[1:]):
        assert start >= released - 0.01  # never two on the GPU at once: 140 > 100
        assert (start < end) == watched  # began during the other's CPU wait only where the release is heard
    assert verifier.on_gpu_released is None  # the scheduler stops listening when it returns
    shard.close()


@pytest.mark.parametrize("processes", [False, True], ids=["in_process", "host_process"])
def test_a_pair_waiting_off_the_gpu_gives_its_slot_back_but_twice_the_capacity_is_the_most_in_flight(processes):
    # on the H100 (2026-12-06) matmuls waited 10-32 s for interp_races on the CPU, each holding one of three
    # slots with its GPU workers idle; now the next pair starts beside such a wait, up to 2x capacity at once
    from core.verification.executor import InProcessShard

    pairs = [(Task(source=f"# task {k}\n# bytes 10\n# deferred\n"), Candidate(source=f"# cand {k}\n"))
             for k in range(4)]
    settings_ = {"delay_s": 0.3, "cpu_s": 1.0, "capacity": 100}
    if processes:  # a GPU shard's host process answers as many requests at once
        with LocalExecutor("triton", "cpu", settings_, cpu_workers=1, processes=True, extra_in_flight=0,
                           verifier_path="tests.test_dispatch:DeferringVerifier") as ex:
            verdicts = ex.verify_many(pairs)
    else:
        shard = InProcessShard("gpu0", DeferringVerifier(**settings_), capacity=1)
        verdicts = schedule(ShardSet([shard], replace=None, extra_in_flight=0), pairs,
                            footprints=plan_memory([shard], pairs))
        shard.close()
    times = [tuple(map(float, v.reason.split())) for v in verdicts]  # (start, end, gpu released)
    assert times[1][0] < times[0][1] - 0.3  # the second began during the first's wait off the GPU
    for (_, _, released), (start, _, _) in zip(times, times[1:]):
        assert start >= released - 0.01  # one on the GPU at a time: the capacity
    events = sorted([(t[0], 1) for t in times] + [(t[1], -1) for t in times])
    assert max(itertools.accumulate(step for _, step in events)) <= 2  # and never more than 2x it in flight


@pytest.mark.parametrize("deferred, fails", [(["interp_races"], False), ([], False), (["interp_races"], True)])
def test_the_verifier_says_its_gpu_memory_is_back_only_for_a_verdict_still_waiting_off_the_gpu(deferred, fails):
    from types import SimpleNamespace

    from core.verification.gpusharing import GpuSharing

    heard = []
    sharing = GpuSharing()
    sharing.memory_admission, sharing._admission_wanted = None, False
    sharing.on_gpu_released = lambda task_id, cand_id: heard.append((task_id, cand_id))
    task, cand = Task(source="# t\n"), Candidate(source="# c\n")
    verification = SimpleNamespace(task=task, candidate=cand, deferred=[], budget=None, verdict=None)

    def stages():
        with sharing._reserved(verification):
            verification.deferred = deferred  # decided with the extra observations, inside the GPU stages
            if fails:
                raise RuntimeError("a GPU stage failed")

    if fails:
        with pytest.raises(RuntimeError):
            stages()
    else:
        stages()
    assert heard == ([(task.id, cand.id)] if deferred and not fails else [])


def test_a_process_shard_hears_the_early_release_through_its_host():
    # a GPU shard is a host process (one per GPU): the release crosses its pipe like verdicts do
    pairs = [(Task(source=f"# task {k}\n# bytes 70\n# deferred\n"), Candidate(source=f"# cand {k}\n"))
             for k in range(3)]
    with LocalExecutor("triton", "cpu", {"delay_s": 0.3, "cpu_s": 0.8, "capacity": 100}, cpu_workers=3,
                       processes=True, verifier_path="tests.test_dispatch:DeferringVerifier", extra_in_flight=0) as ex:
        verdicts = ex.verify_many(pairs)
    times = [tuple(map(float, v.reason.split())) for v in verdicts]  # (start, end, gpu released)
    for (_, end, released), (start, _, _) in zip(times, times[1:]):
        assert released - 0.01 <= start < end

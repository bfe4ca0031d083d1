"""The executor interface: scheduling over shards, lost shards retried elsewhere, no duplicates."""

from __future__ import annotations

import concurrent.futures as cf
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.task import Candidate, Task
from core.verdict import Verdict
from core.verification.executor import ExecutorError, ShardLost, ShardSet, make_executor, schedule
from plugins.executors.local import LocalExecutor

FAKE = "tests.test_executor:SlowVerifier"
REPO = Path(__file__).resolve().parents[1]


class SlowVerifier:
    """A stand-in Verifier for scheduling tests: accepts everything after ``delay_s``, says which process judged."""

    def __init__(self, backend="triton", device="cpu", workers=1, delay_s=0.2, **_):
        self.workers, self.delay_s = workers, delay_s

    def verify(self, task, candidate):
        time.sleep(self.delay_s)
        return Verdict(accepted=True, compiled=True, correct=True, status="accepted", task_id=task.id,
                       candidate_id=candidate.id, reason=f"pid {os.getpid()} "
                       f"gpu {os.environ.get('CUDA_VISIBLE_DEVICES')}")

    def verify_many(self, pairs):
        with cf.ThreadPoolExecutor(max(1, self.workers)) as ex:
            return list(ex.map(lambda p: self.verify(*p), pairs))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def pairs_of(n: int) -> list[tuple[Task, Candidate]]:
    return [(Task(source=f"# task {k}\n"), Candidate(source=f"# cand {k}\n")) for k in range(n)]


class FlakyShard:
    """In-memory shard whose ``fail_on`` request numbers are lost (raise ShardLost)."""

    made = 0

    def __init__(self, fail_on: set[int], capacity: int = 2):
        FlakyShard.made += 1
        self.name, self.capacity, self.fail_on, self.requests = f"flaky{FlakyShard.made}", capacity, fail_on, 0
        self.pool = cf.ThreadPoolExecutor(capacity + 1)

    def submit(self, data):
        n, self.requests = self.requests, self.requests + 1

        def work():
            if n in self.fail_on:
                raise ShardLost("host died")
            return [Verdict(accepted=True, status="accepted", task_id=Task.from_dict(t).id,
                            reason=self.name).to_json() for t, _ in data]

        return self.pool.submit(work)

    def close(self):
        self.pool.shutdown(wait=False)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 30), fails=st.lists(st.sets(st.integers(0, 12), max_size=4), min_size=1, max_size=3),
       chunk=st.integers(1, 4))
def test_every_pair_gets_exactly_one_verdict_whatever_shards_are_lost(n, fails, chunk):
    pairs = pairs_of(n)
    shard_set = ShardSet([FlakyShard(f) for f in fails], replace=lambda old: FlakyShard(set()), chunk=chunk)
    reported: Counter = Counter()
    verdicts = schedule(shard_set, pairs, max_attempts=10, on_verdicts=lambda idx, vs: reported.update(idx))
    assert [v.task_id for v in verdicts] == [t.id for t, _ in pairs]  # order kept, none missing
    assert all(v.accepted for v in verdicts)
    assert reported == Counter(range(n))  # each reported exactly once
    for s in shard_set.shards:
        s.close()


def test_a_pair_that_keeps_killing_its_host_is_reported_crashed_once():
    shard_set = ShardSet([FlakyShard(set(range(100)))], replace=lambda old: FlakyShard(set(range(100))))
    verdicts = schedule(shard_set, pairs_of(2), max_attempts=3)
    assert [v.status for v in verdicts] == ["crashed", "crashed"]
    assert "lost the verification host 3 times" in verdicts[0].reason
    assert shard_set.replaced >= 2  # every lost host was replaced


def test_losing_every_shard_without_replacement_fails_loudly():
    with pytest.raises(ExecutorError, match="every verification shard was lost"):
        schedule(ShardSet([FlakyShard({0})], replace=None), pairs_of(1))


def test_a_host_process_killed_mid_batch_loses_no_verdict_and_reports_no_duplicate():
    executor = LocalExecutor("triton", "cpu", {"delay_s": 0.3}, cpu_workers=1, cpu_shards=2,
                             verifier_path=FAKE)
    try:
        first_pids = {s.pid for s in executor.shards}
        victim = executor.shards[0]
        reported: Counter = Counter()
        killed = threading.Event()

        def progress(idx, vs):
            reported.update(idx)
            if sum(reported.values()) >= 2 and not killed.is_set():
                killed.set()
                os.kill(victim.pid, signal.SIGKILL)

        pairs = pairs_of(12)
        verdicts = executor.verify_many(pairs, on_verdicts=progress)
        assert killed.is_set()
        assert [v.task_id for v in verdicts] == [t.id for t, _ in pairs]
        assert reported == Counter(range(12))
        assert executor.main.replaced == 1 and len(executor.shards) == 2
        assert victim.pid not in {s.pid for s in executor.shards}
        judged_by = {v.reason.split()[1] for v in verdicts}
        assert judged_by - {str(p) for p in first_pids}  # the replacement host judged some
    finally:
        executor.close()


def test_make_executor_from_config_and_unknown_names():
    with make_executor({"name": "local", "cpu_workers": 2, "verifier_path": FAKE}, backend="triton", device="cpu",
                       verifier={"delay_s": 0.0, "workers": 7}) as ex:
        assert ex.workers == 2 and len(ex.shards) == 1
        assert ex.verify(*pairs_of(1)[0]).accepted
        assert "local: 1 shard(s), 2 worker(s) on cpu" in ex.describe()
    with pytest.raises(ExecutorError, match="Known executors: local, ray"):
        make_executor({"name": "slurm"}, backend="triton", device="cpu")


class WarmingVerifier(SlowVerifier):
    """Takes a while to start and says how its warm-up went, as a GPU shard's Verifier does."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        time.sleep(0.3)
        self.warm_up_report = "2/2 warm-up verdicts accepted in 0.3 s"


def test_a_process_shard_says_how_long_it_took_to_start_and_how_its_warm_up_went():
    # a GPU shard's start (pools, CUDA contexts, warm-up verdicts) is the run's first 36 s on the H200:
    # said, not guessed
    with LocalExecutor("triton", "cpu", {"delay_s": 0.0}, cpu_workers=1, processes=True,
                       verifier_path="tests.test_executor:WarmingVerifier") as ex:
        described = ex.describe()
    started = re.search(r"started in ([0-9.]+) s \(2/2 warm-up verdicts accepted in 0.3 s\)", described)
    assert started and float(started.group(1)) >= 0.3, described


def test_cpu_stage_result_is_final_for_what_did_not_compile(monkeypatch):
    class Picky(SlowVerifier):
        def verify(self, task, candidate):
            v = super().verify(task, candidate)
            if "bad" in candidate.source:
                v.accepted = v.compiled = False
                v.status, v.reason = "rejected", "compile: bad"
            return v

    import tests.test_executor as me

    monkeypatch.setattr(me, "SlowVerifier", Picky)  # for the in-process main shard
    ex = LocalExecutor("triton", "cpu", {"delay_s": 0.0}, cpu_workers=1, verifier_path=FAKE,
                       cpu_stage={"checks": ["static"], "workers": 1})
    try:
        pairs = [(Task(source="# a\n"), Candidate(source="good")), (Task(source="# b\n"), Candidate(source="bad"))]
        verdicts = ex.verify_many(pairs)
        # The CPU stage runs in its own process (original SlowVerifier: accepts both); the main shard
        # (Picky) then rejects "bad". Both verdicts exist, in order.
        assert [v.task_id for v in verdicts] == [t.id for t, _ in pairs]
        assert verdicts[0].accepted and not verdicts[1].accepted
    finally:
        ex.close()


# --------------------------------------------------------------------------- the executor registry


def test_executors_come_from_the_registry_and_satisfy_the_contract():
    from core import plugins
    from core.contracts import Executor

    pm = plugins.make_plugin_manager(autoload=False)
    executors = plugins.build_registry("executor", pm)
    assert executors.names() == ["local", "ray"]
    assert executors.owners == {"local": "plugins.executors.local", "ray": "plugins.executors.ray"}
    with make_executor({"name": "local", "cpu_workers": 1, "verifier_path": FAKE}, backend="triton",
                       device="cpu", verifier={"delay_s": 0.0}) as ex:
        assert isinstance(ex, Executor) and isinstance(ex, LocalExecutor)
        seen: list[int] = []
        verdicts = ex.verify_many(pairs_of(3), on_verdicts=lambda idx, vs: seen.extend(idx))
        assert sorted(seen) == [0, 1, 2] and all(v.accepted for v in verdicts)
    assert ex.workers == 0  # closed


def test_the_old_import_path_still_names_the_registered_executors():
    import core.verification.executor as executor

    assert executor.LocalExecutor is LocalExecutor
    assert executor.RayExecutor.__module__ == "plugins.executors.ray"
    with pytest.raises(AttributeError, match="no attribute 'SlurmExecutor'"):
        executor.SlurmExecutor  # noqa: B018


def test_the_local_executor_cannot_be_blocked(monkeypatch):
    from core import plugins

    monkeypatch.setenv(plugins.ENV_BLOCK, "plugins.executors.local,plugins.executors.ray")
    with pytest.warns(UserWarning, match="'plugins.executors.local', which cannot be blocked"):
        pm = plugins.make_plugin_manager(autoload=False)
    assert plugins.build_registry("executor", pm).names() == ["local"]  # ray was blocked, local stays
    assert not pm.is_blocked("plugins.executors.local") and pm.is_blocked("plugins.executors.ray")


def test_registering_the_executors_does_not_import_ray():
    """Ray is imported only when a Ray executor is built, so ``executor=local`` runs without it."""
    code = ("import sys\n"
            "import plugins.executors.ray\n"
            "from core.plugins import build_registry, make_plugin_manager\n"
            "build_registry('executor', make_plugin_manager(autoload=False))\n"
            "print('ray' in sys.modules)\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "KERNELZERO_DISABLE_AUTOLOAD": "1"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, text=True, capture_output=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "False"


@pytest.mark.gpu
def test_one_shard_per_gpu_each_pinned_to_its_gpu():
    import torch

    with LocalExecutor("triton", "cuda", {"delay_s": 0.05}, verifier_path=FAKE) as ex:
        assert len(ex.shards) == torch.cuda.device_count()
        verdicts = ex.verify_many(pairs_of(4 * len(ex.shards)))
        gpus = {v.reason.split()[-1] for v in verdicts}
        assert gpus == {str(i) for i in range(torch.cuda.device_count())}


class TimedShard(FlakyShard):
    """A shard whose every request takes ``delay_s`` per pair; it records when each request started."""

    def __init__(self, delays: dict[int, float], capacity: int = 1):
        super().__init__(set(), capacity)
        self.delays, self.started = delays, []

    def submit(self, data):
        self.started.append(time.monotonic())
        inner = super().submit

        def slow():
            time.sleep(sum(self.delays.get(int(Task.from_dict(t).source.split()[-1]), 0.01) for t, _ in data))
            return inner(data).result()

        return self.pool.submit(slow)


def test_one_slow_verdict_holds_back_only_its_own_slot():
    # a continuous queue: while pair 0 takes 0.6 s on one shard, the other shard finishes every other pair
    shards = [TimedShard({0: 0.6}), TimedShard({0: 0.6})]
    start = time.monotonic()
    verdicts = schedule(ShardSet(shards, replace=None, extra_in_flight=0), pairs_of(8))
    assert all(v.accepted for v in verdicts)
    assert time.monotonic() - start < 0.6 + 0.3  # waves of two would take ~4 x 0.6 s... one slot is slow only once
    for s in shards:
        s.close()


@settings(max_examples=10, deadline=None)
@given(n=st.integers(2, 12), budget_s=st.floats(0.0, 0.15))
def test_no_verification_starts_after_the_deadline_and_the_rest_are_reported_not_run(n, budget_s):
    shard = TimedShard({k: 0.05 for k in range(n)})
    deadline = time.monotonic() + budget_s
    verdicts = schedule(ShardSet([shard], replace=None, extra_in_flight=0), pairs_of(n), deadline=deadline)
    ran = [v for v in verdicts if v is not None]
    assert ran, "the first verification always runs"
    assert verdicts[:len(ran)] == ran and all(v is None for v in verdicts[len(ran):])  # in queue order
    assert all(t <= deadline + 0.02 for t in shard.started[1:])  # none started after the deadline
    if budget_s == 0.0:
        assert len(ran) == 1
    shard.close()

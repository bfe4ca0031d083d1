"""Training's overlapped verification through a verifier that streams (SharedVerification with ``verify_stream``):
each completion handed over starts as soon as a worker is free, the verdicts reach the right completions, and
the rewards are those of verification inside TRL's reward call."""

from __future__ import annotations

import concurrent.futures as cf
import time

import pytest
from test_hub_grpo import ParityVerifier, _shared
from train_fakes import KERNEL

from core.loop.step_clock import StepClock
from core.task import Candidate, Task
from core.verification.scheduling import ShardSet, schedule


class ParityShard:
    """A shard of two slots judging each request with ParityVerifier; a completion naming ``slow`` takes 0.8 s."""

    name, capacity = "parity", 2

    def __init__(self):
        self.pool = cf.ThreadPoolExecutor(3)
        self.judge = ParityVerifier()
        self.started: list[str] = []

    def submit(self, data):
        pairs = [(Task.from_dict(t), Candidate.from_dict(c)) for t, c in data]
        self.started += [c.source for _, c in pairs]

        def work():
            if any("slow" in c.source for _, c in pairs):
                time.sleep(0.8)
            return [v.to_json() for v in self.judge.verify_many(pairs)]

        return self.pool.submit(work)

    def close(self):
        self.pool.shutdown(wait=True)


class StreamingParity(ParityVerifier):
    """ParityVerifier's verdicts through the executors' scheduler (core.verification.scheduling.schedule)."""

    def __init__(self):
        super().__init__()
        self.shard = ParityShard()
        self.streams = 0

    def verify_stream(self, feed, on_verdicts):
        self.streams += 1
        schedule(ShardSet([self.shard], replace=None, extra_in_flight=0), [], on_verdicts=on_verdicts, feed=feed)


def _completions(n, slow=()):
    return [KERNEL + f"# variant {i}{' slow' if i in slow else ''}\n```" for i in range(n)]


def test_streamed_verdicts_reach_their_completions_and_give_the_synchronous_rewards():
    ParityVerifier.delay = 0.0
    completions = _completions(8, slow={0})
    verifier, clock = StreamingParity(), StepClock()
    shared, tasks = _shared(verifier, True, clock)
    task_ids = [tasks[i // 4].id for i in range(8)]
    assert shared.submit_early([task_ids[0]], [completions[0]]) == 1  # the slow one, ended first
    assert shared.submit(task_ids[:4], completions[:4]) == 3
    assert shared.submit(task_ids[4:], completions[4:]) == 4
    overlapped = shared.score(completions, task_ids)
    sync, _ = _shared(ParityVerifier(), False, StepClock())
    expected = sync.score(completions, task_ids)
    assert overlapped.totals == expected.totals and overlapped.per_term == expected.per_term
    assert [v.accepted for v in overlapped.verdicts] == [v.accepted for v in expected.verdicts]
    assert [v.candidate_id for v in overlapped.verdicts] == [v.candidate_id for v in expected.verdicts]
    assert verifier.streams == 1 and shared.verified_in_reward_call == 0 and shared.verifications == 8
    assert clock.value("verify") >= 0.8  # the slow verdict was within the stream's busy time
    assert clock.value("verdicts") == 8
    shared.close()
    verifier.shard.close()


def test_closing_drops_what_has_not_started_and_returns():
    ParityVerifier.delay = 0.0
    completions = _completions(6, slow=set(range(6)))
    verifier = StreamingParity()
    shared, tasks = _shared(verifier, True, StepClock())
    task_ids = [tasks[i // 3].id for i in range(6)]
    shared.submit(task_ids, completions)
    time.sleep(0.2)
    start = time.monotonic()
    shared.close()
    assert time.monotonic() - start < 1.5  # the two running (0.8 s), not three rounds of them
    assert len(verifier.shard.started) == 2
    verifier.shard.close()


def test_a_stream_that_fails_fails_the_reward_call_with_its_error():
    class Broken(ParityVerifier):
        def verify_stream(self, feed, on_verdicts):
            feed.wake.result()
            raise RuntimeError("every verification shard was lost")

    completions = _completions(4)
    shared, tasks = _shared(Broken(), True, StepClock())
    task_ids = [tasks[i // 2].id for i in range(4)]
    shared.submit(task_ids, completions)
    with pytest.raises(RuntimeError, match="shard was lost"):
        shared.score(completions, task_ids)
    shared.submit(task_ids, _completions(5)[1:])  # a later batch, after the failure: told, not hung
    shared.close()


def test_a_local_executor_streams_the_trainers_completions():
    from test_executor import FAKE

    from plugins.executors.local import LocalExecutor

    completions = _completions(4)
    with LocalExecutor("triton", "cpu", {"delay_s": 0.1}, cpu_workers=2, verifier_path=FAKE) as executor:
        shared, tasks = _shared(executor, True, StepClock())
        task_ids = [tasks[i // 2].id for i in range(4)]
        assert shared.submit(task_ids, completions) == 4
        scored = shared.score(completions, task_ids)
        shared.close()
    assert all(v.accepted for v in scored.verdicts) and shared.verified_in_reward_call == 0
    assert [v.candidate_id for v in scored.verdicts] == [c.id for c in scored.candidates]


class StagedParity(StreamingParity):
    """Verdicts that say where their time went, as the real verifier's do (``stage_s``, ``gpu_wait_s``)."""

    def __init__(self):
        super().__init__()
        self.shard.judge = self

    def verify_many(self, pairs):
        verdicts = ParityVerifier.verify_many(self, pairs)
        for v in verdicts:
            v.stage_s, v.gpu_wait_s = {"trials": 0.5, "load": 0.1}, 0.25
        return verdicts


@pytest.mark.parametrize("overlap", [True, False])
def test_a_steps_breakdown_says_where_a_verdicts_time_went(overlap):
    from core.loop.step_clock import breakdown, breakdown_line

    ParityVerifier.delay = 0.0
    completions = _completions(4) + _completions(2)  # two repeated: verified once, counted once
    verifier, clock = StagedParity(), StepClock()
    shared, tasks = _shared(verifier, overlap, clock)
    task_ids = [tasks[i % 2].id for i in range(6)]
    task_ids[4:] = task_ids[:2]
    shared.submit(task_ids, completions)
    shared.score(completions, task_ids)
    row = clock.step_end()
    assert row["throughput/verdicts"] == 4
    assert row["verify_stage/trials_s"] == pytest.approx(2.0) and row["verify_stage/gpu_wait_s"] == pytest.approx(1.0)
    summary = breakdown([row])
    assert summary["per_verdict/trials"] == pytest.approx(0.5) and summary["per_verdict/load"] == pytest.approx(0.1)
    assert breakdown_line("correctness step time", summary).endswith(
        "a verdict's slowest stages: trials 0.50 s, gpu_wait 0.25 s, load 0.10 s")
    shared.close()
    verifier.shard.close()


def test_stages_that_took_no_time_are_not_named():
    from core.loop.step_clock import breakdown_line

    summary = {"steps": 1.0, "step_s": 1.0, "verify_s": 0.1, "verify_share": 0.1, "tokens_per_s": 10.0,
               "verdicts_per_s": 5.0, "per_verdict/static": 0.001, "per_verdict/gpu_wait": 0.0,
               **{f"{p}_{k}": 0.25 for p in ("generate", "wait", "optimize", "other") for k in ("s", "share")}}
    assert "slowest stages" not in breakdown_line("x", summary)
    summary["per_verdict/trials"] = 1.5
    assert breakdown_line("x", summary).endswith("a verdict's slowest stages: trials 1.50 s")

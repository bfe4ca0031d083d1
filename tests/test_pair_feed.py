"""Pairs handed to a running schedule (core/verification/scheduling.py, PairFeed; Executor.verify_stream): training
verifies completions as they are generated, and a batch per call waited at each call's slowest verdict."""

from __future__ import annotations

import threading
import time
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st
from test_executor import FAKE, FlakyShard, TimedShard, pairs_of

from core.verification.executor import PairFeed, ShardSet, schedule
from plugins.executors.local import LocalExecutor


def _feed_from_thread(feed: PairFeed, batches: list[list], pause_s: float, then_close: bool = True) -> threading.Thread:
    def run():
        for batch in batches:
            feed.put(batch)
            time.sleep(pause_s)
        if then_close:
            feed.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.integers(0, 6), min_size=1, max_size=5), fails=st.sets(st.integers(0, 10), max_size=3),
       chunk=st.integers(1, 3))
def test_every_fed_pair_gets_exactly_one_verdict_by_its_feed_index_whatever_shards_are_lost(sizes, fails, chunk):
    pairs = pairs_of(sum(sizes))
    batches, k = [], 0
    for size in sizes:
        batches.append(pairs[k:k + size])
        k += size
    feed = PairFeed()
    shard_set = ShardSet([FlakyShard(fails)], replace=lambda old: FlakyShard(set()), chunk=chunk)
    reported: Counter = Counter()
    by_index: dict[int, str] = {}

    def heard(idx, verdicts):
        reported.update(idx)
        by_index.update((i, v.task_id) for i, v in zip(idx, verdicts))

    thread = _feed_from_thread(feed, batches, 0.005)
    verdicts = schedule(shard_set, [], max_attempts=10, on_verdicts=heard, feed=feed)
    thread.join()
    assert [v.task_id for v in verdicts] == [t.id for t, _ in pairs]
    assert reported == Counter(range(len(pairs)))  # each reported once, by the order it was put in
    assert by_index == {i: t.id for i, (t, _) in enumerate(pairs)}
    for s in shard_set.shards:
        s.close()


def test_a_slow_verdict_does_not_hold_back_pairs_fed_after_it():
    # pair 0 takes 0.8 s; pairs 1-9 arrive one by one while it runs and are all judged before it ends
    # (verify_many called once per arrival would have waited for the slow one before starting the next batch)
    shard = TimedShard({0: 0.8}, capacity=2)
    feed, landed = PairFeed(), {}
    pairs = pairs_of(10)
    start = time.monotonic()
    thread = _feed_from_thread(feed, [[p] for p in pairs], 0.02)
    schedule(ShardSet([shard], replace=None, extra_in_flight=0), [], on_verdicts=lambda idx, vs: landed.update(
        {i: time.monotonic() - start for i in idx}), feed=feed)
    thread.join()
    assert sorted(landed) == list(range(10))
    assert max(landed[i] for i in range(1, 10)) < landed[0]
    shard.close()


def test_a_cancelled_feed_starts_nothing_more_and_returns_once_the_running_pairs_end():
    shard = TimedShard({k: 0.3 for k in range(6)}, capacity=1)
    feed = PairFeed()
    feed.put(pairs_of(6))
    threading.Timer(0.1, lambda: feed.close(cancel=True)).start()
    start = time.monotonic()
    verdicts = schedule(ShardSet([shard], replace=None, extra_in_flight=0), [], feed=feed)
    assert time.monotonic() - start < 0.9  # the first pair's 0.3 s, not six
    assert verdicts[0] is not None and verdicts[0].accepted
    assert all(v is None for v in verdicts[1:]) and len(shard.started) == 1
    shard.close()


def test_an_executor_streams_through_its_host_processes():
    pairs = pairs_of(6)
    with LocalExecutor("triton", "cpu", {"delay_s": 0.2}, cpu_workers=2, cpu_shards=2, verifier_path=FAKE) as ex:
        feed, heard = PairFeed(), Counter()
        thread = _feed_from_thread(feed, [pairs[:2], pairs[2:5], pairs[5:]], 0.05)
        ex.verify_stream(feed, lambda idx, vs: heard.update(i for i, v in zip(idx, vs) if v.accepted))
        thread.join()
    assert heard == Counter(range(6))


def test_putting_into_a_closed_feed_is_refused():
    import pytest

    from core.verification.executor import ExecutorError

    feed = PairFeed()
    feed.close()
    with pytest.raises(ExecutorError, match="closed"):
        feed.put(pairs_of(1))


def test_waiting_for_the_last_verdicts_of_a_closed_feed_burns_no_cpu():
    shard = TimedShard({0: 0.8}, capacity=1)
    feed = PairFeed()
    feed.put(pairs_of(1))
    feed.close()
    cpu = time.process_time()
    verdicts = schedule(ShardSet([shard], replace=None, extra_in_flight=0), [], feed=feed)
    assert verdicts[0].accepted
    assert time.process_time() - cpu < 0.3  # 0.8 s of waiting, not of polling
    shard.close()


def test_schedules_on_several_threads_share_a_host_process_without_mixing_requests():
    # a training stream, the reward call's own verify_many and a held-out evaluation can use one executor at once:
    # their requests cross the same pipe to the host process
    with LocalExecutor("triton", "cpu", {"delay_s": 0.0}, cpu_workers=2, processes=True, verifier_path=FAKE) as ex:
        batches = [pairs_of(60) for _ in range(4)]
        results: dict[int, list] = {}

        def run(k):
            results[k] = ex.verify_many(batches[k])

        threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for k, batch in enumerate(batches):
        assert [v.task_id for v in results[k]] == [t.id for t, _ in batch] and all(v.accepted for v in results[k])


def test_an_executor_with_a_cpu_stage_streams_what_was_put_meanwhile_through_both_stages():
    pairs = pairs_of(7)
    with LocalExecutor("triton", "cpu", {"delay_s": 0.05}, cpu_workers=2, verifier_path=FAKE,
                       cpu_stage={"checks": ["static"], "workers": 1}) as ex:
        feed, heard = PairFeed(), Counter()
        thread = _feed_from_thread(feed, [pairs[:3], pairs[3:4], pairs[4:]], 0.1)
        ex.verify_stream(feed, lambda idx, vs: heard.update(i for i, v in zip(idx, vs) if v.accepted))
        thread.join()
    assert heard == Counter(range(7))

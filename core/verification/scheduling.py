"""How verification pairs reach the shards of an executor (:mod:`core.verification.executor`).

:func:`schedule` runs pairs on a :class:`ShardSet` as one continuous queue: a shard gets its next pair as soon
as it has room, so one slow verdict holds back nothing but its own slot. The pairs are a batch known up front
(``Executor.verify_many``) or, with a :class:`PairFeed`, also those handed over while it runs
(``Executor.verify_stream``: training's verification of completions as they are generated, where a batch per
call would wait at each call's slowest verdict with the other slots idle).
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from core.task import Candidate, Task
from core.verdict import Verdict
from core.verification.dispatch import DispatchQueue

Pair = tuple[Task, Candidate]


class ShardLost(RuntimeError):
    """The process or actor holding a shard is gone; its unfinished work must run elsewhere."""


class ExecutorError(RuntimeError):
    """The executor cannot run (no shard could start, Ray missing ...)."""


def encode_pairs(pairs: Sequence[Pair]) -> list[list[dict[str, Any]]]:
    return [[t.to_dict(), c.to_dict()] for t, c in pairs]


class PairFeed:
    """Pairs handed to a running :func:`schedule` from other threads, in order: pair ``k`` put in all is the
    schedule's index ``k``. :meth:`close` says no more will come; ``close(cancel=True)`` also drops the pairs
    not yet started (they get no verdict)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: list[Pair] = []
        self._closed = False
        self.cancelled = False
        self.put_count = 0
        self.wake: cf.Future = cf.Future()  # done when something was put or the feed closed

    def put(self, pairs: Sequence[Pair]) -> int:
        """Hand ``pairs`` over; returns the schedule index of the first of them."""
        with self._lock:
            if self._closed:
                raise ExecutorError("the pair feed is closed")
            first = self.put_count
            self._pending.extend(pairs)
            self.put_count += len(pairs)
            self._signal()
        return first

    def close(self, cancel: bool = False) -> None:
        with self._lock:
            self._closed = True
            if cancel:
                self.cancelled = True
                self._pending.clear()
            self._signal()

    def take(self) -> list[Pair]:
        """The pairs put since the last take (the schedule's side)."""
        with self._lock:
            taken, self._pending = self._pending, []
            if not self._closed:
                self.wake = cf.Future()
            return taken

    @property
    def done(self) -> bool:
        with self._lock:
            return self._closed and not self._pending

    def _signal(self) -> None:
        if not self.wake.done():
            self.wake.set_result(None)


@dataclass
class ShardSet:
    """Shards of one kind and how to replace a lost one."""

    shards: list[Any]
    replace: Callable[[Any], Any] | None = None
    chunk: int = 1  # pairs per request
    extra_in_flight: int = 1  # requests beyond a shard's capacity kept queued, so its pool never idles
    replaced: int = 0
    lost: list[str] = field(default_factory=list)


def schedule(shard_set: ShardSet, pairs: Sequence[Pair], max_attempts: int = 3,
             on_verdicts: Callable[[list[int], list[Verdict]], None] | None = None,
             deadline: float | None = None, footprints: Mapping[int, Sequence[int | None]] | None = None,
             feed: PairFeed | None = None) -> list[Verdict | None]:
    """Run ``pairs`` on the shards; every pair gets exactly one verdict, in input order.

    One continuous queue: a shard gets its next chunk as soon as it has room, so one slow verdict
    holds back nothing but its own slot. ``deadline`` (``time.monotonic()``): no chunk is started
    after it (the first excepted, so a run always measures something); the pairs never started
    are ``None`` in the result.

    Requests of ``chunk`` pairs go out, ``capacity + extra_in_flight`` per shard. When a shard is lost its
    unfinished chunks return to the front of the queue (so they run next, elsewhere) and the shard
    is replaced; a pair whose shard was lost ``max_attempts`` times gets a ``crashed`` verdict.

    ``footprints`` (``id(shard)`` -> each pair's estimated GPU memory there, :func:`plan_memory`): a shard
    with room starts the first pair that fits beside those it runs (:class:`~core.verification.dispatch.
    DispatchQueue`), not the head of the queue that would wait for memory in its slot.

    ``feed``: more pairs, put while it runs, each queued behind those before it (their indices follow ``pairs``');
    it returns once the feed is closed and every pair has its verdict (a cancelled feed's unstarted pairs: None).
    """
    pairs = list(pairs)
    n = len(pairs)
    results: list[Verdict | None] = [None] * n
    attempts = [0] * n
    queue = DispatchQueue(n, (lambda shard: footprints.get(id(shard))) if footprints else None)
    encoded = encode_pairs(pairs)
    running: dict[cf.Future, tuple[Any, list[int]]] = {}
    released = _EarlyReleases(shard_set.shards if footprints else [])
    never_started: set[int] = set()  # dropped at the deadline

    def occupancy(shard: Any) -> tuple[int, int]:
        """(requests holding a slot, requests in flight) on ``shard``. A request whose pairs all gave their GPU
        back (waiting on interp_races on the CPU) holds no slot: the next starts beside its wait."""
        chunks = [chunk for owner, chunk in running.values() if owner is shard]
        holding = sum(1 for chunk in chunks if not all(i in released.given_back for i in chunk))
        return holding, len(chunks)

    def take_fed() -> None:
        if feed is None:
            return
        more = feed.take()
        if feed.cancelled:
            never_started.update(queue.clear())  # nothing more is wanted: finish what runs
            return
        if more:
            first = len(pairs)
            pairs.extend(more)
            results.extend([None] * len(more))
            attempts.extend([0] * len(more))
            encoded.extend(encode_pairs(more))
            queue.add(range(first, first + len(more)))

    def dispatch() -> None:
        if deadline is not None and len(queue) < len(pairs) and time.monotonic() > deadline:
            never_started.update(queue.clear())  # over the budget: finish what runs, start nothing more
        for shard in list(shard_set.shards):
            while queue:
                holding, in_flight = occupancy(shard)  # at most twice the capacity in flight
                if (holding >= shard.capacity + shard_set.extra_in_flight
                        or in_flight >= 2 * shard.capacity + shard_set.extra_in_flight):
                    break
                chunk = queue.take(shard, shard_set.chunk, holding)
                if not chunk:
                    break  # the next pairs would wait for memory the running ones hold
                running[shard.submit([encoded[i] for i in chunk])] = (shard, chunk)

    def lose(shard: Any, reason: str) -> None:
        if shard not in shard_set.shards:
            return
        shard_set.shards.remove(shard)
        shard_set.lost.append(f"{shard.name}: {reason}")
        try:
            shard.close()
        except Exception:
            pass
        if shard_set.replace is not None:
            try:
                shard_set.shards.append(shard_set.replace(shard))
                shard_set.replaced += 1
            except Exception as exc:
                shard_set.lost.append(f"replacement for {shard.name} failed: {exc}")
        if not shard_set.shards:
            raise ExecutorError("every verification shard was lost: " + "; ".join(shard_set.lost[-4:]))

    take_fed()
    dispatch()
    try:
        while running or (feed is not None and not feed.done):
            # a closed feed's wake stays set: waited on, it would turn this loop into a spin until the last verdict
            wake = [released.wake] + ([feed.wake] if feed is not None and not feed.done else [])
            done, _ = cf.wait([*running, *wake], return_when=cf.FIRST_COMPLETED)
            take_fed()
            released.apply(running, queue, pairs)
            for future in [f for f in done if f in running]:
                shard, chunk = running.pop(future)
                queue.finished(shard, [i for i in chunk if i not in released.given_back])
                released.given_back.difference_update(chunk)  # a pair run again is counted again
                try:
                    answers = future.result()
                except ShardLost as exc:
                    retry = []
                    for i in chunk:
                        attempts[i] += 1
                        if attempts[i] >= max_attempts:
                            task, cand = pairs[i]
                            results[i] = Verdict.failure(
                                "crashed", f"lost the verification host {attempts[i]} times (last: {exc})",
                                task_id=task.id, candidate_id=cand.id)
                        else:
                            retry.append(i)
                    queue.put_back(retry)
                    lose(shard, str(exc))
                    continue
                fresh_idx, fresh = [], []
                for i, text in zip(chunk, answers):
                    if results[i] is None:  # exactly once, even if a retried chunk also finishes
                        results[i] = Verdict.from_json(text)
                        fresh_idx.append(i)
                        fresh.append(results[i])
                if on_verdicts and fresh:
                    on_verdicts(fresh_idx, fresh)
            dispatch()
    finally:
        released.stop()
    missing = [i for i, v in enumerate(results) if v is None and i not in never_started]
    if missing:  # cannot happen unless a shard answered short; never return a hole
        raise ExecutorError(f"{len(missing)} pairs got no verdict (first index {missing[0]})")
    return results


class _EarlyReleases:
    """Pairs whose verification gave its GPU memory back before its verdict (a shard's ``watch_gpu_release``,
    in process or relayed by its host): the dispatch counts their footprint free at once. ``wake``: a future
    done when one came in, so that the scheduler's wait returns."""

    def __init__(self, shards: Sequence[Any]):
        self.lock = threading.Lock()
        self.pending: list[tuple[Any, str, str]] = []
        self.given_back: set[int] = set()  # pair indices whose footprint the queue already freed
        self.wake: cf.Future = cf.Future()
        self.watched = [s for s in shards if callable(getattr(s, "watch_gpu_release", None))]
        for shard in self.watched:
            shard.watch_gpu_release(lambda task_id, cand_id, shard=shard: self._came(shard, task_id, cand_id))

    def _came(self, shard: Any, task_id: str, cand_id: str) -> None:
        with self.lock:
            self.pending.append((shard, task_id, cand_id))
            if not self.wake.done():
                self.wake.set_result(None)

    def apply(self, running: dict[cf.Future, tuple[Any, list[int]]], queue: DispatchQueue,
              pairs: Sequence[Pair]) -> None:
        """Free the footprints of the pairs reported since the last call (the first running match of each)."""
        with self.lock:
            came, self.pending = self.pending, []
            self.wake = cf.Future()
        for shard, task_id, cand_id in came:
            match = next((i for s, chunk in running.values() if s is shard for i in chunk
                          if i not in self.given_back and pairs[i][0].id == task_id and pairs[i][1].id == cand_id),
                         None)
            if match is not None:
                self.given_back.add(match)
                queue.finished(shard, [match])

    def stop(self) -> None:
        for shard in self.watched:
            shard.watch_gpu_release(None)



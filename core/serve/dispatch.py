"""The service's queue in front of an executor: admission ("busy" at once when full), FIFO dispatch of single
pairs to the executor's workers, and the numbers ``GET /metrics`` reports.

Every admitted pair gets exactly one verdict through its ``done`` callback: the executor's own (a candidate that
crashes its sandbox worker is a ``crashed`` verdict, reached by the verifier), or, if the executor itself
raises, an ``error`` verdict saying why. Nothing admitted is dropped, even at shutdown: :meth:`Dispatcher.close`
stops admitting, drains what was admitted, then returns.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from core.task import Candidate, Task
from core.verdict import Verdict

Pair = tuple[Task, Candidate]
Done = Callable[[Verdict], None]

RATE_WINDOW_S = 60.0  # verdicts per second over this window
TIMES_KEPT = 2048  # check times kept for the percentiles


@dataclass
class Job:
    pair: Pair
    done: Done
    admitted: float  # time.monotonic() when admitted


def percentiles(values: Sequence[float], qs: Sequence[float] = (0.5, 0.9, 0.99)) -> dict[str, float]:
    """Nearest-rank percentiles of ``values`` (``{"p50": ..., "p99": ...}``; empty when there are none).

    >>> percentiles([4.0, 1.0, 3.0, 2.0], (0.5, 0.99))
    {'p50': 2.0, 'p99': 4.0}
    """
    if not values:
        return {}
    ordered = sorted(values)
    out = {}
    for q in qs:
        rank = max(1, -(-int(q * 1000) * len(ordered) // 1000))  # ceil(q * n), exact for q with 3 digits
        out[f"p{round(q * 100):g}"] = round(ordered[min(rank, len(ordered)) - 1], 6)
    return out


class Dispatcher:
    """Runs admitted pairs on ``executor`` (anything with ``verify(task, candidate)`` and ``workers``).

    :param max_queue: pairs waiting or in flight at most; :meth:`admit` refuses a request that would pass it.
    :param threads: pairs handed to the executor at once (default: its ``workers``, so its pool stays fed
        and a pair waits here, in order, rather than inside the executor).
    """

    def __init__(self, executor: Any, max_queue: int, threads: int | None = None):
        self.executor = executor
        self.max_queue = int(max_queue)
        self._queue: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._pending = 0  # admitted and not yet answered
        self._in_flight = 0
        self._closing = False
        self.started = time.monotonic()
        self.verdicts_total = 0
        self.by_status: collections.Counter[str] = collections.Counter()
        self.busy_total = 0
        self.executor_errors = 0
        self._answered: collections.deque[float] = collections.deque()  # monotonic times, RATE_WINDOW_S
        self._check_s: collections.deque[float] = collections.deque(maxlen=TIMES_KEPT)
        self._wait_s: collections.deque[float] = collections.deque(maxlen=TIMES_KEPT)
        n = max(1, int(threads or getattr(executor, "workers", 1) or 1))
        self._threads = [threading.Thread(target=self._run, name=f"kz-serve-{i}", daemon=True) for i in range(n)]
        for t in self._threads:
            t.start()

    # -- admission

    def admit(self, pairs: Sequence[Pair], done: Callable[[int, Verdict], None]) -> bool:
        """Queue every pair of a request, or none: False (and nothing queued) when the queue cannot take them
        all or the service is closing. ``done(index, verdict)`` is called once per pair, from a worker thread."""
        with self._lock:
            if self._closing or self._pending + len(pairs) > self.max_queue:
                self.busy_total += 1
                return False
            self._pending += len(pairs)
        now = time.monotonic()
        for i, pair in enumerate(pairs):
            self._queue.put(Job(pair, (lambda v, i=i: done(i, v)), now))
        return True

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def queue_depth(self) -> int:
        """Pairs admitted and not yet handed to the executor."""
        with self._lock:
            return self._pending - self._in_flight

    def retry_after_s(self) -> float:
        """A fair guess of when a slot frees: the median check time, at least one second."""
        times = list(self._check_s)
        return max(1.0, percentiles(times, (0.5,)).get("p50", 1.0)) if times else 1.0

    # -- work

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            with self._lock:
                self._in_flight += 1
            started = time.monotonic()
            task, candidate = job.pair
            try:
                verdict = self.executor.verify(task, candidate)
                if verdict is None:  # an executor's deadline; the service sets none, but never answer nothing
                    raise RuntimeError("the executor returned no verdict")
            except Exception as exc:  # the executor failed (every shard lost ...): this pair's verdict says so
                with self._lock:
                    self.executor_errors += 1
                verdict = Verdict.failure("error", f"verification service: the executor failed: "
                                          f"{type(exc).__name__}: {exc}"[:600], task_id=task.id, candidate_id=candidate.id)
            finished = time.monotonic()
            with self._lock:
                self._in_flight -= 1
                self._pending -= 1
                self.verdicts_total += 1
                self.by_status[verdict.status] += 1
                self._answered.append(finished)
                self._check_s.append(verdict.elapsed_s or finished - started)
                self._wait_s.append(started - job.admitted)
            try:
                job.done(verdict)
            except Exception:  # a caller that went away must not stop this worker thread
                pass

    # -- numbers

    def metrics(self) -> dict[str, Any]:
        """Queue depth, verdicts per second over the last minute, time per check and waiting time."""
        now = time.monotonic()
        with self._lock:
            while self._answered and now - self._answered[0] > RATE_WINDOW_S:
                self._answered.popleft()
            window = min(RATE_WINDOW_S, now - self.started) or 1e-9
            checks, waits = list(self._check_s), list(self._wait_s)
            return {
                "queue_depth": self._pending - self._in_flight,
                "in_flight": self._in_flight,
                "max_queue": self.max_queue,
                "workers": len(self._threads),
                "verdicts_total": self.verdicts_total,
                "verdicts_by_status": dict(self.by_status),
                "verdicts_per_s": round(len(self._answered) / window, 4),
                "busy_total": self.busy_total,
                "executor_errors": self.executor_errors,
                "check_s": {"mean": round(sum(checks) / len(checks), 6) if checks else None, **percentiles(checks)},
                "queue_wait_s": {"mean": round(sum(waits) / len(waits), 6) if waits else None, **percentiles(waits)},
                "uptime_s": round(now - self.started, 3),
                "closing": self._closing,
            }

    def close(self, drain_timeout_s: float = 600.0) -> None:
        """Admit nothing more; let every admitted pair finish (its caller gets its verdict), then stop."""
        with self._lock:
            self._closing = True
        for _ in self._threads:
            self._queue.put(None)  # after every admitted job: FIFO
        deadline = time.monotonic() + drain_timeout_s
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))

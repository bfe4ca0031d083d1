"""Which verification a shard starts next: its queue in order, or, on a GPU whose memory the verifier
admits (:mod:`core.verification.gpumemory`), the first one that fits beside those it already runs.

A shard verifies ``capacity`` pairs at once, and a verification waiting for GPU memory holds its slot.
On the H200 at KernelBench's real sizes (2026-12-05) level 1's elementwise and normalisation problems,
20-odd estimated at more than half the device, came up one after the other: every slot held one of them,
each waited for the device alone, and the small problems queued behind them, which could have run
beside each, had not been sent (1193 s of 2131 s of GPU waits in 24 verdicts were memory admission).

:class:`DispatchQueue` sends, into a free slot, the first pair in queue order whose estimated footprint
fits the shard's admitted memory beside the footprints it is already verifying; a shard running nothing
starts the head whatever its size (it runs alone). A pair passed over for :data:`HOLD_S` stops the
passing: nothing behind it starts until it has, so a large task waits at most that long plus the
running verifications' time. Without footprints (a CPU shard, an executor whose shards cannot plan) the
queue is first come, first served.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import time
from collections.abc import Callable, Sequence
from typing import Any

# How long a pair may be passed over by later ones that fit beside the running verifications (the
# admission's own backfill allows the same: core.verification.gpumemory.BACKFILL_WAIT_S).
HOLD_S = 30.0
# Pairs looked at past the head for one that fits (a queue of thousands is not scanned per slot).
SCAN = 256
PLAN_TIMEOUT_S = 180.0  # a shard that cannot say its tasks' footprints in this long is dispatched in order


class DispatchQueue:
    """The pairs not yet started (indices into the batch) and the footprints running on each shard.

    ``weights(shard)``: each pair's estimated footprint in bytes on ``shard`` (None: unknown);
    ``shard.memory_bytes``: the memory its verifier admits (None or absent: first come, first served)."""

    def __init__(self, n: int, weights: Callable[[Any], Sequence[int | None] | None] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.order: collections.deque[int] = collections.deque(range(n))
        self.weights = weights
        self.clock = clock
        self.running_bytes: dict[int, int] = collections.defaultdict(int)  # id(shard) -> bytes being verified
        self.passed_over: dict[int, float] = {}  # pair -> when a later pair first started ahead of it
        self.skips = 0  # pairs started ahead of an earlier one (for the run's report)

    def __len__(self) -> int:
        return len(self.order)

    def __bool__(self) -> bool:
        return bool(self.order)

    def _weight(self, shard: Any, i: int) -> int:
        ws = self.weights(shard) if self.weights is not None else None
        w = ws[i] if ws is not None and i < len(ws) else None
        return int(w or 0)

    def _budget(self, shard: Any) -> int | None:
        if self.weights is None or self.weights(shard) is None:
            return None
        budget = getattr(shard, "memory_bytes", None)
        return int(budget) if budget else None

    def take(self, shard: Any, size: int, running: int) -> list[int]:
        """Up to ``size`` pairs for ``shard``, which has ``running`` requests in flight; [] when none should
        start now (each would wait for memory the running ones hold)."""
        chunk: list[int] = []
        budget = self._budget(shard)
        while self.order and len(chunk) < size:
            if budget is None:
                chunk.append(self.order.popleft())
                continue
            i = self._fitting(shard, budget, idle=running == 0 and not chunk)
            if i is None:
                break
            chunk.append(i)
            self.running_bytes[id(shard)] += self._weight(shard, i)
        return chunk

    def _fitting(self, shard: Any, budget: int, idle: bool) -> int | None:
        if idle:  # nothing runs here: the head starts, alone if it must
            return self._start(0)
        used = self.running_bytes[id(shard)]
        now = self.clock()
        for k, i in enumerate(list(self.order)[:SCAN]):
            if used + self._weight(shard, i) <= budget:
                return self._start(k)
            if now - self.passed_over.get(i, now) >= HOLD_S:
                return None  # it has waited long enough: nothing behind it goes first
        return None

    def _start(self, k: int) -> int:
        now = self.clock()
        for earlier in list(self.order)[:k]:
            self.passed_over.setdefault(earlier, now)
        self.skips += 1 if k else 0
        i = self.order[k]
        del self.order[k]
        self.passed_over.pop(i, None)
        return i

    def finished(self, shard: Any, chunk: Sequence[int]) -> None:
        """``chunk`` ended on ``shard`` (verdicts, or the shard was lost): its memory is free again."""
        if self._budget(shard) is None:
            return
        self.running_bytes[id(shard)] = max(0, self.running_bytes[id(shard)] -
                                            sum(self._weight(shard, i) for i in chunk))

    def add(self, pairs: Sequence[int]) -> None:
        """Pairs that arrived after the queue was made (a fed schedule), behind those waiting."""
        self.order.extend(pairs)

    def put_back(self, chunk: Sequence[int]) -> None:
        """Pairs to run next (their shard was lost)."""
        self.order.extendleft(reversed(list(chunk)))

    def clear(self) -> list[int]:
        """Start nothing more; the pairs never started."""
        left = list(self.order)
        self.order.clear()
        return left


def plan_memory(shards: Sequence[Any], pairs: Sequence[tuple[Any, Any]],
                timeout_s: float = PLAN_TIMEOUT_S) -> dict[int, list[int | None]]:
    """Each planning shard's estimate of every pair's footprint (``id(shard)`` -> bytes per pair), asked of
    all of them at once (``shard.memory_plan(tasks)``: a future of ``{"capacity", "bytes"}``); sets
    ``shard.memory_bytes``. A shard that cannot plan (no such method, no admission, an error, too slow) is
    left out: it takes its pairs in order."""
    tasks = list({t.id: t for t, _ in pairs}.values())
    asked = {}
    for shard in shards:
        planner = getattr(shard, "memory_plan", None)
        if callable(planner):
            try:
                asked[id(shard)] = (shard, planner(tasks))
            except Exception:  # noqa: BLE001  (a shard that cannot plan is dispatched in order)
                continue
    deadline = time.monotonic() + timeout_s
    plans: dict[int, list[int | None]] = {}
    for key, (shard, future) in asked.items():
        try:
            answer = future.result(timeout=max(0.0, deadline - time.monotonic()))
        except (cf.TimeoutError, Exception):  # noqa: BLE001
            continue
        capacity = (answer or {}).get("capacity")
        if not capacity:
            continue
        shard.memory_bytes = int(capacity)
        by_task = answer.get("bytes") or {}
        plans[key] = [by_task.get(t.id) for t, _ in pairs]
    return plans

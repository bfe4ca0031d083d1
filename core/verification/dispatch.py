"""Which verification a shard starts next: its queue in order, or, on a GPU whose memory the verifier
admits (:mod:`core.verification.gpumemory`), the first one that fits beside those it already runs.

A shard verifies ``capacity`` pairs at once, and a verification waiting for GPU memory holds its slot.
On the H200 at KernelBench's real sizes (2026-12-05) level 1's elementwise and normalisation problems,
20-odd estimated at more than half the device, came up one after the other: every slot held one of them,
each waited for the device alone, and the small problems queued behind them, which could have run
beside each, had not been sent (1193 s of 2131 s of GPU waits in 24 verdicts were memory admission).

:class:`DispatchQueue` sends, into a free slot, the first pair in queue order whose estimated footprint
fits the shard's admitted memory beside the footprints it is already verifying; a shard running nothing
starts the head whatever its size (it runs alone). A pair passed over for :data:`HOLD_S` is *held*: its
footprint is reserved, and a pair behind it starts only where it fits both beside the running ones now
and beside the held pair together with the pairs behind it started since the hold (backfill with a
reservation: those never delay it; it starts once the ones it waits for, those started before the hold and
those ahead of it in the queue, are done). Before, a held pair stopped every start behind it, and level 1's
large problems, one after another in the queue, each held the next: a chain that ran one verification at a
time (on the H100, 2026-12-06, for 125 of 427 s, though most of that time went to problems over the whole
admitted memory, which run alone anyway). Only the first held pair in the queue is a reservation; those
behind it are reserved in turn, as each becomes the first. While every held pair was one, a held pair that
needs the device alone (`34_InstanceNorm`, 135 GiB estimated of 125.8 admitted) let nothing start behind it
from its hold on: on the H200 (2026-12-07) level 1's twenty elementwise and norm problems ran one at a time
for 120 s with the GPU idle a third of that time, while the small problems queued behind all of them. Without
footprints (a CPU shard, an executor whose shards cannot plan) the queue is first come, first served.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import time
from collections.abc import Callable, Sequence
from typing import Any

# How long a pair may be passed over by any later one that fits beside the running verifications, before
# its footprint is reserved (the admission's own backfill does the same: core.verification.gpumemory).
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
        # id(shard) -> {pair: (bytes, when it started)} being verified there
        self.running: dict[int, dict[int, tuple[int, float]]] = collections.defaultdict(dict)
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

    def running_bytes(self, shard: Any) -> int:
        """The estimated bytes ``shard`` is verifying now."""
        return sum(w for w, _ in self.running[id(shard)].values())

    def take(self, shard: Any, size: int, running: int) -> list[int]:
        """Up to ``size`` pairs for ``shard``, which has ``running`` requests in flight; [] when none should
        start now (each would wait for memory the running ones hold, or delay a held pair)."""
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
            self.running[id(shard)][i] = (self._weight(shard, i), self.clock())
        return chunk

    def _fitting(self, shard: Any, budget: int, idle: bool) -> int | None:
        if idle:  # nothing runs here: the head starts, alone if it must
            return self._start(0)
        used = self.running_bytes(shard)
        now = self.clock()
        held: tuple[int, int, float] | None = None  # the reservation ahead: (pair, bytes, when its hold began)
        for k, i in enumerate(list(self.order)[:SCAN]):
            w = self._weight(shard, i)
            if used + w <= budget and (held is None or self._beside_reservation(shard, w, held, budget)):
                return self._start(k)
            first_passed = self.passed_over.get(i)
            if held is None and first_passed is not None and now - first_passed >= HOLD_S:
                held = (i, w, first_passed + HOLD_S)  # only the first: those behind it wait their turn as first
        return None

    def _beside_reservation(self, shard: Any, nbytes: int, hold: tuple[int, int, float], budget: int) -> bool:
        """Whether a pair of ``nbytes`` fits beside a held pair's reservation and the pairs queued behind that
        one started on ``shard`` since its hold began (its backfills: they may still run when the pairs it
        waits for, those started before and those ahead of it in the queue, are done)."""
        pair, reserved, since = hold
        backfilled = sum(w for j, (w, t) in self.running[id(shard)].items() if j > pair and t >= since)
        return nbytes + reserved + backfilled <= budget

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
        for i in chunk:
            self.running[id(shard)].pop(i, None)

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

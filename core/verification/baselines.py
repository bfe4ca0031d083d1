"""Measurements of a task's reference made once and shared by every verification of that task.

The performance stage compares each candidate with the task's eager (and ``torch.compile``)
model. Those times do not depend on the candidate, so the judge measures them once per task and
device, in a reference worker, and keeps them here: concurrent verifications of one task wait for
the one measurement instead of each making its own, and a failed measurement is not kept (the next
verification tries again).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Hashable


class BaselineCache:
    """``get(key, measure)``: the value kept under ``key``, or ``measure()``'s, made once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[Hashable, Any] = {}
        self._measuring: dict[Hashable, threading.Lock] = {}
        self.measured = 0  # how many measurements were made (the rest were shared)

    def get(self, key: Hashable, measure: Callable[[], Any]) -> tuple[Any, bool]:
        """``(value, shared)``: ``shared`` is True when another verification measured it.
        An exception from ``measure`` reaches the caller and nothing is kept."""
        with self._lock:
            if key in self._values:
                return self._values[key], True
            gate = self._measuring.setdefault(key, threading.Lock())
        with gate:  # one measurement per key; the others wait for it here
            with self._lock:
                if key in self._values:
                    return self._values[key], True
            value = measure()
            with self._lock:
                self._values[key] = value
                self.measured += 1
                self._measuring.pop(key, None)
            return value, False

    def __len__(self) -> int:
        with self._lock:
            return len(self._values)

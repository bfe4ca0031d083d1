"""The timer base: what a timing method provides, so the performance check can take another one (as
KernelBench's ``get_timing_function(method)`` picks cuda-events, host time or a profiler by name).

The built-in method is ``plugins.verifiers.performance.timing.GpuTimer`` (CUDA events, a device-wide
synchronise, L2 flushed, fresh inputs, the median). A new method implements :class:`Timer`; the files
it touches are listed in docs/architecture.md ("change how GPU timing is measured").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Timing(Protocol):
    """What a timer measured: the median of the timed runs and a plain record for the verdict."""

    method: str  # one line naming how it measured (events, flush, inputs, statistic)

    @property
    def median_ms(self) -> float: ...

    def to_dict(self, keep_samples: bool = False) -> dict[str, Any]: ...


@runtime_checkable
class Timer(Protocol):
    """Times a callable; made once per worker and reused across candidates."""

    def time(self, fn: Callable[..., Any], make_args: Callable[[int], Sequence[Any]], *,
             check: Callable[[int, Sequence[Any], Any], None] | None = None,
             check_runs: Sequence[int] = ()) -> Timing:
        """Time ``fn(*make_args(i))``; ``make_args(i)`` runs before run ``i``, outside the timed window.

        ``check(i, args, out)`` runs (outside the window) after the runs listed in ``check_runs``
        (negative indices count from the end), so outputs are verified while they are timed."""

"""Kernels a backend lends the judge for its own work on very large tensors: the plain bound's passes over an
output and the input digest's sums. The engine names no toolchain; it asks the registered backends'
optional ``judge_kernels(device)`` (``core.contracts.OPTIONAL_MEMBERS["Backend"]``) and takes the first answer
that is not None. Without one, torch computes the same figures (slower: a chunk and a kernel per operation).

Why: at KernelBench's level-1 sizes an output holds 1.6e9 elements; torch's chunked plain bound ran ~25 kernels
per 2^24-element chunk and pass, about 1 TB of GPU traffic per comparison and ~5 TB for the domain probe's
median, a dozen comparisons per verification on a GPU six verifications share. A lent kernel reads both outputs
once per pass. It must give torch's answers exactly (its float32 rounding, no fused multiply-add), which the
lending backend's tests hold it to.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class BoundStats:
    """One pass over a reference output ``e`` and a candidate's ``g`` for the plain bound
    (:func:`core.verification.plainbound.within_plain_bound`'s rules)."""

    out_of_place: int  # elements whose NaN or infinity is not where the reference's is (then: not plainly)
    judged: int  # finite elements judged (with ``scale_aware``: where the reference is finite)
    peak: float  # the largest judged magnitude of the reference
    least: float  # the smallest (any value >= peak when none is judged)
    max_abs_err: float
    max_rel_err: float  # |e - g| / max(|e|, 1e-30), 0 where e is 0
    sum_of_squares: float  # of the judged magnitudes, in float64


class JudgeKernels(Protocol):
    """What a backend lends (flat, contiguous tensors of one device; the reference and candidate of one dtype,
    float32 or narrower; every figure computed in float32 as torch computes it, sums of squares in float64)."""

    def bound_stats(self, e: Any, g: Any, scale_aware: Any) -> BoundStats:
        """``scale_aware`` false: NaN where ``e`` has NaN, infinities equal, the rest judged; true or "median":
        judged where ``e`` is finite, and ``g`` must be finite there."""

    def bound_exceeding(self, e: Any, g: Any, *, rtol: float, atol: float = 0.0, floor: float = 0.0,
                        tiny: float = 0.0, median: float | None = None) -> int:
        """How many judged elements have ``|e - g| > atol + rtol * |e|``, or given ``median``,
        ``> max(floor * max(|e|, median), tiny) + rtol * |e|``."""

    def count_at_most(self, e: Any, bound: float) -> int:
        """How many finite elements of ``e`` have ``|e| <= bound``."""

    def fingerprint_sums(self, words: Any, lane_offsets: tuple[int, ...], mixes: tuple[int, int]) -> Any:
        """Per lane, the sum mod 2^64 of ``words[i] * weight(i)`` (int64 words; an int64 tensor of one sum per
        lane): :func:`core.verification.digests.fingerprint_weight`'s splitmix64 of ``i + lane_offset``."""


_found: dict[str, Any] = {}
_broken: list[str] = []  # why a lent kernel failed in this process (then: torch, for the rest of it)


def judge_kernels(device_type: str) -> JudgeKernels | None:
    """The kernels the first registered backend lends for ``device_type`` ("cuda"), or None."""
    if _broken:
        return None
    if device_type not in _found:
        found = None
        try:
            from core.plugins import registry

            backends = registry("backend")
            for name in backends.names():
                # the optional member of OPTIONAL_MEMBERS["Backend"] (read here directly: core.contracts names
                # the numerics, which name this module)
                lend = getattr(backends.get(name), "judge_kernels", None)
                found = lend(device_type) if lend is not None else None
                if found is not None:
                    break
        except Exception:  # a backend that cannot say: torch computes the figures
            found = None
        _found[device_type] = found
    return _found[device_type]


def in_use() -> str:
    """What computes this process's large comparisons and digests on CUDA, for the verdict: the lent kernels'
    class, "torch" (none lent, or not asked yet), or why the lent ones were given up."""
    if _broken:
        return f"torch (the lent kernels failed: {_broken[0]})"[:300]
    lent = _found.get("cuda")
    return type(lent).__name__ if lent is not None else "torch"


def lent_or_none(call: Callable[[], T], device_type: str) -> T | None:
    """``call()`` (work on lent kernels), or None where the kernels failed here (they cannot be built, say: torch
    from now on, said once). Running out of memory is the device's, raised as it is; off CUDA (a test's forced
    run, in Triton's interpreter) what failed is raised."""
    import torch

    try:
        return call()
    except torch.cuda.OutOfMemoryError:
        raise
    except Exception as exc:
        if device_type != "cuda":
            raise
        if not _broken:
            warnings.warn(f"the judge's lent kernels failed, torch computes instead: {type(exc).__name__}: {exc}",
                          RuntimeWarning, stacklevel=2)
        _broken.append(f"{type(exc).__name__}: {exc}")
        return None

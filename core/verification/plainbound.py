"""The plain bound of :func:`core.verification.evidence.compare_outputs` over a very large output, a chunk
at a time.

At KernelBench's real sizes an output holds 10^9 elements (4-8 GiB). Judging it whole makes its
absolute values, differences, relative errors and masks as temporaries: five times the output on the
device beside the outputs the keeper already holds (the H200's keeper compares ran out of memory on
``9_Tall_skinny_matrix_multiplication_``, 2026-12-05). An honest kernel's output is almost always within
the plain bound everywhere, and that is decided here in chunks, with temporaries of one chunk.

:func:`within_plain_bound` answers only "plainly within": every NaN where the reference has NaN, every
infinity matching, and every finite element within ``floor * S + rtol * |reference|``, S the output's
scale (RMS of the reference's finite magnitudes, or with ``scale_aware`` their largest, or with
``scale_aware="median"`` per element the larger of its own and their median, or 1 with ``absolute``).
Anything else (an element beyond the bound, a NaN or infinity out of place, a non-contiguous layout)
returns None and the whole-tensor
comparison decides, with its messages, the float64 truth and the outlier rules. The RMS is summed in
float64 (exactly rescaled by a power of two, as :func:`~core.verification.evidence.output_scale` does);
the domain probe's per-element scale (``scale_aware="median"``) takes the median of the reference's
finite magnitudes by bisection over chunk counts, the exact value the whole comparison takes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from core.verification.devicekernels import (  # loaded with the harness: its state is recorded
    judge_kernels,
    lent_or_none,
)

CHUNK_ELEMENTS = 1 << 24  # elements per chunk: the temporaries are a few of these
LARGE_ELEMENTS = 1 << 24  # outputs of more elements are judged here first


@dataclass
class PlainlyWithin:
    judged: int  # elements compared (with ``scale_aware``: where the reference is finite)
    max_abs_err: float
    max_rel_err: float


def _chunks(e: Any, g: Any, work: Any, chunk: int, scale_aware: Any) -> Any:
    """Per chunk: (reference, candidate) in ``work`` dtype, the finite mask, |reference| and |difference|
    (zeros where not finite); None for a chunk with a NaN or infinity out of place."""
    import torch

    ef, gf = e.detach().reshape(-1), g.detach().reshape(-1)
    zero = torch.zeros((), dtype=work, device=ef.device)
    for start in range(0, ef.numel(), chunk):
        ec, gc = ef[start:start + chunk].to(work), gf[start:start + chunk].to(work)
        if scale_aware:
            finite = torch.isfinite(ec)
            if bool((finite & ~torch.isfinite(gc)).any()):
                yield None
                return
        else:
            e_nan, g_nan = torch.isnan(ec), torch.isnan(gc)
            if not torch.equal(e_nan, g_nan):
                yield None
                return
            finite = torch.isfinite(ec) & torch.isfinite(gc)
            if bool(((~e_nan) & (~finite) & (ec != gc)).any()):
                yield None
                return
        yield finite, torch.where(finite, ec.abs(), zero), torch.where(finite, (ec - gc).abs(), zero)


def rms_scale(magnitudes: Any, peak: float, judged: int) -> float:
    """The RMS of ``judged`` finite magnitudes given a chunk at a time (zeros where not finite), their largest
    ``peak``: squares summed in float64 after an exact power-of-two rescale (no overflow, no underflow)."""
    import torch

    k = 1.0 if 2.0 ** -60 <= peak <= 2.0 ** 40 else 2.0 ** -max(-100, min(100, math.floor(math.log2(peak))))
    squares = sum(float(((ref.to(torch.float64) * k) ** 2).sum()) for ref in magnitudes)
    return math.sqrt(squares) / k / math.sqrt(judged)


def median_rank(count_at_most: Callable[[float], int], judged: int) -> int:
    """The rank, among all ``judged`` finite magnitudes, of the median of the nonzero ones (zeros are the smallest:
    it is the ``zeros + (nonzero + 1) // 2``-th), as :func:`~core.verification.evidence.median_scale` takes
    it; 0 when every one is zero (then the median is 0)."""
    zeros = count_at_most(0.0)
    return zeros + max(1, (judged - zeros + 1) // 2) if judged > zeros else 0


def _median_magnitude(e: Any, g: Any, work: Any, chunk: int, judged: int, least: float, peak: float) -> float:
    """The median of the reference's finite nonzero magnitudes (:func:`median_rank`), exactly, by counting
    chunk by chunk."""
    import torch

    from core.verification.selection import bisect_kth

    def count(bound: float) -> int:
        return sum(int((torch.where(finite, ref, math.inf) <= bound).sum())
                   for finite, ref, _ in _chunks(e, g, work, chunk, "median"))

    rank = median_rank(count, judged)
    if rank == 0:
        return 0.0
    bits = 64 if work == torch.float64 else 32
    return bisect_kth(count, rank, least, peak, bits)


def within_plain_bound(e: Any, g: Any, floor: float, rtol: float, floor_of: Callable[[float], float], *,
                       scale_aware: Any = False, absolute: bool = False,
                       chunk: int = CHUNK_ELEMENTS, fused: bool | None = None) -> PlainlyWithin | None:
    """Whether the floating output ``g`` is plainly within the bound of the reference ``e`` (same shape and
    dtype); ``floor_of(S)`` is the bound's absolute part for scale S. None: not plainly (see the module).
    ``fused``: judge by the kernels a backend lends for the output's device (:mod:`core.verification.devicekernels`;
    None: where lent, for CUDA outputs of 32 bits or fewer; True: also on other devices, for tests)."""
    import torch

    if not e.is_floating_point() or not (e.is_contiguous() and g.is_contiguous()):
        return None
    kernels = _lent_kernels(e, g, fused)
    if kernels is not None:
        return _within_fused(kernels, e.detach().reshape(-1), g.detach().reshape(-1), floor, rtol, floor_of,
                             scale_aware=scale_aware, absolute=absolute)
    work = torch.float32 if e.element_size() <= 4 else torch.float64
    judged, peak, least, max_abs, max_rel = 0, 0.0, math.inf, 0.0, 0.0
    for part in _chunks(e, g, work, chunk, scale_aware):
        if part is None:
            return None
        finite, ref, diff = part
        judged += int(finite.sum())
        peak = max(peak, float(ref.max()))
        if scale_aware == "median":  # the smallest finite magnitude (no boolean indexing: no sync, no copy)
            least = min(least, float(torch.where(finite, ref, math.inf).min()))
        max_abs = max(max_abs, float(diff.max()))
        max_rel = max(max_rel, float((diff / ref.clamp_min(1e-30)).masked_fill_(ref == 0, 0.0).max()))
    if max_abs == 0.0:
        return PlainlyWithin(judged, 0.0, max_rel)
    if scale_aware == "median":  # per element max(|reference|, their median), as evidence.median_scale
        if judged == 0:
            return None
        median = _median_magnitude(e, g, work, chunk, judged, least, peak)
        for finite, ref, diff in _chunks(e, g, work, chunk, scale_aware):
            if bool((diff > floor_of(ref.clamp_min(median)) + rtol * ref).any()):
                return None
        return PlainlyWithin(judged, max_abs, max_rel)
    if absolute:
        scale = 1.0
    elif scale_aware or peak == 0.0 or judged <= 0 or not math.isfinite(peak):
        scale = peak
    else:
        scale = rms_scale((ref for _, ref, _ in _chunks(e, g, work, chunk, scale_aware)), peak, judged)
    atol = floor_of(scale)
    for _, ref, diff in _chunks(e, g, work, chunk, scale_aware):
        if bool((diff > atol + rtol * ref).any()):
            return None
    return PlainlyWithin(judged, max_abs, max_rel)


FUSED_DTYPES = ("torch.float32", "torch.float16", "torch.bfloat16")  # judged in float32


def _lent_kernels(e: Any, g: Any, fused: bool | None) -> Any:
    """The lent kernels that judge this pair, or None (then the chunked torch passes)."""
    if fused is False or str(e.dtype) not in FUSED_DTYPES or e.dtype != g.dtype or e.device != g.device:
        return None
    if fused is None and e.device.type != "cuda":
        return None
    return judge_kernels(e.device.type)


@dataclass
class LentFigures:
    """The plain bound's figures by lent kernels: the statistics, the median (the domain probe), the scale
    of the bound (the median, the peak, the RMS or 1) and how many judged elements are beyond it."""

    stats: Any  # core.verification.devicekernels.BoundStats
    median: float | None = None
    scale: float = 0.0
    beyond: int = 0


def lent_figures(kernels: Any, e: Any, g: Any, floor: float, rtol: float, floor_of: Callable[[float], float], *,
                 scale_aware: Any, absolute: bool) -> LentFigures:
    """The plain bound of flat ``e`` and ``g`` by ``kernels``, each pass one read of both outputs: with a NaN or
    infinity out of place, an output equal to the reference, or nothing judged under the median rule, only
    the statistics (nothing more is asked of the kernels)."""
    from core.verification.selection import bisect_kth

    found = kernels.bound_stats(e, g, scale_aware)
    if found.out_of_place or found.max_abs_err == 0.0 or (scale_aware == "median" and found.judged == 0):
        return LentFigures(found)
    if scale_aware == "median":  # per element max(|reference|, their median), as evidence.median_scale
        def count(bound: float) -> int:
            return kernels.count_at_most(e, bound)

        rank = median_rank(count, found.judged)
        median = bisect_kth(count, rank, found.least, found.peak, 32) if rank else 0.0
        beyond = kernels.bound_exceeding(e, g, rtol=rtol, floor=max(0.0, floor), tiny=floor_of(0.0), median=median)
        return LentFigures(found, median, 1.0 if absolute else median, beyond)
    if absolute:
        scale = 1.0
    elif scale_aware or found.peak == 0.0 or found.judged <= 0 or not math.isfinite(found.peak):
        scale = found.peak
    else:
        scale = math.sqrt(found.sum_of_squares) / math.sqrt(found.judged)
    return LentFigures(found, None, scale, kernels.bound_exceeding(e, g, rtol=rtol, atol=floor_of(scale)))


def _within_fused(kernels: Any, e: Any, g: Any, floor: float, rtol: float, floor_of: Callable[[float], float], *,
                  scale_aware: Any, absolute: bool) -> PlainlyWithin | None:
    """:func:`within_plain_bound` by lent single-pass kernels: the same rules and float32 arithmetic."""
    figures = lent_or_none(lambda: lent_figures(kernels, e, g, floor, rtol, floor_of, scale_aware=scale_aware,
                                                absolute=absolute), e.device.type)
    if figures is None:
        return within_plain_bound(e, g, floor, rtol, floor_of, scale_aware=scale_aware, absolute=absolute,
                                  fused=False)
    found = figures.stats
    if found.out_of_place or (scale_aware == "median" and found.judged == 0 and found.max_abs_err != 0.0):
        return None
    if found.max_abs_err == 0.0:
        return PlainlyWithin(found.judged, 0.0, found.max_rel_err)
    return None if figures.beyond else PlainlyWithin(found.judged, found.max_abs_err, found.max_rel_err)

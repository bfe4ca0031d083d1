"""The whole comparison of a very large output, a chunk at a time: what
:func:`core.verification.evidence.compare_outputs` decides once the plain bound did not settle it
(:mod:`core.verification.plainbound`), with its verdicts, figures and messages.

At 10^9 elements the whole-tensor comparison holds the output's magnitudes, differences, relative errors,
masks, the bound, the reference's spread and its per-rerun distances at once: about nine outputs' worth
beside the outputs the keeper holds (54 GiB for one 6-GiB output of KernelBench level 1). Here every
per-element quantity is made a chunk at a time, and only the reference's rounding spread (the largest
distance of the jittered reruns, one output's worth) is kept whole; the spread quantile is the exact
k-th value by bisection over chunk counts, as :func:`core.verification.selection.kth_smallest` finds it.

:func:`compare_large` returns None where the whole comparison must decide: a non-contiguous or
non-floating output, the float64 truth at hand when an element misses the bound (its rules need the
truth element by element), a disputed NaN the truth could stand in for, or a domain probe's output with
no finite element. Its RMS scale is summed per chunk in float64 (the whole comparison's norm sums
otherwise): the two can differ by rounding, at an element exactly on the bound.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from core.verification.devicekernels import lent_or_none
from core.verification.outliers import NO_SPREAD, SPREAD_QUANTILE, Flips, Forgiven, judge_outliers, sensitive_share
from core.verification.plainbound import CHUNK_ELEMENTS, _lent_kernels, _median_magnitude, lent_figures, rms_scale


@dataclass
class LargeResult:
    """One output's part of a :class:`~core.verification.evidence.Comparison`: ``detail`` set means rejected."""

    judged: int = 0
    figures: bool = True  # False: rejected before any arithmetic (NaN, infinities), with no counts
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    detail: str = ""
    outliers: int = 0
    outlier_positions: list = field(default_factory=list)
    band: str = ""


def bound_detail(where: str, n_bad: int, numel: int, floor: float, rtol: float, scale_aware: Any, shown: float,
                 max_abs: float, max_rel: float) -> str:
    """The words of an output whose elements miss the bound (both comparisons say it alike)."""
    what = ("magnitude (at least the median nonzero magnitude" if scale_aware == "median"
            else "largest magnitude" if scale_aware else "RMS magnitude")
    shown_what = f"{what} {shown:.3g})" if scale_aware == "median" else f"{what} {shown:.3g}"
    return (f"{where}: {n_bad}/{numel} elements differ beyond {floor:.3g} x the output's {shown_what} "
            f"+ {rtol:.3g} x |reference| (max abs err {max_abs:.3g}, max rel err {max_rel:.3g})")


def compare_large(e: Any, g: Any, where: str, floor: float, rtol: float, floor_of: Callable[[Any], Any], *,
                  scale_aware: Any, absolute: bool, noise_factor: float, truth_of: Callable[[], Any],
                  reruns_of: Callable[[], list[Any]] | None, chunk: int | None = None,
                  fused: bool | None = None) -> LargeResult | None:
    """Output ``g`` against the reference ``e`` (same shape and dtype, not bitwise equal) by the whole
    comparison's rules, a chunk at a time; None: the whole comparison decides (see the module).
    ``truth_of()``: the output's float64 truth or None; ``reruns_of()``: the reference's jittered reruns of
    this output (None: no rerun was offered); ``floor_of(S)``: the bound's absolute part for scale S.
    ``fused``: the statistics, median, scale and count beyond the bound by the kernels a backend lends (as
    :func:`~core.verification.plainbound.within_plain_bound` takes it); NaN and infinities out of place and
    the outliers rule stay torch's."""
    import torch

    if not e.is_floating_point() or not (e.is_contiguous() and g.is_contiguous()):
        return None
    chunk = int(chunk or CHUNK_ELEMENTS)
    work = torch.float32 if e.element_size() <= 4 else torch.float64
    ef, gf = e.detach().reshape(-1), g.detach().reshape(-1)
    n = ef.numel()
    zero = torch.zeros((), dtype=work, device=ef.device)

    def parts() -> Any:
        """(start, reference, candidate, finite, |reference|, |difference|) per chunk, zeros where not finite."""
        for start in range(0, n, chunk):
            ec, gc = ef[start:start + chunk].to(work), gf[start:start + chunk].to(work)
            finite = torch.isfinite(ec) if scale_aware else torch.isfinite(ec) & torch.isfinite(gc)
            yield (start, ec, gc, finite, torch.where(finite, ec.abs(), zero),
                   torch.where(finite, (ec - gc).abs(), zero))

    kernels = _lent_kernels(e, g, fused)
    lent = None if kernels is None else lent_or_none(
        lambda: lent_figures(kernels, ef, gf, floor, rtol, floor_of, scale_aware=scale_aware, absolute=absolute),
        ef.device.type)
    if lent is not None and not lent.stats.out_of_place:
        return _judged_beyond(lent, e, g, where, floor, rtol, floor_of, scale_aware, noise_factor, truth_of, reruns_of,
                              parts, work)
    # NaN and infinities first, in the whole comparison's order
    lost = nan_apart = inf_apart = 0
    nan_for_number = False
    for start in range(0, n, chunk):
        ec, gc = ef[start:start + chunk].to(work), gf[start:start + chunk].to(work)
        if scale_aware:
            lost += int((torch.isfinite(ec) & ~torch.isfinite(gc)).sum())
            continue
        e_nan, g_nan = torch.isnan(ec), torch.isnan(gc)
        nan_apart += int((e_nan != g_nan).sum())
        nan_for_number = nan_for_number or bool((g_nan & ~e_nan).any())
        finite = torch.isfinite(ec) & torch.isfinite(gc)
        inf_apart += int(((~e_nan) & (~finite) & (ec != gc)).sum())
    if lost:
        return LargeResult(figures=False, detail=f"{where}: {lost} element(s) are not finite where the reference is")
    if nan_apart:
        if not nan_for_number and truth_of() is not None:
            return None  # the truth may stand in for the reference's NaN: the whole comparison's rule
        kind = "NaN where the reference is a number" if nan_for_number else "a number where the reference is NaN"
        return LargeResult(figures=False, detail=f"{where}: {nan_apart} element(s) hold {kind}")
    if inf_apart:
        return LargeResult(figures=False, detail=f"{where}: {inf_apart} element(s) are infinite where the reference "
                                                "is not (or vice versa)")

    judged, peak, least, max_abs, max_rel = 0, 0.0, math.inf, 0.0, 0.0
    for _, _, _, finite, ref, diff in parts():
        judged += int(finite.sum())
        peak = max(peak, float(ref.max()))
        least = min(least, float(torch.where(finite, ref, math.inf).min()))
        max_abs = max(max_abs, float(diff.max()))
        max_rel = max(max_rel, float((diff / ref.clamp_min(1e-30)).masked_fill_(ref == 0, 0.0).max()))
    result = LargeResult(judged, True, max_abs, max_rel)
    if max_abs == 0.0:
        return result
    if scale_aware == "median" and judged == 0:
        return None
    median = _median_magnitude(e, g, work, chunk, judged, least, peak) if scale_aware == "median" else None
    if absolute:
        scale: float = 1.0
    elif median is not None:
        scale = median
    elif scale_aware or peak == 0.0 or judged <= 0 or not math.isfinite(peak):
        scale = peak
    else:  # the RMS of the finite magnitudes, as the plain bound takes it
        scale = rms_scale((ref for *_, ref, _ in parts()), peak, judged)

    atol_of = _atol_of(floor_of, median, scale)
    n_bad = sum(int((diff > atol_of(ref) + rtol * ref).sum()) for *_, ref, diff in parts())
    return _beyond(result, n_bad, e, g, where, floor, rtol, scale_aware, median, scale, atol_of, noise_factor,
                   truth_of, reruns_of, parts, work)


def _atol_of(floor_of: Callable[[Any], Any], median: float | None, scale: float) -> Callable[[Any], Any]:
    """The bound's absolute part for a chunk's |reference|: per element with the median (the domain probe)."""
    def atol_of(ref: Any) -> Any:
        return floor_of(ref.clamp_min(median)) if median is not None else floor_of(scale)

    return atol_of


def _judged_beyond(lent: Any, e: Any, g: Any, where: str, floor: float, rtol: float, floor_of: Callable[[Any], Any],
                   scale_aware: Any, noise_factor: float, truth_of: Callable[[], Any],
                   reruns_of: Callable[[], list[Any]] | None, parts: Callable[[], Any], work: Any) -> LargeResult | None:
    """:func:`compare_large` from the lent kernels' figures (no NaN or infinity out of place)."""
    found, median, scale = lent.stats, lent.median, lent.scale
    result = LargeResult(found.judged, True, found.max_abs_err, found.max_rel_err)
    if found.max_abs_err == 0.0:
        return result
    if scale_aware == "median" and found.judged == 0:
        return None
    return _beyond(result, lent.beyond, e, g, where, floor, rtol, scale_aware, median, scale,
                   _atol_of(floor_of, median, scale), noise_factor, truth_of, reruns_of, parts, work)


def _beyond(result: LargeResult, n_bad: int, e: Any, g: Any, where: str, floor: float, rtol: float, scale_aware: Any,
            median: float | None, scale: float, atol_of: Callable[[Any], Any], noise_factor: float,
            truth_of: Callable[[], Any], reruns_of: Callable[[], list[Any]] | None, parts: Callable[[], Any],
            work: Any) -> LargeResult | None:
    """The verdict once ``n_bad`` judged elements are known to be beyond the bound: none, accepted; with the
    truth at hand, the whole comparison's rules; else the outliers rule against the reference's reruns."""
    judged, max_abs, max_rel, n = result.judged, result.max_abs_err, result.max_rel_err, e.numel()
    if n_bad == 0:
        return result
    if truth_of() is not None:
        return None  # judged against the truth element by element: the whole comparison's rules
    shown = median if median is not None else scale
    rejected = bound_detail(where, n_bad, n, floor, rtol, scale_aware, shown, max_abs, max_rel)
    forgiven = _outliers(e, g, parts, reruns_of() if reruns_of is not None else [], atol_of, rtol, judged,
                         noise_factor, tuple(e.shape), work, per_element=scale_aware == "median")
    if forgiven is None:  # no rerun to measure the reference's own spread with
        result.detail = rejected + (f"; {NO_SPREAD}" if reruns_of is not None else "")
    elif forgiven.ok:
        result.outliers, result.outlier_positions, result.band = \
            forgiven.outliers, forgiven.outlier_positions, forgiven.band
    else:
        result.detail = f"{rejected}; {forgiven.detail}"
    return result


def _outliers(e: Any, g: Any, parts: Callable[[], Any], reruns: list[Any], atol_of: Callable[[Any], Any], rtol: float,
              judged: int, noise_factor: float, shape: tuple[int, ...], work: Any,
              per_element: bool = False) -> Forgiven | None:
    """The outlier rule (:func:`core.verification.outliers.forgive_outliers`, ``per_element`` as there) on
    the reference's spread against its jittered ``reruns``, kept whole (one output's worth); the rest a
    chunk at a time."""
    import torch

    from core.verification.selection import bisect_kth

    others = [r.detach().reshape(-1) for r in reruns if isinstance(r, torch.Tensor) and r.shape == e.shape]
    if not others:
        return None
    spread = torch.empty(e.numel(), dtype=work, device=e.device)
    flips_count, flips_largest = 0, 0.0
    zero = torch.zeros((), dtype=work, device=e.device)
    finite_spread = []  # (start, finite mask) per chunk, kept for the quantile's counts
    for start, ec, _, finite, ref, _ in parts():
        finite_spread.append((start, finite))
        bound = atol_of(ref) + rtol * ec.abs()  # the reference's own bound, as the whole rule draws it
        part, missed = None, None
        for other in others:
            d = (ec - other[start:start + ec.numel()].to(device=e.device, dtype=work)).abs()
            d = torch.where(torch.isfinite(d) & finite, d, zero)
            over = d > bound
            if bool(over.any()):
                flips_largest = max(flips_largest, float(d[over].max()))
                missed = over if missed is None else missed | over
            part = d if part is None else torch.maximum(part, d)
        flips_count += int(missed.sum()) if missed is not None else 0
        spread[start:start + ec.numel()] = part
    q = 0.0
    if judged:
        def count(bound: float) -> int:
            return sum(int(((spread[s:s + f.numel()] <= bound) & f).sum()) for s, f in finite_spread)

        smallest = min(float(torch.where(f, spread[s:s + f.numel()], math.inf).min()) for s, f in finite_spread)
        largest = max(float(torch.where(f, spread[s:s + f.numel()], -math.inf).max()) for s, f in finite_spread)
        k = max(1, min(judged, math.ceil(SPREAD_QUANTILE * judged)))
        q = bisect_kth(count, k, smallest, largest, 64 if work == torch.float64 else 32)

    def still() -> Any:
        for start, _, _, _, ref, diff in parts():
            beyond = (diff > atol_of(ref) + rtol * ref) & (diff > noise_factor * q)
            if per_element:
                beyond &= diff > noise_factor * spread[start:start + diff.numel()]
            yield start, beyond

    m = sum(int(s.sum()) for _, s in still())

    def positions() -> list[int]:
        return [start + int(k) for start, s in still() for k in s.nonzero().reshape(-1).tolist()]

    def diff_at(where: list[int]) -> list[float]:
        idx = torch.tensor(where, dtype=torch.long, device=e.device)
        return (e.detach().reshape(-1)[idx].to(work) - g.detach().reshape(-1)[idx].to(work)).abs().tolist()

    def sensitive() -> Any:  # where noise_factor x the reference's own spread is beyond the plain bound
        for start, ec, _, finite, ref, _ in parts():
            yield start, finite & (noise_factor * spread[start:start + ec.numel()] > atol_of(ref) + rtol * ref)

    return judge_outliers(judged, q, m, positions, diff_at, lambda where: spread[where].tolist(), noise_factor,
                          shape, Flips(flips_count, flips_largest), per_element, sensitive_share(sensitive, shape))

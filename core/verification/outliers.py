"""What the reference's own rounding excuses in a comparison (issue 39): the elements of an output that
miss every bound of :func:`core.verification.evidence.compare_outputs` are judged against the reference's
spread element by element (its distance from the float64 truth and from reruns on inputs moved by an ulp,
:func:`jittered`): within a quantile of that spread (the near-zero rule), or as a few isolated rounding
outliers, never as a structured region (:func:`structured_outliers`)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

# Isolated rounding outliers (issue 39): among 10^7-10^8 elements, an honest kernel misses the bound at a
# handful of elements where the output cancels (a value computed from intermediates far larger than
# itself). Where the reference's own rounding spread is known element by element (the float64 truth,
# or the reference rerun on inputs moved by an ulp: :func:`jittered`), the elements that miss every
# bound are forgiven when they are few (at most max(OUTLIER_COUNT, OUTLIER_FRACTION x n)), scattered
# (:func:`structured_outliers`) and each within REFERENCE_NOISE_FACTOR x the reference's own spread at
# that element. A wrong row, channel, tail block or stride is structured, or too many, or wrong where
# the reference is well conditioned: still rejected.
OUTLIER_COUNT = 32
OUTLIER_FRACTION = 1e-6
# The near-zero rule: an output's elements also pass within REFERENCE_NOISE_FACTOR x this quantile of
# the reference's own spread over the output (a group norm's mean is ~0: rounding of its O(1)
# intermediates is its scale, not its own 1e-9 magnitude).
SPREAD_QUANTILE = 0.9
JITTER_RUNS = 2  # reruns of the reference on inputs moved by an ulp
# The reruns come in antithetic pairs: the second moves every element the other way. A single move can land
# the rerun on the reference's own value where that value is itself an ulp or two from the formula's (a
# cancelling sum rounded otherwise), which would show no spread at the very elements that have the most;
# of two moves that straddle the formula's value, one is always the move's size away.
# Flips the reference makes itself: where an output saturates or switches on an intermediate far larger than
# itself (clamp(conv(x)) at x1e8 inputs: a sum of terms of 1e16 whose rounding of ~8 decides 0 or 1), the
# elements in the switching band jump by the whole step on any rounding change, and which of them jump
# differs from one rounding to the next. The reference rerun on inputs moved by an ulp shows the band (its
# own jumps) without landing on the candidate's jumps. Those are forgiven when they are no more than
# FLIP_COUNT_FACTOR x the reference's own, scattered, within the overall outlier limit, and each at most
# FLIP_SIZE_FACTOR x the reference's largest own jump.
FLIP_COUNT_FACTOR = 4
FLIP_SIZE_FACTOR = 2.0
# Outliers allowed beyond the isolated ones: this share of the reference's own jumps (a band wider than
# OUTLIER_COUNT elements has more honest jumps than that; a few wrong elements among a narrow band do not).
FLIP_SHARE = 0.25


# Said where an output missed the bound and no spread of the reference's own could excuse any element: no float64
# truth (too many elements) and no rerun (the reference, rerun on the same inputs, gave other bits).
NO_SPREAD = ("the reference's own rounding spread could not be measured (no float64 truth at this size, and no "
             "rerun: on the same inputs the reference gave other bits, or failed)")


@dataclass
class Flips:
    """Elements where the reference, rerun on inputs moved by an ulp (or against the float64 truth), misses
    the plain bound of its own output: how many, and by how much at most."""

    count: int = 0
    largest: float = 0.0


@dataclass
class Forgiven:
    """:func:`forgive_outliers`'s answer (its fields are those of a ``Comparison``)."""

    ok: bool
    detail: str
    outliers: int = 0  # elements beyond the spread quantile (see OUTLIER_COUNT)
    outlier_positions: list = field(default_factory=list)  # the first few, as indices into the output
    band: str = ""  # how the reference's own jumps excused them (a switching band), else ""


def jittered(inputs: list[Any], seed: int = 0, flip: bool = False) -> list[Any]:
    """``inputs`` with every floating element moved by one or two ulps up or down at random (a
    generator seeded by ``seed``; ``flip``: every move the other way; integers and zeros untouched):
    rerunning the reference on them measures how far its own rounding moves each output element (the
    ``rerun`` of :func:`compare_outputs`). Only the trusted reference ever runs on them.

    Each input is copied once and moved in place a chunk at a time (:data:`JITTER_CHUNK`): the whole-tensor
    formula held four input-sized temporaries, 24 GiB beside KernelBench level 1's 6-GiB inputs (GELU's
    reruns ran an H100 out of memory, 2026-12-06)."""
    import torch

    out = []
    for k, x in enumerate(inputs):
        if not (isinstance(x, torch.Tensor) and x.is_floating_point()) or x.numel() == 0:
            out.append(x)
            continue
        gen = torch.Generator(device=x.device)
        gen.manual_seed((int(seed) * 1_000_033 + k) % (1 << 63))
        out.append(_move_in_place(x.detach().clone(), gen, flip))  # dense, in x's layout
    return out


def _move_in_place(t: Any, gen: Any, flip: bool) -> Any:
    """``t`` with each element multiplied by 1 + eps or 1 - eps of its dtype (exact factors; the product is
    rounded once: 1-2 ulps), the signs drawn from ``gen`` a chunk at a time (``flip``: every one reversed), in
    place: no temporary larger than :data:`JITTER_CHUNK` elements."""
    import torch

    eps = torch.finfo(t.dtype).eps
    for part in _flat_chunks(t):
        up = torch.randint(0, 2, part.shape, generator=gen, device=t.device, dtype=torch.int8)
        if flip:
            up = 1 - up
        part.mul_(up.to(t.dtype).mul_(2 * eps).add_(1 - eps))
    return t


def _flat_chunks(t: Any) -> Any:
    """Views of a dense, non-overlapping ``t``'s elements, :data:`JITTER_CHUNK` at a time, in memory order (a
    channels-last tensor is permuted to contiguous first); the whole of ``t`` at once where no flat view exists."""
    dense = t
    if not t.is_contiguous():
        dense = t.permute(sorted(range(t.dim()), key=lambda d: (-t.stride(d), -t.size(d))))
        if not dense.is_contiguous():
            yield t
            return
    flat = dense.view(-1)
    for begin in range(0, flat.numel(), JITTER_CHUNK):
        yield flat[begin:begin + JITTER_CHUNK]


# Intermediates are moved in chunks of this many elements (the sign of each element is drawn per chunk,
# so a rerun's transient is one chunk's signs, not a tensor as large as the op's output).
JITTER_CHUNK = 1 << 24


def rounding_jitter(seed: int, flip: bool = False) -> Any:
    """A dispatch mode moving every rounded op's floating outputs (``core.verification.worker.rounding``'s
    allow-list: fresh results of arithmetic, contractions, reductions, normalisations) by an ulp up or
    down at random, seeded. The reference rerun under it rounds each intermediate otherwise, as a kernel
    that orders its arithmetic otherwise does; moving only the inputs misses that where an intermediate
    cancels (``layer_norm(conv(x) + 1)`` at x6e-8: ``conv(x)`` moved by an ulp leaves ``conv(x) + 1``
    rounding the same, while another kernel rounds it elsewhere). Activations that are formulas
    (GELU's ``1 + erf``) run as PyTorch's decomposition, each step moved. Only the trusted reference
    runs under it."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_map

    from core.verification.worker.rounding import ELEMENTWISE_DECOMPOSED, _rounds, decompositions

    generators: dict[Any, Any] = {}
    decomposed = decompositions()
    elementwise = {f for f in decomposed if f.overloadpacket.__name__ in ELEMENTWISE_DECOMPOSED}

    def move(t: Any) -> Any:
        if not (isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() and t.is_contiguous()):
            return t
        gen = generators.get(t.device)
        if gen is None:
            gen = generators[t.device] = torch.Generator(device=t.device)
            gen.manual_seed(int(seed) % (1 << 63))
        return _move_in_place(t, gen, flip)  # flip: the antithetic rerun's moves, each the other way

    def narrow(t: Any) -> Any:
        # a half-precision activation's formula runs in float32 (torch._decomp's type promotion), whose moves
        # its final rounding hides: that rounding is moved too
        return move(t) if isinstance(t, torch.Tensor) and t.dtype in (torch.float16, torch.bfloat16) else t

    class RoundingJitter(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            decompose = decomposed.get(func)
            if decompose is not None:  # an activation's formula: each of its steps moved (rounding's _DECOMPOSED)
                x, kwargs = args[0] if args else None, kwargs or {}
                if not (func in elementwise and isinstance(x, torch.Tensor) and x.is_contiguous()
                        and x.numel() > JITTER_CHUNK):
                    with self:
                        return tree_map(narrow, decompose(*args, **kwargs))
                # chunk by chunk: the formula's steps are output-sized temporaries, three alive at once
                # (GELU at KernelBench's 1.6e9 elements: 18 GiB more than the activation, which ran out)
                out, flat = None, x.view(-1)
                for start in range(0, flat.numel(), JITTER_CHUNK):
                    with self:
                        part = decompose(flat[start:start + JITTER_CHUNK], *args[1:], **kwargs)
                    if out is None:  # the formula's dtype (a half-precision activation's is its input's)
                        out = torch.empty(x.shape, dtype=part.dtype, device=x.device)
                    out.view(-1)[start:start + JITTER_CHUNK].copy_(part)
                return narrow(out)
            out = func(*args, **(kwargs or {}))
            return tree_map(move, out) if _rounds(func) else out

    return RoundingJitter()


def reference_spread(e: Any, truth: Any, reruns: list[Any], finite: Any, atol: Any = None,
                     rtol: float = 0.0) -> tuple[Any | None, Flips]:
    """Element by element, how far the reference's own rounding moves it: the largest of its distance
    from the float64 truth and from each jittered rerun (zeros where not finite; None when neither is
    known); and, with ``atol``, its :class:`Flips`: where those distances miss the plain bound
    ``atol + rtol |e|`` of its own output (see :data:`FLIP_COUNT_FACTOR`)."""
    import torch

    work = torch.float32 if e.element_size() <= 4 else torch.float64
    ew = e.detach().to(work)
    spread, missed, largest = None, None, 0.0
    bound = atol + rtol * ew.abs() if atol is not None else None
    others = list(reruns)
    if isinstance(truth, torch.Tensor) and truth.shape == e.shape:
        others.append(truth.to(e.device))
    for other in others:
        if not isinstance(other, torch.Tensor) or other.shape != e.shape:
            continue
        d = (ew - other.detach().to(device=e.device, dtype=work)).abs()
        d = torch.where(torch.isfinite(d) & finite, d, torch.zeros((), dtype=work, device=d.device))
        if bound is not None:
            over = d > bound
            if bool(over.any()):
                largest = max(largest, float(d[over].max()))
                missed = over if missed is None else missed | over
        spread = d if spread is None else torch.maximum(spread, d)
    return spread, Flips(int(missed.sum()) if missed is not None else 0, largest)


def forgive_outliers(diff: Any, bad: Any, spread: Any, finite: Any, noise_factor: float,
                     shape: tuple[int, ...], flips: Flips | None = None, per_element: bool = False,
                     bound: Any = None) -> Forgiven:
    """Whether the elements in ``bad`` (missing the plain bound by ``diff``) are within what the
    reference's own ``spread`` justifies: the output's spread quantile (:data:`SPREAD_QUANTILE`, the
    near-zero rule), or, for at most max(:data:`OUTLIER_COUNT`, :data:`OUTLIER_FRACTION` x n)
    scattered elements, the spread at the element itself, or the reference's own ``flips`` (at most
    :data:`FLIP_COUNT_FACTOR` x as many, each at most :data:`FLIP_SIZE_FACTOR` x its largest).
    ``per_element`` (the domain probe, judged element by element): every element within the spread at
    that element passes, however many; an output spanning dozens of decades has no one scale of rounding.
    ``bound``: the plain bound per element, which says where the reference's own rounding could put an honest
    outlier (:func:`sensitive_share`)."""
    from core.verification.selection import quantile

    n = int(finite.sum())
    q = quantile(spread[finite], SPREAD_QUANTILE) if n else 0.0
    still = bad & (diff > noise_factor * q)
    if per_element:
        still &= diff > noise_factor * spread
    flat_diff, flat_spread = diff.reshape(-1), spread.reshape(-1)

    def positions() -> list[int]:
        return still.reshape(-1).nonzero().reshape(-1).tolist()

    def at(values: Any) -> Any:
        return lambda where: values[where].tolist()

    share = None if bound is None else sensitive_share(
        lambda: [(0, (finite & (noise_factor * spread > bound)).reshape(-1))], shape)
    return judge_outliers(n, q, int(still.sum()), positions, at(flat_diff), at(flat_spread), noise_factor, shape,
                          flips, per_element, share)


def sensitive_share(masks: Any, shape: tuple[int, ...]) -> Any:
    """``share(d, index)``: of the elements where the reference's own rounding spread, ``noise_factor`` times,
    exceeds the plain bound (where an honest outlier can be, :func:`judge_outliers`), the fraction at ``index`` of
    dimension ``d`` (None: there are none). ``masks()`` yields (flat start, flat mask of those elements) per chunk
    of the output; asked only when outliers crowd on one index, so each call is a pass over the masks."""

    def share(d: int, index: int) -> float | None:
        stride, size = math.prod(shape[d + 1:]), shape[d]
        total = at = 0
        for start, mask in masks():
            where = mask.nonzero().reshape(-1)
            total += int(where.numel())
            at += int((((where + start) // stride) % size == index).sum())
        return at / total if total else None

    return share


def judge_outliers(n: int, q: float, m: int, positions: Any, diff_at: Any, spread_at: Any, noise_factor: float,
                   shape: tuple[int, ...], flips: Flips | None = None, per_element: bool = False,
                   share: Any = None) -> Forgiven:
    """:func:`forgive_outliers`'s rule on its figures, however they were gathered (whole tensors, or chunks of
    a very large output: :mod:`core.verification.largecompare`): ``n`` finite elements, the spread quantile
    ``q``, ``m`` elements beyond ``noise_factor`` x ``q``; ``positions()`` their flat indices, ascending
    (asked only when few); ``diff_at(idx)`` and ``spread_at(idx)`` the error and spread at flat indices;
    ``per_element``: ``m`` counts only those beyond the spread at their own element too. ``share``
    (:func:`sensitive_share`): where the reference's own rounding could put honest outliers, by index; outliers
    each within the spread at their own element crowd on an index only beyond what that share predicts."""
    there = " and at their own element" if per_element else ""
    if m == 0:
        return Forgiven(True, f"within {noise_factor:g}x the reference's own rounding spread {q:.3g}{there}")
    # a wide switching band allows a share of the reference's own jumps (FLIP_SHARE): on inputs moved by an ulp the
    # reference jumped at ~2,000 of 65,536 elements of clamp(3x - 3y) at x1e8, an honest kernel at ~100
    limit = max(OUTLIER_COUNT, int(OUTLIER_FRACTION * n), int(FLIP_SHARE * (flips.count if flips is not None else 0)))
    if m > limit:
        return Forgiven(False, f"{m} element(s) beyond {noise_factor:g}x the reference's own rounding spread "
                        f"{q:.3g}{there}: more than the {limit} isolated rounding outliers allowed", outliers=m)
    flat = list(positions())
    errors, spreads = diff_at(flat), spread_at(flat)
    beyond = [k for k, err, sp in zip(flat, errors, spreads) if err > noise_factor * sp]
    where = [_index(int(k), shape) for k in flat[:32]]
    # jumps like the reference's own in a switching band: judged as a whole (few and scattered), not one by one
    like_flips = bool(flips is not None and flips.count and m <= FLIP_COUNT_FACTOR * flips.count
                      and max(errors) <= FLIP_SIZE_FACTOR * flips.largest)
    flipped = (f"; the reference itself jumps by up to {flips.largest:.3g} at {flips.count} element(s) on inputs "
               "moved by an ulp (a switching band)") if like_flips and flips is not None else ""
    if beyond and not like_flips:
        k = beyond[0]
        j = flat.index(k)
        return Forgiven(False, f"{len(beyond)} of {m} outlier(s) are beyond {noise_factor:g}x the reference's "
                        f"own rounding spread at that element (first at {_index(k, shape)}: err "
                        f"{errors[j]:.3g}, spread {spreads[j]:.3g})",
                        outliers=m, outlier_positions=where)
    pattern = structured_outliers(flat, shape, share if not beyond else None)
    if pattern:
        return Forgiven(False, f"{m} outlier(s) form a pattern ({pattern}), not isolated rounding: {where[:8]}",
                        outliers=m, outlier_positions=where)
    return Forgiven(True, f"{m} isolated rounding outlier(s) at {where[:8]}{flipped}", outliers=m,
                    outlier_positions=where, band=flipped.removeprefix("; "))


def _index(flat: int, shape: tuple[int, ...]) -> list[int]:
    out = []
    for size in reversed(shape or (1,)):
        out.append(flat % max(size, 1))
        flat //= max(size, 1)
    return out[::-1]


# structured_outliers: the smallest group that can be called a pattern, the size of a dimension along
# which all outliers sharing one index is a pattern, and the common stride that is one.
PATTERN_MIN = 4
PATTERN_DIM = 8
PATTERN_STRIDE = 32


def structured_outliers(flat: list[int], shape: tuple[int, ...], share: Any = None) -> str:
    """A name for the pattern the outliers (flat indices, ascending) form, "" when they look like
    scattered rounding: three or more in a contiguous run, four or more on one index of a
    dimension of at least :data:`PATTERN_DIM` (a row, a channel, a column), all of them or far more
    than scattered outliers would put on one index, or four or more whose gaps
    share a stride of at least :data:`PATTERN_STRIDE` (every 4096th element, a tile's last lane).

    ``share(d, index)`` (:func:`sensitive_share`): the fraction of the elements where the reference's own rounding
    could put an honest outlier that lie at that index. Where it is more than an even share (and more than
    1/:data:`PATTERN_DIM`), outliers crowd there only beyond what that fraction predicts: a batch norm over a channel
    whose mean dwarfs its spread (KernelBench's `11_ConvTranspose2d_BatchNorm_Tanh_MaxPool_GroupNorm` at inputs
    x315000 offset, H200 2026-12-07: 6 of 27 outliers in one channel, each within the reference's own spread)."""
    run = 1
    for a, b in zip(flat, flat[1:]):
        run = run + 1 if b - a == 1 else 1
        if run >= 3:
            return f"a contiguous run at flat index {b - 2}"
    if len(flat) < PATTERN_MIN:
        return ""
    coords = [_index(k, shape) for k in flat]
    for d, size in enumerate(shape):
        if size < PATTERN_DIM:
            continue
        # one index far more crowded than scattered outliers would make it (a wrong row among a few honest
        # outliers elsewhere): beyond a Poisson tail of the count expected there, or all of them on it
        index, crowd = Counter(c[d] for c in coords).most_common(1)[0]

        def beyond_tail(mean: float) -> bool:
            return crowd >= PATTERN_MIN and crowd > mean + 6 * math.sqrt(mean) + 3

        if not (crowd == len(flat) or beyond_tail(len(flat) / size)):
            continue
        p = share(d, index) if share is not None else None  # a pass over the output: only for a crowd
        if p is not None and p > max(1 / size, 1 / PATTERN_DIM) and not beyond_tail(len(flat) * p):
            continue
        return f"all at index {index} of dimension {d}" if crowd == len(flat) else \
            f"{crowd} of {len(flat)} at index {index} of dimension {d}"
    g = 0
    for a, b in zip(flat, flat[1:]):
        g = math.gcd(g, b - a)
    if g >= PATTERN_STRIDE:
        return f"a stride of {g} elements"
    return ""

"""The plain bound's passes over a very large output as single Triton reductions (the GPU's path).

:func:`core.verification.plainbound.within_plain_bound` decides in torch a chunk at a time, which keeps its
temporaries small but moves the output through memory many times: each chunk's masks, magnitudes and
differences are separate kernels (about 25 per chunk and pass), the scale and the bound are two more passes,
and the domain probe's median is a bisection of up to 31 counting passes, each rebuilding the chunks. At
KernelBench's level-1 sizes (outputs of 1.6e9 elements) that is about 1 TB of GPU traffic per comparison and
5 TB for the median, a dozen comparisons per verification, on a GPU that six verifications share.

Here each pass reads the reference and the candidate once, in one kernel, with no temporaries but a few
numbers per program: :func:`stats` (whether a NaN or infinity is out of place, the judged count, the largest
magnitude and difference, the largest relative error, the smallest finite magnitude and the float64 sum of
squares), :func:`exceeding` (elements beyond the bound, with the torch path's float32 arithmetic: the
products and sums rounded separately, no fused multiply-add) and :func:`count_at_most` (the median's
bisection step). The float32 arithmetic and the rules are those of the torch path, which stays the path off
CUDA and for float64 outputs; ``tests/test_fusedbound.py`` holds the two to the same answers in Triton's
interpreter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

BLOCK = 2048  # elements per program and step
MAX_PROGRAMS = 8192  # programs per launch; each walks its share of the output BLOCK elements at a time
FLOAT32_MAX = 3.4028234663852886e38  # "no finite magnitude" for the smallest one (a judged count of 0 says so)
FUSED_DTYPES = ("torch.float32", "torch.float16", "torch.bfloat16")  # outputs judged in float32

_kernels: dict[str, Any] = {}


@dataclass(frozen=True)
class BoundStats:
    out_of_place: int  # elements whose NaN or infinity is not where the reference's is (then: not plainly)
    judged: int
    peak: float  # the largest finite magnitude of the reference
    least: float  # the smallest (FLOAT32_MAX when none is finite)
    max_abs_err: float
    max_rel_err: float
    sum_of_squares: float  # of the reference's finite magnitudes, in float64


def applies(e: Any, g: Any) -> bool:
    """Whether the fused passes judge this pair: contiguous float32/16/bfloat16 CUDA tensors of one dtype."""
    return (getattr(e, "is_cuda", False) and getattr(g, "is_cuda", False) and str(e.dtype) in FUSED_DTYPES
            and e.dtype == g.dtype and e.numel() == g.numel() and e.is_contiguous() and g.is_contiguous())


def _build() -> dict[str, Any]:
    """The three kernels, defined on first use (importing Triton costs a second)."""
    if _kernels:
        return _kernels
    import triton
    import triton.language as tl

    @triton.jit
    def _stats(E, G, n, per_program, counts, floats, squares, SCALE_AWARE: tl.constexpr, BLOCK: tl.constexpr):
        pid = tl.program_id(0).to(tl.int64)
        lanes = tl.arange(0, BLOCK)
        judged = tl.zeros([BLOCK], tl.int32)
        misplaced = tl.zeros([BLOCK], tl.int32)
        peak = tl.zeros([BLOCK], tl.float32)
        least = tl.full([BLOCK], 3.4028234663852886e38, tl.float32)
        max_abs = tl.zeros([BLOCK], tl.float32)
        max_rel = tl.zeros([BLOCK], tl.float32)
        sumsq = tl.zeros([BLOCK], tl.float64)
        for step in range(0, per_program, BLOCK):
            idx = pid * per_program + step + lanes
            inside = idx < n
            e = tl.load(E + idx, mask=inside, other=0.0).to(tl.float32)
            g = tl.load(G + idx, mask=inside, other=0.0).to(tl.float32)
            e_finite = (e - e) == 0.0  # inf - inf and NaN - NaN are NaN
            g_finite = (g - g) == 0.0
            if SCALE_AWARE:  # judged where the reference is finite; the candidate must be finite there
                finite = e_finite & inside
                wrong = finite & ~g_finite
            else:  # NaN where the reference has NaN, infinities equal, the rest judged
                e_nan = e != e  # noqa: PLR0124 (NaN is the one value unequal to itself)
                g_nan = g != g  # noqa: PLR0124
                finite = e_finite & g_finite & inside
                wrong = inside & ((e_nan != g_nan) | (~e_nan & ~finite & (e != g)))
            ref = tl.where(finite, tl.abs(e), 0.0)
            diff = tl.where(finite, tl.abs(e - g), 0.0)
            rel = tl.where(ref == 0.0, 0.0, diff / tl.maximum(ref, 1e-30))
            judged += finite.to(tl.int32)
            misplaced += wrong.to(tl.int32)
            peak = tl.maximum(peak, ref)
            least = tl.minimum(least, tl.where(finite, ref, 3.4028234663852886e38))
            max_abs = tl.maximum(max_abs, diff)
            max_rel = tl.maximum(max_rel, rel)
            wide = ref.to(tl.float64)
            sumsq += wide * wide
        tl.store(counts + pid * 2, tl.sum(judged, axis=0))
        tl.store(counts + pid * 2 + 1, tl.sum(misplaced, axis=0))
        tl.store(floats + pid * 4, tl.max(peak, axis=0))
        tl.store(floats + pid * 4 + 1, tl.min(least, axis=0))
        tl.store(floats + pid * 4 + 2, tl.max(max_abs, axis=0))
        tl.store(floats + pid * 4 + 3, tl.max(max_rel, axis=0))
        tl.store(squares + pid, tl.sum(sumsq, axis=0))

    @triton.jit
    def _exceeding(E, G, n, per_program, counts, atol, rtol, floor, tiny, median, PER_ELEMENT: tl.constexpr,
                   BLOCK: tl.constexpr):
        pid = tl.program_id(0).to(tl.int64)
        lanes = tl.arange(0, BLOCK)
        beyond = tl.zeros([BLOCK], tl.int32)
        for step in range(0, per_program, BLOCK):
            idx = pid * per_program + step + lanes
            inside = idx < n
            e = tl.load(E + idx, mask=inside, other=0.0).to(tl.float32)
            g = tl.load(G + idx, mask=inside, other=0.0).to(tl.float32)
            finite = ((e - e) == 0.0) & ((g - g) == 0.0) & inside
            ref = tl.where(finite, tl.abs(e), 0.0)
            diff = tl.where(finite, tl.abs(e - g), 0.0)
            relative = rtol * ref
            if PER_ELEMENT:  # the domain probe: max(floor * max(|ref|, median), tiny) + rtol * |ref|
                absolute = tl.maximum(floor * tl.maximum(ref, median), tiny)
                bound = absolute + relative
            else:
                bound = atol + relative
            beyond += (finite & (diff > bound)).to(tl.int32)
        tl.store(counts + pid, tl.sum(beyond, axis=0))

    @triton.jit
    def _count_at_most(E, n, per_program, counts, bound, BLOCK: tl.constexpr):
        pid = tl.program_id(0).to(tl.int64)
        lanes = tl.arange(0, BLOCK)
        found = tl.zeros([BLOCK], tl.int32)
        for step in range(0, per_program, BLOCK):
            idx = pid * per_program + step + lanes
            inside = idx < n
            e = tl.load(E + idx, mask=inside, other=0.0).to(tl.float32)
            finite = ((e - e) == 0.0) & inside
            found += (finite & (tl.abs(e) <= bound)).to(tl.int32)
        tl.store(counts + pid, tl.sum(found, axis=0))

    _kernels.update(stats=_stats, exceeding=_exceeding, count_at_most=_count_at_most)
    return _kernels


def _grid(n: int) -> tuple[int, int]:
    """(programs, elements per program, a multiple of BLOCK) for an output of ``n`` elements."""
    steps = -(-n // BLOCK)
    per_program = -(-steps // MAX_PROGRAMS) * BLOCK
    return max(1, -(-n // per_program)), per_program


# no fused multiply-add: the bound is rounded as torch rounds it, a product then a sum
_LAUNCH = {"enable_fp_fusion": False}


def _launch_options() -> dict[str, Any]:
    import os

    return {} if os.environ.get("TRITON_INTERPRET") == "1" else _LAUNCH  # the interpreter rounds each op


def stats(e: Any, g: Any, scale_aware: Any) -> BoundStats:
    """One pass over the reference ``e`` and candidate ``g`` (flat, contiguous, same dtype and device)."""
    import torch

    kernels = _build()
    n = e.numel()
    programs, per_program = _grid(n)
    counts = torch.empty(programs, 2, dtype=torch.int32, device=e.device)
    floats = torch.empty(programs, 4, dtype=torch.float32, device=e.device)
    squares = torch.empty(programs, dtype=torch.float64, device=e.device)
    kernels["stats"][(programs,)](e, g, n, per_program, counts, floats, squares, SCALE_AWARE=bool(scale_aware),
                                  BLOCK=BLOCK, **_launch_options())
    summed = counts.to(torch.int64).sum(dim=0)
    figures = torch.stack([summed[0].double(), summed[1].double(), floats[:, 0].max().double(),
                           floats[:, 1].min().double(), floats[:, 2].max().double(), floats[:, 3].max().double(),
                           squares.sum()]).tolist()  # one transfer, one wait
    judged, misplaced, peak, least, max_abs, max_rel, sumsq = figures
    return BoundStats(int(misplaced), int(judged), peak, least, max_abs, max_rel, sumsq)


def exceeding(e: Any, g: Any, *, rtol: float, atol: float = 0.0, floor: float = 0.0, tiny: float = 0.0,
              median: float | None = None) -> int:
    """How many judged elements are beyond ``atol + rtol * |ref|`` (or, given ``median``, beyond
    ``max(floor * max(|ref|, median), tiny) + rtol * |ref|``), in float32 as the torch path computes it."""
    import torch

    kernels = _build()
    n = e.numel()
    programs, per_program = _grid(n)
    counts = torch.empty(programs, dtype=torch.int32, device=e.device)
    kernels["exceeding"][(programs,)](e, g, n, per_program, counts, float(atol), float(rtol), float(floor),
                                      float(tiny), float(median or 0.0), PER_ELEMENT=median is not None,
                                      BLOCK=BLOCK, **_launch_options())
    return int(counts.to(torch.int64).sum())


def count_at_most(e: Any, bound: float) -> int:
    """How many finite elements of ``e`` have a magnitude of at most ``bound`` (a float32 value)."""
    import torch

    kernels = _build()
    n = e.numel()
    programs, per_program = _grid(n)
    counts = torch.empty(programs, dtype=torch.int32, device=e.device)
    kernels["count_at_most"][(programs,)](e, n, per_program, counts, float(bound), BLOCK=BLOCK,
                                          **_launch_options())
    return int(counts.to(torch.int64).sum())


def rms(sum_of_squares: float, judged: int) -> float:
    return math.sqrt(sum_of_squares) / math.sqrt(judged)

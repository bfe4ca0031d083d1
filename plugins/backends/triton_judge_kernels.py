"""Triton kernels the Triton backend lends the judge for its own work on very large CUDA tensors
(``TritonBackend.judge_kernels``, :mod:`core.verification.devicekernels`): the plain bound's passes over an
output (its statistics, the elements beyond the bound, the median bisection's count) and the input digest's
weighted sums, each one kernel that reads its tensors once, with a few numbers per program left to sum.

They compute what torch computes in the engine (float32 as torch rounds it: products and sums rounded apart,
no fused multiply-add; sums of squares in float64; integer sums mod 2^64); ``tests/test_judge_kernels.py``
holds them to torch's answers in Triton's interpreter on the CPU and on the device on a GPU.
"""

from __future__ import annotations

import os
from typing import Any

from core.api.numerics import BoundStats

BLOCK = 2048  # elements per program and step of the bound's kernels
MAX_PROGRAMS = 8192  # programs per launch; each walks its share of the tensor BLOCK elements at a time
FINGERPRINT_BLOCK = 1024
_kernels: dict[str, Any] = {}


def judge_kernels(device: str) -> Any:
    """The kernels for ``device``: CUDA, or any device in Triton's interpreter (tests); else None."""
    if device == "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return TritonJudgeKernels()
    return None


def _build() -> dict[str, Any]:
    """The kernels, defined on first use (importing Triton costs a second)."""
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

    @triton.jit
    def _fingerprint(W, n, per_program, sums, lane0, lane1, mix1, mix2, BLOCK: tl.constexpr):
        pid = tl.program_id(0).to(tl.int64)
        lanes = tl.arange(0, BLOCK)
        two = tl.arange(0, 2)  # both sums at once, each with its own weights
        offsets = tl.where(two == 0, lane0, lane1)
        acc = tl.zeros([BLOCK, 2], tl.int64)
        m1 = mix1.to(tl.uint64, bitcast=True)
        m2 = mix2.to(tl.uint64, bitcast=True)
        for step in range(0, per_program, BLOCK):
            idx = pid * per_program + step + lanes
            inside = idx < n
            word = tl.load(W + idx, mask=inside, other=0)
            z = (idx[:, None] + offsets[None, :]).to(tl.uint64, bitcast=True)  # unsigned: the shifts are logical
            z = (z ^ (z >> 30)) * m1
            z = (z ^ (z >> 27)) * m2
            acc += word[:, None] * ((z ^ (z >> 31)) | 1).to(tl.int64, bitcast=True)
        tl.store(sums + pid * 2 + two, tl.sum(acc, axis=0))

    _kernels.update(stats=_stats, exceeding=_exceeding, count_at_most=_count_at_most, fingerprint=_fingerprint)
    return _kernels


def _grid(n: int, block: int) -> tuple[int, int]:
    """(programs, elements per program, a multiple of ``block``) for a tensor of ``n`` elements."""
    steps = -(-n // block)
    per_program = -(-steps // MAX_PROGRAMS) * block
    return max(1, -(-n // per_program)), per_program


def _exact_rounding() -> dict[str, Any]:
    """No fused multiply-add: the bound is rounded as torch rounds it, a product then a sum (the interpreter
    rounds each operation anyway, and takes no compiler options)."""
    return {} if os.environ.get("TRITON_INTERPRET") == "1" else {"enable_fp_fusion": False}


def _count(kernel: str, e: Any, tensors: tuple[Any, ...], scalars: tuple[float, ...], **constants: Any) -> int:
    """Launch a counting kernel over ``e``'s elements (its tensors, n, the programs' share, their counts, its
    scalars) and sum the programs' counts."""
    import torch

    n = e.numel()
    programs, per_program = _grid(n, BLOCK)
    counts = torch.empty(programs, dtype=torch.int32, device=e.device)
    _build()[kernel][(programs,)](*tensors, n, per_program, counts, *scalars, **constants, BLOCK=BLOCK,
                                  **_exact_rounding())
    return int(counts.to(torch.int64).sum())


class TritonJudgeKernels:
    """:class:`core.verification.devicekernels.JudgeKernels` in Triton."""

    def bound_stats(self, e: Any, g: Any, scale_aware: Any) -> BoundStats:
        import torch

        n = e.numel()
        programs, per_program = _grid(n, BLOCK)
        counts = torch.empty(programs, 2, dtype=torch.int32, device=e.device)
        floats = torch.empty(programs, 4, dtype=torch.float32, device=e.device)
        squares = torch.empty(programs, dtype=torch.float64, device=e.device)
        _build()["stats"][(programs,)](e, g, n, per_program, counts, floats, squares, SCALE_AWARE=bool(scale_aware),
                                       BLOCK=BLOCK, **_exact_rounding())
        summed = counts.to(torch.int64).sum(dim=0)
        figures = torch.stack([summed[0].double(), summed[1].double(), floats[:, 0].max().double(),
                               floats[:, 1].min().double(), floats[:, 2].max().double(),
                               floats[:, 3].max().double(), squares.sum()]).tolist()  # one transfer, one wait
        judged, misplaced, peak, least, max_abs, max_rel, sumsq = figures
        return BoundStats(int(misplaced), int(judged), peak, least, max_abs, max_rel, sumsq)

    def bound_exceeding(self, e: Any, g: Any, *, rtol: float, atol: float = 0.0, floor: float = 0.0,
                        tiny: float = 0.0, median: float | None = None) -> int:
        return _count("exceeding", e, (e, g), (float(atol), float(rtol), float(floor), float(tiny), float(median or 0.0)),
                      PER_ELEMENT=median is not None)

    def count_at_most(self, e: Any, bound: float) -> int:
        return _count("count_at_most", e, (e,), (float(bound),))

    def fingerprint_sums(self, words: Any, lane_offsets: tuple[int, ...], mixes: tuple[int, int]) -> Any:
        import torch

        if len(lane_offsets) != 2:
            raise ValueError(f"the fingerprint kernel sums two lanes, not {len(lane_offsets)}")
        n = words.numel()
        programs, per_program = _grid(n, FINGERPRINT_BLOCK)
        partial = torch.empty(programs, 2, dtype=torch.int64, device=words.device)
        _build()["fingerprint"][(programs,)](words, n, per_program, partial, *lane_offsets, *mixes,
                                             BLOCK=FINGERPRINT_BLOCK)
        return partial.sum(dim=0)  # wraps mod 2^64

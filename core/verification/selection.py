"""Order statistics of very large tensors: the k-th smallest element and quantiles, exactly.

The judge takes quantiles of whole outputs (the reference's rounding spread, a probe's median
magnitude). ``torch.kthvalue`` on a CUDA tensor runs one thread block per slice, so a single slice
of 1.6e9 elements took 12-16 s on an H200 (KernelBench level 1 at its real sizes, 2026-12-05;
pytorch/pytorch#75599: 20x slower than a sort). ``torch.quantile`` refuses more than 2^24 elements,
and a sort needs several times the tensor's memory.

:func:`kth_smallest` bisects on the floats' order-preserving integer keys instead: each step
counts the elements at or below a candidate value, a reduction that reads the tensor once (in
chunks, so its temporaries stay small) at the device's full bandwidth. At most 32 steps for 32-bit
floats, 64 for float64, and the answer is the exact k-th smallest value, as ``kthvalue`` gives it.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from typing import Any

# Up to this many elements (and always off CUDA) torch.kthvalue is used: it is fast there.
DIRECT_MAX_ELEMENTS = 1 << 22
# Elements compared per reduction (a bool temporary of this size).
CHUNK_ELEMENTS = 1 << 26

# (struct float format, struct int format, mask of the bits below the sign) per key width
_KEY_FORMATS = {32: ("<f", "<i", 0x7FFFFFFF), 64: ("<d", "<q", 0x7FFFFFFFFFFFFFFF)}


def _key(value: float, bits: int) -> int:
    """The float's order-preserving integer key: keys compare as the floats do (-0.0 just below 0.0)."""
    ffmt, ifmt, low = _KEY_FORMATS[bits]
    raw = struct.unpack(ifmt, struct.pack(ffmt, value))[0]
    return raw if raw >= 0 else raw ^ low


def _value(key: int, bits: int) -> float:
    """The float of an order-preserving key (:func:`_key`'s inverse)."""
    ffmt, ifmt, low = _KEY_FORMATS[bits]
    raw = key if key >= 0 else key ^ low
    return struct.unpack(ffmt, struct.pack(ifmt, raw))[0]


def count_at_most(values: Any, bound: float, chunk: int = CHUNK_ELEMENTS) -> int:
    """How many elements of the flat tensor ``values`` are ``<= bound`` (NaN never is)."""
    import torch

    work = values.dtype if values.dtype == torch.float64 else torch.float32
    total = None
    for start in range(0, values.numel(), chunk):
        part = values[start:start + chunk]
        n = (part.to(work) <= bound).sum()
        total = n if total is None else total + n
    return int(total) if total is not None else 0


def kth_smallest(values: Any, k: int, *, method: str = "auto", chunk: int = CHUNK_ELEMENTS) -> float:
    """The ``k``-th smallest (1-based) element of a floating tensor with no NaN, as
    ``values.reshape(-1).kthvalue(k)`` gives it. ``method``: ``"bisect"`` (the module's note),
    ``"kthvalue"``, or ``"auto"``: bisection for CUDA tensors of over :data:`DIRECT_MAX_ELEMENTS`."""
    import torch

    flat = values.reshape(-1)
    n = flat.numel()
    if not 1 <= k <= n:
        raise ValueError(f"k={k} is outside 1..{n}")
    chosen = method
    if method == "auto":
        chosen = "bisect" if flat.device.type == "cuda" and n > DIRECT_MAX_ELEMENTS else "kthvalue"
    if chosen not in ("bisect", "kthvalue"):
        raise ValueError(f"kth_smallest: unknown method {method!r}")
    if chosen == "kthvalue" or not flat.is_floating_point():
        return float(flat.kthvalue(k).values)
    bits = 64 if flat.dtype == torch.float64 else 32
    smallest, largest = float(flat.min()), float(flat.max())
    if math.isnan(smallest) or math.isnan(largest):  # NaN has no key: kthvalue orders it last
        if method == "auto":
            return float(flat.kthvalue(k).values)
        raise ValueError("kth_smallest: the tensor holds NaN")
    return bisect_kth(lambda bound: count_at_most(flat, bound, chunk), k, smallest, largest, bits)


def bisect_kth(count: Callable[[float], int], k: int, smallest: float, largest: float, bits: int = 32) -> float:
    """The ``k``-th smallest of values known only through ``count(bound)`` (how many are ``<= bound``),
    ``smallest`` and ``largest`` among them (no NaN): the smallest float whose count reaches ``k``, by
    bisection on the order-preserving keys of ``bits``-bit floats (a value held by a tensor of narrower
    floats is one of these)."""
    lo, hi = _key(smallest, bits), _key(largest, bits)
    while lo < hi:  # the smallest key whose value has at least k elements at or below it
        mid = (lo + hi) // 2
        if count(_value(mid, bits)) >= k:
            hi = mid
        else:
            lo = mid + 1
    return _value(lo, bits)


def quantile(values: Any, q: float, **options: Any) -> float:
    """The ``q`` quantile of a 1-d tensor as its ``ceil(q n)``-th smallest element (0 when empty);
    ``torch.quantile`` refuses tensors of over 2^24 elements."""
    n = values.numel()
    if n == 0:
        return 0.0
    return kth_smallest(values, max(1, min(n, math.ceil(q * n))), **options)

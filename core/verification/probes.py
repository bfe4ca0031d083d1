"""Stability probes: inputs of unusual magnitude and shape of distribution, drawn afresh for every
verification so that a kernel cannot recognise them.

A probe is ``{"scale": s, "dist": d}``. The task's ``get_inputs()`` is drawn under the probe's seed
as for a trial; then every floating tensor ``x`` becomes, by distribution ``d``:

``scaled``        ``s * x``
``heavy_tailed``  ``s * x * exp(1.5 z)``: the same signs, magnitudes spread over ~4 decades
``offset``        ``s * (x + c)``, ``c`` uniform in ±[3, 30]: far from zero mean (one-pass
                  variance, softmax without the max subtracted)
``sparse``        ``s * x`` with about 60% of the elements exactly zero
``uniform``       ``s * sign(x) * u``, ``u`` uniform in [0, 1): bounded magnitudes
``domain``        the dtype's finite domain swept (:func:`domain_sweep`): magnitudes log-spaced from
                  tiny (1e-20 in fp32) to the edge where ``exp`` overflows (~88 in fp32, ~11 in fp16),
                  both signs, in an order drawn from the probe's seed; the scale is ignored

(``z``, ``c``, ``u`` and the zeros come from a generator seeded by the probe's seed, so every
worker draws the same inputs.) The default plan (:func:`draw_plan`) has three probes: a large scale,
a small one, and a mild one (between x1/30 and x30, away from x1), each at a log-uniform scale in its
dtype's range and with a distribution drawn at random; a fixed plan (``Verifier(probe_scales=...)``)
scales only. Every plan, drawn or fixed (unless empty), also holds the deterministic domain probe
(:data:`DOMAIN_PROBE`, issue 39): a kernel wrong on part of an op's finite domain (an ``exp``
clamped or approximated by a polynomial valid on [-10, 10]) is then rejected on every verification,
not only when a random scale happens to land there. Its outputs span dozens of decades, so they are
judged element by element (``compare_outputs(scale_aware="median")``), where the reference is finite.
"""

from __future__ import annotations

import math
import random
from typing import Any

DISTRIBUTIONS = ("scaled", "heavy_tailed", "offset", "sparse", "uniform", "domain")
DOMAIN_PROBE = {"scale": 1.0, "dist": "domain"}
# (smallest magnitude, edge) of the domain sweep per dtype: the edge is 0.99 x ln(max), where exp
# overflows; an op whose reference overflows earlier (exp(2x)) is judged where it is finite.
DOMAIN_RANGES = {"float32": (1e-20, 87.8), "bfloat16": (1e-20, 87.8), "float16": (1e-3, 10.9),
                 "float64": (1e-150, 702.0)}
# (large, small) scale ranges per dtype: large enough to overflow a naive square or exp, small
# enough to vanish in an absolute tolerance, both inside the dtype's normal range
SCALE_RANGES = {
    "float32": ((1e3, 1e18), (1e-8, 1e-3)),
    "bfloat16": ((1e3, 1e18), (1e-8, 1e-3)),
    "float64": ((1e3, 1e150), (1e-150, 1e-3)),
    "float16": ((1e1, 1e3), (1e-3, 1e-1)),
}
MILD = (1 / 30, 30.0)
MILD_EXCLUDED = (0.5, 2.0)  # too close to the trials' own inputs to probe anything


def _log_uniform(rng: random.Random, lo: float, hi: float) -> float:
    return float(f"{math.exp(rng.uniform(math.log(lo), math.log(hi))):.3g}")


def draw_plan(dtype: str, rng: random.Random | None = None) -> list[dict[str, Any]]:
    """Three probes for a task of ``dtype``: large, small and mild scales, random distributions."""
    rng = rng or random.SystemRandom()
    large, small = SCALE_RANGES.get(dtype, SCALE_RANGES["float32"])
    mild = _log_uniform(rng, *MILD)
    while MILD_EXCLUDED[0] <= mild <= MILD_EXCLUDED[1]:
        mild = _log_uniform(rng, *MILD)
    scales = [_log_uniform(rng, *large), _log_uniform(rng, *small), mild]
    drawn = [{"scale": s, "dist": rng.choice(DISTRIBUTIONS[:-1])} for s in scales]
    return [*drawn, dict(DOMAIN_PROBE)]


def fixed_plan(probes: list[float | dict[str, Any]]) -> list[dict[str, Any]]:
    """A plan of the given probes: a number is a scale of the task's own distribution; a
    ``{"scale", "dist"}`` (a plan :func:`draw_plan` drew, replayed) is kept."""
    plan = []
    for p in probes:
        dist = p.get("dist", "scaled") if isinstance(p, dict) else "scaled"
        if dist not in DISTRIBUTIONS:
            raise ValueError(f"unknown probe distribution {dist!r}; known: {', '.join(DISTRIBUTIONS)}")
        plan.append({"scale": scale_of(p), "dist": dist})
    if plan and not any(p["dist"] == "domain" for p in plan):
        plan.append(dict(DOMAIN_PROBE))  # every verification sweeps the domain
    return plan


def is_domain(probe: float | dict[str, Any] | str) -> bool:
    """Whether ``probe`` (a spec, or its name as :func:`describe` gives it) is the domain sweep."""
    if isinstance(probe, str):
        return probe.startswith("domain")
    return isinstance(probe, dict) and probe.get("dist") == "domain"


# Probes are computed in chunks of this many elements: a 4-GiB input transformed in float64 at once held
# three 8-GiB temporaries on the GPU (KernelBench level 1 at its real sizes, 2026-12-04).
CHUNK = 1 << 24


def domain_sweep(n: int, dtype: Any, seed: int, device: Any = None, out_dtype: Any = None) -> Any:
    """``n`` values covering ``dtype``'s finite domain (:data:`DOMAIN_RANGES`): magnitudes log-spaced
    from the smallest to the edge, the edge itself and 1.0 included, half of them negative, in an order
    drawn from ``seed`` (the values are the same every verification, their places are not).

    Up to :data:`CHUNK` values the order is a random permutation drawn from the seed; beyond, the affine
    permutation ``i -> (a*i + b) mod n``, ``a`` the coprime stride nearest ``0.618 n`` (or ``n`` minus
    it) and ``b`` drawn from the seed, computed where the values land (``device``), chunk by chunk, in
    ``out_dtype`` (float64 by default). A random permutation of 10^9 places drawn on the host took
    minutes per verification at KernelBench's real sizes and 16 GiB of host memory."""
    import torch

    name = str(dtype).replace("torch.", "")
    tiny, edge = DOMAIN_RANGES.get(name, DOMAIN_RANGES["float32"])
    lo, hi = math.log10(tiny), math.log10(edge)
    pos, neg = n - n // 2, n // 2
    out = torch.empty(n, dtype=out_dtype or torch.float64, device=device)
    if n == 0:
        return out
    for start, ranks in _sweep_ranks(n, seed, out.device):
        count = ranks.numel()
        negative = ranks >= pos
        index = torch.where(negative, ranks - pos, ranks).to(torch.float64)
        steps = torch.where(negative, torch.full_like(index, max(neg - 1, 1)), torch.full_like(index, max(pos - 1, 1)))
        mags = torch.pow(10.0, lo + (hi - lo) * index / steps)
        if pos >= 3:
            mags = torch.where(ranks == pos - 2, torch.ones_like(mags), mags)  # the ordinary scale too
        out[start:start + count] = torch.where(negative, -mags, mags)
    return out


def _sweep_ranks(n: int, seed: int, device: Any) -> Any:
    """``(start, ranks)`` of the domain sweep's places ``[start, start + len(ranks))``, a chunk at a time:
    a random permutation when ``n`` fits one chunk, else the affine one of :func:`domain_sweep`."""
    import torch

    if n <= CHUNK:  # one chunk: a random permutation, as cheap on the host as on the device at this size
        gen = torch.Generator()
        gen.manual_seed(int(seed) % (1 << 63))
        yield 0, torch.randperm(n, generator=gen).to(device)
        return
    rng = random.Random(int(seed))
    # the coprime stride nearest the golden ratio of n: any run of consecutive places, a row, gets ranks
    # spread over the whole domain (every row of 100 spans > 85% of it for every n tried, 300 to 3000). A
    # stride jittered by the seed, or a small or near-n/2 one, can give a row one narrow band.
    a = _golden_stride(n)
    if rng.random() < 0.5:
        a = n - a  # the same rows, reversed
    b = rng.randrange(n)
    for start in range(0, n, CHUNK):
        count = min(CHUNK, n - start)
        yield start, (torch.arange(count, dtype=torch.int64, device=device) * a + (a * start + b) % n) % n


def _golden_stride(n: int) -> int:
    """The integer nearest ``0.618 * n`` that is coprime to ``n`` (a permutation's stride)."""
    base = round(n * 0.6180339887498949)
    for distance in range(n):
        for a in (base + distance, base - distance):
            if 0 < a < n and math.gcd(a, n) == 1:
                return a
    return 1


def scale_of(probe: float | dict[str, Any]) -> float:
    return float(probe["scale"]) if isinstance(probe, dict) else float(probe)


def describe(probe: float | dict[str, Any]) -> str:
    """``x1e+03`` or ``x1e+03 heavy_tailed``."""
    dist = probe.get("dist", "scaled") if isinstance(probe, dict) else "scaled"
    if dist == "domain":
        return "domain sweep"
    return f"x{scale_of(probe):g}" + ("" if dist == "scaled" else f" {dist}")


def apply(inputs: list[Any], probe: float | dict[str, Any], seed: int) -> list[Any]:
    """``inputs`` transformed by ``probe`` (a plain number: scaled by it); integers untouched."""
    import torch

    scale = scale_of(probe)
    dist = probe.get("dist", "scaled") if isinstance(probe, dict) else "scaled"
    if dist not in DISTRIBUTIONS:
        raise ValueError(f"unknown probe distribution {dist!r}; known: {', '.join(DISTRIBUTIONS)}")
    if dist == "scaled" and scale == 1.0:
        return inputs
    if dist == "domain":
        return [domain_sweep(x.numel(), x.dtype, int(seed) * 1_000_003 + k, x.device, x.dtype).reshape(x.shape)
                if isinstance(x, torch.Tensor) and x.is_floating_point() else x for k, x in enumerate(inputs)]
    out = []
    for k, x in enumerate(inputs):
        if not (isinstance(x, torch.Tensor) and x.is_floating_point()):
            out.append(x)
            continue
        gen = torch.Generator(device=x.device)
        gen.manual_seed((int(seed) * 1_000_003 + k) % (1 << 63))
        offset = None
        if dist == "offset":
            u, side = torch.rand(2, generator=gen, device=x.device).tolist()
            offset = (3 + 27 * u) * (1 if side < 0.5 else -1)
        y = torch.empty_like(x)  # the input's own layout
        source, target = (x.reshape(-1), y.view(-1)) if x.is_contiguous() else (x, y)
        chunks = range(0, source.numel(), CHUNK) if x.is_contiguous() else [None]
        for start in chunks:  # float64 a chunk at a time: the transient stays ~0.5 GiB
            part = source if start is None else source[start:start + CHUNK]
            goal = target if start is None else target[start:start + CHUNK]
            goal.copy_(_transform(part.double(), dist, scale, offset, gen))
        out.append(y)
    return out


def _transform(work: Any, dist: str, scale: float, offset: float | None, gen: Any) -> Any:
    """One chunk of a probe's distribution (the module's docstring), in float64."""
    import torch

    def noise(kind: str) -> Any:
        base = torch.rand if kind == "u" else torch.randn
        return base(work.shape, generator=gen, device=work.device, dtype=torch.float64)

    if dist == "scaled":
        return work * scale
    if dist == "heavy_tailed":
        return work * scale * torch.exp(1.5 * noise("z"))
    if dist == "offset":
        return (work + offset) * scale
    if dist == "sparse":
        return work * scale * (noise("u") >= 0.6)
    return torch.sign(work) * noise("u") * scale  # uniform

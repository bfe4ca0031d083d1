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


def domain_sweep(n: int, dtype: Any, seed: int, device: Any = None) -> Any:
    """``n`` float64 values covering ``dtype``'s finite domain (:data:`DOMAIN_RANGES`): magnitudes
    log-spaced from the smallest to the edge, the edge itself and 1.0 included, half of them negative,
    permuted by ``seed`` (the values are the same every verification, their places are not)."""
    import torch

    name = str(dtype).replace("torch.", "")
    tiny, edge = DOMAIN_RANGES.get(name, DOMAIN_RANGES["float32"])
    pos = n - n // 2
    mags = torch.logspace(math.log10(tiny), math.log10(edge), max(pos, 1), dtype=torch.float64)
    if pos >= 3:
        mags[-2] = 1.0  # the ordinary scale too
    negs = torch.logspace(math.log10(tiny), math.log10(edge), max(n // 2, 1), dtype=torch.float64)[: n // 2]
    values = torch.cat([mags[:pos], -negs])
    gen = torch.Generator()
    gen.manual_seed(int(seed) % (1 << 63))
    values = values[torch.randperm(n, generator=gen)]
    return values.to(device) if device is not None else values


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
        return [domain_sweep(x.numel(), x.dtype, int(seed) * 1_000_003 + k, x.device).reshape(x.shape).to(x.dtype)
                if isinstance(x, torch.Tensor) and x.is_floating_point() else x for k, x in enumerate(inputs)]
    out = []
    for k, x in enumerate(inputs):
        if not (isinstance(x, torch.Tensor) and x.is_floating_point()):
            out.append(x)
            continue
        gen = torch.Generator(device=x.device)
        gen.manual_seed((int(seed) * 1_000_003 + k) % (1 << 63))
        work = x.double() if x.dtype != torch.float64 else x

        def noise(kind: str) -> Any:
            base = torch.rand if kind == "u" else torch.randn
            return base(x.shape, generator=gen, device=x.device, dtype=torch.float64)

        if dist == "scaled":
            y = work * scale
        elif dist == "heavy_tailed":
            y = work * scale * torch.exp(1.5 * noise("z"))
        elif dist == "offset":
            u, side = torch.rand(2, generator=gen, device=x.device).tolist()
            c = (3 + 27 * u) * (1 if side < 0.5 else -1)
            y = (work + c) * scale
        elif dist == "sparse":
            y = work * scale * (noise("u") >= 0.6)
        else:  # uniform
            y = torch.sign(work) * noise("u") * scale
        out.append(y.to(x.dtype))
    return out

"""Stability probes (issue 18, item 2): drawn afresh per verification at random scales, mild ones
included, and with other distributions than scaled randn; judged where the reference is finite;
an unusable probe is reported, never dropped."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from core.task import Candidate, Task
from core.verification.evidence import compare_outputs
from core.verification.probes import DISTRIBUTIONS, MILD, MILD_EXCLUDED, SCALE_RANGES, apply, describe, draw_plan
from core.verify import Verifier

HERE = Path(__file__).parent / "redteam"


@pytest.mark.parametrize("dtype", sorted(SCALE_RANGES))
def test_a_plan_has_a_large_a_small_and_a_mild_probe_in_the_dtypes_range(dtype):
    (large_lo, large_hi), (small_lo, small_hi) = SCALE_RANGES[dtype]
    for seed in range(50):
        large, small, mild, domain = draw_plan(dtype, random.Random(seed))
        assert large_lo * 0.99 <= large["scale"] <= large_hi * 1.01
        assert small_lo * 0.99 <= small["scale"] <= small_hi * 1.01
        assert MILD[0] * 0.99 <= mild["scale"] <= MILD[1] * 1.01
        assert not MILD_EXCLUDED[0] <= mild["scale"] <= MILD_EXCLUDED[1]
        assert {p["dist"] for p in (large, small, mild)} <= set(DISTRIBUTIONS)


def test_plans_are_drawn_afresh_and_cover_every_distribution():
    plans = [draw_plan("float32") for _ in range(40)]  # the default: the system's randomness
    assert len({tuple(p["scale"] for p in plan) for plan in plans}) == len(plans)
    assert {p["dist"] for plan in plans for p in plan} == set(DISTRIBUTIONS)


@settings(max_examples=40, deadline=None)
@given(dist=st.sampled_from(DISTRIBUTIONS), scale=st.floats(1e-6, 1e6), seed=st.integers(0, 2**62),
       shape=st.lists(st.integers(1, 40), min_size=1, max_size=3))
def test_every_worker_draws_the_same_probe_inputs(dist, scale, seed, shape):
    torch.manual_seed(seed % 1000)
    x, idx = torch.randn(shape), torch.randint(0, 5, shape)
    probe = {"scale": scale, "dist": dist}
    first, again = apply([x, idx, 3], probe, seed), apply([x, idx, 3], probe, seed)
    assert torch.equal(first[0], again[0]) and first[0].dtype == x.dtype and first[0].shape == x.shape
    assert first[1] is idx and first[2] == 3  # integers and plain values are left alone


def test_the_distributions_have_the_shapes_they_promise():
    torch.manual_seed(0)
    x = torch.randn(200_000)

    def draw(dist):
        return apply([x], {"scale": 10.0, "dist": dist}, seed=7)[0]

    assert torch.equal(draw("scaled"), x * 10)
    heavy = draw("heavy_tailed")
    assert torch.equal(torch.sign(heavy), torch.sign(x))
    assert heavy.abs().max() / heavy.abs().median() > 10 * (x.abs().max() / x.abs().median())
    assert draw("offset").mean().abs() >= 10 * 3 - 0.5  # shifted by at least 3 before scaling
    assert 0.55 < float((draw("sparse") == 0).float().mean()) < 0.65
    uniform = draw("uniform")
    assert float(uniform.abs().max()) <= 10 and torch.equal(torch.sign(uniform), torch.sign(x))
    with pytest.raises(ValueError, match="unknown probe distribution"):
        apply([x], {"scale": 1.0, "dist": "gaussian"}, seed=0)
    assert describe({"scale": 1e3, "dist": "scaled"}) == "x1000" and describe({"scale": 0.5, "dist": "sparse"}) == "x0.5 sparse"


def test_a_probe_is_judged_only_where_the_reference_is_finite():
    ref = torch.tensor([1.0, float("inf"), float("nan"), -2.0])
    assert compare_outputs([ref], [torch.tensor([1.0, 5.0, 0.0, -2.0])], scale_aware=True).judged == 2
    assert compare_outputs([ref], [torch.tensor([1.0, 5.0, 0.0, -2.0])], scale_aware=True).ok
    lost = compare_outputs([ref], [torch.tensor([float("inf"), 5.0, 0.0, -2.0])], scale_aware=True)
    assert not lost.ok and "not finite where the reference is" in lost.detail
    assert not compare_outputs([ref], [torch.tensor([1.0, 5.0, 0.0, -2.0])]).ok  # trials still match NaN/inf
    nowhere = torch.full((3,), float("inf"))
    assert compare_outputs([nowhere], [torch.zeros(3)], scale_aware=True).judged == 0


def _verify(task: str, candidate: str, probe_scales: dict | None = None, checks=None):
    with Verifier(backend="triton", device="cpu", workers=1, timeout_s=90, probe_scales=probe_scales,
                  checks=checks) as v:
        return v.verify(Task.from_file(HERE / "tasks" / f"{task}.py"), Candidate.from_file(HERE / "candidates" / f"{candidate}.py"))


def test_a_kernel_that_recognises_fixed_probes_passed_them_and_fails_drawn_ones():
    checks = ["correctness", "integrity", "stability"]
    fixed = _verify("softmax", "num_probe_recognising_softmax", {"float32": [1e3, 1e-5, 1e15]}, checks)
    # the old, recognisable scales: it behaves on each of them, but every plan now also sweeps the domain
    assert not fixed.accepted and fixed.reason.startswith("stability: inputs domain sweep"), fixed.reason
    drawn = _verify("softmax", "num_probe_recognising_softmax", None, checks)
    honest = _verify("softmax", "honest_softmax", None, checks)
    assert not drawn.accepted and drawn.reason.startswith("stability: inputs x"), drawn.reason
    assert honest.accepted, honest.reason
    assert "stable on probes" in honest.checks["stability"].detail


def test_an_unusable_probe_is_reported_not_dropped(tmp_path):
    task = tmp_path / "square.py"
    task.write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
        "        return x * x * 1e30\n\n\ndef get_inputs():\n    return [torch.randn(64) + 3]\n\n\n"
        "def get_init_inputs():\n    return []\n")
    candidate = (
        "import torch\nimport torch.nn as nn\nimport triton\nimport triton.language as tl\n\n\n@triton.jit\n"
        "def square_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):\n"
        "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n    x = tl.load(x_ptr + offs, mask=offs < n)\n"
        "    tl.store(out_ptr + offs, x * x * 1e30, mask=offs < n)\n\n\nclass ModelNew(nn.Module):\n"
        "    def forward(self, x):\n        out = torch.empty_like(x)\n"
        "        square_kernel[(1,)](x, out, x.numel(), BLOCK=64)\n        return out\n")
    path = tmp_path / "cand.py"
    path.write_text(candidate)
    with Verifier(backend="triton", device="cpu", workers=1, timeout_s=90, probe_scales={"float32": [1e10, 2.0]},
                  checks=["correctness", "integrity", "stability"]) as v:
        verdict = v.verify(Task.from_file(task), Candidate.from_file(path))
    assert verdict.accepted, verdict.reason
    stability = verdict.checks["stability"]
    assert stability.data["unusable"] == ["x1e+10"] and stability.data["judged"] == ["x2", "domain sweep"]
    assert "1 probe(s) unusable, the reference nowhere finite: x1e+10" in stability.detail


def _sweep_values(n: int, dtype: str) -> torch.Tensor:
    """The domain sweep's values as its docstring defines them, sorted: log-spaced magnitudes from the
    smallest to the edge (1.0 among them), half negative."""
    import math

    from core.verification.probes import DOMAIN_RANGES

    tiny, edge = DOMAIN_RANGES[dtype]
    pos = n - n // 2
    mags = torch.logspace(math.log10(tiny), math.log10(edge), max(pos, 1), dtype=torch.float64)[:pos]
    if pos >= 3:
        mags[-2] = 1.0
    negs = torch.logspace(math.log10(tiny), math.log10(edge), max(n // 2, 1), dtype=torch.float64)[: n // 2]
    return torch.cat([mags, -negs]).sort().values


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 3000), seed=st.integers(0, 2**62), chunk=st.sampled_from([7, 64, 1 << 24]),
       dtype=st.sampled_from(["float32", "float16", "float64"]))
@example(n=587, seed=488_530_602_016, chunk=7, dtype="float32")  # a seed-jittered stride gave a row 79%
def test_the_domain_sweep_holds_every_value_of_the_domain_once_in_a_seeded_order(n, seed, chunk, dtype):
    # every worker draws the same sweep; however it is chunked (a 4-GiB input is swept a chunk at a time),
    # the same values (to the last ulp of a vectorised pow) in the same places
    from unittest import mock

    import core.verification.probes as probes
    from core.verification.probes import domain_sweep

    whole = domain_sweep(n, dtype, seed)
    with mock.patch.object(probes, "CHUNK", chunk):
        chunked = domain_sweep(n, dtype, seed)
        assert torch.equal(chunked, domain_sweep(n, dtype, seed))
    assert torch.equal(whole, domain_sweep(n, dtype, seed))
    torch.testing.assert_close(whole.sort().values, _sweep_values(n, dtype), rtol=1e-12, atol=0)
    torch.testing.assert_close(chunked.sort().values, _sweep_values(n, dtype), rtol=1e-12, atol=0)
    if n >= 300 and chunk < n:  # every row of 100 consecutive places spans most of the domain's decades
        import math

        from core.verification.probes import DOMAIN_RANGES

        tiny, edge = DOMAIN_RANGES[dtype]
        rows = chunked[: n - n % 100].abs().log10().reshape(-1, 100)
        spans = rows.max(dim=1).values - rows.min(dim=1).values
        assert float(spans.min()) > 0.8 * (math.log10(edge) - math.log10(tiny))
    if n > 16:  # places differ between seeds; the values do not
        assert not torch.equal(domain_sweep(n, dtype, seed + 1), whole)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(300, 60_000))
def test_every_row_of_the_large_sweep_order_spans_the_domain_whatever_its_start(n):
    # the stride alone fixes which ranks a row of 100 places gets (the seed only shifts and reverses the
    # order), so checking every start bounds every seed: no row is a narrow band of the domain
    from core.verification.probes import _golden_stride

    a = _golden_stride(n)
    assert math.gcd(a, n) == 1
    pos, neg = n - n // 2, n // 2
    starts = torch.arange(n, dtype=torch.int64)[:, None]
    ranks = (starts + a * torch.arange(100, dtype=torch.int64)[None, :]) % n
    negative = ranks >= pos
    place = torch.where(negative, (ranks - pos) / max(neg - 1, 1), ranks / max(pos - 1, 1))
    assert float((place.max(dim=1).values - place.min(dim=1).values).min()) > 0.85


@settings(max_examples=30, deadline=None)
@given(dist=st.sampled_from(sorted(set(DISTRIBUTIONS) - {"domain"})), seed=st.integers(0, 2**40),
       n=st.integers(1, 400), chunk=st.sampled_from([5, 64, 1 << 24]))
def test_a_probe_is_the_same_whether_computed_whole_or_in_chunks(dist, seed, n, chunk):
    # chunks bound the float64 transient on the device; a worker's chunking never changes its inputs
    from unittest import mock

    import core.verification.probes as probes

    x = torch.randn(n, generator=torch.Generator().manual_seed(seed % 1000))
    probe = {"scale": 3.0, "dist": dist}
    whole = apply([x], probe, seed)[0]
    with mock.patch.object(probes, "CHUNK", chunk):
        again = apply([x], probe, seed)[0]
    if dist in ("scaled", "offset"):  # no noise drawn: chunking cannot move anything
        assert torch.equal(whole, again)
    assert again.dtype == x.dtype and again.shape == x.shape and torch.isfinite(again).all()

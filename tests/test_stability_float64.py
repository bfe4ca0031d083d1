"""Accuracy is judged against a float64 run of the task, not against PyTorch's fp32 rounding.

Ill-conditioned compositions (a normalisation after a bias or a softmax, probed at x1e-5 / x1e3)
amplify rounding noise by ~1/sqrt(eps); the fp32 reference carries that noise too, so an honest
kernel that rounds differently used to fail the stability probe (issue 3, six false rejections in
the expert's 500-task run). These tests pin both sides of the rule in core.verification.evidence.compare_outputs:
honest fp32 evaluations are accepted against the truth, less accurate ones still are not.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.program import Node, Program, TensorSpec
from core.task import Candidate
from core.verification.evidence import REFERENCE_NOISE_FACTOR, compare_outputs
from core.verify import Verifier

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

# The stability probe's tolerances (StabilityCheck: 10x the fp32 table, atol relative to magnitude).
PROBE_TOL = {"float32": (1e-3, 1e-3)}


def _layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """An honest fp32 layer norm that rounds differently from PyTorch's (two passes, its own order)."""
    mean = x.flip(-1).sum(-1, keepdim=True) / x.shape[-1]
    dev = x - mean
    var = (dev * dev).flip(-1).sum(-1, keepdim=True) / x.shape[-1]
    return dev * torch.rsqrt(var + eps) * w + b


def _softmax(z: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    z = z.to(dtype)
    e = torch.exp(z - z.max(-1, keepdim=True).values)
    return (e / e.sum(-1, keepdim=True)).float()


def _softmax_layer_norm(rows: int, cols: int, scale: float, seed: int):
    """softmax -> layer_norm on inputs scaled like the probe: the fp32 reference, the float64 truth
    (the same fp32 inputs, run in float64), and the weight/bias."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) * scale
    w, b = torch.randn(cols, generator=g), torch.zeros(cols)  # nn.LayerNorm's bias starts at 0
    ref = torch.nn.functional.layer_norm(torch.softmax(x, -1), (cols,), w, b, 1e-5)
    truth = torch.nn.functional.layer_norm(torch.softmax(x.double(), -1), (cols,), w.double(), b.double(), 1e-5)
    return x, w, b, ref, truth


conditioning = {"rows": st.integers(1, 12), "cols": st.sampled_from([8, 16, 33, 64, 200]),
                "scale": st.sampled_from([1e-5, 1e-4, 1e-3]), "seed": st.integers(0, 2**31 - 1)}


def test_the_false_rejection_is_real_without_the_truth():
    """What issue 3 saw: an honest fp32 kernel misses PyTorch's fp32 result at x1e-5, not the truth."""
    plain_failures = 0
    for seed in range(5):
        x, w, b, ref, truth = _softmax_layer_norm(8, 64, 1e-5, seed)
        honest = _layer_norm(_softmax(x), w, b)
        plain_failures += not compare_outputs([ref], [honest], tolerances=PROBE_TOL, scale_aware=True).ok
        assert compare_outputs([ref], [honest], tolerances=PROBE_TOL, scale_aware=True, truth=[truth]).ok
    assert plain_failures >= 3  # measured: every seed fails the plain comparison


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**conditioning)
def test_an_honest_fp32_softmax_layer_norm_is_accepted_against_the_float64_truth(rows, cols, scale, seed):
    x, w, b, ref, truth = _softmax_layer_norm(rows, cols, scale, seed)
    honest = _layer_norm(_softmax(x), w, b)
    cmp = compare_outputs([ref], [honest], tolerances=PROBE_TOL, scale_aware=True, truth=[truth])
    assert cmp.ok, cmp.detail
    assert cmp.noise_ratio <= REFERENCE_NOISE_FACTOR


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**conditioning)
def test_a_softmax_computed_in_fp16_is_still_rejected(rows, cols, scale, seed):
    x, w, b, ref, truth = _softmax_layer_norm(rows, cols, scale, seed)
    half = _layer_norm(_softmax(x, torch.float16), w, b)
    cmp = compare_outputs([ref], [half], tolerances=PROBE_TOL, scale_aware=True, truth=[truth])
    assert not cmp.ok
    assert "float64 reference" in cmp.detail


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 64), noise=st.floats(0, 1e-3), seed=st.integers(0, 2**31 - 1))
def test_the_truth_only_ever_widens_acceptance(n, noise, seed):
    """Whatever the truth says, a candidate that matches the fp32 reference is still accepted."""
    g = torch.Generator().manual_seed(seed)
    ref = torch.randn(n, generator=g)
    got = ref + noise * torch.randn(n, generator=g)
    wild_truth = torch.randn(n, generator=g, dtype=torch.float64) * 100
    plain = compare_outputs([ref], [got])
    with_truth = compare_outputs([ref], [got], truth=[wild_truth])
    assert with_truth.ok or not plain.ok


def test_nan_or_inf_where_the_reference_is_finite_fails_even_with_a_truth():
    ref = torch.tensor([1.0, 2.0, 3.0])
    truth = ref.double()
    for bad in (float("nan"), float("inf")):
        got = torch.tensor([1.0, bad, 3.0])
        cmp = compare_outputs([ref], [got], truth=[truth], noise_factor=1e30)
        assert not cmp.ok


def test_a_truth_that_is_not_finite_gives_no_allowance():
    ref = torch.tensor([1.0, 2.0, 3.0])
    truth = torch.tensor([1.0, float("inf"), 3.0], dtype=torch.float64)  # e.g. float64 semantics differ
    cmp = compare_outputs([ref], [torch.tensor([1.0, 2.5, 3.0])], truth=[truth])
    assert not cmp.ok and "float64" not in cmp.detail


# --------------------------------------------------------------------------- through the verifier


@pytest.fixture(scope="module", params=[False, True], ids=["judge_compares", "compare_on_device"])
def verifier(request):
    # compare_on_device: the keeper computes, vets and uses the float64 truth itself (core.verification.devicemem)
    with Verifier(backend="triton", device="cpu", workers=2, timeout_s=120, compare_on_device=request.param) as v:
        yield v


@pytest.fixture(scope="module")
def catalog():
    from core.plugins import registry

    ops = registry("op")
    return {n: ops.get(n) for n in ops.names()}


def _task(program: Program, catalog):
    from plugins.proposers.common import program_to_task

    return program_to_task(program, catalog, seed=0)


def _expert(task) -> Candidate:
    from core.plugins import registry

    candidate = registry("coder").create("expert").generate([task], "triton")[0][0]
    assert not candidate.declined, candidate.declined
    return candidate


# The compositions named in issue 3's false rejections (conv -> layer_norm, softmax ->
# layer_norm, log_softmax -> group_norm, matmul -> layer_norm -> sum), at CPU-test sizes.
ILL_CONDITIONED = {
    # the conv's bias is constant along the normalised rows: at x1e-5 it dominates them
    "conv2d->layer_norm": Program([TensorSpec((2, 3, 10, 12))], [
        Node("conv2d", (0,), {"out_channels": 4, "kernel_size": 3, "stride": 1, "padding": 1, "dilation": 1,
                              "groups": 1}),
        Node("layer_norm", (1,), {"eps": 1e-5})]),
    "softmax->layer_norm": Program([TensorSpec((29, 64))], [
        Node("softmax", (0,)), Node("layer_norm", (1,), {"eps": 1e-5})]),
    "log_softmax->group_norm": Program([TensorSpec((4, 8, 16))], [
        Node("log_softmax", (0,)), Node("group_norm", (1,), {"num_groups": 2, "eps": 1e-5})]),
    "matmul->layer_norm->sum": Program([TensorSpec((33, 53)), TensorSpec((53, 72))], [
        Node("matmul", (0, 1)), Node("layer_norm", (2,), {"eps": 1e-5}), Node("sum", (3,), {"dim": -1, "keepdim": True})]),
}


@pytest.mark.parametrize("name", sorted(ILL_CONDITIONED))
def test_honest_expert_kernels_on_ill_conditioned_compositions_are_accepted(verifier, catalog, name):
    task = _task(ILL_CONDITIONED[name], catalog)
    verdict = verifier.verify(task, _expert(task))
    assert verdict.accepted, verdict.reason
    assert verdict.checks["stability"].passed


def _mutate(source: str, pattern: str, replacement: str) -> str:
    import re

    mutated, n = re.subn(pattern, replacement, source)
    assert n, f"the expert's layer-norm code changed shape; update the pattern {pattern!r}"
    return mutated


# Rows whose mean dwarfs their spread (x * 0.01 + 1) but whose variance still dwarfs eps.
OFFSET_ROWS = Program([TensorSpec((8, 64), scale=1e-2)], [
    Node("add_scalar", (0,), {"value": 1.0}), Node("layer_norm", (1,), {"eps": 1e-5})])


def test_the_expert_kernel_for_offset_rows_is_accepted(verifier, catalog):
    task = _task(OFFSET_ROWS, catalog)
    verdict = verifier.verify(task, _expert(task))
    assert verdict.accepted, verdict.reason


def test_a_one_pass_variance_layer_norm_is_rejected_against_the_truth(verifier, catalog):
    """E[x^2] - E[x]^2 in fp32 loses ~3 digits when the mean dwarfs the spread: far beyond 16x
    PyTorch's own error against the float64 truth, so the truth does not rescue it."""
    import re

    task = _task(OFFSET_ROWS, catalog)
    honest = _expert(task).source
    found = re.search(r"(_t\d+)_dev = tl\.where\(m2, (\w+) - \1_mean, 0\.0\)", honest)
    assert found, "the expert's layer-norm code changed shape; update the pattern"
    stat, x = found.groups()
    source = _mutate(honest, rf"tl\.sum\({stat}_dev \* {stat}_dev, axis=1\)\[:, None\] / N",
                     f"tl.maximum(tl.sum(tl.where(m2, {x} * {x}, 0.0), axis=1)[:, None] / N - {stat}_mean * {stat}_mean, 0.0)")
    verdict = verifier.verify(task, Candidate(source=source, backend="triton"))
    assert not verdict.accepted
    assert verdict.reason.startswith("correctness:"), verdict.reason
    assert "float64 reference" in verdict.reason


def test_a_layer_norm_that_rounds_to_fp16_inside_the_kernel_is_rejected(verifier, catalog):
    task = _task(ILL_CONDITIONED["softmax->layer_norm"], catalog)
    source = _mutate(_expert(task).source, r"(_t\d+_dev) = tl\.where\(m2, (\w+) - (_t\d+_mean), 0\.0\)",
                     r"\1 = tl.where(m2, \2 - \3, 0.0).to(tl.float16).to(tl.float32)")
    verdict = verifier.verify(task, Candidate(source=source, backend="triton"))
    assert not verdict.accepted
    assert verdict.reason.startswith("correctness:"), verdict.reason


# --------------------------------------------------------------------------- when there is no truth

_SCALED_ADD = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def scaled_add(a_ptr, b_ptr, out_ptr, n, factor, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask)
    b = tl.load(b_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, a * factor + b, mask=mask)


class ModelNew(nn.Module):
    def forward(self, a, b):
        out = torch.empty_like(a)
        scaled_add[(triton.cdiv(a.numel(), 1024),)](a, b, out, a.numel(), FACTOR, BLOCK=1024)
        return out
'''


def _scaled_add_task(body: str):
    from core.task import Task

    return Task(source=f'''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b):
        return {body}


def get_inputs():
    return [torch.randn(3001), torch.randn(3001)]


def get_init_inputs():
    return []
''')


def test_a_float64_run_that_is_another_function_is_not_used_as_truth(verifier):
    """A dtype-dependent constant makes the float64 run a different function: the trials show it,
    the truth is dropped, and a candidate that matches the float64 run instead is rejected."""
    task = _scaled_add_task("a * (torch.finfo(a.dtype).eps * 1e6) + b")
    fp32_factor = torch.finfo(torch.float32).eps * 1e6
    honest = verifier.verify(task, Candidate(source=_SCALED_ADD.replace("FACTOR", repr(fp32_factor))))
    assert honest.accepted, honest.reason
    # the honest kernel matches the fp32 reference: the float64 run was never needed
    assert "on demand" in honest.checks["correctness"].data["float64_reference"]
    float64_factor = torch.finfo(torch.float64).eps * 1e6
    other = verifier.verify(task, Candidate(source=_SCALED_ADD.replace("FACTOR", repr(float64_factor))))
    assert not other.accepted and other.reason.startswith("correctness:"), other.reason
    # ... this one missed it, so the truth was fetched, vetted against the trials, and dropped
    assert "disagrees with the fp32 reference" in other.checks["correctness"].data["float64_reference"]


def test_a_task_that_draws_random_numbers_gets_no_float64_truth(verifier):
    task = _scaled_add_task("a * 2.0 + b + 0.0 * torch.rand_like(a)")
    verdict = verifier.verify(task, Candidate(source=_SCALED_ADD.replace("FACTOR", "2.0")))
    assert verdict.accepted, verdict.reason
    assert "random numbers" in verdict.checks["correctness"].data["float64_reference"]
    wrong = verifier.verify(task, Candidate(source=_SCALED_ADD.replace("FACTOR", "2.5")))
    assert not wrong.accepted and "random numbers" in wrong.checks["correctness"].data["float64_reference"]


def test_the_float64_reference_is_used_and_can_be_turned_off(verifier, catalog):
    task = _task(ILL_CONDITIONED["softmax->layer_norm"], catalog)
    with Verifier(backend="triton", device="cpu", workers=1, float64_on_demand=False) as eager:
        verdict = eager.verify(task, _expert(task))
    assert verdict.checks["correctness"].data["float64_reference"] == "float64 reference in use"
    with Verifier(backend="triton", device="cpu", workers=1, float64_max_elements=0) as off:
        verdict = off.verify(task, _expert(task))
    assert verdict.checks["correctness"].data["float64_reference"] == "float64 reference disabled"


# --------------------------------------------------------------------------- when PyTorch's rounding is lucky

# x * s + c with c in +-[3, 30] (the "offset" probe) at s ~1e-8: after "+ 1.0" fp32 rounds every row to
# one or two neighbouring constants. PyTorch's Welford pass then has an exact mean and the reference is
# 0 (off by the truth's own ~1e-7), while the expert's two-pass kernel, whose partial sums round, is
# ~4e-5 off: 100x "worse" than PyTorch through no fault of its own. CI drew such a probe and rejected
# the honest kernel; fp32 rounding noise measured by Monte Carlo arithmetic (core.verification.worker.
# rounding) is the yardstick now, not one lucky rounding.
LUCKY_PROBES = [{"scale": s, "dist": "offset"} for s in (1e-8, 2.68e-8, 1e-7)]


@pytest.mark.parametrize("compare_on_device", [False, True], ids=["judge_compares", "compare_on_device"])
def test_the_expert_kernel_is_accepted_where_pytorch_rounds_luckily(catalog, compare_on_device):
    task = _task(OFFSET_ROWS, catalog)
    candidate = _expert(task)
    with Verifier(backend="triton", device="cpu", workers=1, timeout_s=120, compare_on_device=compare_on_device,
                  probe_scales={"float32": LUCKY_PROBES}) as v:
        for _ in range(3):  # the probes' seeds are drawn per verification: several roundings
            verdict = v.verify(task, candidate)
            assert verdict.accepted, verdict.reason
            assert verdict.checks["stability"].passed


def test_fp16_statistics_are_still_rejected_where_pytorch_rounds_luckily(catalog):
    """The rounding yardstick is fp32's: a kernel that rounds its deviations to fp16 is ~2^13 noisier."""
    task = _task(OFFSET_ROWS, catalog)
    source = _mutate(_expert(task).source, r"(_t\d+_dev) = tl\.where\(m2, (\w+) - (_t\d+_mean), 0\.0\)",
                     r"\1 = tl.where(m2, \2 - \3, 0.0).to(tl.float16).to(tl.float32)")
    with Verifier(backend="triton", device="cpu", workers=1, timeout_s=120,
                  probe_scales={"float32": [{"scale": 1e3, "dist": "offset"}, *LUCKY_PROBES]}) as v:
        verdict = v.verify(task, Candidate(source=source, backend="triton"))
    assert not verdict.accepted
    assert "float64 reference" in verdict.reason, verdict.reason

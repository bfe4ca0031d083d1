"""A NaN of the fp32 reference that the float64 reference disputes.

PyTorch's fp32 GELU on the CPU gives NaN at +Inf on its vectorised path and +Inf on its scalar one
(short inner rows, float64, CUDA). Which elements take which path depends on the layout and on the
machine: the expert's kernel, written for one machine's NaN, failed CI on another machine's +Inf. The
rule (core.verification.evidence.truth_for_disputed_nan): where the fp32 reference is NaN, the
candidate holds a number and the vetted float64 reference is +-Inf, that value stands in for the
reference. A finite float64 value does not: it may be a dtype-dependent function. Everything else about NaN stays exact: no truth, a NaN truth, or any other number is
rejected, and NaN where the reference is a number is never accepted.
"""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from core.program import Node, Program, TensorSpec
from core.verification.evidence import RunObservation, Trial, compare_outputs, truth_agrees
from core.verify import Verifier

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

INF, NAN = float("inf"), float("nan")


def _reference_and_truth(n: int, at: int, truth_value: float):
    ref = torch.linspace(-2.0, 2.0, n)
    truth = ref.double().clone()
    ref[at], truth[at] = NAN, truth_value
    return ref, truth


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 64), data=st.data(), truth_value=st.sampled_from([INF, -INF]))
def test_the_truths_value_stands_in_for_a_disputed_nan(n, data, truth_value):
    at = data.draw(st.integers(0, n - 1))
    ref, truth = _reference_and_truth(n, at, truth_value)
    honest = truth.float()
    cmp = compare_outputs([ref], [honest], truth=[truth])
    assert cmp.ok, cmp.detail
    assert "float64 reference's value where the fp32 reference is NaN" in cmp.detail
    assert compare_outputs([ref], [ref.clone()], truth=[truth]).ok  # the reference's own NaN still passes


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 64), data=st.data(), truth_value=st.sampled_from([INF, -INF]),
       other=st.sampled_from([INF, -INF, 0.0, 1.0, -7.25, 1e30]))
def test_any_other_number_there_is_rejected(n, data, truth_value, other):
    if other == truth_value:
        other = -truth_value - 1.0
    at = data.draw(st.integers(0, n - 1))
    ref, truth = _reference_and_truth(n, at, truth_value)
    forged = truth.float()
    forged[at] = other
    assert not compare_outputs([ref], [forged], truth=[truth]).ok


def test_without_a_usable_truth_a_number_where_the_reference_is_nan_fails():
    ref, truth = _reference_and_truth(8, 3, INF)
    honest = truth.float()
    assert not compare_outputs([ref], [honest]).ok  # no truth at all
    assert not compare_outputs([ref], [honest], truth=lambda: None).ok  # the truth was refused
    nan_truth = truth.clone()
    nan_truth[3] = NAN
    assert not compare_outputs([ref], [honest], truth=[nan_truth]).ok  # the truth is NaN there too
    assert not compare_outputs([ref], [honest], truth=[truth.float()]).ok  # not a float64 run
    assert not compare_outputs([ref], [honest], truth=[truth[:-1]]).ok  # not the output's shape


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 64), data=st.data(), truth_value=st.sampled_from([0.0, 3.5, -1e30, 1e-40]))
def test_a_finite_truth_does_not_stand_in_for_a_nan(n, data, truth_value):
    """fp32 NaN against a finite float64 value may be a dtype-dependent function, not rounding: the
    candidate holding the float64 value is rejected, as without a truth."""
    at = data.draw(st.integers(0, n - 1))
    ref, truth = _reference_and_truth(n, at, truth_value)
    assert not compare_outputs([ref], [truth.float()], truth=[truth]).ok
    assert not truth_agrees([_trial(ref, truth)])[0]


def test_nan_where_the_reference_is_a_number_fails_whatever_the_truth():
    ref = torch.tensor([1.0, NAN, 3.0])
    got = torch.tensor([NAN, 2.0, 3.0])  # a number for the reference's NaN and a NaN for its number
    truth = torch.tensor([NAN, 2.0, 3.0], dtype=torch.float64)
    assert not compare_outputs([ref], [got], truth=[truth]).ok


def _trial(expected: torch.Tensor, truth: torch.Tensor) -> Trial:
    return Trial(seed=0, inputs=[], expected=[expected], observed=RunObservation("trial 0"), truth=[truth])


def test_the_vetting_of_the_truth_leaves_out_the_references_nans():
    ref, truth = _reference_and_truth(16, 5, INF)
    assert truth_agrees([_trial(ref, truth)])[0]
    other = truth.clone()
    other[7] = 100.0  # a different function where the reference is a number: still refused
    assert not truth_agrees([_trial(ref, other)])[0]
    nan_truth = ref.double().clone()
    nan_truth[2] = NAN  # NaN in float64 where fp32 has a number: still refused
    assert not truth_agrees([_trial(ref, nan_truth)])[0]


# --------------------------------------------------------------------------- through the verifier

@pytest.fixture(scope="module", params=[False, True], ids=["judge_compares", "compare_on_device"])
def verifier(request):
    with Verifier(backend="triton", device="cpu", workers=1, timeout_s=120, compare_on_device=request.param) as v:
        yield v


def _gelu_task(layout: str):
    from core.plugins import registry
    from plugins.proposers.common import program_to_task

    ops = registry("op")
    catalog = {n: ops.get(n) for n in ops.names()}
    program = Program([TensorSpec((3, 37), layout=layout, distribution="specials")],
                      [Node("gelu", (0,), {"approximate": "none"})])
    return program_to_task(program, catalog, seed=0)


def _expert(task):
    from core.plugins import registry

    candidate = registry("coder").create("expert").generate([task], "triton")[0][0]
    assert not candidate.declined, candidate.declined
    return candidate


def _reference_outputs(task) -> tuple[torch.Tensor, torch.Tensor]:
    """The task's fp32 output and its float64 run on the same inputs (what the verifier's truth is)."""
    from plugins.coders.expert_lowering.selfcheck import load_module

    module = load_module(task.source, "gelu_ref")
    torch.manual_seed(0)
    inputs = module.get_inputs()
    with torch.no_grad():
        return module.Model()(*inputs), module.Model().double()(*[x.double() for x in inputs])


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_the_experts_gelu_of_specials_is_accepted_whichever_value_this_cpu_gives(verifier, layout):
    task = _gelu_task(layout)
    verdict = verifier.verify(task, _expert(task))
    assert verdict.accepted, verdict.reason


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_the_truth_the_rule_relies_on_is_inf_where_the_specials_plant_inf(layout):
    """The float64 run is +Inf at the planted +Inf whatever this CPU's fp32 path gives there (NaN
    vectorised, +Inf scalar), and NaN at the planted NaN: so only +Inf can stand in for a NaN."""
    fp32, fp64 = (out.reshape(-1) for out in _reference_outputs(_gelu_task(layout)))
    middle = fp32.numel() // 2
    assert float(fp64[middle]) == INF
    assert float(fp32[middle]) == INF or bool(torch.isnan(fp32[middle]))
    assert bool(torch.isnan(fp64[0])) and bool(torch.isnan(fp32[0]))


DTYPE_DEPENDENT_TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        y = x * 2.0
        if x.dtype == torch.float32:  # NaN in fp32 where x > 1, numbers in float64
            y = torch.where(x > 1.0, torch.full_like(y, float("nan")), y)
        return y


def get_inputs():
    return [torch.randn(64, 64)]


def get_init_inputs():
    return []
'''

DOUBLING_KERNEL = '''import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _double(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=m) * 2.0, mask=m)


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        _double[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y
'''


def test_a_kernel_for_the_float64_function_of_a_dtype_dependent_task_is_rejected(verifier):
    """The float64 run is a different function where the fp32 task is NaN (finite there): the kernel
    that computes the float64 one skipped the task's NaNs and is rejected (it was accepted when any
    number of the truth could stand in)."""
    from core.task import Candidate, Task

    verdict = verifier.verify(Task(DTYPE_DEPENDENT_TASK), Candidate(DOUBLING_KERNEL, "triton"))
    assert not verdict.accepted
    assert verdict.reason.startswith("correctness:"), verdict.reason


@pytest.mark.parametrize("replacement", ["0.0", "-float('inf')", "3.0"])
def test_a_kernel_that_writes_another_number_at_inf_is_rejected(verifier, replacement):
    task = _gelu_task("contiguous")
    source = _expert(task).source
    forged, n = re.subn(r"(v1 = )(0\.5 \* v0 \* \(1\.0 \+ tl\.math\.erf\(v0 \* 0\.7071067811865476\)\))",
                        rf"\1tl.where(v0 == float('inf'), {replacement}, \2)", source)
    assert n == 1, "the expert's GELU code changed shape; update the pattern"
    from core.task import Candidate

    verdict = verifier.verify(task, Candidate(forged, "triton", task.id))
    assert not verdict.accepted
    assert "correctness" in verdict.reason


def test_a_kernel_that_hides_the_nan_of_a_nan_input_is_rejected(verifier):
    task = _gelu_task("contiguous")
    source = _expert(task).source
    forged, n = re.subn(r"(v1 = )(0\.5 \* v0 \* \(1\.0 \+ tl\.math\.erf\(v0 \* 0\.7071067811865476\)\))",
                        r"\1tl.where(v0 != v0, 0.0, \2)", source)
    assert n == 1
    from core.task import Candidate

    verdict = verifier.verify(task, Candidate(forged, "triton", task.id))
    assert not verdict.accepted

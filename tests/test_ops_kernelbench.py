"""The ops grown for KernelBench (issue 19): each one's shape rule, z3 hook and costs against torch,
and its expert lowering against the PyTorch reference in the Triton interpreter; rows too long for
one tile streamed in chunks."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.program import Node, Program, ProgramError, TensorSpec
from plugins.coders.expert_lowering import Unsupported, lower_program
from plugins.coders.expert_lowering.selfcheck import compare
from plugins.proposers.common import program_to_task, render_source, resolve_catalog
from plugins.proposers.solver import Constraints, ProgramBuilder
from plugins.proposers.validate import check_task

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

CATALOG = resolve_catalog()
GROWN = {
    "div", "maximum", "minimum", "div_scalar", "rsub_scalar", "pow_scalar", "abs", "neg", "sqrt", "rsqrt", "exp",
    "log", "mish", "hardsigmoid", "elu", "selu", "smooth_l1", "amin", "cumsum", "cumprod", "reshape", "expand",
    "triu", "tril", "conv1d", "conv3d", "conv_transpose1d", "conv_transpose3d", "max_pool1d", "max_pool3d",
    "avg_pool1d", "avg_pool3d",
}


def test_the_grown_ops_are_in_the_catalog_with_every_hook():
    assert GROWN <= set(CATALOG)
    for name in GROWN:
        spec = CATALOG[name]
        assert spec.render is not None and spec.call and spec.family and spec.tier in range(4)
        # shape-changing ops carry the z3 hook; elementwise ones are shape-preserving, as the builder assumes
        assert spec.constrain is not None or spec.family in ("elementwise", "activation"), name


def solved(name: str, seed: int) -> Program:
    rng = random.Random(seed)
    for _ in range(30):
        builder = ProgramBuilder(CATALOG, rng)
        try:
            builder.apply(name, builder.draw_params(name), numel_target=256)
            return builder.solve(Constraints(max_numel=2048, max_ops=1))
        except ProgramError:
            continue
    raise AssertionError(f"no valid instance of {name} in 30 draws")


@pytest.mark.parametrize("name", sorted(GROWN))
def test_z3_instance_runs_in_torch_with_the_inferred_shape_and_the_expert_matches(name):
    program = solved(name, 3)
    task = program_to_task(program, CATALOG, seed=3)
    check_task(task, CATALOG)  # torch agrees with the shape rule
    assert task.flops >= 0 and task.min_bytes > 0
    result = compare(task.source, lower_program(program, CATALOG), seed=3)
    assert result.ok, f"{name} {program.to_json()}: {result.detail}"


@pytest.mark.parametrize("params", [
    {"out_channels": 6, "kernel_size": (3, 2, 1), "stride": (1, 2, 1), "padding": (1, 0, 0), "dilation": (1, 1, 2),
     "groups": 2, "bias": False},
    {"out_channels": 4, "kernel_size": 2, "stride": 1, "padding": 0, "dilation": 1, "groups": 1},
])
def test_conv3d_per_axis_parameters(params):
    program = Program([TensorSpec((2, 4, 5, 6, 7))], [Node("conv3d", (0,), params), Node("relu", (1,))])
    assert compare(render_source(program, CATALOG), lower_program(program, CATALOG)).ok


def test_grouped_dilated_transposed_conv1d_and_dilated_max_pool1d():
    conv = {"out_channels": 6, "kernel_size": 3, "stride": 2, "padding": 1, "output_padding": 1, "dilation": 2,
            "groups": 3}
    program = Program([TensorSpec((2, 6, 9), layout="transposed")], [
        Node("conv_transpose1d", (0,), conv), Node("max_pool1d", (1,), {"kernel_size": 3, "stride": 2, "padding": 1,
                                                                       "dilation": 2})])
    assert compare(render_source(program, CATALOG), lower_program(program, CATALOG)).ok


def test_expand_is_a_view_and_broadcast_add_fuses_into_one_kernel():
    program = Program([TensorSpec((3, 8, 5)), TensorSpec((8, 1))],
                      [Node("expand", (1,), {"shape": (3, 8, 5)}), Node("add", (0, 2)), Node("tanh", (3,))])
    source = lower_program(program, CATALOG)
    assert source.count("@triton.jit\ndef _pointwise_") == 1 and ".expand(" in source
    assert compare(render_source(program, CATALOG), source).ok


def test_a_reshape_of_a_kernels_result_is_returned_without_a_copy():
    program = Program([TensorSpec((4, 6))], [Node("relu", (0,)), Node("reshape", (1,), {"shape": (2, -1)})])
    source = lower_program(program, CATALOG)
    assert source.count("@triton.jit\ndef _pointwise_") == 1  # no output copy kernel
    assert compare(render_source(program, CATALOG), source).ok
    view_of_input = Program([TensorSpec((4, 6))], [Node("reshape", (0,), {"shape": (24,)})])
    assert "_pointwise_" in lower_program(view_of_input, CATALOG)  # an input's view is copied out


def test_a_per_row_scalar_broadcast_back_stays_in_the_row_kernel():
    # x - mean(x, -1, keepdim) : the expanded mean is a register value, one kernel
    program = Program([TensorSpec((5, 33))], [Node("mean", (0,), {"keepdim": True}),
                                              Node("expand", (1,), {"shape": (5, 33)}), Node("sub", (0, 2))])
    source = lower_program(program, CATALOG)
    assert source.count("@triton.jit\ndef _rows_") == 1
    assert compare(render_source(program, CATALOG), source).ok


# --------------------------------------------------------------------------- long rows


LONG = 20000  # above the resident row limit (16384)


@pytest.mark.parametrize("ops", [
    [("softmax", {})], [("log_softmax", {})], [("logsumexp", {"keepdim": True})], [("sum", {})],
    [("mean", {"keepdim": True})], [("amax", {})], [("amin", {})], [("layer_norm", {"eps": 1e-5})],
    [("rms_norm", {"eps": 1e-6})], [("cumsum", {})], [("silu", {}), ("softmax", {}), ("tanh", {})],
])
def test_long_rows_are_streamed_in_chunks(ops):
    nodes = [Node(op, (i,), params) for i, (op, params) in enumerate(ops)]
    program = Program([TensorSpec((2, LONG), scale=3.0)], nodes)
    source = lower_program(program, CATALOG)
    assert "for n0 in range(0, N, BN)" in source
    assert compare(render_source(program, CATALOG), source, trials=1).ok, source


def test_long_rows_keep_nan_and_inf_like_pytorch():
    for op in ("amax", "amin", "softmax", "logsumexp"):
        program = Program([TensorSpec((3, LONG), distribution="specials")], [Node(op, (0,))])
        assert compare(render_source(program, CATALOG), lower_program(program, CATALOG), trials=1).ok, op


def test_long_half_precision_rows_and_long_cumprod_are_declined():
    with pytest.raises(Unsupported, match="resident row limit"):
        lower_program(Program([TensorSpec((2, LONG), dtype="bfloat16")], [Node("softmax", (0,))]), CATALOG)
    with pytest.raises(Unsupported, match="cumprod"):
        lower_program(Program([TensorSpec((2, LONG))], [Node("cumprod", (0,))]), CATALOG)


# --------------------------------------------------------------------------- random elementwise chains


UNARY = sorted(n for n in GROWN if CATALOG[n].arity == 1 and CATALOG[n].family in ("elementwise", "activation")
               and n not in ("triu", "tril"))
BINARY = ["div", "maximum", "minimum"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(st.sampled_from(UNARY + BINARY), min_size=1, max_size=4),
       shape=st.sampled_from([(7,), (3, 17), (2, 3, 5)]), scale=st.sampled_from([1.0, 30.0, 1e-3]),
       distribution=st.sampled_from(["randn", "rand", "specials"]), seed=st.integers(0, 1000))
def test_random_chains_of_the_grown_pointwise_ops_match(ops, shape, scale, distribution, seed):
    inputs = [TensorSpec(shape, scale=scale, distribution=distribution), TensorSpec(shape, layout="transposed"
                                                                                   if len(shape) > 1 else "offset")]
    nodes = []
    for op in ops:
        last = len(inputs) + len(nodes) - 1
        params = {k: v[0] for k, v in CATALOG[op].params.items()}
        nodes.append(Node(op, (last, 1) if CATALOG[op].arity == 2 else (last,), params))
    program = Program(inputs, nodes)
    result = compare(render_source(program, CATALOG), lower_program(program, CATALOG), seed=seed, trials=1)
    assert result.ok, f"{program.to_json()}: {result.detail}"

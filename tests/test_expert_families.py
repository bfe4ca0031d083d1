"""Expert lowering of the anchor families (layout views, norms, matmul/linear/bmm with epilogues),
run in the Triton interpreter against the PyTorch reference, adversarial layouts and sizes included."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.program import Node as N
from core.program import Program
from core.program import TensorSpec as T
from plugins.coders.expert_lowering import Unsupported, lower_program
from plugins.coders.expert_lowering.selfcheck import compare
from plugins.proposers.common import render_source

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

def _conv(oc, k, s, p, d, g):
    return {"out_channels": oc, "kernel_size": k, "stride": s, "padding": p, "dilation": d, "groups": g}


def _conv_t(oc, k, s, p, op):
    return {"out_channels": oc, "kernel_size": k, "stride": s, "padding": p, "output_padding": op, "dilation": 1}


CASES = {
    # conv2d as implicit GEMM (stride, padding, dilation, groups), pooling, fused epilogues
    "conv3x3": Program([T((2, 4, 9, 9))], [N("conv2d", (0,), _conv(8, 3, 1, 1, 1, 1))]),
    "conv_grouped_dilated_transposed_relu": Program([T((2, 4, 9, 11), layout="transposed")],
                                                    [N("conv2d", (0,), _conv(8, 3, 2, 2, 2, 2)), N("relu", (1,))]),
    "conv1x1_fp16_groups4": Program([T((2, 8, 7, 7), dtype="float16")], [N("conv2d", (0,), _conv(16, 1, 1, 0, 1, 4))]),
    "conv5x5_bf16_silu": Program([T((1, 3, 10, 10), dtype="bfloat16")],
                                 [N("conv2d", (0,), _conv(4, 5, 2, 2, 1, 1)), N("silu", (1,))]),
    "conv_transpose_3x3": Program([T((2, 4, 5, 5))], [N("conv_transpose2d", (0,), _conv_t(8, 3, 1, 0, 0))]),
    "conv_transpose_stride2_outpad_transposed_relu": Program(
        [T((2, 4, 5, 6), layout="transposed")], [N("conv_transpose2d", (0,), _conv_t(4, 4, 2, 1, 1)), N("relu", (1,))]),
    "conv_transpose_fp16": Program([T((1, 3, 7, 7), dtype="float16")], [N("conv_transpose2d", (0,), _conv_t(16, 2, 2, 0, 0))]),
    "sdpa_cross_lengths": Program([T((2, 3, 17, 8)), T((2, 3, 21, 8)), T((2, 3, 21, 12))],
                                  [N("scaled_dot_product_attention", (0, 1, 2), {"is_causal": False})]),
    "sdpa_causal_transposed_offset_relu": Program(
        [T((2, 2, 19, 16), layout="transposed"), T((2, 2, 19, 16)), T((2, 2, 19, 16), layout="offset")],
        [N("scaled_dot_product_attention", (0, 1, 2), {"is_causal": True}), N("relu", (3,))]),
    "sdpa_fp16_causal": Program([T((1, 2, 33, 32), dtype="float16")] * 3,
                                [N("scaled_dot_product_attention", (0, 1, 2), {"is_causal": True})]),
    "sdpa_bf16_many_key_blocks": Program(
        [T((1, 1, 40, 8), dtype="bfloat16"), T((1, 1, 300, 8), dtype="bfloat16"), T((1, 1, 300, 8), dtype="bfloat16")],
        [N("scaled_dot_product_attention", (0, 1, 2), {"is_causal": False})]),
    "sdpa_zero_batch": Program([T((0, 2, 5, 8)), T((0, 2, 7, 8)), T((0, 2, 7, 8))],
                               [N("scaled_dot_product_attention", (0, 1, 2), {"is_causal": False})]),
    # depthwise (groups = in channels): a direct kernel, the window unrolled (KernelBench level 1, 82_-86_)
    "depthwise3x3_bias": Program([T((2, 6, 9, 11))], [N("conv2d", (0,), _conv(6, 3, 1, 0, 1, 6))]),
    "depthwise_mult2_strided_dilated_padded_transposed_relu": Program(
        [T((2, 4, 10, 9), layout="transposed")], [N("conv2d", (0,), _conv(8, 3, 2, 2, 2, 4)), N("relu", (1,))]),
    "depthwise_asymmetric_kernel_fp16": Program([T((2, 4, 9, 8), dtype="float16")],
                                                [N("conv2d", (0,), _conv(4, (3, 1), 1, (1, 0), 1, 4))]),
    "depthwise_conv1d_offset": Program([T((2, 5, 17), layout="offset")], [N("conv1d", (0,), _conv(5, 4, 1, 1, 1, 5))]),
    "depthwise_conv3d_bf16": Program([T((1, 3, 5, 6, 7), dtype="bfloat16")],
                                     [N("conv3d", (0,), _conv(3, 3, 1, 1, 1, 3))]),
    "depthwise_separable": Program([T((2, 4, 8, 8))], [N("conv2d", (0,), _conv(4, 3, 1, 1, 1, 4)),
                                                       N("conv2d", (1,), _conv(6, 1, 1, 0, 1, 1))]),
    "max_pool_specials": Program([T((2, 3, 9, 9), distribution="specials")],
                                 [N("max_pool2d", (0,), {"kernel_size": 3, "stride": 2, "padding": 1})]),
    "avg_pool_offset_tanh": Program([T((2, 3, 9, 8), layout="offset")],
                                    [N("avg_pool2d", (0,), {"kernel_size": 2, "stride": 2, "padding": 1}), N("tanh", (1,))]),
    "conv_then_pool": Program([T((2, 3, 8, 8))], [N("conv2d", (0,), _conv(4, 3, 1, 1, 1, 1)),
                                                  N("max_pool2d", (1,), {"kernel_size": 2, "stride": 2, "padding": 0})]),
    # layout: views in forward, a strided copy kernel when a reshape must copy, a copy for a bare view
    "transpose_alone_is_copied": Program([T((3, 4, 5))], [N("transpose", (0,))]),
    "permute_relu_softmax": Program([T((3, 4, 5))], [N("permute", (0,), {"dims": (2, 0, 1)}), N("relu", (1,)),
                                                       N("softmax", (2,))]),
    "flatten_of_transposed": Program([T((3, 4, 5), layout="transposed")], [N("flatten", (0,)), N("sigmoid", (1,))]),
    "split_last_then_sum": Program([T((3, 8))], [N("split_last", (0,), {"factor": 4}), N("sum", (1,))]),
    "softmax_then_flatten": Program([T((2, 3, 7))], [N("softmax", (0,)), N("flatten", (1,))]),
    # norms
    "group_norm_rank4": Program([T((2, 8, 5, 7))], [N("group_norm", (0,), {"num_groups": 4, "eps": 1e-5})]),
    "group_norm_rank3_transposed_relu": Program([T((3, 8, 9), layout="transposed")],
                                                [N("group_norm", (0,), {"num_groups": 2, "eps": 1e-5}), N("relu", (1,))]),
    "group_norm_bf16_large": Program([T((2, 4, 6, 6), dtype="bfloat16", scale=100.0)],
                                     [N("group_norm", (0,), {"num_groups": 1, "eps": 1e-5})]),
    "group_norm_residual_offset": Program([T((2, 8, 5, 7)), T((2, 8, 5, 7), layout="offset")],
                                          [N("group_norm", (0,), {"num_groups": 8, "eps": 1e-5}), N("add", (2, 1))]),
    "layer_norm_gelu_strided": Program([T((6, 33), layout="strided")],
                                       [N("layer_norm", (0,), {"eps": 1e-5}), N("gelu", (1,), {"approximate": "none"})]),
    "rms_norm_fp16": Program([T((6, 33), dtype="float16")], [N("rms_norm", (0,), {"eps": 1e-6})]),
    "layer_norm_bf16_large": Program([T((4, 50), dtype="bfloat16", scale=1e3)], [N("layer_norm", (0,), {"eps": 1e-5})]),
    "batch_norm_relu_transposed": Program([T((2, 3, 4, 5), layout="transposed")],
                                          [N("batch_norm", (0,), {"eps": 1e-5}), N("relu", (1,))]),
    "batch_norm_then_softmax_is_two_kernels": Program([T((2, 3, 4, 5))], [N("batch_norm", (0,), {"eps": 1e-5}),
                                                                       N("softmax", (1,)), N("mean", (2,))]),
    # matmul family with fused epilogues
    "linear_bias_gelu_residual": Program([T((17, 24)), T((17, 40))], [
        N("linear", (0,), {"out_features": 40, "bias": True}), N("gelu", (2,), {"approximate": "tanh"}),
        N("add", (3, 1))]),
    "linear_rank3_transposed_nobias": Program([T((2, 17, 24), layout="transposed")],
                                              [N("linear", (0,), {"out_features": 16, "bias": False})]),
    "matmul_transposed_then_softmax": Program([T((33, 20)), T((20, 18), layout="transposed")],
                                              [N("matmul", (0, 1)), N("softmax", (2,))]),
    "bmm_bf16_offset_silu": Program([T((3, 33, 20), dtype="bfloat16"), T((3, 20, 18), dtype="bfloat16", layout="offset")],
                                    [N("bmm", (0, 1)), N("silu", (2,))]),
    # split-K (few output tiles, a long K): partial tiles per K-chunk, summed in order by the epilogue kernel
    "matvec_split_k": Program([T((16, 16424)), T((16424, 1))], [N("matmul", (0, 1))]),
    "linear_split_k_bias_relu": Program([T((8, 40960))], [N("linear", (0,), {"out_features": 24, "bias": True}),
                                                          N("relu", (1,))]),
    # (scaled: a sum of 16384 unit products is ~128, where a different order of fp32 adds moves it by ~1e-3, over
    # this harness's fixed 1e-4; the judge's own bound scales with the magnitudes)
    "bmm_split_k_transposed_residual": Program(
        [T((2, 8, 16384), scale=0.1), T((2, 16384, 8), layout="transposed", scale=0.1), T((2, 8, 8))],
        [N("bmm", (0, 1)), N("add", (3, 2))]),
    "linear_zero_rows": Program([T((0, 24))], [N("linear", (0,), {"out_features": 16, "bias": True})]),
    "linear_fp16_odd": Program([T((97, 61), dtype="float16")], [N("linear", (0,), {"out_features": 48, "bias": True}),
                                                              N("relu", (1,))]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_family_case_matches_reference(name, catalog):
    program = CASES[name]
    source = lower_program(program, catalog)
    result = compare(render_source(program, catalog), source)
    assert result.ok, f"{name}: {result.detail}\n{source}"


def test_a_long_reduction_with_few_tiles_is_split_over_k(catalog):
    from plugins.coders.expert_lowering.matmul_kernels import split_k

    source = lower_program(CASES["matvec_split_k"], catalog)
    assert "_matmul_0_part" in source and "for s in range(SPLIT)" in source
    assert "atomic" not in source  # a fixed order of the partials: the same bits every run
    assert split_k(4096, 4096, 65536, 1) == 1 and split_k(2048, 1, 1 << 20, 1) == 64  # KernelBench 1_ and 4_
    assert "_part" not in lower_program(CASES["linear_bias_gelu_residual"], catalog)


def test_matmul_epilogue_is_fused_into_one_kernel(catalog):
    source = lower_program(CASES["linear_bias_gelu_residual"], catalog)
    assert source.count("@triton.jit\ndef _matmul_") == 1
    assert "_pointwise_" not in source
    assert "tl.dot" in source


def test_what_is_not_lowered_is_declined_with_the_reason(catalog):
    program = Program([T((2, 2, 8, 300))] * 3, [N("scaled_dot_product_attention", (0, 1, 2), {"is_causal": False})])
    with pytest.raises(Unsupported, match="head dim"):
        lower_program(program, catalog)
    with pytest.raises(Unsupported, match="resident row limit"):
        # float32 rows this long are streamed in chunks since issue 19 (test_ops_kernelbench.py)
        lower_program(Program([T((2, 20000), dtype="float16")], [N("softmax", (0,))]), catalog)


@pytest.fixture(scope="module")
def catalog():
    from core.plugins import registry

    ops = registry("op")
    return {n: ops.get(n) for n in ops.names()}


@pytest.mark.parametrize("shapes", [((0, 5, 7), (0, 7, 3)), ((2, 0, 7), (2, 7, 3)), ((2, 5, 0), (2, 0, 3))],
                         ids=["empty_batch", "no_rows", "no_inner"])
def test_an_empty_bmm_is_accepted_with_no_out_of_bounds_read(shapes, catalog):
    """An empty batch still runs one program (the grid is at least 1); its loads of the second operand
    were masked by K and N only, and read past the end of an empty storage (expert_acceptance seed 7:
    the memory check's 'out-of-bounds load(s), 0 bytes past the end')."""
    from core.plugins import registry
    from core.verify import Verifier
    from plugins.proposers.common import program_to_task

    task = program_to_task(Program([T(shapes[0]), T(shapes[1])], [N("bmm", (0, 1))]), catalog, seed=0)
    candidate = registry("coder").create("expert").generate([task], "triton")[0][0]
    with Verifier(backend="triton", device="cpu", workers=1, timeout_s=120) as verifier:
        verdict = verifier.verify(task, candidate)
    assert verdict.accepted, verdict.reason
    assert verdict.checks["memory"].passed


# Expert answers the verifier rejected in benchmarks/expert_acceptance.py --n 500 --seed 7 (2026-12-04), each
# with the probe plan that caught it (None: the default plan; the trials' own inputs did it).
EDGE_CASES = {
    # q.k overflowed fp32 where PyTorch, scaling q first, did not: inf - inf in the softmax
    "sdpa_overflowing_scores": (Program([T((8, 8, 6, 6)), T((8, 8, 6, 6)), T((8, 8, 6, 8))],
                                        [N("scaled_dot_product_attention", (0, 1, 2), {"is_causal": True})]),
                                [{"scale": 5.58e17, "dist": "heavy_tailed"}]),
    # an infinite query: a row of -inf scores is 0 in PyTorch (not 0/0), and a masked +inf score is NaN
    # (its causal mask is an additive -inf)
    "sdpa_infinite_query_causal": (Program([T((5, 4, 2, 1), distribution="specials"), T((5, 4, 2, 1)),
                                            T((5, 4, 2, 4))],
                                           [N("scaled_dot_product_attention", (0, 1, 2), {"is_causal": True})]), None),
    # PyTorch's CPU cumprod carries float64: fp32 overflowed to inf before the zeros of triu, inf * 0 = NaN
    "reverse_cumprod_after_triu": (Program([T((64, 4))], [N("linear", (0,), {"out_features": 64, "bias": False}),
                                                          N("triu", (1,), {"diagonal": 1}),
                                                          N("cumprod", (2,), {"reverse": True})]),
                                   [{"scale": 3e8, "dist": "scaled"}]),
}


@pytest.mark.parametrize("name", sorted(EDGE_CASES))
def test_the_expert_matches_pytorch_at_the_edges_the_verifier_probes(name, catalog):
    from core.plugins import registry
    from core.verify import Verifier
    from plugins.proposers.common import program_to_task

    program, probes = EDGE_CASES[name]
    task = program_to_task(program, catalog, seed=0)
    candidate = registry("coder").create("expert").generate([task], "triton")[0][0]
    with Verifier(backend="triton", device="cpu", workers=1, timeout_s=120,
                  probe_scales={"float32": probes} if probes else None) as verifier:
        for _ in range(2):  # fresh trial seeds each time
            verdict = verifier.verify(task, candidate)
            assert verdict.accepted, verdict.reason


@st.composite
def depthwise_programs(draw):
    """A depthwise conv over 1-3 spatial dims: channels, multiplier, per-axis kernel, stride, padding and
    dilation drawn, the input just large enough for an output of at least one element per axis."""
    n = draw(st.integers(1, 3))
    channels, mult = draw(st.integers(2, 4)), draw(st.integers(1, 2))
    axes = [draw(st.tuples(st.integers(1, 3), st.integers(1, 2), st.integers(0, 1), st.integers(1, 2)))
            for _ in range(n)]  # (kernel, stride, padding, dilation)
    sizes = [max(1, d * (k - 1) + 1 - 2 * p) + draw(st.integers(0, 4)) for k, _, p, d in axes]
    params = {"out_channels": channels * mult, "kernel_size": tuple(a[0] for a in axes),
              "stride": tuple(a[1] for a in axes), "padding": tuple(a[2] for a in axes),
              "dilation": tuple(a[3] for a in axes), "groups": channels, "bias": draw(st.booleans())}
    layout = draw(st.sampled_from(["contiguous", "transposed", "offset", "strided"]))
    return Program([T((draw(st.integers(1, 2)), channels, *sizes), layout=layout)], [N(f"conv{n}d", (0,), params)])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=depthwise_programs())
def test_any_depthwise_conv_is_the_direct_kernel_and_matches_pytorch(program, catalog):
    source = lower_program(program, catalog)
    assert "_dwconv_" in source and "tl.dot" not in source
    result = compare(render_source(program, catalog), source)
    assert result.ok, f"{program}: {result.detail}\n{source}"

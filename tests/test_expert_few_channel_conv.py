"""The channels-last conv2d with few input channels reduces over each window row's (kw, channel) pairs in one
run (BK of them a step) instead of a channel block per tap, which left most of every tensor-core step zero
(KernelBench 50_, conv 3 -> 96 with an 11 x 11 window at stride 4: 0.06x eager on the H200). Run in the Triton
interpreter against PyTorch over channels, window, stride, padding, dilation, layouts and epilogues."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.program import Node as N
from core.program import Program
from core.program import TensorSpec as T
from plugins.coders.expert_lowering import lower_program
from plugins.coders.expert_lowering.conv_kernels import fold_window_rows
from plugins.coders.expert_lowering.selfcheck import compare
from plugins.proposers.common import render_source

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@pytest.fixture(scope="module")
def catalog():
    from core.plugins import registry

    ops = registry("op")
    return {n: ops.get(n) for n in ops.names()}


def _conv(oc, k, s, p, d):
    return {"out_channels": oc, "kernel_size": k, "stride": s, "padding": p, "dilation": d, "groups": 1}


def test_only_few_channels_fold_the_window_row():
    assert fold_window_rows(3, 11, "float32")  # KernelBench 50_: 33 of 64 filled, not 3 of 32
    assert fold_window_rows(8, 3, "float32") and fold_window_rows(16, 3, "float32")  # level 2's Conv2d tasks
    assert not fold_window_rows(64, 3, "float32") and not fold_window_rows(32, 5, "float32")  # whole blocks already
    assert not fold_window_rows(3, 1, "float32")  # one tap a row: nothing to fold


def test_kernelbench_50_lowers_to_the_folded_loop(catalog):
    program = Program([T((2, 3, 40, 40))], [N("conv2d", (0,), _conv(12, 11, 4, 2, 1))])
    source = lower_program(program, catalog)
    assert "RW = KW * C" in source and "CB = tl.cdiv(C, BK)" not in source
    assert compare(render_source(program, catalog), source).ok
    wide = lower_program(Program([T((2, 64, 9, 9))], [N("conv2d", (0,), _conv(8, 3, 1, 1, 1))]), catalog)
    assert "CB = tl.cdiv(C, BK)" in wide and "RW = KW * C" not in wide


@settings(max_examples=14, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(channels=st.sampled_from([1, 2, 3, 5, 8, 16]), kernel=st.integers(2, 5), stride=st.integers(1, 3),
       pad=st.integers(0, 2), dilation=st.integers(1, 2), out_channels=st.sampled_from([4, 12, 33]),
       layout=st.sampled_from(["contiguous", "transposed", "offset"]),
       dtype=st.sampled_from(["float32", "float32", "float16"]), epilogue=st.booleans())
def test_few_channel_conv2d_matches_pytorch(catalog, channels, kernel, stride, pad, dilation, out_channels, layout,
                                            dtype, epilogue):
    pad = min(pad, kernel - 1)
    side = kernel * dilation + 2 * stride + 1
    nodes = [N("conv2d", (0,), _conv(out_channels, kernel, stride, pad, dilation))]
    nodes += [N("relu", (1,))] if epilogue else []
    program = Program([T((2, channels, side, side + 3), layout=layout, dtype=dtype)], nodes)
    source = lower_program(program, catalog)
    assert "RW = KW * C" in source
    result = compare(render_source(program, catalog), source)
    assert result.ok, f"{result.detail}\n{source}"

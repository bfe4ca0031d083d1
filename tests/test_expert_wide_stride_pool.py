"""Pooling with a wide W stride loads each window row's taps as one [BLOCK, taps] tile (lanes along the row's
contiguous taps, not one output per lane a stride apart: KernelBench's 45_Average_Pooling_2D, an 11 x 11 window
at stride 11, ran at 0.05x eager). Run in the Triton interpreter against PyTorch, max and average, 1-3
spatial dimensions, padding, dilation, a non-power-of-two row, specials and odd layouts."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.program import Node as N
from core.program import Program
from core.program import TensorSpec as T
from plugins.coders.expert_lowering import lower_program
from plugins.coders.expert_lowering.conv_kernels import ROW_TILE_MIN_STRIDE, _row_taps
from plugins.coders.expert_lowering.selfcheck import compare
from plugins.proposers.common import render_source

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@pytest.fixture(scope="module")
def catalog():
    from core.plugins import registry

    ops = registry("op")
    return {n: ops.get(n) for n in ops.names()}


def test_only_a_wide_stride_loads_a_row_of_taps_at_once():
    assert _row_taps(11, 11) == 16 and _row_taps(4, ROW_TILE_MIN_STRIDE) == 4
    assert _row_taps(3, 2) == 1 and _row_taps(8, 1) == 1  # near-contiguous already: tap by tap
    assert _row_taps(1, 8) == 1


def test_kernelbench_45_lowers_to_the_row_tile(catalog):
    program = Program([T((2, 3, 44, 44))], [N("avg_pool2d", (0,), {"kernel_size": 11, "stride": 11, "padding": 0})])
    source = lower_program(program, catalog)
    assert "tl.arange(0, 16)[None, :]" in source and "tl.sum(acc, axis=1)" in source
    assert compare(render_source(program, catalog), source).ok


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["max", "avg"]), dims=st.integers(1, 3), kernel=st.integers(2, 7),
       extra_stride=st.integers(0, 5), pad=st.integers(0, 3), dilation=st.integers(1, 2),
       layout=st.sampled_from(["contiguous", "transposed", "offset"]),
       distribution=st.sampled_from(["randn", "specials"]), epilogue=st.booleans())
def test_wide_stride_pooling_matches_pytorch(catalog, kind, dims, kernel, extra_stride, pad, dilation, layout,
                                             distribution, epilogue):
    stride = ROW_TILE_MIN_STRIDE + extra_stride
    pad = min(pad, kernel // 2)  # PyTorch's own limit
    params = {"kernel_size": kernel, "stride": stride, "padding": pad}
    if kind == "max":
        params["dilation"] = dilation
    spatial = (kernel * dilation + 3, kernel * dilation + stride + 1, 3 * stride + kernel * dilation)[-dims:]
    nodes = [N(f"{kind}_pool{dims}d", (0,), params)] + ([N("tanh", (1,))] if epilogue else [])
    program = Program([T((2, 3, *spatial), layout=layout, distribution=distribution)], nodes)
    source = lower_program(program, catalog)
    assert "[None, :]" in source  # the row tile, not the tap-by-tap loop
    result = compare(render_source(program, catalog), source)
    assert result.ok, f"{result.detail}\n{source}"

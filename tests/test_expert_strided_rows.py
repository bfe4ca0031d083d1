"""Reductions and row maps over a middle dim (KernelBench's 47_-53_, level 2's softmax over channels).

The row is then a transposed view: its elements lie a row of the inner dims apart, its neighbouring rows next to
each other. The resident row kernel held one such row of 4096 elements per program, one element per 32-byte
sector read: 0.18x-0.23x of eager on an H100 (2026-12-07). Such rows are streamed by ``ACROSS_TILE`` adjacent
rows at a time (row_loop_kernels, ``across``); these tests run that tile in the interpreter against PyTorch.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plugins.coders.expert_lowering.elementwise_kernels import MAX_COALESCED_ROW
from plugins.coders.expert_lowering.row_loop_kernels import ACROSS_TILE
from plugins.coders.expert_lowering.selfcheck import compare
from tests.test_expert_capture import answer, problem

ACROSS = f"_BN = _BM = {ACROSS_TILE}"


def _lowered(body: str, shape: str, dtype: str = "") -> tuple[str, str]:
    source = problem([f"return {body}"], f"torch.randn({shape}{', dtype=' + dtype if dtype else ''})")
    cand = answer(source)
    assert cand.declined is None, cand.declined
    return source, cand.source


BODIES = {
    "sum": "torch.sum(x, dim={d})",
    "mean_keepdim": "torch.mean(x, dim={d}, keepdim=True)",
    "amax": "torch.amax(x, dim={d})",
    "amin": "torch.min(x, dim={d})[0]",
    "softmax": "torch.softmax(x, dim={d})",
    "log_softmax": "torch.log_softmax(x * 0.5, dim={d}) + 1.0",
    "logsumexp": "torch.logsumexp(x, dim={d})",
    "sum_of_activation": "torch.sum(torch.relu(x) * 2.0, dim={d})",
}


@pytest.mark.parametrize("name", sorted(BODIES))
def test_a_middle_dim_row_is_streamed_by_adjacent_rows_and_matches(name):
    # rows of 300 (not a multiple of the tile) over 70 inner positions (two tiles of rows, the second partial)
    source, cand = _lowered(BODIES[name].format(d=1), "3, 300, 70")
    assert ACROSS in cand, cand
    result = compare(source, cand, seed=3, trials=2)
    assert result.ok, f"{name}: {result.detail}\n{cand}"


@pytest.mark.parametrize("body, shape", [
    ("torch.sum(x, dim=-1)", "64, 300"),  # the last dim: rows already contiguous
    ("torch.sum(x, dim=1)", f"4, {MAX_COALESCED_ROW}, 64"),  # short rows: the resident tile holds 32 of them
    ("torch.cumprod(x, dim=1)", "2, 300, 8"),  # no streamed lowering: the resident kernel, still right
])
def test_what_the_resident_kernel_reads_well_or_alone_lowers_stays_resident(body, shape):
    source, cand = _lowered(body, shape)
    assert ACROSS not in cand, cand
    assert compare(source, cand, seed=3, trials=1).ok


def test_a_half_precision_middle_dim_row_keeps_the_resident_kernel_and_matches():
    # the streamed kernel is float32 only (row_loop_kernels): a float16 task is lowered as before, not declined
    source, cand = _lowered("torch.softmax(x, dim=1)", "2, 300, 40", dtype="torch.float16")
    assert ACROSS not in cand
    assert compare(source, cand, seed=3, trials=1).ok


def test_a_permute_that_keeps_the_last_dim_is_not_streamed():
    source, cand = _lowered("torch.softmax(x.permute(1, 0, 2), dim=-1)", "3, 4, 300")
    assert ACROSS not in cand
    assert compare(source, cand, seed=3, trials=1).ok


@settings(max_examples=12, deadline=None)
@given(op=st.sampled_from(["sum", "amax", "softmax", "logsumexp"]), reduced=st.integers(MAX_COALESCED_ROW + 1, 400),
       inner=st.integers(1, 130), outer=st.integers(1, 3), middle=st.integers(1, 3),
       where=st.sampled_from(["3d", "4d_before_middle", "4d_after_middle"]))
def test_any_middle_dim_and_ragged_tile_edges_match_pytorch(op, reduced, inner, outer, middle, where):
    # the reduced dim anywhere but last, the inner extent on either side of a tile of rows
    dims, d = {"3d": ([outer, reduced, inner], 1), "4d_before_middle": ([outer, reduced, middle, inner], 1),
               "4d_after_middle": ([outer, middle, reduced, inner], 2)}[where]
    body = BODIES[op].format(d=d)
    source, cand = _lowered(body, ", ".join(map(str, dims)))
    assert ACROSS in cand, cand
    result = compare(source, cand, seed=11, trials=1)
    assert result.ok, f"{body} over {dims}: {result.detail}"


def test_the_streamed_launch_covers_every_row_with_whole_tiles():
    _, cand = _lowered("torch.sum(x, dim=1)", "2, 300, 70")
    launch = re.search(r"^\s+(_rows_\d+)\[\(max\(1, triton.cdiv\(_M, _BM\)\),\)\]", cand, re.MULTILINE)
    assert launch, cand

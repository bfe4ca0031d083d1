"""The program IR renders to KernelBench modules whose Model matches the inferred shapes."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from core.plugins import make_plugin_manager, build_registry
from core.program import Node, Program, ProgramError, TensorSpec, render_task_source

CATALOG = dict(build_registry("op", make_plugin_manager(autoload=False)).entries)
UNARY = sorted(n for n, s in CATALOG.items() if s.arity == 1 and s.family in ("elementwise", "activation"))
ROW = sorted(n for n, s in CATALOG.items() if s.family in ("reduction", "softmax"))


def run_module(source: str):
    namespace: dict = {}
    exec(compile(source, "<task>", "exec"), namespace)
    torch.manual_seed(0)
    model = namespace["Model"](*namespace["get_init_inputs"]())
    inputs = namespace["get_inputs"]()
    return model(*inputs), inputs


def _params(name: str, draw) -> dict:
    space = CATALOG[name].params
    return {k: draw(st.sampled_from(list(v))) for k, v in space.items()}


@st.composite
def programs(draw):
    rows = draw(st.integers(1, 6))
    cols = draw(st.integers(1, 40))
    layout = draw(st.sampled_from(["contiguous", "transposed", "offset", "strided"]))
    inputs = [TensorSpec((rows, cols), layout=layout)]
    nodes = []
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(UNARY))
        nodes.append(Node(op, (len(inputs) + len(nodes) - 1,), _params(op, draw)))
    if draw(st.booleans()):
        op = draw(st.sampled_from(ROW))
        nodes.append(Node(op, (len(inputs) + len(nodes) - 1,), _params(op, draw)))
    return Program(inputs, nodes)


@settings(max_examples=40, deadline=None)
@given(programs())
def test_rendered_task_runs_and_matches_inferred_shape(program):
    source = render_task_source(program, CATALOG)
    out, inputs = run_module(source)
    shapes = program.value_shapes(CATALOG)
    assert tuple(out.shape) == shapes[-1]
    assert tuple(inputs[0].shape) == program.inputs[0].shape
    layout = program.inputs[0].layout
    if layout == "contiguous":
        assert inputs[0].is_contiguous()
    elif layout == "offset":
        assert inputs[0].storage_offset() == 1
    elif layout == "strided" and program.inputs[0].shape[-1] > 1:
        assert not inputs[0].is_contiguous()
    assert Program.from_json(program.to_json()) == program


def test_binary_op_and_costs():
    program = Program([TensorSpec((4, 8)), TensorSpec((4, 8))], [Node("add", (0, 1)), Node("relu", (2,))])
    out, (a, b) = run_module(render_task_source(program, CATALOG))
    torch.testing.assert_close(out, torch.relu(a + b))
    assert program.flops(CATALOG) == 2 * 32
    assert program.min_bytes(CATALOG) == 3 * 32 * 4
    assert program.intermediates() == 1


def test_specials_and_offset_inputs_render():
    program = Program([TensorSpec((3, 5), layout="offset", distribution="specials", scale=1e4)], [Node("relu", (0,))])
    out, (x,) = run_module(render_task_source(program, CATALOG))
    assert x.storage_offset() == 1
    assert torch.isnan(out.reshape(-1)[0]) and torch.isinf(out.reshape(-1)[7])


@pytest.mark.parametrize("program, message", [
    (Program([TensorSpec((2, 3)), TensorSpec((3, 2))], [Node("add", (0, 1))]), "differ in shape"),
    (Program([TensorSpec((2, 3))], [Node("relu", (5,))]), "reads value 5"),
    (Program([TensorSpec((2, 3))], [Node("nope", (0,))]), "unknown op 'nope'"),
    (Program([TensorSpec((2, 3))], [Node("add", (0,))]), "takes 2 tensors"),
    (Program([TensorSpec((2, 3))], []), "at least one op"),
])
def test_invalid_programs_are_rejected_with_a_reason(program, message):
    with pytest.raises(ProgramError, match=message):
        program.value_shapes(CATALOG)

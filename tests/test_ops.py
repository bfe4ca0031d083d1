"""The op catalog: every op's shape rule agrees with torch, its z3 rule agrees with its concrete rule,
costs are sane, and a third-party op drops in through register_ops."""

from __future__ import annotations

import math
import random

import pytest
import z3

from core import hookimpl
from core.program import Node, OpSpec, Program, ProgramError, TensorSpec
from plugins.proposers.common import program_to_task, resolve_catalog
from plugins.proposers.solver import Constraints, ProgramBuilder
from plugins.proposers.validate import check_task, run_reference

CATALOG = resolve_catalog()
REQUIRED = {
    "add", "sub", "mul", "relu", "gelu", "silu", "sigmoid", "tanh", "softplus", "hardswish", "leaky_relu",
    "sum", "mean", "amax", "logsumexp", "softmax", "log_softmax", "layer_norm", "rms_norm", "group_norm",
    "batch_norm", "linear", "matmul", "bmm", "conv2d", "conv_transpose2d", "max_pool2d", "avg_pool2d",
    "transpose", "permute", "flatten", "split_last", "scaled_dot_product_attention",
}


def test_catalog_covers_the_issue():
    assert REQUIRED <= set(CATALOG)
    for name, spec in CATALOG.items():
        assert spec.name == name and spec.render is not None and spec.call and spec.family
        assert spec.tier in range(0, 4)


def solved_single_op(name: str, seed: int) -> Program:
    """One valid instance of ``name`` chosen by z3 (parameters redrawn until they fit)."""
    rng = random.Random(seed)
    for _ in range(20):
        builder = ProgramBuilder(CATALOG, rng)
        try:
            builder.apply(name, builder.draw_params(name), numel_target=512)
            return builder.solve(Constraints(max_numel=4096, max_ops=1))
        except ProgramError:
            continue
    raise AssertionError(f"no valid instance of {name} in 20 draws")


@pytest.mark.parametrize("name", sorted(REQUIRED))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_op_runs_in_torch_with_the_inferred_shape(name, seed):
    program = solved_single_op(name, seed)
    task = program_to_task(program, CATALOG, seed=seed)
    check_task(task, CATALOG)  # raises with the source when torch disagrees with the shape rule
    assert task.flops >= 0 and task.min_bytes > 0


@pytest.mark.parametrize("name", ["conv2d", "linear", "layer_norm", "batch_norm", "group_norm", "conv_transpose2d"])
def test_weight_bytes_match_the_module_parameters(name):
    program = solved_single_op(name, 5)
    task = program_to_task(program, CATALOG, seed=0)
    weight_bytes = task.min_bytes - (sum(math.prod(s) for s in task.shapes)
                                     + math.prod(program.value_shapes(CATALOG)[-1])) * 4
    from plugins.proposers.validate import load_module

    model = load_module(task.source).Model()
    params = sum(p.numel() for p in model.parameters()) + sum(b.numel() for n, b in model.named_buffers()
                                                              if n.endswith(("running_mean", "running_var")))
    assert weight_bytes == params * 4


def test_matmul_flops_are_two_m_n_k():
    program = Program([TensorSpec((3, 5)), TensorSpec((5, 7))], [Node("matmul", (0, 1))])
    assert program.flops(CATALOG) == 2 * 3 * 5 * 7
    assert tuple(run_reference(program_to_task(program, CATALOG, seed=0)).shape) == (3, 7)


def test_concrete_rule_rejects_what_torch_rejects():
    with pytest.raises(ProgramError, match="inner dimensions"):
        Program([TensorSpec((3, 5)), TensorSpec((4, 7))], [Node("matmul", (0, 1))]).value_shapes(CATALOG)
    with pytest.raises(ProgramError, match="groups"):
        Program([TensorSpec((1, 3, 8, 8))], [Node("conv2d", (0,), {"out_channels": 4, "kernel_size": 3, "stride": 1,
                                                                     "padding": 0, "dilation": 1, "groups": 2})]
                ).value_shapes(CATALOG)
    with pytest.raises(ProgramError, match="rank"):
        Program([TensorSpec((3, 5))], [Node("conv2d", (0,), {})]).value_shapes(CATALOG)


def test_symbolic_rule_makes_conv_outputs_exist():
    """z3 must never pick a conv input smaller than the dilated kernel."""
    for seed in range(10):
        builder = ProgramBuilder(CATALOG, random.Random(seed))
        builder.apply("conv2d", {"out_channels": 8, "kernel_size": 5, "stride": 2, "padding": 0, "dilation": 2,
                                 "groups": 1}, numel_target=64)
        program = builder.solve(Constraints(max_numel=4096))
        n, c, h, w = program.inputs[0].shape
        assert h >= 9 and w >= 9


# ---------------------------------------------------------------------------- third-party op


class _CubePlugin:
    @hookimpl
    def register_ops(self, register):
        register("cube", OpSpec(name="cube", family="elementwise", tier=0, arity=1, call="torch.pow",
                                flops=lambda s, p: 2 * math.prod(s[0]),
                                render=lambda a, p, m: f"{a[0]} * {a[0]} * {a[0]}"))


def test_a_third_party_op_drops_in_and_is_proposed(plugin_manager):
    from core.contracts import CurriculumState
    from core.plugins import registry
    from plugins.proposers.random_proposer import RandomProposer

    plugin_manager.register(_CubePlugin(), name="cube-plugin")
    assert "cube" in registry("op")
    proposer = RandomProposer(seed=0, max_ops=2)  # catalog defaults to the (fresh) op registry
    tasks = proposer.propose(8, CurriculumState(max_tier=0, allowed_ops=["cube", "relu"]))
    assert any("cube" in t.ops for t in tasks)
    for t in tasks:
        check_task(t, proposer.catalog)
        assert "* " in t.source or "relu" in t.source


def test_z3_context_is_private_per_builder():
    a, b = ProgramBuilder(CATALOG, random.Random(0)), ProgramBuilder(CATALOG, random.Random(0))
    assert a.ctx.z3ctx is not b.ctx.z3ctx and isinstance(a.ctx.dim(), z3.ArithRef)

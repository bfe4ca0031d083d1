from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from core.contracts import CurriculumState, Proposer
from core.plugins import registry
from core.program import Node, Program, TensorSpec
from plugins.proposers.common import AdversarialSchedule, program_to_task, resolve_catalog
from plugins.proposers.random_proposer import RandomProposer
from plugins.proposers.solver import program_costs
from plugins.proposers.validate import check_task, degeneracy

CATALOG = resolve_catalog()


def test_random_is_registered_and_follows_the_protocol():
    proposer = registry("proposer").create("random", min_ops=1, max_ops=3, seed=3)
    assert isinstance(proposer, Proposer)
    assert proposer.name == "random"


def test_same_seed_gives_same_tasks_in_same_order():
    a = RandomProposer(seed=11).propose(20, CurriculumState(max_tier=3))
    b = RandomProposer(seed=11).propose(20, CurriculumState(max_tier=3))
    c = RandomProposer(seed=12).propose(20, CurriculumState(max_tier=3))
    assert [t.id for t in a] == [t.id for t in b]
    assert [t.id for t in a] != [t.id for t in c]


def test_tier_zero_uses_only_tier_zero_ops():
    tasks = RandomProposer(seed=1, max_ops=4).propose(30, CurriculumState(max_tier=0))
    assert all(CATALOG[op].tier == 0 for t in tasks for op in t.ops)
    assert all(t.tier == 0 for t in tasks)


def test_allowed_ops_restrict_the_catalog():
    tasks = RandomProposer(seed=4, max_ops=3).propose(15, CurriculumState(max_tier=3, allowed_ops=["conv2d", "relu"]))
    assert {op for t in tasks for op in t.ops} <= {"conv2d", "relu"}


def test_state_dict_resumes_the_stream():
    p = RandomProposer(seed=5)
    p.propose(7, CurriculumState(max_tier=1))
    state = p.state_dict()
    rest = [t.id for t in p.propose(5, CurriculumState(max_tier=1))]
    q = RandomProposer(seed=999)
    q.load_state_dict(state)
    assert [t.id for t in q.propose(5, CurriculumState(max_tier=1))] == rest


def test_rejects_inverted_op_counts():
    with pytest.raises(ValueError, match="min_ops <= max_ops"):
        RandomProposer(min_ops=3, max_ops=2)


def test_unknown_tier_fails_with_an_actionable_message():
    with pytest.raises(ValueError, match="no op is allowed"):
        RandomProposer(seed=0).propose(1, CurriculumState(max_tier=3, allowed_ops=["nope"]))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), tier=st.integers(0, 3))
def test_tasks_from_any_seed_are_valid(seed, tier):
    for task in RandomProposer(seed=seed, max_ops=4).propose(4, CurriculumState(max_tier=tier)):
        check_task(task, CATALOG)
        assert task.seed is not None and task.program is not None
        assert 1 <= len(task.ops) <= 4
        assert all(CATALOG[op].tier <= tier for op in task.ops)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), min_ops=st.integers(1, 3), numel=st.sampled_from([256, 4096, 16384]),
       align=st.sampled_from([1, 4, 16]), scale=st.sampled_from([1.0, 0.5, 0.2]))
def test_tasks_honour_their_constraints(seed, min_ops, numel, align, scale):
    lo_flops = 64
    proposer = RandomProposer(seed=seed, min_ops=min_ops, max_ops=min_ops + 1, max_numel=numel, align=align,
                              min_flops=lo_flops, max_flops=10**8, memory_budget=2**22, adversarial_share=0.0)
    limits = proposer.constraints().scaled(scale)
    for task in proposer.propose(3, CurriculumState(max_tier=3, param_scale=scale)):
        program = Program.from_dict(task.program)
        costs = program_costs(program, CATALOG)
        assert min_ops <= len(task.ops) <= min_ops + 1
        assert program.intermediates() >= min_ops - 1
        assert lo_flops <= costs["flops"] <= 10**8
        assert costs["memory"] <= 2**22
        assert costs["max_numel"] <= limits.max_numel
        assert all(t.shape[-1] % align == 0 for t in program.inputs)
        check_task(task, CATALOG)


def test_param_scale_shrinks_tensors():
    big = RandomProposer(seed=3, max_numel=16384).propose(30, CurriculumState(max_tier=2, param_scale=1.0))
    small = RandomProposer(seed=3, max_numel=16384).propose(30, CurriculumState(max_tier=2, param_scale=0.1))
    largest = lambda ts: max(program_costs(Program.from_dict(t.program), CATALOG)["max_numel"] for t in ts)  # noqa: E731
    assert largest(small) <= 1638 < largest(big)


@given(share=st.floats(0.10, 0.15), start=st.integers(0, 500))
def test_adversarial_schedule_stays_in_band_over_any_window_of_100(share, start):
    schedule = AdversarialSchedule(share)
    flags = [schedule.next() for _ in range(start + 300)]
    for i in range(start, start + 200):
        assert 10 <= sum(flags[i:i + 100]) <= 15


def test_adversarial_share_of_proposed_tasks_is_in_band():
    tasks = RandomProposer(seed=8, max_ops=2).propose(130, CurriculumState(max_tier=1))
    flags = [t.adversarial is not None for t in tasks]
    assert all(10 <= sum(flags[i:i + 100]) <= 15 for i in range(0, 31))
    for t in tasks:
        if t.adversarial:
            assert set(t.adversarial) and t.source.startswith('"""')
            assert "adversarial" in t.source.splitlines()[0]


def test_degenerate_filter_rejects_what_it_should():
    def task(nodes, shape=(4, 8)):
        return program_to_task(Program([TensorSpec(shape)], nodes), CATALOG, seed=0)

    assert not degeneracy(task([Node("relu", (0,))]))
    # softmax over a dimension of size 1 is the constant 1
    assert degeneracy(task([Node("softmax", (0,))], shape=(4, 1))).reason == "output is constant"
    # x - x is zero whatever the input
    assert "near zero" in degeneracy(task([Node("sub", (0, 0))])).reason
    assert degeneracy(task([Node("relu", (0,))], shape=(0, 8))).reason == "output is empty"
    assert not degeneracy(task([Node("relu", (0,))], shape=(0, 8)), allow_empty=True)


def test_proposed_tasks_are_not_degenerate():
    for task in RandomProposer(seed=2, max_ops=3).propose(40, CurriculumState(max_tier=3)):
        assert not degeneracy(task, allow_empty=task.adversarial is not None and "zero_size_dim" in task.adversarial)


def test_adversarial_tags_describe_the_task():
    proposer = RandomProposer(seed=21, max_ops=2, adversarial_share=1.0)
    seen = set()
    for task in proposer.propose(60, CurriculumState(max_tier=2)):
        program = Program.from_dict(task.program)
        first = program.inputs[0]
        tags = set(task.adversarial)
        seen |= tags
        if "zero_size_dim" in tags:
            assert first.shape[0] == 0
        if "size_one_dim" in tags:
            assert 1 in first.shape
        if "non_power_of_two" in tags:
            assert all(d % 2 == 1 and d > 1 for t in program.inputs for d in t.shape)
        if "transposed_input" in tags:
            assert first.layout == "transposed"
        if "offset_input" in tags:
            assert first.layout == "offset"
        if "nan_inf" in tags:
            assert first.distribution == "specials"
        if tags & {"large_magnitude", "tiny_magnitude"}:
            assert first.scale != 1.0
        check_task(task, CATALOG)
    assert len(seen) >= 7, seen


def test_degenerate_filter_rejects_an_output_that_is_mostly_nan():
    # what the MCTS proposer emitted (issue 42): rsqrt -> mul -> sqrt on randn, ~80% NaN
    nodes = [Node("rsqrt", (0,)), Node("mul", (2, 1)), Node("sqrt", (3,))]
    task = program_to_task(Program([TensorSpec((16, 32)), TensorSpec((16, 32))], nodes), CATALOG, seed=0)
    reason = degeneracy(task).reason
    assert reason and reason.startswith("output is mostly not finite (7") and "NaN or Inf" in reason
    # one op off half its domain (sqrt of randn: about half NaN) is still a task
    assert not degeneracy(program_to_task(Program([TensorSpec((16, 32))], [Node("sqrt", (0,))]), CATALOG, seed=0))
    # planted NaN/Inf inputs are meant to spread: an adversarial nan_inf task is not judged by its share
    planted = program_to_task(Program([TensorSpec((16, 32)), TensorSpec((16, 32))], nodes), CATALOG, seed=0,
                              adversarial=["nan_inf"])
    assert not degeneracy(planted)

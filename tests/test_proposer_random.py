from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from core.contracts import CurriculumState, Proposer
from core.plugins import registry
from plugins.proposers.common import AdversarialSchedule, resolve_catalog
from plugins.proposers.random_proposer import RandomProposer
from plugins.proposers.validate import check_task

CATALOG = resolve_catalog()


def test_random_is_registered_and_follows_the_protocol():
    proposer = registry("proposer").create("random", min_ops=1, max_ops=3, seed=3)
    assert isinstance(proposer, Proposer)
    assert proposer.name == "random"


def test_same_seed_gives_same_tasks_in_same_order():
    a = RandomProposer(seed=11).propose(20, CurriculumState(max_tier=1))
    b = RandomProposer(seed=11).propose(20, CurriculumState(max_tier=1))
    c = RandomProposer(seed=12).propose(20, CurriculumState(max_tier=1))
    assert [t.id for t in a] == [t.id for t in b]
    assert [t.id for t in a] != [t.id for t in c]


def test_tier_zero_uses_only_tier_zero_ops():
    tasks = RandomProposer(seed=1, max_ops=4).propose(30, CurriculumState(max_tier=0))
    assert all(CATALOG[op].tier == 0 for t in tasks for op in t.ops)
    assert all(t.tier == 0 for t in tasks)


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


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), tier=st.integers(0, 1))
def test_tasks_from_any_seed_are_valid(seed, tier):
    for task in RandomProposer(seed=seed, max_ops=4).propose(4, CurriculumState(max_tier=tier)):
        check_task(task, CATALOG)
        assert task.seed is not None and task.program is not None


@given(share=st.floats(0.10, 0.15), start=st.integers(0, 500))
def test_adversarial_schedule_stays_in_band_over_any_window_of_100(share, start):
    schedule = AdversarialSchedule(share)
    flags = [schedule.next() for _ in range(start + 300)]
    for i in range(start, start + 200):
        assert 10 <= sum(flags[i:i + 100]) <= 15


def test_degenerate_filter_rejects_what_it_should():
    from core.program import Node, Program, TensorSpec
    from plugins.proposers.common import program_to_task
    from plugins.proposers.validate import degeneracy

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
    from plugins.proposers.validate import degeneracy

    for task in RandomProposer(seed=2, max_ops=3).propose(40, CurriculumState(max_tier=1)):
        assert not degeneracy(task, allow_empty=task.adversarial is not None)

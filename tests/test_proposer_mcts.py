from __future__ import annotations

import json

import pytest

from core.contracts import CurriculumState, Proposer
from core.plugins import registry
from plugins.proposers.common import resolve_catalog
from plugins.proposers.mcts import MCTSProposer, learnability
from plugins.proposers.random_proposer import RandomProposer
from plugins.proposers.validate import check_task

CATALOG = resolve_catalog()
CURRICULUM = CurriculumState(max_tier=3)
NORMS = {"layer_norm", "rms_norm", "group_norm", "batch_norm"}


def synthetic_solve_rate(task) -> float:
    """A pretend coder: never solves convolutions, solves norms half the time, everything else always."""
    if any(op.startswith("conv") for op in task.ops):
        return 0.0
    return 0.5 if NORMS & set(task.ops) else 1.0


def test_learnability_rules():
    assert learnability(0.5) == 1.0 and learnability(0.0) == 0.0 and learnability(1.0) == 0.0
    assert learnability(0.0, "absolute_zero") == 0.0
    assert learnability(0.25, "absolute_zero") == 0.75
    with pytest.raises(ValueError, match="unknown learnability rule"):
        learnability(0.5, "nope")


def test_mcts_is_registered_and_follows_the_protocol():
    proposer = registry("proposer").create("mcts", seed=1, max_ops=3)
    assert isinstance(proposer, Proposer) and proposer.name == "mcts"


def test_mcts_tasks_are_valid_and_deterministic():
    a = MCTSProposer(seed=3, max_ops=3).propose(12, CURRICULUM)
    b = MCTSProposer(seed=3, max_ops=3).propose(12, CURRICULUM)
    assert [t.id for t in a] == [t.id for t in b]
    for t in a:
        check_task(t, CATALOG)


def _rounds(proposer, rounds, per_round=20):
    share = []
    for _ in range(rounds):
        tasks = proposer.propose(per_round, CURRICULUM)
        proposer.feedback({t.id: synthetic_solve_rate(t) for t in tasks})
        share.append(sum(synthetic_solve_rate(t) == 0.5 for t in tasks) / len(tasks))
    return share


def test_mcts_moves_towards_learnable_tasks():
    mcts = _rounds(MCTSProposer(seed=0, max_ops=3, filter_degenerate=False), 14)
    rand = _rounds(RandomProposer(seed=0, max_ops=3, filter_degenerate=False), 14)
    late_mcts, late_rand = sum(mcts[-4:]) / 4, sum(rand[-4:]) / 4
    assert late_mcts > 2 * late_rand, (mcts, rand)


def test_feedback_ignores_unknown_ids_and_backs_up_values():
    p = MCTSProposer(seed=2, max_ops=2, filter_degenerate=False)
    tasks = p.propose(4, CURRICULUM)
    p.feedback({"not-a-task": 0.5})
    assert p.feedback_count == 0
    p.feedback({tasks[0].id: 0.5})
    assert p.feedback_count == 1 and tasks[0].id not in p.pending
    assert p.tree[""].value_n == 1 and p.tree[""].value_sum == pytest.approx(1.0)


def test_state_dict_round_trips_through_json_and_resumes():
    p = MCTSProposer(seed=9, max_ops=3, filter_degenerate=False)
    _rounds(p, 3, per_round=8)
    state = json.loads(json.dumps(p.state_dict()))
    expected = [t.id for t in p.propose(6, CURRICULUM)]
    q = MCTSProposer(seed=0, max_ops=3, filter_degenerate=False)
    q.load_state_dict(state)
    assert [t.id for t in q.propose(6, CURRICULUM)] == expected
    assert q.tree.keys() == p.tree.keys()

"""The ``replay`` proposer: prioritized task replay around a base proposer."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.contracts import CurriculumState, Proposer
from core.plugins import registry
from plugins.proposers.random_proposer import RandomProposer
from plugins.proposers.replay import ReplayProposer

TIER0 = CurriculumState(max_tier=0)
BASE = {"name": "random", "max_ops": 1}


def replay(**kwargs) -> ReplayProposer:
    return ReplayProposer(**{"base": BASE, "seed": 0, **kwargs})


def test_registered_and_follows_the_protocol():
    proposer = registry("proposer").create("replay", base=BASE, seed=1)
    assert isinstance(proposer, Proposer) and proposer.name == "replay"


def test_without_replay_it_is_the_base_proposers_stream():
    ours, base = replay(replay_share=0.0), RandomProposer(seed=0, max_ops=1)
    for _ in range(3):
        tasks = ours.propose(4, TIER0)
        assert [t.id for t in tasks] == [t.id for t in base.propose(4, TIER0)]
        ours.feedback({t.id: 0.5 for t in tasks})
    assert ours.replayed == 0


def test_fresh_tasks_keep_the_base_order_and_mixed_tasks_come_back():
    ours, base = replay(replay_share=0.5, min_buffer=1), RandomProposer(seed=0, max_ops=1)
    expected = [t.id for t in base.propose(64, TIER0)]
    served, fresh, replayed = [], [], []
    for _ in range(8):
        tasks = ours.propose(4, TIER0)
        for t in tasks:
            (replayed if t.id in served else fresh).append(t.id)
        served += [t.id for t in tasks]
        # every task solved half the time: all stay learnable
        ours.feedback({t.id: 0.5 for t in tasks})
    assert fresh == expected[:len(fresh)]
    assert len(replayed) == ours.replayed == 14  # 2 of 4 from the second batch on
    assert len(fresh) + len(replayed) == 32


def test_tasks_solved_by_all_or_none_are_not_replayed():
    ours = replay(replay_share=1.0, min_buffer=1)
    first = ours.propose(4, TIER0)
    ours.feedback({first[0].id: 1.0, first[1].id: 0.0, first[2].id: 0.25, first[3].id: 0.0})
    second = ours.propose(4, TIER0)
    assert [t.id for t in second if t.id in {f.id for f in first}] == [first[2].id]
    assert ours.replayed == 1


def test_replays_follow_the_score_ranking():
    ours = replay(replay_share=0.25, min_buffer=1, staleness=0.0, temperature=0.3)
    first = ours.propose(8, TIER0)
    rates = dict(zip([t.id for t in first], [0.5, 0.9, 0.95, 0.99, 0.97, 0.98, 0.96, 0.94]))
    ours.feedback(rates)
    best = first[0].id  # 4p(1-p) = 1.0, the rest below 0.4
    picks = []
    for _ in range(40):
        tasks = ours.propose(4, TIER0)
        picks += [t.id for t in tasks if t.id in rates]
        ours.feedback({t.id: rates[t.id] for t in tasks if t.id in rates})  # scores stay as they were
    assert picks.count(best) > len(picks) / 2, picks.count(best)


def test_replay_respects_the_curriculum_tier():
    ours = replay(replay_share=1.0, min_buffer=1)
    wide = CurriculumState(max_tier=3)
    tasks = ours.propose(16, wide)
    higher = [t for t in tasks if t.tier > 0]
    assert higher, "the catalog should offer ops above tier 0"
    ours.feedback({t.id: 0.5 for t in tasks})
    again = ours.propose(16, TIER0)
    assert again and all(t.tier == 0 for t in again)


def test_buffer_is_bounded_and_keeps_the_highest_scores():
    ours = replay(replay_share=0.0, buffer_size=4)
    tasks = ours.propose(8, TIER0)
    rates = [0.5, 0.1, 0.45, 0.9, 0.55, 0.2, 0.4, 0.05]
    ours.feedback({t.id: p for t, p in zip(tasks, rates)})
    kept = {t.id for t, p in zip(tasks, rates) if p in (0.5, 0.45, 0.55, 0.4)}
    assert set(ours.buffer) == kept


def test_max_visits_retires_a_task():
    ours = replay(replay_share=1.0, min_buffer=1, max_visits=2)
    task = ours.propose(1, TIER0)[0]
    ours.feedback({task.id: 0.5})
    again = ours.propose(1, TIER0)[0]
    assert again.id == task.id
    ours.feedback({task.id: 0.5})
    assert task.id not in ours.buffer and ours.propose(1, TIER0)[0].id != task.id


def test_state_dict_round_trips_through_json_and_resumes():
    def step(p, tasks):
        p.feedback({t.id: (0.5 if i % 2 else 1.0) for i, t in enumerate(tasks)})

    whole = replay(min_buffer=1)
    for _ in range(3):
        step(whole, whole.propose(4, TIER0))
    resumed = replay(min_buffer=1)
    resumed.load_state_dict(json.loads(json.dumps(whole.state_dict())))
    for _ in range(3):
        a, b = whole.propose(4, TIER0), resumed.propose(4, TIER0)
        assert [t.id for t in a] == [t.id for t in b]
        step(whole, a)
        step(resumed, b)


@settings(max_examples=25, deadline=None)
@given(share=st.floats(0.0, 1.0), batches=st.lists(st.integers(1, 6), min_size=1, max_size=6),
       rates=st.lists(st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]), min_size=36, max_size=36))
def test_replayed_tasks_were_served_and_last_scored_mixed(share, batches, rates):
    ours = replay(replay_share=share, min_buffer=1)
    last: dict[str, float] = {}
    r = iter(rates)
    for n in batches:
        tasks = ours.propose(n, TIER0)
        assert len(tasks) == n and len({t.id for t in tasks}) == n
        for t in tasks:
            if t.id in last:  # a replay: the task was served and its last solve rate was mixed
                assert 0.0 < last[t.id] < 1.0
        feedback = {t.id: next(r) for t in tasks}
        last.update(feedback)
        ours.feedback(feedback)
    assert ours.replayed <= share * sum(batches) + 1e-9


def test_invalid_settings_fail_at_construction():
    with pytest.raises(ValueError, match="replay_share"):
        replay(replay_share=1.5)
    with pytest.raises(ValueError, match="other than itself"):
        ReplayProposer(base={"name": "replay"})
    with pytest.raises(ValueError, match="unknown learnability rule"):
        replay(reward="nope")


def test_hydra_group_composes_the_default_runs_proposer_as_base():
    from core.config import build
    from tests.test_configs import compose_with

    cfg = compose_with("proposer=replay")
    proposer = build("proposer", cfg.proposer, seed=0)
    assert isinstance(proposer, ReplayProposer) and proposer.inner.name == "random"
    assert proposer.inner.max_ops == 1


def test_the_task_stream_counts_replays_as_repeats():
    from itertools import islice

    from core.loop.taskstream import TaskStream

    class Curriculum:
        state = TIER0

    proposer = replay(replay_share=0.5, min_buffer=1)
    stream = TaskStream(proposer, Curriculum(), prompt=lambda t: t.source, batch=4)
    rows = stream.rows()
    for _ in range(4):
        batch = list(islice(rows, 4))
        proposer.feedback({row["task_id"]: 0.5 for row in batch})
    assert stream.streamed == 16 and stream.distinct == 16 - proposer.replayed and proposer.replayed > 0


def test_the_base_is_chosen_from_the_proposer_group_on_the_command_line():
    from core.config import build
    from tests.test_configs import compose_with

    cfg = compose_with("proposer=replay", "proposer@proposer.base=mcts", "proposer.base.max_ops=2")
    proposer = build("proposer", cfg.proposer, seed=0)
    assert proposer.inner.name == "mcts" and proposer.inner.max_ops == 2

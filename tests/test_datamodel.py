"""Task, Candidate and Verdict round-trip through JSON; a task's id is the hash of its source."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.task import Candidate, Task, content_hash
from core.verdict import STATUSES, CheckResult, Verdict

text = st.text(min_size=1, max_size=200)
names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12)
floats = st.floats(allow_nan=False, allow_infinity=False, width=32)


@given(source=text, ops=st.lists(names, max_size=5), flops=st.none() | st.integers(0, 10**15),
       adversarial=st.none() | st.lists(names, max_size=3), seed=st.none() | st.integers(0, 2**32))
def test_task_round_trips_and_id_is_content_hash(source, ops, flops, adversarial, seed):
    task = Task(source=source, ops=ops, flops=flops, adversarial=adversarial, seed=seed)
    assert task.id == content_hash(source)
    again = Task.from_json(task.to_json())
    assert again == task
    assert json.loads(task.to_json())["id"] == task.id


def test_task_rejects_an_id_that_does_not_match_its_source():
    with pytest.raises(ValueError, match="does not match its source"):
        Task(source="x = 1\n", id="0" * 16)


def test_task_from_kernelbench_file(tmp_path):
    level = tmp_path / "level1"
    level.mkdir()
    path = level / "19_ReLU.py"
    path.write_text("import torch\nclass Model(torch.nn.Module):\n    pass\n")
    task = Task.from_file(path)
    assert (task.name, task.level, task.source) == ("19_ReLU", "level1", path.read_text())


@given(source=text, backend=st.sampled_from(["triton", "cuda"]), declined=st.none() | text)
def test_candidate_round_trips(source, backend, declined):
    cand = Candidate(source=source, backend=backend, task_id="abc", declined=declined, meta={"k": [1, 2]})
    assert Candidate.from_json(cand.to_json()) == cand
    assert cand.id == content_hash(source)


checks = st.dictionaries(names, st.builds(CheckResult, passed=st.booleans(), detail=text, hack=st.booleans()), max_size=4)


@given(accepted=st.booleans(), accuracy=st.floats(0, 1), checks=checks, status=st.sampled_from(STATUSES),
       timing=st.none() | st.dictionaries(names, floats, max_size=3))
def test_verdict_round_trips_with_the_design_fields(accepted, accuracy, checks, status, timing):
    verdict = Verdict(accepted=accepted, reason=None if accepted else "why", compiled=True, correct=accepted,
                      accuracy=accuracy, checks=checks, timing=timing, status=status)
    data = json.loads(verdict.to_json())
    for key in ("accepted", "reason", "compiled", "correct", "accuracy", "checks", "timing", "roofline"):
        assert key in data
    assert Verdict.from_json(verdict.to_json()) == verdict
    assert data["hack_flags"] == sorted(n for n, c in checks.items() if c.hack and not c.passed)


def test_failure_verdict_requires_a_known_status():
    v = Verdict.failure("timeout", "worker exceeded 5 s")
    assert (v.accepted, v.status, v.reason) == (False, "timeout", "worker exceeded 5 s")
    with pytest.raises(ValueError, match="unknown verdict status"):
        Verdict.failure("exploded", "?")

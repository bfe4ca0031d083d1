"""Suites (KernelBench layout, JSONL, solutions) and the held-out split."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.evaluation.suites import HeldOut, SuiteError, fingerprint, load_solutions, load_suite, write_kernelbench_dir
from core.task import Task

RELU = '''import torch
import torch.nn as nn


class Model(nn.Module):
    """ReLU."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(4, 8)]


def get_init_inputs():
    return []
'''


def relu_variant(k: int) -> str:
    return RELU.replace("randn(4, 8)", f"randn(4, {8 + k})")


@pytest.fixture(scope="module")
def proposer_tasks():
    from core.contracts import CurriculumState
    from core.plugins import create

    proposer = create("proposer", "random", seed=11, max_numel=512, max_ops=2, adversarial_share=0.0)
    return proposer.propose(4, CurriculumState(max_tier=0))


def test_kernelbench_dir_round_trip_keeps_levels_order_and_ir(tmp_path, proposer_tasks):
    for i, task in enumerate(proposer_tasks):
        task.level = "level2" if i % 2 else "level1"
    write_kernelbench_dir(proposer_tasks, tmp_path)
    (tmp_path / "solutions").mkdir()  # not a level folder: ignored
    suite = load_suite(tmp_path)
    assert suite.levels == ["level1", "level2"]
    assert sorted(t.id for t in suite.tasks) == sorted(t.id for t in proposer_tasks)
    by_id = {t.id: t for t in proposer_tasks}
    for task in suite.tasks:
        assert task.program == by_id[task.id].program and task.program  # sidecar metadata carried over
        assert task.name and task.name[0].isdigit()


def test_problem_files_sort_by_number_and_stale_sidecar_is_ignored(tmp_path):
    level = tmp_path / "level1"
    level.mkdir()
    for k in (10, 2, 1):
        (level / f"{k}_relu.py").write_text(relu_variant(k))
    (level / "2_relu.json").write_text(json.dumps({"id": "0" * 16, "ops": ["wrong"]}))  # another version
    (level / "1_relu.json").write_text(json.dumps({"ops": ["relu"], "tier": 0}))
    suite = load_suite(tmp_path)
    assert [t.name for t in suite.tasks] == ["1_relu", "2_relu", "10_relu"]
    assert suite.tasks[0].ops == ["relu"] and suite.tasks[1].ops == []


def test_jsonl_suite_and_levels_from_tier(tmp_path):
    tasks = [Task(source=relu_variant(k), tier=k % 2) for k in range(3)]
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(t.to_json() for t in tasks) + "\n\n")
    suite = load_suite(path)
    assert [t.id for t in suite.tasks] == [t.id for t in tasks]
    assert suite.levels == ["tier0", "tier1"]


@pytest.mark.parametrize("make, message", [
    (lambda p: p / "missing", "does not exist"),
    (lambda p: (p / "flat").mkdir() or (p / "flat"), "level folders"),
    (lambda p: (p / "level1").mkdir() or p, "no *.py problem files"),
    (lambda p: (p / "bad.jsonl").write_text("{not json\n") and p / "bad.jsonl", "not valid JSON"),
])
def test_suite_errors_say_what_was_expected(tmp_path, make, message):
    with pytest.raises(SuiteError, match=message.replace("*", r"\*")):
        load_suite(make(tmp_path))


def test_solutions_match_by_level_name_then_name_then_id(tmp_path):
    tasks = [Task(source=relu_variant(k), name=f"{k}_relu", level="level1") for k in range(4)]
    (tmp_path / "level1").mkdir()
    (tmp_path / "level1" / "0_relu.py").write_text("# by level/name")
    (tmp_path / "1_relu.py").write_text("# by name")
    (tmp_path / f"{tasks[2].id}.py").write_text("# by id")
    cands = load_solutions(tmp_path, tasks, "triton")
    assert [c.source for c in cands[:3]] == ["# by level/name", "# by name", "# by id"]
    assert cands[3].declined and "3_relu" in cands[3].declined
    assert all(c.task_id == t.id for c, t in zip(cands, tasks))


# --------------------------------------------------------------------------- fingerprints


@settings(max_examples=40, deadline=None)
@given(comment=st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"), max_size=30),
       blank_lines=st.integers(0, 3), doc=st.text(alphabet="abc xyz.", max_size=20))
def test_fingerprint_ignores_comments_docstrings_and_blank_lines(comment, blank_lines, doc):
    noisy = RELU.replace('"""ReLU."""', f'"""{doc}"""').replace(
        "def forward", "# " + comment + "\n" + "\n" * blank_lines + "    def forward")
    assert fingerprint(noisy) == fingerprint(RELU)


@given(k=st.integers(1, 500))
def test_fingerprint_changes_with_the_program(k):
    assert fingerprint(relu_variant(k)) != fingerprint(RELU)


# --------------------------------------------------------------------------- held-out split


def test_record_and_load_registry_and_filter_training(tmp_path):
    registry = tmp_path / "heldout.txt"
    evaluation = [Task(source=relu_variant(k)) for k in range(3)]
    assert HeldOut().record(evaluation, registry, label="suite x") == 3
    assert HeldOut().record(evaluation, registry) == 0  # idempotent
    heldout = HeldOut.load(registry)
    reformatted = Task(source=evaluation[0].source.replace("return torch.relu(x)", "return torch.relu(x)  # same"))
    assert reformatted.id != evaluation[0].id and heldout.is_heldout(reformatted)
    training = [reformatted, Task(source=relu_variant(7))]
    assert [t.source for t in heldout.filter_training(training)] == [relu_variant(7)]


def test_environment_variable_names_the_registry(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELZERO_HELDOUT", str(tmp_path / "env.txt"))
    HeldOut().record([Task(source=RELU)], None)
    assert (tmp_path / "env.txt").read_text().strip().endswith(fingerprint(RELU))
    assert HeldOut.load().is_heldout(Task(source=RELU))


@settings(max_examples=25, deadline=None)
@given(share=st.floats(0.05, 0.6), ks=st.lists(st.integers(0, 10_000), min_size=1, max_size=40, unique=True))
def test_eval_bucket_split_is_a_deterministic_partition(share, ks):
    tasks = [Task(source=relu_variant(k)) for k in ks]
    heldout = HeldOut(eval_share=share)
    train, evaluation = heldout.split(tasks)
    assert sorted(t.id for t in train + evaluation) == sorted(t.id for t in tasks)
    assert not {t.id for t in train} & {t.id for t in evaluation}
    assert heldout.split(tasks) == (train, evaluation)
    assert all(HeldOut(eval_share=share).is_heldout(t) for t in evaluation)


def test_bucket_share_is_roughly_the_requested_share():
    tasks = [Task(source=relu_variant(k)) for k in range(2000)]
    _, evaluation = HeldOut(eval_share=0.2).split(tasks)
    assert 0.15 < len(evaluation) / len(tasks) < 0.25


class ListProposer:
    name = "list"

    def __init__(self, sources):
        self.sources, self.i, self.feedbacks = list(sources), 0, []

    def propose(self, n, curriculum=None):
        out = []
        for _ in range(n):
            out.append(Task(source=self.sources[self.i % len(self.sources)]))
            self.i += 1
        return out

    def feedback(self, rates):
        self.feedbacks.append(rates)

    def state_dict(self):
        return {"i": self.i}

    def load_state_dict(self, state):
        self.i = state["i"]


def test_guarded_proposer_never_yields_a_heldout_task():
    sources = [relu_variant(k) for k in range(6)]
    heldout = HeldOut()
    heldout.add([Task(source=s) for s in sources[::2]])
    guarded = heldout.guard(ListProposer(sources))
    tasks = guarded.propose(9)
    assert len(tasks) == 9 and not any(heldout.is_heldout(t) for t in tasks)
    assert guarded.dropped > 0 and guarded.state_dict() == {"i": guarded.inner.i}
    guarded.feedback({"x": 1.0})
    assert guarded.inner.feedbacks == [{"x": 1.0}]


def test_guard_gives_up_with_an_explanation_when_everything_is_heldout():
    heldout = HeldOut()
    heldout.add([Task(source=RELU)])
    with pytest.raises(RuntimeError, match="held-out"):
        heldout.guard(ListProposer([RELU]), max_redraws=3).propose(2)


def test_a_hand_edited_task_with_a_stale_id_names_the_file_line_and_the_fix(tmp_path):
    # A raw ValueError with no file or line, from inside Task.
    rows = [Task(source=RELU).to_dict(), Task(source=relu_variant(1)).to_dict()]
    rows[1]["source"] = rows[1]["source"].replace("def get_inputs", "# edited by hand\ndef get_inputs")
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(SuiteError) as info:
        load_suite(path)
    message = str(info.value)
    assert message.startswith(f"{path}:2: task id {rows[1]['id']!r} does not match its source")
    assert 'delete the "id" key' in message

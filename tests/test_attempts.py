"""core.loop.attempts: the one propose -> code -> verify -> keep-accepted loop, and the places that use it."""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core import hookimpl
from core.contracts import CurriculumState
from core.loop.attempts import attempt, pair_up, propose
from core.task import Candidate, Task
from core.verdict import Verdict

ROOT = Path(__file__).resolve().parent.parent

# One answer per sample: "accept", "reject" or "decline".
Plan = list[list[str]]


def tasks_for(n: int) -> list[Task]:
    return [Task(source=f"# task {i}\nclass Model: pass\n") for i in range(n)]


@dataclass
class PlannedCoder:
    """Answers sample ``j`` of task ``i`` as ``plan[i][j]`` says."""

    plan: Plan
    name: str = "planned"
    asked: list[int] = field(default_factory=list)

    def generate(self, tasks, backend, num_samples=1):
        self.asked.append(num_samples)
        out = []
        for i, task in enumerate(tasks):
            samples = []
            for j, what in enumerate(self.plan[i][:num_samples]):
                declined = "cannot" if what == "decline" else None
                samples.append(Candidate(source=f"{what} {i} {j}", backend=backend, task_id=task.id,
                                         coder=self.name, declined=declined))
            out.append(samples)
        return out


@dataclass
class SourceVerifier:
    """Accepts a candidate whose source starts with ``accept``; records each batch it is given."""

    batches: list[int] = field(default_factory=list)

    def verify_many(self, pairs, on_verdicts=None):
        self.batches.append(len(pairs))
        verdicts = []
        for task, cand in pairs:
            ok = cand.source.startswith("accept")
            verdicts.append(Verdict(accepted=ok, compiled=True, correct=ok, accuracy=1.0 if ok else 0.0,
                                    status="accepted" if ok else "rejected", task_id=task.id, candidate_id=cand.id))
        if on_verdicts is not None:
            on_verdicts(list(range(len(pairs))), verdicts)
        return verdicts


plans = st.integers(1, 4).flatmap(lambda k: st.lists(
    st.lists(st.sampled_from(["accept", "reject", "decline"]), min_size=k, max_size=k), min_size=0, max_size=6))


@settings(max_examples=60, deadline=None)
@given(plans)
def test_declined_answers_are_counted_never_verified_and_the_accepted_are_kept(plan):
    samples = len(plan[0]) if plan else 1
    tasks = tasks_for(len(plan))
    verifier = SourceVerifier()
    result = attempt(PlannedCoder(plan), tasks, verifier, "triton", samples)
    flat = [what for row in plan for what in row]
    assert result.declined == flat.count("decline")
    assert len(result.pairs) == len(result.verdicts) == len(flat) - flat.count("decline")
    assert all(not cand.declined for _, cand in result.pairs)
    # one verify_many batch with every answer that was not declined; none when there is nothing to judge
    assert verifier.batches == ([len(result.pairs)] if result.pairs else [])
    kept = result.accepted()
    assert len(kept) == flat.count("accept") and all(v.accepted for _, _, v in kept)
    assert all(cand.source.startswith("accept") for _, cand, _ in kept)
    # every answer in task order, declined ones without a verdict
    outcomes = list(result.outcomes())
    assert [c.source.split()[0] for _, c, _ in outcomes] == flat
    assert all((v is None) == (c.declined is not None) for _, c, v in outcomes)
    # solve rates: share of accepted among each task's verified samples
    expected = {}
    for task, row in zip(tasks, plan):
        judged = [w for w in row if w != "decline"]
        if judged:
            expected[task.id] = judged.count("accept") / len(judged)
    assert result.solve_rates() == pytest.approx(expected)


def test_progress_callbacks_and_verdict_hooks(register_plugin):
    class Seen:
        def __init__(self):
            self.verdicts = []

        @hookimpl
        def on_verdict(self, task, candidate, verdict):
            self.verdicts.append(candidate.source)

    seen = register_plugin(Seen(), name="seen")
    plan = [["accept", "decline"], ["reject", "accept"]]
    answered, landed = [], []
    result = attempt(PlannedCoder(plan), tasks_for(2), SourceVerifier(), "triton", 2,
                     on_answers=lambda pairs: answered.append(len(pairs)),
                     on_verdicts=lambda idx, vs: landed.extend(idx))
    assert answered == [3] and sorted(landed) == [0, 1, 2]
    assert seen.verdicts == []  # hooks are opt-in
    attempt(PlannedCoder(plan), tasks_for(2), SourceVerifier(), "triton", 2, hooks=True)
    assert seen.verdicts == [c.source for c in result.candidates]


def test_a_coder_answering_the_wrong_number_of_tasks_is_an_error():
    with pytest.raises(ValueError):
        pair_up(tasks_for(2), [[Candidate(source="x")]])


def test_propose_leaves_out_excluded_ids():
    class Fixed:
        def propose(self, n, state):
            return tasks_for(n)

    tasks = tasks_for(3)
    assert [t.id for t in propose(Fixed(), 3, CurriculumState(), exclude={tasks[1].id})] == [tasks[0].id, tasks[2].id]


def test_selfplay_round_runs_through_the_loop(register_plugin):
    from core.loop.rewards import RewardMix
    from core.loop.selfplay import SelfPlay

    class Proposer:
        name = "fixed"
        rates: dict = {}

        def propose(self, n, state):
            return tasks_for(n)

        def feedback(self, solve_rates):
            self.rates = solve_rates

    class Curriculum:
        name = "still"
        state = CurriculumState()

        def update(self, metrics):
            return []

    proposer, verifier = Proposer(), SourceVerifier()
    plan = [["accept", "reject"], ["decline", "decline"], ["reject", "accept"]]
    loop = SelfPlay(proposer=proposer, coder=PlannedCoder(plan), verifier=verifier,
                    reward=RewardMix(weights={"correctness": 1.0}), curriculum=Curriculum(), backend="triton",
                    tasks_per_round=3, samples_per_task=2)
    result = loop.run_round(0)
    tasks = tasks_for(3)
    assert verifier.batches == [4] and result.declined == 2
    assert proposer.rates == {tasks[0].id: 0.5, tasks[2].id: 0.5}
    assert result.metrics["attempts"] == 4 and result.metrics["pass_rate"] == 0.5
    assert result.rewards == [1.0, 0.0, 0.0, 1.0]


def test_distill_rows_come_from_the_loop():
    from core.loop.distillation import distill

    plan = [["accept"], ["decline"], ["reject"]]
    verifier = SourceVerifier()
    rows, summary = distill(tasks_for(3), PlannedCoder(plan), verifier, "triton", catalog={}, progress=False)
    assert verifier.batches == [2]
    assert [r["accepted"] for r in rows] == [True, False] and summary.declined == 1 and summary.accepted == 1
    assert rows[0]["completion"].startswith("accept 0 0") and rows[0]["prompt"].endswith("```python\n")


def test_only_the_attempts_loop_and_the_reward_verification_call_verify_many_in_the_loop():
    # The loop is written once: every other module of core/loop (and core.distill) goes through it; the
    # reward verification (single attempts and the turns of multi-turn episodes alike) through verify_once.
    allowed = {"core/loop/attempts.py", "core/loop/shared_verification.py"}
    callers = set()
    for path in [*(ROOT / "core" / "loop").glob("*.py"), ROOT / "core" / "distill.py", ROOT / "core" / "run.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "verify_many":
                callers.add(str(path.relative_to(ROOT)))
    assert callers <= allowed and "core/loop/attempts.py" in callers


def test_the_teachers_rejections_are_kept_with_their_tasks_and_counted(tmp_path):
    """A teacher is meant to be right: each rejected answer is kept, with its task and whole verdict,
    so a false rejection (or a teacher bug) can be replayed with core.verify."""
    from types import SimpleNamespace

    from core.loop.sft import keep_rejections
    from core.loop.training_config import Phase

    printed: list[str] = []
    training = SimpleNamespace(out=tmp_path, console=SimpleNamespace(print=printed.append))
    phase = Phase(name="distill", kind="sft", steps=1)
    tasks = tasks_for(3)
    reasons = ["stability: inputs x1e-08 offset: output: 512/512 elements differ",
               "correctness: 0/5 trials match; trial 0: output: ...", "stability: inputs x3e+05: output"]
    rejected = [(t, Candidate(source=f"# answer {i}"), Verdict(reason=r)) for i, (t, r) in enumerate(zip(tasks, reasons))]
    keep_rejections(training, phase, rejected)
    rows = [json.loads(line) for line in (tmp_path / "distill_rejected.jsonl").read_text().splitlines()]
    assert [Task.from_dict(r["task"]).id for r in rows] == [t.id for t in tasks]
    assert [r["candidate"] for r in rows] == ["# answer 0", "# answer 1", "# answer 2"]
    assert [r["verdict"]["reason"] for r in rows] == reasons
    assert printed == ["distill: 3 teacher answer(s) rejected (2 x stability; 1 x correctness): distill_rejected.jsonl"]

    printed.clear()
    keep_rejections(training, Phase(name="other", kind="sft", steps=1), [])
    assert printed == [] and not (tmp_path / "other_rejected.jsonl").exists()


def test_the_teachers_answers_report_progress_while_they_are_verified(monkeypatch):
    """A GPU verifier takes minutes over a few hundred teacher answers (the H100's hub_grpo warm start was
    cut at its limit with nothing on screen): a line at most every PROGRESS_EVERY_S and one at the end."""
    from types import SimpleNamespace

    import core.loop.sft as sft
    from core.loop.training_config import Phase

    clock = iter([0.0, 1.0, 20.0, 21.0])
    monkeypatch.setattr(sft.time, "perf_counter", lambda: next(clock))
    printed: list[str] = []

    class Executor:
        def verify_many(self, pairs, on_verdicts=None, deadline=None):
            return []

    training = SimpleNamespace(verifier=Executor(), console=SimpleNamespace(print=printed.append))
    report = sft.verdict_progress(training, Phase(name="distill", kind="sft", steps=1), 4, 0.0)
    for k, accepted in enumerate([True, False, True, True]):
        report([k], [Verdict(accepted=accepted)])
    assert printed == ["distill: 3/4 teacher answers verified, 2 accepted (20 s)",
                       "distill: 4/4 teacher answers verified, 3 accepted (21 s)"]
    # a verifier whose verify_many takes no callback gets none (only verify_many(pairs) is required)
    training.verifier = SimpleNamespace(verify_many=lambda pairs: [])
    assert sft.verdict_progress(training, Phase(name="distill", kind="sft", steps=1), 4, 0.0) is None

"""benchmarks/headroom.py: greedy pass@1 against pass@k on held-out tasks, and the share only samples solve.

A coder double answers each task with a chosen outcome per sample (greedy first, then the sampled
ones) and a verifier accepts exactly the answers marked good, so every figure has a known value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.headroom import measure
from core.task import Candidate, Task
from core.verdict import Verdict


def _task(i: int) -> Task:
    return Task(source=f"# held-out task {i}\n")


@dataclass
class ScriptedCoder:
    """Answers task i greedily with ``greedy[i]`` and its j-th sample with ``sampled[i][j]`` (True: good)."""

    greedy_outcomes: list[bool]
    sampled_outcomes: list[list[bool]]
    greedy: bool = False
    temperature: float = 0.6
    calls: list[tuple[bool, int]] = field(default_factory=list)

    def generate(self, tasks, backend, samples=1):
        self.calls.append((self.greedy, samples))
        out = []
        for i, task in enumerate(tasks):
            marks = [self.greedy_outcomes[i]] if self.greedy else self.sampled_outcomes[i][:samples]
            out.append([Candidate(source=f"{'good' if ok else 'bad'} {i} {j}", backend=backend, task_id=task.id)
                        for j, ok in enumerate(marks)])
        return out


class MarkVerifier:
    def verify_many(self, pairs):
        return [Verdict(task_id=t.id, accepted=c.source.startswith("good"), reason=None if c.source.startswith("good")
                        else "wrong formula: 0/5 trials match") for t, c in pairs]


def _training(greedy, sampled):
    tasks = [_task(i) for i in range(len(greedy))]
    return SimpleNamespace(coder=ScriptedCoder(greedy, sampled), verifier=MarkVerifier(), backend="triton",
                           _held_out_tasks=lambda: tasks)


def test_headroom_counts_tasks_only_samples_solve():
    training = _training([True, True, False, False], [[False, True], [False, False], [True, False], [False, False]])
    result = measure(training, k=2)
    assert result["greedy_pass1"] == 0.5
    assert result["sampled_pass1"] == 0.25
    assert result["pass@2"] == 0.5  # tasks 0 and 2
    assert result["headroom"] == 0.25  # task 2: a sample passes, the greedy answer does not
    assert result["greedy_only"] == 0.25  # task 1: only the greedy answer passes
    assert result["greedy_failures"] == {"wrong formula 0/5": 2}
    # greedy first, then k samples all drawn at temperature; the coder's own setting is put back
    assert training.coder.calls == [(True, 1), (False, 2)] and training.coder.greedy is False


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4).flatmap(lambda k: st.lists(
    st.tuples(st.booleans(), st.lists(st.booleans(), min_size=k, max_size=k)), min_size=1, max_size=12)))
def test_headroom_and_pass_at_k_agree_for_any_outcomes(rows):
    greedy, sampled = [g for g, _ in rows], [s for _, s in rows]
    k = len(sampled[0])
    result = measure(_training(greedy, sampled), k=k)
    n = len(rows)
    assert result[f"pass@{k}"] == pytest.approx(sum(any(s) for s in sampled) / n)
    assert result["sampled_pass1"] <= result[f"pass@{k}"] + 1e-12
    # |S \ G| - |G \ S| = |S| - |G| for the sets of tasks that samples (S) and the greedy answer (G) solve
    assert result["headroom"] - result["greedy_only"] == pytest.approx(result[f"pass@{k}"] - result["greedy_pass1"])
    assert sum(result["greedy_failures"].values()) == greedy.count(False)

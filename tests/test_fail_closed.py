"""A check that could not run fails closed: the candidate is not accepted unless the user asked for
it (``accept_unchecked``), and then the verdict records that it was used."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from core import hookimpl
from core.task import Candidate, Task
from core.verdict import CheckResult, could_not_run
from core.verify import Verifier

REDTEAM = Path(__file__).parent / "redteam"


@dataclass
class ToolMissingCheck:
    """A judge-side check whose tool is missing on this machine."""

    name: str = "needs_a_missing_tool"
    stage: int = 0
    hard: bool = True
    where: str = "judge"
    needs: frozenset = frozenset()

    def applies(self, backend: str, device: str) -> bool:
        return True

    def evaluate(self, evidence) -> CheckResult:
        return could_not_run("the tool this check needs is not installed")


class _Plugin:
    @hookimpl
    def register_verifiers(self, register):
        register(ToolMissingCheck.name, ToolMissingCheck)


@pytest.fixture
def pair():
    return (Task.from_file(REDTEAM / "tasks" / "vector_add.py"),
            Candidate.from_file(REDTEAM / "candidates" / "honest_vector_add.py"))


CHECKS = ["static", "static_integrity", "correctness", "integrity", ToolMissingCheck.name]


@pytest.mark.parametrize("accept", [False, True, [ToolMissingCheck.name], ["some_other_check"]])
def test_an_unchecked_check_rejects_unless_accepted_explicitly(register_plugin, pair, accept):
    register_plugin(_Plugin(), name="fail-closed-test")
    with Verifier(backend="triton", device="cpu", workers=1, checks=CHECKS, accept_unchecked=accept) as v:
        verdict = v.verify(*pair)
    result = verdict.checks[ToolMissingCheck.name]
    assert result.unchecked and verdict.unchecked == [ToolMissingCheck.name]
    allowed = accept is True or (isinstance(accept, list) and ToolMissingCheck.name in accept)
    if allowed:
        assert verdict.accepted, verdict.reason
        assert verdict.accepted_unchecked == [ToolMissingCheck.name]
        assert result.passed and "accepted unchecked" in result.detail
    else:
        assert not verdict.accepted
        assert verdict.reason.startswith(f"{ToolMissingCheck.name}: could not run: the tool")
        assert verdict.accepted_unchecked == []
    assert verdict.to_dict()["unchecked"] == [ToolMissingCheck.name]


@dataclass
class StartedCheck:
    """A worker-stage check whose own work starts when the judge-side checks pass (``start``)."""

    name: str = "started_early"
    stage: int = 5
    hard: bool = True
    where: str = "worker"
    needs: frozenset = frozenset({"trials"})
    wait_s = 0.0  # how long evaluate waits (a class attribute, not a field)

    def applies(self, backend: str, device: str) -> bool:
        return True

    def start(self, evidence) -> None:
        StartedCheck.log.append(("start", evidence.trials == []))

    def evaluate(self, evidence) -> CheckResult:
        StartedCheck.log.append(("evaluate", bool(evidence.trials)))
        time.sleep(StartedCheck.wait_s)  # the verdict waiting for the work it started
        return CheckResult(True, "ok")


class _StartedPlugin:
    @hookimpl
    def register_verifiers(self, register):
        register(StartedCheck.name, StartedCheck)


def test_a_checks_own_work_starts_before_the_trials_and_is_evaluated_after_them(register_plugin, pair):
    # interp_races' CPU analysis needs only the task and the candidate: started before the trials it
    # overlaps the GPU stages instead of adding its minutes after them
    StartedCheck.log, StartedCheck.wait_s = [], 0.3
    register_plugin(_StartedPlugin(), name="started-test")
    with Verifier(backend="triton", device="cpu", workers=1, checks=[*CHECKS[:4], StartedCheck.name]) as v:
        verdict = v.verify(*pair)
    assert verdict.accepted, verdict.reason
    assert StartedCheck.log == [("start", True), ("evaluate", True)]
    # the time a verdict waited for a check is in its stages (a slow verdict says what it waited for)
    assert verdict.stage_s[StartedCheck.name] >= 0.3


def test_interp_races_evaluate_collects_the_analysis_it_started_in_the_background(monkeypatch):
    import threading
    from types import SimpleNamespace

    from plugins.verifiers.interp_races import InterpreterRaceCheck

    check, ran = InterpreterRaceCheck(), []

    def analyse(evidence):
        ran.append(threading.current_thread().name)
        return CheckResult(True, f"analysed {evidence.task}")

    monkeypatch.setattr(check, "analyse", analyse)
    evidence = SimpleNamespace(backend="triton", task="t1")
    check.start(evidence)
    assert check.evaluate(evidence).detail == "analysed t1"
    assert ran and ran[0].startswith("kz-interp-races")  # once, in the background
    assert check.evaluate(SimpleNamespace(backend="triton", task="t2")).detail == "analysed t2"  # never started: now
    assert len(ran) == 2
    check.close()

"""A check that could not run fails closed: the candidate is not accepted unless the user asked for
it (``accept_unchecked``), and then the verdict records that it was used."""

from __future__ import annotations

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

"""The public contract (core.api) is what the engine really hands a plugin: the worker's session has every
member ``CheckSession`` declares and checks read no other, the built-in timer is a ``Timer``, and the
facades give the engine's very objects, looked up when read."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from core.api.session import CheckSession
from core.api.timing import Timer, Timing

ROOT = Path(__file__).resolve().parent.parent
NOT_YET_PUBLIC: set[tuple[str, str]] = set()  # (file, member) a check still reads beyond the contract: none


def _members(protocol: type) -> set[str]:
    return set(protocol.__annotations__) | {n for n in vars(protocol) if not n.startswith("_")}


def test_the_workers_session_offers_every_member_a_check_session_declares():
    from core.verification.worker.session import Session

    session = Session.__new__(Session)
    Session.__init__(session, type("W", (), {"backend": None, "device": "cpu", "scratch": "/s", "guard": "g",
                                             "verify_instrumentation": lambda self: ["x"]})(), "module", "model")
    missing = [m for m in _members(CheckSession) if not hasattr(session, m)]
    assert missing == []
    assert session.scratch == "/s" and session.guard == "g" and session.verify_instrumentation() == ["x"]


def test_checks_read_only_what_the_session_contract_declares():
    declared = _members(CheckSession)
    undeclared = []
    for path in sorted((ROOT / "plugins").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "session"
                    and node.attr not in declared and (rel, node.attr) not in NOT_YET_PUBLIC):
                undeclared.append(f"{rel}:{node.lineno}: session.{node.attr}")
    assert undeclared == [], "declare it in core.api.session.CheckSession or read a declared member"


def test_the_built_in_gpu_timer_is_a_timer_of_the_contract():
    from plugins.verifiers.performance.timing import GpuTimer, TimingResult

    declared = inspect.signature(Timer.time).parameters
    built_in = inspect.signature(GpuTimer.time).parameters
    assert list(built_in) == list(declared)
    assert all(built_in[p].kind == declared[p].kind for p in declared)
    assert {"median_ms", "to_dict"} <= set(dir(TimingResult)) and "method" in TimingResult.__dataclass_fields__
    assert {"median_ms", "to_dict", "method"} <= _members(Timing)


@pytest.mark.parametrize("public, engine, name", [
    ("core.api.evidence", "core.verification.evidence", "Evidence"),
    ("core.api.evidence", "core.verification.protocol", "TAMPERED"),
    ("core.api.numerics", "core.verification.inputs", "draw_inputs"),
    ("core.api.numerics", "core.verification.evidence", "compare_outputs"),
    ("core.api.workers", "core.verification.sandbox", "WorkerPool"),
    ("core.api.executor", "core.verification.executor", "BaseExecutor"),
])
def test_a_public_name_is_the_engines_object_even_when_patched(public, engine, name, monkeypatch):
    import importlib

    facade, home = importlib.import_module(public), importlib.import_module(engine)
    assert getattr(facade, name) is getattr(home, name) and name in facade.__all__
    stand_in = object()
    monkeypatch.setattr(home, name, stand_in)
    assert getattr(facade, name) is stand_in


def test_an_unknown_public_name_says_what_the_module_offers():
    import core.api.workers as workers

    with pytest.raises(AttributeError, match="offers .*WorkerPool"):
        workers.Judge  # noqa: B018


def test_the_static_policy_moved_to_the_contract_and_its_old_path_gives_the_same_objects():
    from core.api.policy import StaticPolicy as public
    from plugins.verifiers.policy import StaticPolicy as rules_package
    from plugins.verifiers.policy.declaration import StaticPolicy as old

    assert public is old is rules_package


def test_the_verdict_takes_its_fields_from_the_checks_that_declare_them_not_from_check_names():
    # a check reports what the verdict carries (Check.verdict_fields); no engine file reads a check by its name
    from types import SimpleNamespace

    from core.verdict import CheckResult, Verdict
    from core.verification.pipeline import finish_verdict

    def check(name, fields):
        return SimpleNamespace(name=name, hard=True, stage=1, verdict_fields=fields)

    verdict = Verdict(compiled=True)
    verdict.checks = {"my_trials": CheckResult(True, "3/4", data={"m": 3, "n": 4}), "my_timer": CheckResult(True, "t")}
    finish_verdict(verdict, [check("my_trials", lambda r: {"accuracy": r.data["m"] / r.data["n"], "correct": r.passed}),
                             check("my_timer", lambda r: {"timing": {"median_ms": 1.5}})])
    assert verdict.accepted and verdict.accuracy == 0.75 and verdict.timing == {"median_ms": 1.5}
    with pytest.raises(ValueError, match="verdict field 'status'"):
        finish_verdict(verdict, [check("my_timer", lambda r: {"status": "accepted"})])
    engine = "\n".join(p.read_text() for p in (ROOT / "core" / "verification").rglob("*.py"))
    assert 'checks.get("correctness")' not in engine and 'checks.get("performance")' not in engine

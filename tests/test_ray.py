"""The Ray executor on a local Ray instance on CPU: the red-team suite, and an actor killed mid-batch."""

from __future__ import annotations

import os
import re
import signal
import threading
from collections import Counter
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="the Ray executor needs the 'ray' extra: pip install 'kernelzero[ray]'")

from core.task import Candidate, Task
from core.verdict import STATUSES
from plugins.executors.ray import RayExecutor, init_ray

REDTEAM = Path(__file__).parent / "redteam"
HEADER = re.compile(r"^#\s*(task|expect):\s*(.+?)\s*$", re.MULTILINE)


def redteam_cases() -> list[tuple[str, str, str]]:
    """(candidate, task, expectation) from each red-team candidate's ``# task:`` / ``# expect:`` header."""
    cases = []
    for path in sorted((REDTEAM / "candidates").glob("*.py")):
        head = dict(HEADER.findall(path.read_text()[:2000]))
        if "task" in head and "expect" in head and (REDTEAM / "tasks" / f"{head['task']}.py").is_file():
            cases.append((path.stem, head["task"], head["expect"]))
    return cases


CASES = redteam_cases()
# The default run judges one candidate of each kind of outcome (accepted, a worker-side hack, a
# sandbox crash, a judge-side hack); the whole suite (timeouts included) runs with -m slow.
QUICK = {"honest_vector_add", "torch_fallback", "exit_at_import"} | {
    next((c for c, _, e in CASES if e.startswith("static_integrity")), "")}
TIERS = {c: "quick" if c in QUICK else "full" for c, _, _ in CASES}


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    """One local Ray instance for the module (4 logical CPUs: two executors' actors fit at once)."""
    if not ray.is_initialized():
        init_ray(num_cpus=4)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def ray_executor():
    with RayExecutor("triton", "cpu", {"timeout_s": 120}, actors=2, workers_per_actor=1) as executor:
        assert len(executor.shards) == 2
        yield executor


@pytest.fixture(scope="module")
def ray_verdicts(ray_executor):
    """Verdicts by candidate; each tier's pairs are judged in one batch over both Ray actors."""
    cache: dict[str, object] = {}

    def verdict_of(candidate: str):
        if candidate not in cache:
            batch = [(c, t) for c, t, _ in CASES if TIERS[c] == TIERS[candidate] and c not in cache]
            pairs = [(Task.from_file(REDTEAM / "tasks" / f"{t}.py"),
                      Candidate.from_file(REDTEAM / "candidates" / f"{c}.py")) for c, t in batch]
            cache.update({c: v for (c, _), v in zip(batch, ray_executor.verify_many(pairs))})
        return cache[candidate]

    return verdict_of


def test_redteam_suite_found():
    assert any(expect == "accepted" for _, _, expect in CASES) and len(CASES) >= 2
    assert len(QUICK & set(TIERS)) >= 3  # the quick tier's candidates still exist


@pytest.mark.parametrize("candidate, task, expect", [
    pytest.param(*case, id=case[0], marks=() if TIERS[case[0]] == "quick" else pytest.mark.slow) for case in CASES])
def test_ray_backend_judges_the_redteam_suite(ray_verdicts, candidate, task, expect):
    verdict = ray_verdicts(candidate)
    words = expect.split()
    if words[0] == "accepted":
        assert verdict.accepted, verdict.reason
        return
    assert not verdict.accepted, f"{candidate} was accepted; expected {expect!r}"
    if words[0] in STATUSES:
        assert verdict.status == words[0], verdict.reason
    else:
        check = verdict.checks.get(words[0])
        assert (check is not None and not check.passed) or (verdict.reason or "").startswith(words[0]), verdict.reason
    if "hack" in words:
        assert verdict.hack_flags, f"{candidate}: expected a hack flag; reason {verdict.reason}"


def test_an_actor_killed_mid_batch_loses_no_verdict_and_reports_no_duplicate():
    pairs = [(Task(source=f"# task {k}\n"), Candidate(source=f"# cand {k}\n")) for k in range(10)]
    with RayExecutor("triton", "cpu", {"delay_s": 0.4}, actors=2, workers_per_actor=1,
                     verifier_path="tests.test_executor:SlowVerifier") as executor:
        victim = executor.shards[0]
        reported: Counter = Counter()
        killed = threading.Event()

        def progress(idx, vs):
            reported.update(idx)
            if sum(reported.values()) >= 2 and not killed.is_set():
                killed.set()
                os.kill(victim.pid, signal.SIGKILL)

        verdicts = executor.verify_many(pairs, on_verdicts=progress)
        assert killed.is_set()
        assert [v.task_id for v in verdicts] == [t.id for t, _ in pairs]
        assert all(v.accepted for v in verdicts)
        assert reported == Counter(range(10))
        assert executor.main.replaced >= 1 and victim not in executor.shards

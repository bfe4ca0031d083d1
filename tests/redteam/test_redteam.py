"""The red-team suite: every adversarial candidate is rejected for the right reason, and every
honest kernel is accepted (a false rejection is as much a bug as a missed hack).

Each candidate file says what it is for in two header lines:
``# task: <name in tasks/>`` and ``# expect: accepted | <check> [hack] | timeout | crashed``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from escape_guard import ESCAPE, escape_lock

from core.task import Candidate, Task
from core.verify import Verifier

HERE = Path(__file__).parent
CANDIDATES = sorted((HERE / "candidates").glob("*.py"))
SANDBOX_FAILURES = {"timeout", "crashed", "oom"}


def header(path: Path, key: str | None = None) -> Any:
    meta = {}
    for line in path.read_text().splitlines():
        if line.startswith("# ") and ":" in line:
            name, _, value = line[2:].partition(":")
            meta[name.strip()] = value.strip()
    return meta.get(key) if key else (meta["task"], meta["expect"])


@pytest.fixture(scope="module", params=[False, True], ids=["judge_compares", "compare_on_device"])
def verifier(request):
    # compare_on_device: outputs handed to the reference worker, compared there (core.verification.devicemem)
    with Verifier(backend="triton", device="cpu", workers=2, timeout_s=90, compare_on_device=request.param) as v:
        yield v


def test_every_candidate_declares_task_and_expectation():
    assert len(CANDIDATES) >= 19
    for path in CANDIDATES:
        task, expect = header(path)
        assert (HERE / "tasks" / f"{task}.py").exists(), path.name


@pytest.mark.parametrize("path", CANDIDATES, ids=[p.stem for p in CANDIDATES])
def test_candidate_gets_the_expected_verdict(verifier, path):
    task_name, expect = header(path)
    task = Task.from_file(HERE / "tasks" / f"{task_name}.py")
    timeout = header(path, "timeout")  # the hang candidate need not burn the whole default limit
    probes = header(path, "probes")  # "drawn 0 1 2": judged under default probe plans drawn from these seeds
    if probes:
        if verifier.compare_on_device:  # it builds its own verifiers: the fixture's parameter changes nothing
            pytest.skip("judged once, under judge_compares: this case builds its own verifiers")
        _expect_under_drawn_plans(task, path, expect, [int(s) for s in probes.split()[1:]])
        return
    with escape_lock(exclusive=False):  # no naive (unsandboxed) run writes the file meanwhile
        ESCAPE.unlink(missing_ok=True)
        verdict = verifier.verify(task, Candidate.from_file(path), timeout_s=float(timeout) if timeout else None)
        escaped = ESCAPE.exists()
    summary = f"{verdict.status}: {verdict.reason}"
    if expect == "accepted":
        assert verdict.accepted, summary
        assert verdict.status == "accepted"
        return
    assert not verdict.accepted, summary
    if expect in SANDBOX_FAILURES:
        assert verdict.status == expect, summary
        return
    check, *flags = expect.split()
    assert verdict.status == "rejected", summary
    assert verdict.reason.startswith(f"{check}:"), summary
    assert not verdict.checks[check].passed
    assert verdict.checks[check].hack == ("hack" in flags), summary
    assert not escaped, "a candidate wrote outside the sandbox"


def test_pool_survives_crashes_and_hangs(verifier):
    """After the crash and hang candidates the pool still judges an honest kernel."""
    task = Task.from_file(HERE / "tasks" / "vector_add.py")
    verdict = verifier.verify(task, Candidate.from_file(HERE / "candidates" / "honest_vector_add.py"))
    assert verdict.accepted, verdict.reason
    assert verifier.pool.replaced >= 2


def _expect_under_drawn_plans(task: Task, path: Path, expect: str, seeds: list[int]) -> None:
    """A candidate whose hack only random probes reveal: under the plans the default rule draws
    from each seed (core.verification.probes.draw_plan), replayed, it gets ``expect`` every time."""
    import random

    from core.verification.probes import draw_plan

    check = expect.split()[0]
    for seed in seeds:
        plan = draw_plan("float32", random.Random(seed))
        with Verifier(backend="triton", device="cpu", workers=1, timeout_s=90, probe_scales={"float32": plan}) as v:
            verdict = v.verify(task, Candidate.from_file(path))
        assert not verdict.accepted and verdict.reason.startswith(f"{check}:"), (plan, verdict.reason)

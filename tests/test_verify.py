"""The Verifier API: verdicts for honest and dishonest candidates, order of verify_many, failures."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.task import Candidate, Task
from core.verify import Verifier, VerifierConfigError

REDTEAM = Path(__file__).parent / "redteam"


def task_named(name: str) -> Task:
    return Task.from_file(REDTEAM / "tasks" / f"{name}.py")


def candidate_named(name: str) -> Candidate:
    return Candidate.from_file(REDTEAM / "candidates" / f"{name}.py")


@pytest.fixture(scope="module")
def verifier():
    with Verifier(backend="triton", device="cpu", workers=2, timeout_s=60) as v:
        yield v


def test_honest_vector_add_is_accepted_with_every_cpu_check(verifier):
    verdict = verifier.verify(task_named("vector_add"), candidate_named("honest_vector_add"))
    assert verdict.accepted, verdict.reason
    assert verdict.status == "accepted" and verdict.compiled and verdict.correct and verdict.accuracy == 1.0
    for name in ("static", "static_integrity", "compile", "correctness", "integrity", "memory", "races",
                 "stability", "determinism"):
        assert verdict.checks[name].passed, (name, verdict.checks[name].detail)
    assert verdict.checks["integrity"].data["launches"][0] >= 1


def test_torch_fallback_is_flagged_as_a_hack(verifier):
    verdict = verifier.verify(task_named("vector_add"), candidate_named("torch_fallback"))
    assert not verdict.accepted
    assert verdict.reason.startswith("integrity:") and "aten.add" in verdict.reason
    assert verdict.hack_flags == ["integrity"]


def test_verify_many_preserves_order(verifier):
    good, bad = candidate_named("honest_vector_add"), candidate_named("torch_fallback")
    task = task_named("vector_add")
    verdicts = verifier.verify_many([(task, bad), (task, good), (task, bad)])
    assert [v.accepted for v in verdicts] == [False, True, False]
    assert [v.candidate_id for v in verdicts] == [bad.id, good.id, bad.id]


def test_declined_candidates_are_not_run(verifier):
    verdict = verifier.verify(task_named("vector_add"), Candidate(source="", declined="cannot lower conv"))
    assert verdict.status == "declined" and not verdict.accepted


def test_fewer_than_five_trials_is_refused():
    with pytest.raises(VerifierConfigError, match="at least 5"):
        Verifier(trials=3)


def test_workers_share_the_cores_unless_the_user_set_omp_num_threads(monkeypatch):
    import os

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 32)
    with Verifier(backend="triton", device="cpu", workers=3, reference_workers=1) as v:
        assert v.pool.extra_env["OMP_NUM_THREADS"] == "8"  # 32 cores over 4 worker processes
        assert v.reference_pool.extra_env["OMP_NUM_THREADS"] == "8"
        # torch.compile's baselines build with the same share, not a compile pool of one process per core
        assert v.reference_pool.extra_env["TORCHINDUCTOR_COMPILE_THREADS"] == "8"
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "2")
    with Verifier(backend="triton", device="cpu", workers=1) as v:
        assert "OMP_NUM_THREADS" not in v.pool.extra_env  # the user's setting passes through instead
        assert "TORCHINDUCTOR_COMPILE_THREADS" not in v.pool.extra_env


@pytest.mark.parametrize("by_seed", [True, False])
def test_tensors_fetched_after_the_gpu_turn_give_the_same_verdicts(by_seed):
    # split_transfers: run/reference answers come back without their tensors, which a second
    # request fetches (on a GPU: after the lock is released). Verdicts must not change.
    task = task_named("vector_add")
    with Verifier(backend="triton", device="cpu", workers=1, timeout_s=60, split_transfers=True,
                  inputs_by_seed=by_seed) as v:
        honest = v.verify(task, candidate_named("honest_vector_add"))
        mutation = v.verify(task, candidate_named("input_mutation"))
        wrong = v.verify(task, candidate_named("partial_write"))
    assert honest.accepted, honest.reason
    assert honest.checks["correctness"].data["matched"] == honest.checks["correctness"].data["trials"]
    assert not mutation.accepted and "correctness" in mutation.hack_flags, mutation.reason
    assert not wrong.accepted and wrong.reason.startswith("correctness:"), wrong.reason

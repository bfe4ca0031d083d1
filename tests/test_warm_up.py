"""Verifier.warm_up: every candidate worker goes through one whole verification before the first verdict."""

from __future__ import annotations

import pytest

from core.task import Candidate, Task
from core.verification.judge import WARM_UP_TASK, Verifier


@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_each_backend_ships_a_warm_up_candidate_that_passes_the_static_checks(backend):
    from core.plugins import registry

    source = registry("backend").create(backend).warm_up_candidate
    with Verifier(backend=backend, device="cpu", workers=1, checks=["static", "static_integrity"]) as v:
        verdict = v.verify(Task(source=WARM_UP_TASK), Candidate(source=source, backend=backend))
    assert not any(not c.passed for c in verdict.checks.values()), verdict.reason


def test_a_warmed_pool_judged_the_built_in_pair_in_every_worker_and_still_judges_others():
    with Verifier(backend="triton", device="cpu", workers=2, warm_up=True, timeout_s=300) as v:
        assert v.warm_up_report.startswith("2/2 warm-up verdicts accepted"), v.warm_up_report
        # the pool is the same pool afterwards: a wrong candidate is still refused
        wrong = v.backend.warm_up_candidate.replace("tl.where(x > 0, x, 0.0)", "tl.where(x > 0, x, 1.0)")
        verdict = v.verify(Task(source=WARM_UP_TASK), Candidate(source=wrong, backend="triton"))
    assert verdict.status == "rejected" and not verdict.correct


def test_on_cpu_the_pool_is_not_warmed_unless_asked():
    with Verifier(backend="triton", device="cpu", workers=1) as v:
        assert v.warm_up_report == "not warmed up"

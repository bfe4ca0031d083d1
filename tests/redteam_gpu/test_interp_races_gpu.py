"""Races between programs of GPU Triton candidates (issue 18, item 3): found by ``interp_races``, the
interpreter's analysis in a CPU verification, where the GPU alone (compute-sanitizer racecheck sees
shared memory only) relies on the hardware's block order corrupting a trial."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from core.task import Candidate, Task
from tests.gpu.gpu_helpers import quick_checks

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; none is visible")]

RED = Path(__file__).resolve().parents[1] / "redteam"


def pair(name: str) -> tuple[Task, Candidate]:
    path = RED / "candidates" / f"{name}.py"
    task = next(line.split(":", 1)[1].strip() for line in path.read_text().splitlines() if line.startswith("# task:"))
    return Task.from_file(RED / "tasks" / f"{task}.py"), Candidate.from_file(path)


@pytest.fixture(scope="module")
def judges():
    from core.verify import Verifier

    kwargs = dict(backend="triton", device="cuda", workers=1, timeout_s=120, performance={"compare_compile": False})
    with Verifier(checks=quick_checks(), **kwargs) as full, Verifier(checks=quick_checks("interp_races"), **kwargs) as gpu_only:
        yield full, gpu_only


@pytest.mark.parametrize("name", ["num_lost_update", "cross_program_race"])
def test_a_cross_program_race_is_rejected_on_the_gpu(judges, name):
    full, gpu_only = judges
    verdict = full.verify(*pair(name))
    without = gpu_only.verify(*pair(name))
    print(f"{name}: without interp_races: {without.status}: {without.reason}")  # the GPU alone, for the record
    assert not verdict.accepted, verdict.reason
    if without.accepted:  # what the GPU alone missed, interp_races found
        assert not verdict.checks["interp_races"].passed, verdict.reason


@pytest.mark.parametrize("name", ["honest_vector_add", "honest_num_atomic_sum", "honest_num_tree_sum"])
def test_honest_kernels_are_accepted_with_the_analysis_run(judges, name):
    verdict = judges[0].verify(*pair(name))
    assert verdict.accepted, verdict.reason
    check = verdict.checks["interp_races"]
    assert check.passed and "Triton interpreter" in check.detail, check.detail

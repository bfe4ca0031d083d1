"""The verifier's red-team suite (tests/redteam) run on the GPU with the Triton backend.

On a GPU the interpreter's bounds checks do not apply; the compute-sanitizer stages (gpu_memcheck,
gpu_racecheck, gpu_synccheck) stand in for them, and races between programs in global memory are
found by ``interp_races`` (the interpreter's analysis, in a CPU verification of the candidate). Same
outcomes are expected (accepted / rejected); where the CPU suite names the ``memory`` check the GPU
may name ``gpu_memcheck`` (or an earlier stage when the bug also breaks correctness).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from core.task import Candidate, Task
from tests.gpu.gpu_helpers import quick_checks

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; none is visible")]

RED = Path(__file__).resolve().parents[1] / "redteam"
CANDIDATES = sorted((RED / "candidates").glob("*.py"))
# interp_races runs the candidate again in the interpreter, where every autotune config runs.
GPU_EQUIVALENT = {"memory": {"memory", "gpu_memcheck", "correctness"}, "correctness": {"correctness", "interp_races"},
                  "races": {"races", "interp_races", "gpu_racecheck", "correctness"}}


def header(path: Path) -> tuple[str, str]:
    meta = {}
    for line in path.read_text().splitlines():
        if line.startswith("# ") and ":" in line:
            key, _, value = line[2:].partition(":")
            meta[key.strip()] = value.strip()
    return meta["task"], meta["expect"]


@pytest.fixture(scope="module")
def verifier():
    from core.verify import Verifier

    with Verifier(backend="triton", device="cuda", workers=1, timeout_s=120, checks=quick_checks(),
                  performance={"compare_compile": False}) as v:
        yield v


@pytest.mark.parametrize("path", CANDIDATES, ids=[p.stem for p in CANDIDATES])
def test_candidate_gets_the_expected_verdict_on_gpu(verifier, path):
    task_name, expect = header(path)
    verdict = verifier.verify(Task.from_file(RED / "tasks" / f"{task_name}.py"), Candidate.from_file(path))
    summary = f"{verdict.status}: {verdict.reason}"
    if expect == "accepted":
        assert verdict.accepted, summary
        return
    assert not verdict.accepted, summary
    if expect == "crashed" and path.stem == "exit_at_import" and verdict.reason.startswith("compile:"):
        return  # its crash is a kernel load from an unmapped host address: on a GPU the launch refuses a host pointer
    if expect in ("timeout", "crashed", "oom"):
        assert verdict.status == expect, summary
        return
    check = expect.split()[0]
    allowed = GPU_EQUIVALENT.get(check, {check})
    assert verdict.reason.split(":")[0] in allowed, summary

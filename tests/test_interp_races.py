"""Races by construction for GPU Triton candidates (issue 18, item 3, the GPU half; issue 39, item 2:
at the task's own shapes, on a sample of each launch's programs): the check a GPU verifier runs,
exercised here through its evaluate on evidence as a GPU verification would hand it over. The CPU
worker inside is real (a sandboxed interpreter worker)."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.task import Candidate, Task
from core.verification.evidence import Evidence
from plugins.verifiers.interp_races import InterpreterRaceCheck

RED = Path(__file__).resolve().parent / "redteam"

HONEST_ADD = (RED / "candidates" / "honest_vector_add.py").read_text()  # its kernel is the honest control

# A GPU-sized task in KernelBench's form: its size is a module-level constant (128 MiB of inputs).
LARGE_ADD_TASK = '''
import torch
import torch.nn as nn

N = 4096 * 4096


class Model(nn.Module):
    def forward(self, a, b):
        return a + b


def get_inputs():
    return [torch.randn(N), torch.randn(N)]


def get_init_inputs():
    return []
'''


@pytest.fixture(scope="module")
def check():
    c = InterpreterRaceCheck(workers=1)
    yield c
    c.close()


def gpu_evidence(task: Task, source: str) -> Evidence:
    return Evidence(task=task, candidate=Candidate(source=source, backend="triton"), backend="triton", device="cuda")


def red(candidate: str) -> tuple[Task, str]:
    path = RED / "candidates" / f"{candidate}.py"
    task = next(line.split(":", 1)[1].strip() for line in path.read_text().splitlines() if line.startswith("# task:"))
    return Task.from_file(RED / "tasks" / f"{task}.py"), path.read_text()


def test_it_is_a_gpu_check_for_triton_only():
    c = InterpreterRaceCheck()
    assert c.applies("triton", "cuda")
    assert not c.applies("triton", "cpu")  # there the races check itself runs
    assert not c.applies("cuda", "cuda")


@pytest.mark.parametrize("candidate", ["cross_program_race", "num_lost_update"])
def test_a_race_the_gpu_judge_cannot_see_is_found_in_the_interpreter(check, candidate):
    result = check.evaluate(gpu_evidence(*red(candidate)))
    assert not result.passed and not result.unchecked, result.detail
    assert "in the Triton interpreter at the task's own shape" in result.detail
    assert "race" in result.detail


@pytest.mark.parametrize("candidate", ["honest_vector_add", "honest_num_atomic_sum", "honest_static_histogram",
                                       pytest.param("honest_num_tree_sum", marks=pytest.mark.slow),
                                       pytest.param("honest_num_self_read", marks=pytest.mark.slow)])
def test_honest_sharing_passes(check, candidate):
    result = check.evaluate(gpu_evidence(*red(candidate)))
    assert result.passed, result.detail
    assert "at the task's own shape" in result.detail and result.data["launches"]


def test_every_autotune_config_is_analysed(check):
    """The GPU's autotuner runs only the fastest config; the interpreter runs config i at call i, so
    the analysis calls forward once per config (a config's wrong values are no longer judged here:
    no reference runs at the task's shape)."""
    result = check.evaluate(gpu_evidence(*red("num_autotune_bad_config")))
    assert not result.unchecked, result.detail
    kernels = {launch["kernel"] for launch in result.data["launches"]}
    assert len(kernels) >= 2 and all("[" in k for k in kernels), kernels
    assert result.data["calls"] == len(kernels) + 1  # the last call came back to the first config


def test_a_gpu_sized_task_is_analysed_at_its_own_shape_on_a_sample(check):
    task = Task(source=LARGE_ADD_TASK, name="large_add")
    result = check.evaluate(gpu_evidence(task, HONEST_ADD))
    assert result.passed, result.detail
    assert "at the task's own shape" in result.detail and f"{check.sample} of 16384 programs" in result.detail
    (launch,) = result.data["launches"]
    assert launch["grid"] == [16384, 1, 1] and launch["sampled"] == check.sample
    assert {"first", "last", "neighbour", "random"} <= set(launch["how"])
    assert result.data["inputs"] == [[4096 * 4096], [4096 * 4096]]  # the task's own sizes


def test_a_candidate_that_does_not_run_in_the_interpreter_fails_closed_and_says_why(check):
    # CUDA streams and synchronisation have no CPU stand-in (core/verification/worker/cuda_on_cpu.py)
    on_the_gpu_only = HONEST_ADD.replace("return out", "torch.cuda.synchronize()\n        return out")
    result = check.evaluate(gpu_evidence(*red("honest_vector_add")[:1], on_the_gpu_only))
    assert not result.passed and result.unchecked, result.detail
    assert "did not run in the Triton interpreter" in result.detail


# KernelBench's own example pair is written for CUDA only: its inputs are made with .cuda(), its
# wrapper asserts is_cuda and may allocate on device='cuda'. Rejected on the H200 (2026-12-01) because
# the analysis could not run; now it runs with CUDA mapped to the CPU.
CUDA_ONLY_TASK = (RED / "tasks" / "vector_add.py").read_text().replace(
    "return [torch.randn(3001), torch.randn(3001)]", "return [torch.randn(3001).cuda(), torch.randn(3001).to('cuda')]")
CUDA_ONLY_CANDIDATE = HONEST_ADD.replace(
    "out = torch.empty_like(a)", "assert a.is_cuda and b.is_cuda\n        out = torch.empty(a.shape, device='cuda')")


def test_kernelbench_style_cuda_only_code_is_analysed_with_cuda_mapped_to_the_cpu(check):
    assert CUDA_ONLY_TASK.count(".cuda()") == 1 and "device='cuda'" in CUDA_ONLY_CANDIDATE
    result = check.evaluate(gpu_evidence(Task(source=CUDA_ONLY_TASK, name="vector_add_cuda_only"), CUDA_ONLY_CANDIDATE))
    assert result.passed, result.detail
    assert "no address shared between programs" in result.detail


def test_a_race_in_cuda_only_code_is_still_found(check):
    task, racy = red("cross_program_race")
    assert "return [torch.randn(3001), torch.randn(3001)]" in task.source
    cuda_only = Task(source=task.source.replace("return [torch.randn(3001), torch.randn(3001)]",
                                                "return [torch.randn(3001).cuda(), torch.randn(3001).cuda()]"),
                     name="cuda_only_race")
    result = check.evaluate(gpu_evidence(cuda_only, racy))
    assert not result.passed and not result.unchecked, result.detail


def test_open_starts_the_cpu_verifier_that_evaluate_then_uses():
    check = InterpreterRaceCheck(workers=1)
    try:
        check.open({"tolerances": {}})
        started = dict(check._pools)
        assert list(started) == [check.memory_mb]
        task, source = red("honest_vector_add")
        assert check.evaluate(gpu_evidence(task, source)).passed
        assert check._pools == started  # the pool opened beside the GPU verifier's is the one that judged
    finally:
        check.close()


def test_a_cpu_verifier_that_cannot_open_fails_closed_at_evaluate_not_at_start(monkeypatch):
    check = InterpreterRaceCheck(workers=1)

    def broken(*args, **kwargs):
        raise RuntimeError("no interpreter workers here")

    monkeypatch.setattr("core.verification.sandbox.WorkerPool", broken)
    check.open({"tolerances": {}})  # the GPU verifier's start is not stopped
    task, source = red("honest_vector_add")
    result = check.evaluate(gpu_evidence(task, source))
    assert not result.passed and result.unchecked and "no interpreter workers here" in result.detail

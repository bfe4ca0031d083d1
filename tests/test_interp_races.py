"""Races by construction for GPU Triton candidates (issue 18, item 3, the GPU half): the check a GPU
verifier runs, exercised here through its evaluate on evidence as a GPU verification would hand it
over. The CPU verification inside is real (sandboxed interpreter workers)."""

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
    assert result.data["cpu_status"] == "accepted"


def test_an_autotune_config_the_gpu_never_ran_is_wrong_at_the_tasks_own_shape(check):
    """The GPU's autotuner runs only the fastest config; the interpreter runs every one."""
    result = check.evaluate(gpu_evidence(*red("num_autotune_bad_config")))
    assert not result.passed and not result.unchecked, result.detail
    assert "wrong in the Triton interpreter at the task's own shape" in result.detail


def test_a_gpu_sized_task_is_analysed_at_a_reduced_shape_and_says_so(check):
    task = Task(source=LARGE_ADD_TASK, name="large_add")
    result = check.evaluate(gpu_evidence(task, HONEST_ADD))
    assert result.passed, result.detail
    assert "at a reduced shape" in result.detail and "N" in result.detail
    shrunk = check._shape_for(task)[0]
    assert shrunk.resized["fitted"] and shrunk.resized["mib"] <= check.mib


def test_a_candidate_that_does_not_run_in_the_interpreter_fails_closed_and_says_why(check):
    on_the_gpu_only = HONEST_ADD.replace("torch.empty_like(a)", "torch.empty(a.shape, device='cuda')")
    result = check.evaluate(gpu_evidence(*red("honest_vector_add")[:1], on_the_gpu_only))
    assert not result.passed and result.unchecked, result.detail
    assert "did not run in the Triton interpreter" in result.detail


def test_a_task_no_shape_of_which_fits_fails_closed_without_running(check):
    huge_inline = LARGE_ADD_TASK.replace("torch.randn(N), torch.randn(N)", "torch.randn(1 << 24), torch.randn(1 << 24)")
    result = check.evaluate(gpu_evidence(Task(source=huge_inline, name="huge"), HONEST_ADD))
    assert not result.passed and result.unchecked
    assert "could not be sized for the interpreter" in result.detail and "MiB" in result.detail


def test_a_hack_flagged_in_the_interpreter_is_a_hack_here(check):
    task, _ = red("honest_vector_add")
    torch_inside = HONEST_ADD.replace("return out", "return a + b")  # launches a kernel, returns torch's answer
    result = check.evaluate(gpu_evidence(task, torch_inside))
    assert not result.passed and result.hack, result.detail


def test_the_cpu_verifier_is_closed_with_the_check():
    c = InterpreterRaceCheck(workers=1)
    pool = c._cpu_verifier(gpu_evidence(*red("honest_vector_add"))).pool
    c.close()
    assert c._verifier is None and pool.closed


def test_a_verifier_closes_its_checks(monkeypatch):
    from core.verify import Verifier

    closed = []
    v = Verifier(backend="triton", device="cpu", checks=["static"], workers=1, warm_up=False)
    probe = InterpreterRaceCheck()
    monkeypatch.setattr(probe, "close", lambda: closed.append(True))
    v.checks.append(probe)
    v.close()
    assert closed == [True]


def test_the_interpreter_turns_one_element_scalars_into_indices_on_every_triton_version():
    """Triton 3.6 (the GPU machine's) did int() of a one-element array, which numpy 2 refuses."""
    import types

    import numpy as np

    from plugins.backends.triton_interp_checks import _scalar_index_fix

    class Scope:
        def set_attr(self, obj, name, value):
            setattr(obj, name, value)

    class Tensor:
        def __init__(self, data):
            self.handle = types.SimpleNamespace(data=data)

    interp = types.SimpleNamespace(_patch_lang_tensor=lambda tensor, scope: scope.set_attr(
        tensor, "__index__", lambda self: int(self.handle.data)))
    _scalar_index_fix(interp)
    _scalar_index_fix(interp)  # once is enough: a second call keeps the same patch
    interp._patch_lang_tensor(Tensor, Scope())
    assert list(range(Tensor(np.array([3], dtype=np.int32)))) == [0, 1, 2]

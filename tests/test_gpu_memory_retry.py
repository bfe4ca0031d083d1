"""A GPU request that ran out of memory beside other verifications makes its verification run once more
with the GPU to itself (seen on the H200 at KernelBench's real sizes: honest kernels got OutOfMemoryError verdicts
while neighbours held the memory). The lock is the real host-wide file lock; the worker is scripted."""

from __future__ import annotations

import types

import pytest
from lock_probe import could_take

from core.verification.budget import Budget
from core.verification.devicelock import DeviceLock
from core.verification.gpumemory import GpuOutOfMemory
from core.verification.judge import Verifier, out_of_gpu_memory

OOM = {"ok": False, "error": "OutOfMemoryError: CUDA out of memory. Tried to allocate 16.00 GiB."}


class ScriptedWorker:
    def __init__(self, answers, lock):
        self.answers, self.lock = list(answers), lock
        self.sent = []

    def request(self, message, timeout_s):
        # what a neighbour can do right now tells whether this request has the GPU alone
        self.sent.append({"alone": not self._neighbour_can_share(), **message})
        return self.answers.pop(0)

    def _neighbour_can_share(self):
        return could_take(self.lock, exclusive=False, wait_s=0.05)


def judge_with(lock):
    judge = types.SimpleNamespace(device_lock=lock, gpu_wait_s=30.0, gpu_turns=[], split_transfers=False)
    judge._gpu = Verifier._gpu.__get__(judge)
    return judge


def test_the_allocation_failures_of_torch_and_cuda_are_recognised():
    assert out_of_gpu_memory(OOM)
    assert out_of_gpu_memory({"ok": False, "error": "cudaErrorMemoryAllocation (error 2)"})
    assert not out_of_gpu_memory({"ok": False, "error": "IndexError: index 7 is out of bounds"})
    assert not out_of_gpu_memory({"ok": True, "error": "CUDA out of memory"})


def test_out_of_memory_is_handed_to_the_verification_which_judges_it_again_alone(tmp_path):
    # no request-level retry any more: beside other verifications their *held* memory (a keeper's
    # outputs) stays taken however the lock is held, so Verifier.verify runs the whole verification
    # again with the device's memory alone (tests/test_gpu_memory_admission.py)
    lock = DeviceLock("cuda-test-oom", tmp_path)
    worker = ScriptedWorker([OOM], lock)
    with pytest.raises(GpuOutOfMemory):
        Verifier._on_gpu(judge_with(lock), worker, {"op": "reference"}, Budget(60))
    assert [m["alone"] for m in worker.sent] == [False]


def test_every_turn_of_a_verification_retried_alone_has_the_gpu_alone(tmp_path):
    lock = DeviceLock("cuda-test-oom2", tmp_path)
    worker = ScriptedWorker([{"ok": True, "trials": []}], lock)
    budget = Budget(60)
    budget.alone = True
    answer = Verifier._on_gpu(judge_with(lock), worker, {"op": "run"}, budget)
    assert answer["ok"] and [m["alone"] for m in worker.sent] == [True]


def test_other_failures_are_not_retried(tmp_path):
    lock = DeviceLock("cuda-test-oom3", tmp_path)
    worker = ScriptedWorker([{"ok": False, "error": "AssertionError"}], lock)
    answer = Verifier._on_gpu(judge_with(lock), worker, {"op": "run"}, Budget(60))
    assert answer["error"] == "AssertionError" and len(worker.sent) == 1


def test_a_check_waiting_on_the_cpu_is_judged_after_the_verification_gave_its_gpu_memory_back(monkeypatch):
    # H200, 2026-12-05: a matrix-vector verdict held its 37-GiB reservation through 90 s of the CPU
    # interpreter's race analysis, while a 105-GiB task waited for the memory. That wait now comes after.
    import contextlib

    from core.task import Candidate, Task
    from core.verdict import CheckResult, Verdict
    from core.verification import pipeline
    from core.verification.pipeline import Verification

    reserved: list[bool] = []
    seen: dict[str, bool] = {}

    @contextlib.contextmanager
    def reservation(verification):
        reserved.append(True)
        try:
            yield
        finally:
            reserved.pop()

    class Check:
        where, hard, stage = "worker", True, 3

        def __init__(self, name, needs, passed=True):
            self.name, self.needs, self.passed = name, frozenset(needs), passed

        def evaluate(self, evidence):
            seen[self.name] = bool(reserved)  # whether the GPU memory was still held
            return CheckResult(self.passed, self.name)

    def run_checks(races_pass):
        checks = [Check("correctness", {"trials"}), Check("stability", {"trials", "probes"}),
                  Check("interp_races", {"trials", "interpreter"}, races_pass)]
        verifier = types.SimpleNamespace(checks=checks, compile_only=None, backend_name="triton", device="cuda",
                                         trials=5, tolerances={}, _reserved=reservation)
        verdict = Verdict()
        v = Verification(verifier, Task(source="x = 1"), Candidate(source="y = 2"), verdict, 60.0)

        def on_device():  # the trials' checks, then the extra observations' (as executed() does)
            verdict.compiled = verdict.correct = True
            v.evaluate([checks[0]])
            v.extra_observations()
            v.finish()

        monkeypatch.setattr(pipeline.ExtraObservations, "make", lambda self: None)
        v.on_device = on_device
        v.run()
        return verdict

    verdict = run_checks(races_pass=True)
    assert seen == {"correctness": True, "stability": True, "interp_races": False}
    assert verdict.accepted and set(verdict.checks) == {"correctness", "stability", "interp_races"}
    verdict = run_checks(races_pass=False)  # and its failure still decides the verdict
    assert not verdict.accepted and verdict.reason.startswith("interp_races")


def test_outputs_the_keeper_ran_out_of_memory_adopting_are_the_devices_fault_not_the_candidates():
    # H100, 2026-12-05: "correctness: 4/5 trials match; trial 4 raised its outputs could not be read:
    # OutOfMemoryError" rejected five honest level-1 kernels: the keeper had no room for their outputs
    import contextlib
    from types import SimpleNamespace

    from core.verdict import Verdict
    from core.verification.gpumemory import GpuOutOfMemory
    from core.verification.keeper import Keeper

    class KeeperWorker:
        def __init__(self, error, forged=False):
            self.error, self.forged = error, forged

        def request(self, message, timeout_s):
            return {"ok": True, "runs": [{"outputs": [{"held": "c0.0", "shape": [4], "dtype": "float32", "finite": True}]},
                                         {"error": self.error, "forged": self.forged}]}

    class CandidateWorker:
        scratch, dropped = "/tmp", 0

        def request(self, message, timeout_s):
            CandidateWorker.dropped += message["op"] == "drop_exports"
            return {"ok": True}

    budget = SimpleNamespace(verdict=Verdict(), left=lambda: 60.0)
    verifier = SimpleNamespace(_gpu=lambda budget, label="": contextlib.nullcontext())
    oom = "OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB"
    observations = [{"output": [{"path": "a"}]}, {"output": [{"path": "b"}]}]
    with pytest.raises(GpuOutOfMemory, match="adopt"):  # judged again alone, never a rejection
        Keeper(verifier, KeeperWorker(oom), budget, evidence=None).adopt(CandidateWorker(), observations, [0, 1])
    assert CandidateWorker.dropped == 1  # its exports are given back first
    # any other failure to read them is the candidate's (a forged hand-over is flagged besides)
    observations = [{"output": [{"path": "a"}]}, {"output": [{"path": "b"}]}]
    Keeper(verifier, KeeperWorker("ValueError: no such export"), budget, evidence=None).adopt(
        CandidateWorker(), observations, [0, 1])
    assert observations[1]["output"] is None and "could not be read" in observations[1]["error"]
    observations = [{"output": [{"path": "a"}]}, {"output": [{"path": "b"}]}]
    Keeper(verifier, KeeperWorker(oom, forged=True), budget, evidence=None).adopt(
        CandidateWorker(), observations, [0, 1])
    assert observations[1]["sandbox"]

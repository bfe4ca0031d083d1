"""Races by construction for GPU Triton candidates (issue 18, item 3, the GPU half; issue 39, item 2:
at the task's own shapes, on a sample of each launch's programs): the check a GPU verifier runs,
exercised here through its evaluate on evidence as a GPU verification would hand it over. The CPU
worker inside is real (a sandboxed interpreter worker)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
    assert result.data["calls"] == len(kernels) == 2  # one call per config: no call comes back to the first


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


def test_a_task_that_moves_its_inputs_to_cuda_is_judged_by_the_pool_open_started():
    # KernelBench's example (.cuda() in get_inputs) was not measurable on the meta device, so its memory class was
    # the largest this host holds: a pool spawned on its first use, 8.5 s of the first served call on the H100
    check = InterpreterRaceCheck(workers=1)
    try:
        check.open({"tolerances": {}})
        started = dict(check._pools)
        task = Task(source=CUDA_ONLY_TASK, name="vector_add_cuda_only")
        plan = check._plan(task)
        assert plan["mib"] is not None and plan["memory_mb"] == check.memory_mb, plan
        assert check.evaluate(gpu_evidence(task, CUDA_ONLY_CANDIDATE)).passed
        assert check._pools == started
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


# --------------------------------------------------------------------------- issue 39, item 2: the task's own shapes

# KernelBench level 2's conv + bias (1_Conv2D_ReLU_BiasAdd) at a modest real size: its size constants
# feed each other (bias_shape is built from out_channels), which the old reduced shape broke ("the
# expanded size of the tensor (128) must match the existing size (16)").
CONV_BIAS_TASK = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
        super(Model, self).__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        x = self.conv(x)
        x = torch.relu(x)
        x = x + self.bias
        return x


batch_size = 8
in_channels = 8
out_channels = 32
height = width = 64
kernel_size = 3
bias_shape = (out_channels, 1, 1)


def get_inputs():
    return [torch.rand(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, bias_shape]
'''


def test_the_expert_teachers_conv_bias_kernel_is_analysed_at_the_tasks_own_shape_and_passes(check):
    """Before: the expert's kernels failed in the interpreter ('NoneType' object is not subscriptable:
    its autotuned GPU path is built only where torch.cuda.is_available()), and the task's sizes were
    scaled. Now: its own shape, its GPU path, a sample of each launch's programs, named in the detail."""
    from core.plugins import registry

    task = Task(source=CONV_BIAS_TASK, name="conv_bias")
    candidate = registry("coder").create("expert").generate([task], "triton")[0][0]
    assert not candidate.declined, candidate.declined
    result = check.evaluate(gpu_evidence(task, candidate.source))
    assert result.passed, result.detail
    assert "at the task's own shape" in result.detail and "no address shared between programs" in result.detail
    assert result.data["inputs"] == [[8, 8, 64, 64]]
    launches = result.data["launches"]
    sampled = [launch for launch in launches if launch["programs"] > check.sample]
    assert sampled, launches
    for launch in sampled:  # the data name what ran of every launch: grid, count, how chosen
        assert launch["sampled"] == check.sample and {"first", "last", "neighbour"} <= set(launch["how"])
    from plugins.verifiers.interp_races import describe_samples

    described = describe_samples(launches)  # the detail's words, before its 700-character cut
    for launch in launches[:6]:  # the first six named (the autotuner's configs and the channels-last copies)
        assert f"{launch['sampled']} of {launch['programs']} programs" in described
    assert len(launches) <= 6 or f"; {len(launches) - 6} more launch(es)" in described
    assert described[:300] in result.detail


# Program p reads the first output of block p + 1 (times zero: every value is right, so no GPU trial
# can see it), which program p + 1 writes: a race between neighbours only.
NEIGHBOUR_RACE = HONEST_ADD.split("@triton.jit")[0] + '''@triton.jit
def add_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    s = tl.load(a_ptr + offs, mask=m) + tl.load(b_ptr + offs, mask=m)
    tl.store(out_ptr + offs, s, mask=m)
    nxt = (pid + 1) * BLOCK
    extra = tl.load(out_ptr + nxt, mask=nxt < n, other=0.0)
    tl.store(out_ptr + offs, s + extra * 0.0, mask=m)


class ModelNew(nn.Module):
    def forward(self, a, b):
        out = torch.empty_like(a)
        n = a.numel()
        add_kernel[(triton.cdiv(n, 1024),)](a, b, out, n, BLOCK=1024)
        return out
'''


def test_a_race_between_neighbours_in_a_grid_far_larger_than_the_sample_is_found(check):
    task = Task(source=LARGE_ADD_TASK, name="large_add")
    result = check.evaluate(gpu_evidence(task, NEIGHBOUR_RACE))
    assert not result.passed and not result.unchecked, result.detail
    assert "race: add_kernel" in result.detail and "at the task's own shape" in result.detail
    (launch,) = result.data["launches"]
    assert launch["programs"] == 16384 and launch["sampled"] == check.sample  # 0.1% of the programs ran


def test_random_inputs_above_the_threshold_are_tiled_blocks_not_constants():
    import torch

    from plugins.verifiers.interp_races import TILE, fast_random

    torch.manual_seed(0)
    with fast_random(above=1000):
        big = torch.rand(3, TILE)  # tiled
        ints = torch.randint(0, 7, (2, TILE), dtype=torch.int32)
        like = torch.randn_like(big)
        small = torch.rand(10)
        filled = torch.empty(2 * TILE + 5).uniform_(-2.0, -1.0)
    assert big.shape == (3, TILE) and torch.equal(big[0], big[1]) and big[0].unique().numel() > TILE // 2
    assert 0.0 <= float(big.min()) and float(big.max()) < 1.0
    assert ints.dtype == torch.int32 and int(ints.min()) >= 0 and int(ints.max()) < 7 and ints.unique().numel() == 7
    assert like.shape == big.shape and abs(float(like.mean())) < 0.01 and not torch.equal(like, big)
    assert small.unique().numel() == 10
    assert -2.0 <= float(filled.min()) and float(filled.max()) < -1.0 and filled[:TILE].unique().numel() > TILE // 2
    assert "uniform_" not in vars(torch.Tensor) and torch.rand.__module__ != __name__  # put back as it was


def test_a_task_the_host_cannot_hold_could_not_run_and_says_why(check):
    huge = LARGE_ADD_TASK.replace("N = 4096 * 4096", "N = 4096 * 4096 * 1024")  # 2 x 64 GiB on the meta device
    result = check.evaluate(gpu_evidence(Task(source=huge, name="huge_add"), HONEST_ADD))
    from plugins.verifiers.interp_races import host_memory_mb

    if host_memory_mb() > 400_000:
        pytest.skip("this host holds it")
    assert not result.passed and result.unchecked
    assert "MiB of CPU memory at the task's own shape" in result.detail and "this host has" in result.detail


def test_a_worker_out_of_its_address_space_is_retried_in_a_class_twice_as_large(monkeypatch):
    # the plan is an estimate: on an H100 host a 2.5 GiB conv3d output did not fit its class, and the honest
    # kernel was rejected (could not run). Here the plan is made too small for 768 MiB of tensors.
    task = Task(source=LARGE_ADD_TASK.replace("N = 4096 * 4096", "N = 4096 * 4096 * 4"), name="add_768m")
    check = InterpreterRaceCheck(workers=1)
    planned = check._plan

    def too_small(t):
        plan = planned(t)
        plan["memory_mb"] = 1536  # called once: the retry's class is set on this same plan
        return plan

    monkeypatch.setattr(check, "_plan", too_small)
    try:
        result = check.evaluate(gpu_evidence(task, HONEST_ADD))
    finally:
        check.close()
    assert result.passed and not result.unchecked, result.detail
    assert "alloc" in result.data["retried_after"] and result.data["memory_mb"] == 3072


def test_a_candidate_that_fails_for_its_own_reasons_is_not_retried(check, monkeypatch):
    calls = []
    analyse = check._analyse
    monkeypatch.setattr(check, "_analyse", lambda *a: calls.append(a) or analyse(*a))
    broken = HONEST_ADD.replace("tl.load(", "tl.lode(", 1)
    result = check.evaluate(gpu_evidence(Task(source=LARGE_ADD_TASK, name="add"), broken))
    assert not result.passed and len(calls) == 1


# --------------------------------------------------------------------------- the sample itself


def _linear(c, grid):
    return (c[0] * grid[1] + c[1]) * grid[2] + c[2]


@settings(max_examples=300, deadline=None)
@given(grid=st.tuples(st.integers(1, 40), st.integers(1, 40), st.integers(1, 12)), budget=st.integers(1, 40),
       seed=st.integers(0, 2**62))
def test_the_sample_is_deterministic_and_holds_the_corners_and_their_neighbours(grid, budget, seed):
    import random

    from plugins.backends.triton_interp_checks import choose_programs

    programs, how = choose_programs(grid, budget, random.Random(seed))
    assert (programs, how) == choose_programs(grid, budget, random.Random(seed))
    total = grid[0] * grid[1] * grid[2]
    assert len(programs) == len(set(programs)) and all(0 <= p < total for p in programs)
    assert programs[0] == 0
    assert sum(how.values()) == len(programs)
    if total <= budget:
        assert sorted(programs) == list(range(total)) and how == {"all": total}
        return
    last = [d - 1 for d in grid]
    corners = {0, total - 1}
    for axis in range(3):
        if grid[axis] > 1:
            up = [0, 0, 0]
            up[axis] = 1
            down = list(last)
            down[axis] -= 1
            corners |= {_linear(up, grid), _linear(down, grid)}
    assert corners <= set(programs)
    ups = [_linear([int(a == axis) for a in range(3)], grid) for axis in range(3) if grid[axis] > 1]
    assert programs[1:1 + len(ups)] == ups  # the first pairs run first (a launch's time budget may end it)
    assert len(programs) <= max(budget, len(corners))
    assert how["first"] == 1 and how.get("last", 0) <= 1  # the last may be the first's neighbour already
    if budget >= len(corners) + 2 and total >= 4 * budget:  # room for random anchors and their neighbours
        assert how.get("random", 0) >= 1


@pytest.mark.parametrize(("cores", "verifier_workers", "expected"), [(16, 1, 1), (16, 4, 4), (16, 64, 8), (2, 0, 2)])
def test_the_cpu_pool_is_sized_to_the_verifications_in_flight(monkeypatch, cores, verifier_workers, expected):
    # a one-shot `core.verify` (one worker) started eight interpreter workers on the H200's 16 cores,
    # each importing torch and Triton beside the GPU workers it waited for
    import os

    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    sized = []
    check = InterpreterRaceCheck()
    monkeypatch.setattr(check, "_pool", lambda memory_mb: sized.append(check.default_workers()))
    check.open({"tolerances": {}, "workers": verifier_workers})
    assert sized == [expected]


class GrowingPool:
    """A memory class's pool as WorkerPool sizes itself (``grow``), recording each growth."""

    def __init__(self, size):
        self.size, self.grown = size, []

    def grow(self, size):
        self.grown.append(size)
        self.size = max(self.size, size)
        return self.size


@pytest.mark.parametrize(("cores", "verifier_workers", "most"), [(16, 1, 3), (16, 3, 7), (16, 6, 8), (16, 64, 8),
                                                                (2, 0, 2), (64, 6, 13)])
def test_the_cpu_pool_grows_while_analyses_wait_up_to_the_verifications_in_flight(monkeypatch, cores,
                                                                                  verifier_workers, most):
    # a GPU shard keeps up to 2 * workers + 1 verifications in flight (scheduling.py); each begins its analysis at
    # once, and on an H100 three interpreter workers for seven of them left the matmuls' verdicts waiting 10-33 s
    import os

    from core.verdict import CheckResult

    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    check = InterpreterRaceCheck()
    check._verifier_workers = verifier_workers
    assert check.max_workers() == most

    pool = GrowingPool(check.default_workers())
    check._pools[check.memory_mb] = pool
    monkeypatch.setattr(check, "_analyse", lambda *a: CheckResult(True, "analysed"))
    plan = {"memory_mb": check.memory_mb}
    for waiting in range(1, 2 * most + 2):
        check._active_in = {check.memory_mb: waiting - 1}  # the call counts itself
        assert check._analyse_in_pool(None, plan, 1 << 20, "here").passed
        assert pool.size == max(check.default_workers(), min(most, waiting))
    assert pool.grown == sorted(set(pool.grown))  # one step at a time, never back
    larger = GrowingPool(1)  # a larger memory class keeps its one worker
    check._pools[2 * check.memory_mb] = larger
    check._active_in = {check.memory_mb: 2 * most}
    check._analyse_in_pool(None, {"memory_mb": 2 * check.memory_mb}, 1 << 20, "here")
    assert larger.size == 1 and larger.grown == []
    fixed = InterpreterRaceCheck(workers=2)
    assert fixed.max_workers() == 2  # a configured size stays fixed


def test_a_larger_memory_class_grows_while_its_analyses_wait_within_half_the_hosts_memory(monkeypatch):
    # H200, 2026-12-07 (128 GiB host): level 1's elementwise problems, each in the 32 GiB class, were analysed one at
    # a time by that class's single worker; their verdicts waited 10-36 s on it, one after another
    import os

    from core.verdict import CheckResult
    from plugins.verifiers.interp_races import LARGER_CLASSES_HOST_SHARE

    monkeypatch.setattr(os, "cpu_count", lambda: 16)  # the H200 host's cores
    check = InterpreterRaceCheck()
    check._verifier_workers = 6
    monkeypatch.setattr(check, "_analyse", lambda *a: CheckResult(True, "analysed"))
    host_mb, big, mid = 131072, 4 * check.memory_mb, 2 * check.memory_mb  # 128 GiB; the 32 and 16 GiB classes
    check._pools[big] = GrowingPool(1)
    for waiting in range(1, 6):  # analyses of the 32 GiB class at once (the call adds itself)
        check._active_in[big] = waiting - 1
        assert check._analyse_in_pool(None, {"memory_mb": big}, host_mb, "here").passed
    assert check._pools[big].size == int(LARGER_CLASSES_HOST_SHARE * host_mb // big) == 2
    check._pools[mid] = GrowingPool(1)  # beside the 32 GiB class's two workers, the 16 GiB class keeps its first one
    check._active_in[mid] = 7
    check._analyse_in_pool(None, {"memory_mb": mid}, host_mb, "here")
    assert check._pools[mid].size == 1 and check._pools[mid].grown == []
    roomy = 4 * host_mb  # a host four times as large: the 16 GiB class grows to one per waiting analysis
    check._analyse_in_pool(None, {"memory_mb": mid}, roomy, "here")
    assert check._pools[mid].size == min(8, check.max_workers())
    assert check._active_in == {big: 4, mid: 7}  # each call counted itself out again


def test_the_analysis_workers_run_at_a_lower_cpu_priority_and_a_pool_grows():
    # the analysis takes the cores the GPU's workers leave idle, never the host thread that launches a timed run
    import os

    from core.api.workers import Limits, WorkerPool

    check = InterpreterRaceCheck()
    pool = WorkerPool("candidate", "triton", "cpu", size=1, limits=Limits(memory_mb=4096, nice=check.nice),
                      extra_env={"TRITON_INTERPRET": "1"})
    try:
        assert pool.grow(2) == 2 and pool.grow(1) == 2
        workers = [pool.acquire(), pool.acquire()]
        for worker in workers:
            worker.wait_ready()
            assert os.getpriority(os.PRIO_PROCESS, worker.proc.pid) == min(19, os.getpriority(os.PRIO_PROCESS, 0)
                                                                           + check.nice)
        for worker in workers:
            pool.release(worker)
    finally:
        pool.close()


# A full reduction as the expert writes it at KernelBench's sizes (96_HuberLoss: one program, 524288
# iterations, over the analysis' 300 s in the interpreter): here two programs, each summing its half in a
# loop of 2^14 iterations; LOST_TAIL also writes the other program's slot in its last iteration.
DEEP_SUM_TASK = '''
import torch
import torch.nn as nn

N = 2 * 16384 * 64


class Model(nn.Module):
    def forward(self, x):
        return x.view(2, -1).sum(dim=1)


def get_inputs():
    return [torch.randn(N)]


def get_init_inputs():
    return []
'''

DEEP_SUM = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def half_sum(x_ptr, out_ptr, n_half, BLOCK: tl.constexpr, LOST: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    last = tl.cdiv(n_half, BLOCK) - 1
    for k in range(0, tl.cdiv(n_half, BLOCK)):
        offs = k * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + pid * n_half + offs, mask=offs < n_half, other=0.0)
        if LOST:
            if k == last:  # the other program's slot, without atomics, in the loop's last iteration
                tl.store(out_ptr + (1 - pid), tl.sum(acc, axis=0) * 0.0 + tl.load(out_ptr + (1 - pid)))
    tl.store(out_ptr + pid, tl.sum(acc, axis=0))


class ModelNew(nn.Module):
    LOST = False

    def forward(self, x):
        out = torch.zeros(2, device=x.device, dtype=torch.float32)
        half_sum[(2,)](x, out, x.numel() // 2, BLOCK=64, LOST=self.LOST)
        return out
'''


def test_a_long_loop_runs_a_sample_of_its_iterations_at_the_tasks_own_shape(check):
    from plugins.backends.triton_interp_checks import LOOP_SAMPLE_ABOVE

    task = Task(source=DEEP_SUM_TASK, name="deep_sum")
    result = check.evaluate(gpu_evidence(task, DEEP_SUM))
    assert result.passed, result.detail
    (launch,) = result.data["launches"]
    assert launch["loop_iterations"] == 16384 and launch["loop_ran"] == LOOP_SAMPLE_ABOVE
    assert f"a loop of 16384 iterations ran {LOOP_SAMPLE_ABOVE} of them" in result.detail


def test_a_race_in_a_long_loops_last_iteration_is_still_found(check):
    task = Task(source=DEEP_SUM_TASK, name="deep_sum")
    result = check.evaluate(gpu_evidence(task, DEEP_SUM.replace("    LOST = False", "    LOST = True")))
    assert not result.passed and not result.unchecked, result.detail
    assert "race" in result.detail and "half_sum" in result.detail


def test_loops_run_whole_outside_a_sampled_launch():
    # the CPU verifier's own race and bounds checks (no sample) run every iteration
    from plugins.backends import triton_interp_checks as checks

    assert checks.STATE.sample == 0
    assert checks.sampled_loop(range(100_000)) == range(100_000)
    checks.STATE.sample = 16
    try:
        chosen = checks.sampled_loop(range(0, 300_000, 3))
        assert len(chosen) == checks.LOOP_SAMPLE_ABOVE and chosen == sorted(chosen)
        assert chosen[:checks.LOOP_EDGE] == list(range(0, 3 * checks.LOOP_EDGE, 3))  # the first and last run
        assert chosen[-1] == 299_997
        assert checks.sampled_loop(range(0, 300_000, 3)) == chosen  # the same in every program of a launch
        assert checks.sampled_loop(range(4096)) == range(4096)  # short loops whole
    finally:
        checks.STATE.sample = 0

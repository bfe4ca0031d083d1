"""Races between programs found by construction in the Triton interpreter (issue 18, item 3): the
addresses each program touched, not the values, so a lost update that every sequential order hides
is still found, and honest sharing (atomics, disjoint tiles, reading one's own writes, a later
launch reading an earlier one's output, every program storing the same flag) is not."""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.verification.evidence import RACE_FINDING, RACE_SUMMARY
from plugins.backends import triton_races
from plugins.backends.triton_races import ATOMIC, EXCHANGE, LOAD, STORE, AccessLog, find_races

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs the Triton interpreter")


# --------------------------------------------------------------------------- the analysis itself


def brute_force(accesses: list[tuple[int, int, int, int]]) -> set[int]:
    """Racing addresses of (program, kind, address, bits) accesses, straight from the rule."""
    racing = set()
    for address in {a for _, _, a, _ in accesses}:
        here = [(p, k, b) for p, k, a, b in accesses if a == address]
        if len({p for p, _, _ in here}) < 2 or all(k == LOAD for _, k, _ in here):
            continue
        last = {p: b for p, k, b in here if k in (STORE, EXCHANGE)}  # each program's last overwrite
        plain = any(k in (STORE, LOAD) for _, k, _ in here)
        if len(set(last.values())) > 1 or (plain and any(k != STORE for _, k, _ in here)):
            racing.add(address)
    return racing


access = st.tuples(st.integers(0, 3), st.sampled_from([STORE, ATOMIC, LOAD, EXCHANGE]), st.integers(0, 6),
                  st.integers(0, 1))


@settings(max_examples=300, deadline=None)
@given(accesses=st.lists(access, max_size=30))
def test_the_analysis_agrees_with_the_rule_stated_plainly(accesses):
    log = AccessLog(kernel="k")
    for program, kind, address, bits in accesses:
        log.program = program
        log.add(kind, np.array([address * 4], dtype=np.uint64),
                np.array([bits], dtype=np.uint64) if kind in (STORE, EXCHANGE) else None)
    report = find_races(log)
    want = brute_force(accesses)
    assert (report.races if report else 0) == len(want)


def test_recording_stops_at_the_budget_and_says_so(monkeypatch):
    monkeypatch.setattr(triton_races, "MAX_ADDRESSES", 10)
    log = AccessLog()
    log.add(LOAD, np.arange(8, dtype=np.uint64))
    log.add(LOAD, np.arange(8, dtype=np.uint64))  # over: loads are dropped
    assert log.cut_short and log.recorded == 8
    log.add(STORE, np.arange(8, dtype=np.uint64), np.zeros(8, dtype=np.uint64))  # writes still count, up to 2x
    log.add(STORE, np.arange(8, dtype=np.uint64), np.zeros(8, dtype=np.uint64))
    assert log.recorded == 16 and log.kinds == [LOAD, STORE]


# --------------------------------------------------------------------------- kernels in the interpreter


@pytest.fixture(scope="module")
def backend():
    from plugins.backends.triton_backend import TritonBackend

    b = TritonBackend()
    b.prepare_worker("cpu")
    return b


def _run(backend, launch, shuffled: bool = True) -> list[str]:
    """Launch under the worker's instrumentation; the findings of the call."""
    from contextlib import ExitStack

    with ExitStack() as stack:
        stack.enter_context(backend.launch_tracker())
        findings = stack.enter_context(backend.bounds_checking())
        if shuffled:
            stack.enter_context(backend.program_order(7))
        launch()
    return list(findings)


def _races(findings: list[str]) -> list[str]:
    return [f for f in findings if f.startswith(RACE_FINDING)]


@pytest.fixture(scope="module")
def kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def lost_update(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        s = tl.sum(tl.load(x_ptr + offs, mask=offs < n, other=0.0), axis=0)
        tl.store(out_ptr, tl.load(out_ptr) + s)

    @triton.jit
    def atomic_sum(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.atomic_add(out_ptr, tl.sum(tl.load(x_ptr + offs, mask=offs < n, other=0.0), axis=0))

    @triton.jit
    def flag(x_ptr, out_ptr, flag_ptr, n, BLOCK: tl.constexpr, BY_PROGRAM: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) * 2, mask=m)
        tl.store(flag_ptr, tl.program_id(0) if BY_PROGRAM else 1)

    @triton.jit
    def neighbour(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m), mask=m)
        prev = offs - BLOCK
        old = tl.load(out_ptr + prev, mask=m & (prev >= 0), other=0.0)  # another program's output
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) + old * 0, mask=m)

    @triton.jit
    def own_block(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m), mask=m)
        tl.store(out_ptr + offs, tl.load(out_ptr + offs, mask=m) * 2, mask=m)

    @triton.jit
    def clamped(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        # every program's masked-off lanes point at the last element: masked lanes touch nothing
        offs = tl.minimum(tl.program_id(0) * BLOCK + tl.arange(0, BLOCK), n - 1)
        m = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK) < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m), mask=m)

    @triton.jit
    def exchange_update(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        # a lost update written with atomics: read by exchanging 0 in, write back by exchanging
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        s = tl.sum(tl.load(x_ptr + offs, mask=offs < n, other=0), axis=0)
        old = tl.atomic_xchg(out_ptr, 0)
        tl.atomic_xchg(out_ptr, old + s)

    @triton.jit
    def locked_sum(x_ptr, out_ptr, lock_ptr, n, BLOCK: tl.constexpr):
        # a spin lock taken with atomic_cas and released by exchanging 0 back: every program leaves 0
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        s = tl.sum(tl.load(x_ptr + offs, mask=offs < n, other=0.0), axis=0)
        while tl.atomic_cas(lock_ptr, 0, 1) == 1:
            pass
        tl.atomic_add(out_ptr, s)
        tl.atomic_xchg(lock_ptr, 0)

    return {"lost_update": lost_update, "atomic_sum": atomic_sum, "flag": flag, "neighbour": neighbour,
            "own_block": own_block, "clamped": clamped, "exchange_update": exchange_update,
            "locked_sum": locked_sum}


def test_a_lost_update_is_found_though_every_order_gives_the_right_sum(backend, kernels):
    import torch

    x, out = torch.randn(3000), torch.zeros(1)
    findings = _run(backend, lambda: kernels["lost_update"][(12,)](x, out, 3000, BLOCK=256))
    assert out.item() == pytest.approx(float(x.sum()), rel=1e-5, abs=1e-4)  # the values cannot show it
    races = _races(findings)
    assert len(races) == 1 and "lost_update" in races[0]
    assert "loads and stores it" in races[0]
    assert any(f.startswith(RACE_SUMMARY) for f in findings)


def test_reading_another_programs_output_is_a_race(backend, kernels):
    import torch

    x, out = torch.randn(1000), torch.empty(1000)
    assert _races(_run(backend, lambda: kernels["neighbour"][(4,)](x, out, 1000, BLOCK=256)))


@pytest.mark.parametrize("name", ["atomic_sum", "own_block", "clamped"])
def test_honest_sharing_is_not_a_race(backend, kernels, name):
    import torch

    x = torch.randn(1000)
    out = torch.zeros(1) if name == "atomic_sum" else torch.empty(1000)
    findings = _run(backend, lambda: kernels[name][(4,)](x, out, 1000, BLOCK=256))
    assert not _races(findings), findings
    assert findings[-1].startswith(f"{RACE_SUMMARY}1 launch(es)")


def test_a_lost_update_through_exchanges_is_a_race_and_a_lock_is_not(backend, kernels):
    import torch

    x, out, lock = torch.randn(1000), torch.zeros(1), torch.zeros(1, dtype=torch.int32)
    counts, total = torch.randint(0, 9, (1000,), dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    races = _races(_run(backend, lambda: kernels["exchange_update"][(4,)](counts, total, 1000, BLOCK=256)))
    assert int(total) == int(counts.sum())  # right in every sequential order
    assert races and "exchanges a value into it" in races[0]
    assert not _races(_run(backend, lambda: kernels["locked_sum"][(4,)](x, out, lock, 1000, BLOCK=256)))


def test_programs_storing_the_same_flag_do_not_race_and_different_values_do(backend, kernels):
    import torch

    x, out, flag = torch.randn(1000), torch.empty(1000), torch.zeros(1, dtype=torch.int32)
    same = _run(backend, lambda: kernels["flag"][(4,)](x, out, flag, 1000, BLOCK=256, BY_PROGRAM=False))
    assert not _races(same)
    differ = _races(_run(backend, lambda: kernels["flag"][(4,)](x, out, flag, 1000, BLOCK=256, BY_PROGRAM=True)))
    assert differ and "stores it" in differ[0]


def test_a_later_launch_reading_an_earlier_ones_output_is_not_a_race(backend, kernels):
    import torch

    x, tmp, out = torch.randn(1000), torch.empty(1000), torch.empty(1000)

    def pipeline():
        kernels["own_block"][(1,)](x, tmp, 1000, BLOCK=1024)  # one program writes it all
        kernels["own_block"][(4,)](tmp, out, 1000, BLOCK=256)  # four others read it

    findings = _run(backend, pipeline)
    assert not _races(findings)
    assert findings[-1].startswith(f"{RACE_SUMMARY}2 launch(es)")


def test_accesses_are_only_logged_while_the_order_is_shuffled(backend, kernels):
    import torch

    x, out = torch.randn(3000), torch.zeros(1)
    assert _run(backend, lambda: kernels["lost_update"][(12,)](x, out, 3000, BLOCK=256), shuffled=False) == []


def test_a_launch_over_the_budget_is_reported_as_cut_short(backend, kernels, monkeypatch):
    import torch

    monkeypatch.setattr(triton_races, "MAX_ADDRESSES", 300)
    x, out = torch.randn(1000), torch.empty(1000)
    findings = _run(backend, lambda: kernels["own_block"][(4,)](x, out, 1000, BLOCK=256))
    assert "cut short" in findings[-1]


def test_the_program_ids_are_the_shuffled_grids(backend, kernels):
    """Every program of a 2-D grid gets its own id (a row's chunks are told apart)."""
    from plugins.backends.triton_interp_checks import STATE

    seen = []
    original = AccessLog.add

    def spy(self, kind, addresses, bits=None):
        seen.append(self.program)
        return original(self, kind, addresses, bits)

    import torch

    x, out = torch.randn(1000), torch.zeros(1)
    AccessLog.add = spy
    try:
        _run(backend, lambda: kernels["atomic_sum"][(4,)](x, out, 1000, BLOCK=256))
    finally:
        AccessLog.add = original
    assert sorted(set(seen)) == [0, 1, 2, 3]
    assert STATE.log is None and not STATE.races


def test_cost_stays_linear_in_the_accesses():
    """A million accesses by a thousand programs are analysed in well under a second."""
    import time

    log = AccessLog()
    rng = np.random.default_rng(0)
    for program, chunk in itertools.product(range(1000), range(2)):
        log.program = program
        base = np.uint64(program * 4096 + chunk * 2048)
        log.add(LOAD, base + np.arange(0, 2048, 4, dtype=np.uint64) + np.uint64(1 << 30))
        log.add(STORE, base + np.arange(0, 2048, 4, dtype=np.uint64), rng.integers(0, 9, 512).astype(np.uint64))
    start = time.perf_counter()
    assert find_races(log) is None
    assert time.perf_counter() - start < 2.0


# --------------------------------------------------------------------------- sampled launches (issue 39, item 2)


def _sampled(backend, launch, sample: int, seed: int = 7, launch_s: float = 0.0) -> tuple[list[str], list[dict]]:
    from contextlib import ExitStack

    with ExitStack() as stack:
        stack.enter_context(backend.launch_tracker())
        findings = stack.enter_context(backend.bounds_checking())
        launches = stack.enter_context(backend.program_order(seed, sample=sample, launch_s=launch_s))
        launch()
    return list(findings), list(launches)


def test_a_sampled_launch_runs_only_its_sample_with_the_true_ids_and_grid(backend):
    import torch
    import triton
    import triton.language as tl

    from plugins.backends.triton_interp_checks import STATE

    @triton.jit
    def ids(out_ptr, grid_ptr):
        x, y, z = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        linear = (x * tl.num_programs(1) + y) * tl.num_programs(2) + z
        tl.store(out_ptr + linear, linear)
        tl.store(grid_ptr + linear * 3 + tl.arange(0, 4), tl.where(tl.arange(0, 4) == 0, tl.num_programs(0),
                 tl.where(tl.arange(0, 4) == 1, tl.num_programs(1), tl.num_programs(2))), mask=tl.arange(0, 4) < 3)

    grid = (20, 30, 4)
    out = torch.full((2400,), -1, dtype=torch.int32)
    dims = torch.zeros(2400 * 3 + 1, dtype=torch.int32)
    findings, launches = _sampled(backend, lambda: ids[grid](out, dims), sample=12)
    ran = (out >= 0).nonzero().flatten().tolist()
    (launch,) = launches
    assert launch["grid"] == list(grid) and launch["programs"] == 2400 and launch["sampled"] == len(ran) >= 12
    assert ran == sorted(launch["ids"]) and all(out[p] == p for p in ran)  # each program saw its true id
    assert launch["ids"][:4] == [0, 120, 4, 1]  # the first and its neighbours ran first (axis 0, 1, 2)
    assert {0, 1, 4, 120, 2399, 2398, 2395, 2279} <= set(ran)  # the corners and their neighbours on each axis
    assert all(dims[p * 3:p * 3 + 3].tolist() == list(grid) for p in ran)  # and the true grid
    assert not _races(findings)
    assert STATE.sample == 0 and STATE.sampled is None and STATE.launches is None  # off again after


def test_a_lost_update_is_found_in_a_sample_and_honest_tiles_pass(backend, kernels):
    import torch

    n = 1 << 20
    x, total, out = torch.randn(n), torch.zeros(1), torch.empty(n)
    racy, launches = _sampled(backend, lambda: kernels["lost_update"][(n // 256,)](x, total, n, BLOCK=256), sample=8)
    assert _races(racy) and launches[0]["sampled"] == 8 and launches[0]["programs"] == 4096
    honest, _ = _sampled(backend, lambda: kernels["own_block"][(n // 256,)](x, out, n, BLOCK=256), sample=8)
    assert not _races(honest), honest
    neighbour, _ = _sampled(backend, lambda: kernels["neighbour"][(n // 256,)](x, out, n, BLOCK=256), sample=8)
    assert _races(neighbour)  # program p reads block p - 1: first and its +1 neighbour are both sampled


def test_the_same_seed_samples_the_same_programs(backend, kernels):
    import torch

    n = 1 << 20
    x, out = torch.randn(n), torch.empty(n)
    runs = [_sampled(backend, lambda: kernels["own_block"][(n // 256,)](x, out, n, BLOCK=256), sample=8, seed=s)[1]
            for s in (3, 3, 4)]
    assert runs[0][0]["ids"] == runs[1][0]["ids"] != runs[2][0]["ids"]


def test_a_launch_whose_time_budget_is_spent_starts_no_more_programs_and_the_next_launch_runs(backend, kernels):
    """Programs with a deep loop (a matmul with a K of 500k): the programs that ran are analysed, in
    the order chosen (the first and its neighbour first), and forward goes on. Two programs run
    whatever the budget: with only the first, a lost update whose programs outlast the budget (a
    loop added to do so is cheap on a GPU) had no second program to race with, and passed."""
    import torch

    n = 1 << 20
    x, total, out = torch.randn(n), torch.zeros(1), torch.empty(n)

    def two_launches():
        kernels["lost_update"][(n // 256,)](x, total, n, BLOCK=256)
        kernels["own_block"][(n // 256,)](x, out, n, BLOCK=256)

    findings, launches = _sampled(backend, two_launches, sample=8, launch_s=1e-9)
    assert [launch["ran"] for launch in launches] == [2, 2]  # the first and its neighbour; no more after the budget
    assert _races(findings) and findings[-1].startswith(f"{RACE_SUMMARY}2 launch(es)")
    honest, launches = _sampled(backend, lambda: kernels["own_block"][(n // 256,)](x, out, n, BLOCK=256), sample=8,
                                launch_s=1e-9)
    assert launches[0]["ran"] == 2 and not _races(honest)


def test_integers_wrap_as_on_the_gpu_while_sampling_and_the_interpreters_option_comes_back(backend):
    # the interpreter's int32 overflow sanitizer is a debug option GPU builds leave off; while a GPU
    # candidate is sampled at its task's size it is off (40% of a matmul program's time), and after
    # the analysis the interpreter is as it was (the CPU path keeps its own setting)
    from triton.runtime.interpreter import interpreter_builder

    before = interpreter_builder.options
    with backend.program_order(3, sample=4):
        assert interpreter_builder.options.sanitize_overflow is False
    assert interpreter_builder.options is before
    with backend.program_order(3):  # not sampling: the CPU path's own setting
        assert interpreter_builder.options is before

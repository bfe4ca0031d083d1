"""CPU-testable parts of the honest GPU timer: statistics, repetition policy, fresh inputs."""

from __future__ import annotations

import math
import statistics

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from plugins.verifiers.performance.timing import (
    MiB,
    TimingPolicy,
    _Profile,
    flush_bytes,
    fresh_like,
    honest_sample,
    plan_runs,
    plan_warmup,
    quantile,
    relative_spread,
    summarize,
)

samples = st.lists(st.floats(min_value=1e-4, max_value=1e4, allow_nan=False), min_size=1, max_size=200)


@given(samples)
@settings(max_examples=200, deadline=None)
def test_summary_is_ordered_and_matches_statistics(xs):
    s = summarize(xs)
    assert s.min_ms <= s.p10_ms <= s.median_ms <= s.p90_ms <= s.max_ms
    assert s.median_ms == pytest.approx(statistics.median(xs))
    assert s.runs == len(xs)
    assert s.iqr_ms >= 0 and s.std_ms >= 0


@given(st.floats(min_value=1e-4, max_value=1e5, allow_nan=False),
       st.integers(1, 50), st.integers(0, 1000), st.floats(1.0, 1e4))
@settings(max_examples=300, deadline=None)
def test_runs_adapt_to_kernel_length_within_bounds(est, min_runs, extra, budget):
    policy = TimingPolicy(min_runs=min_runs, max_runs=min_runs + extra, budget_ms=budget)
    n = plan_runs(est, policy)
    assert policy.min_runs <= n <= policy.max_runs
    # shorter kernels never get fewer runs
    assert plan_runs(est / 2, policy) >= n
    # inside the bounds the budget is spent: n * est covers the budget without a whole extra run
    if policy.min_runs < n < policy.max_runs:
        assert n * est >= budget - 1e-6 and (n - 1) * est < budget + 1e-6


def test_run_plan_examples_and_degenerate_estimates():
    p = TimingPolicy()
    assert plan_runs(3.12, p) == 129  # a 3 ms memory-bound kernel: ~0.4 s of kernel time
    assert plan_runs(0.001, p) == p.max_runs
    assert plan_runs(0.0, p) == p.max_runs and plan_runs(float("inf"), p) == p.min_runs
    assert plan_warmup(0.01, p) == p.max_warmup and plan_warmup(100.0, p) == p.min_warmup
    with pytest.raises(ValueError):
        TimingPolicy(min_runs=5, max_runs=2)
    for bad in (-1.0, 20_000.0):  # a negative filler, or one longer than any kernel we time
        with pytest.raises(ValueError, match="hide_launch_us"):
            TimingPolicy(hide_launch_us=bad)
    with pytest.raises(ValueError, match="filler_margin"):  # a filler shorter than the launch hides nothing
        TimingPolicy(filler_margin=0.5)
    with pytest.raises(ValueError, match="settle_every"):
        TimingPolicy(settle_every=0)
    with pytest.raises(ValueError, match="l2_flush_bytes"):
        TimingPolicy(l2_flush_bytes=-1)


@given(floor=st.integers(0, 1 << 31), registered=st.integers(0, 1 << 30), driver=st.integers(0, 1 << 30))
@settings(max_examples=200, deadline=None)
def test_flush_covers_twice_the_l2_and_the_floor(floor, registered, driver):
    """The flush must evict everything a run left in L2: twice the L2 at least (the registered
    device's size wins over the driver's), never less than the policy's floor, never nothing."""
    policy = TimingPolicy(l2_flush_bytes=floor)
    l2 = registered or driver
    if floor == 0 and l2 == 0:
        with pytest.raises(ValueError, match="flush"):
            flush_bytes(policy, registered, driver)
        return
    n = flush_bytes(policy, registered, driver)
    assert n >= floor and n >= 2 * l2
    assert n in (floor, 2 * l2)
    assert flush_bytes(TimingPolicy(flush_l2=False, l2_flush_bytes=floor), registered, driver) == 0


def test_default_flush_is_twice_the_l2():
    """The default policy flushes twice the device's L2 (100 MiB on an H200's 50 MiB), not a fixed size."""
    assert flush_bytes(TimingPolicy(), l2_bytes=50 * MiB) == 100 * MiB
    assert flush_bytes(TimingPolicy(), device_l2_bytes=40 * MiB) == 80 * MiB


def test_quantile_and_spread():
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == pytest.approx(2.5)
    assert relative_spread([1.0, 1.01, 0.995]) == pytest.approx(0.015 / 1.0)
    with pytest.raises(ValueError):
        summarize([])


@given(st.floats(0, 10), st.floats(0, 10), st.floats(0, 1))
def test_honest_sample_never_under_the_stream_time(stream, device, overhead):
    t = honest_sample(stream, device, overhead)
    assert t >= stream
    # Hidden work beyond the host's jitter is always charged in full.
    assert t >= device - overhead or device - overhead - stream <= max(0.02, 0.05 * stream)


def test_host_jitter_does_not_replace_the_stream_time():
    assert honest_sample(0.27, 0.30, 0.02) == 0.27


def test_side_stream_work_is_charged():
    # events on the current stream saw 0.01 ms; the device-wide sync took 2 ms more than usual
    assert honest_sample(0.01, 2.03, 0.02) == pytest.approx(2.01)


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "offset", "expanded"])
def test_fresh_inputs_keep_layout_and_distribution_but_not_values(layout):
    base = torch.rand(64, 48) * 3.0  # non-negative: drawn uniformly again
    if layout == "transposed":
        base = base.t()
    elif layout == "offset":
        base = torch.rand(64 * 48 + 1)[1:].view(64, 48)
    elif layout == "expanded":
        base = torch.randn(1, 48).expand(64, 48)
    gen = torch.Generator().manual_seed(0)
    new = fresh_like([base, 7, "x"], gen)[0]
    assert new.shape == base.shape and new.stride() == base.stride()
    assert new.storage_offset() == base.storage_offset() and new.dtype == base.dtype
    assert new.data_ptr() != base.data_ptr()
    assert not torch.equal(new, base)
    if layout != "expanded":
        assert float(new.min()) >= 0.0


def test_fresh_inputs_for_ints_bools_and_empty():
    gen = torch.Generator().manual_seed(1)
    ints = torch.randint(3, 9, (100,))
    flags = torch.rand(100) > 0.5
    empty = torch.empty(0, 3)
    a, b, c = fresh_like([ints, flags, empty], gen)
    assert a.dtype == ints.dtype and int(a.min()) >= 3 and int(a.max()) <= 8
    assert b.dtype == torch.bool and 0 < int(b.sum()) < 100
    assert c.shape == (0, 3)
    assert _Profile(torch.tensor([float("nan")])).kind == "copy"


class _Clock:
    """A deterministic host clock for GpuTimer's loop on CPU: only the fake launches advance it."""

    now = 0.0

    @classmethod
    def perf_counter(cls) -> float:
        return cls.now

    @classmethod
    def spend(cls, seconds: float) -> None:
        cls.now += seconds


class _ClockEvent:
    """A stand-in for torch.cuda.Event: the fake clock at record()."""

    def __init__(self, enable_timing: bool = True):
        self.t = 0.0

    def record(self) -> None:
        self.t = _Clock.now

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, other: "_ClockEvent") -> float:
        return (other.t - self.t) * 1e3


class _Filler:
    fills_gpu = True

    def __init__(self) -> None:
        self.micros = 100.0

    def __call__(self) -> None:
        pass

    def resize(self, micros: float) -> None:
        self.micros = micros


def _cpu_timer(policy, monkeypatch):
    import types

    import plugins.verifiers.performance.timing
    from plugins.verifiers.performance.timing import GpuTimer

    monkeypatch.setattr(plugins.verifiers.performance.timing, "time", types.SimpleNamespace(perf_counter=_Clock.perf_counter))
    timer = GpuTimer.__new__(GpuTimer)  # GpuTimer's loop on CPU: fake-clock events, a no-op filler
    timer.torch = types.SimpleNamespace(cuda=types.SimpleNamespace(Event=_ClockEvent, synchronize=lambda: None))
    timer.policy, timer._flush, timer.flush_bytes, timer._overhead_ms = policy, None, 0, None
    timer._filler = _Filler()
    return timer


def test_the_filler_grows_to_the_hosts_launch_time_and_descheduled_runs_are_run_again(monkeypatch):
    from plugins.verifiers.performance.timing import MAX_FILLER_US

    calls = []

    def launch():  # 0.3 ms to launch; every 7th call the host is descheduled for 3 ms
        calls.append(1)
        _Clock.spend(0.003 if len(calls) % 7 == 0 else 0.0003)

    # every planned run (no settle test: identical samples would settle at settle_every)
    policy = TimingPolicy(budget_ms=5.0, min_runs=12, max_runs=12, warmup_ms=1.0, min_warmup=4, settle_rel=0.0)
    result = _cpu_timer(policy, monkeypatch).time(launch, lambda i: ())
    # filler_margin (1.3) times the warm-up launch time: still long enough that no kept run is exposed
    assert result.launch_hidden_us == pytest.approx(policy.filler_margin * 300.0)
    assert MAX_FILLER_US > 600.0
    assert result.stats.runs == 12 and len(calls) == 4 + 12 + 2  # two descheduled runs were run again
    assert result.launch_exposed_runs == 0  # no kept run had its launch in the window
    assert result.stats.max_ms == pytest.approx(0.3)  # and no 3 ms sample was kept


def test_a_launch_always_slower_than_the_longest_filler_is_kept_and_counted(monkeypatch):
    from plugins.verifiers.performance.timing import MAX_FILLER_US

    calls = []

    def chatty_forward():  # 6 ms of host work per call: more than the filler may ever hold the GPU
        calls.append(1)
        _Clock.spend(0.006)

    policy = TimingPolicy(budget_ms=5.0, min_runs=3, max_runs=3, warmup_ms=1.0, min_warmup=3, max_warmup=3)
    result = _cpu_timer(policy, monkeypatch).time(chatty_forward, lambda i: ())
    assert result.launch_hidden_us == MAX_FILLER_US
    assert result.stats.runs == 3 and result.launch_exposed_runs == 3  # kept, and reported as exposed
    assert len(calls) == 3 + 3 * (1 + policy.launch_retries)  # each timed run tried 1 + retries times


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.01, 100.0, allow_nan=False), min_size=1, max_size=300))
def test_the_median_interval_holds_the_median_and_shrinks_to_it(xs):
    from plugins.verifiers.performance.timing import median_interval, median_settled

    lo, hi = median_interval(xs)
    med = statistics.median(xs)
    assert min(xs) <= lo <= med <= hi <= max(xs)
    assert median_settled([med] * max(10, len(xs)), 1e-9)  # identical samples: settled at once
    assert not median_settled(xs, 0.0)  # 0 = never stop early


def test_the_interval_covers_the_true_median_about_95_percent_of_the_time():
    import random

    from plugins.verifiers.performance.timing import median_interval

    rng = random.Random(0)
    covered = sum(lo <= 0.0 <= hi for lo, hi in (median_interval([rng.gauss(0, 1) for _ in range(60)])
                                                 for _ in range(2000)))
    assert 0.93 <= covered / 2000 <= 0.985


def _steady_then(monkeypatch, policy, noise):
    import random

    rng = random.Random(1)
    calls = []

    def launch():
        calls.append(1)
        _Clock.spend(0.0001 * (1 + noise * rng.random()))

    checked = []
    result = _cpu_timer(policy, monkeypatch).time(launch, lambda i: (), check=lambda r, a, o: checked.append(r),
                                                  check_runs=(0, -1))
    return result, checked


def test_a_steady_kernel_stops_once_its_median_settles_and_its_last_run_is_still_checked(monkeypatch):
    policy = TimingPolicy(budget_ms=100.0, min_runs=20, max_runs=500, warmup_ms=0.5, settle_rel=0.005,
                          settle_every=20)
    steady, checked = _steady_then(monkeypatch, policy, noise=0.001)
    assert steady.stats.runs == 20  # settled at the first look
    assert checked == [0, 19]
    planned = TimingPolicy(budget_ms=100.0, min_runs=20, max_runs=500, warmup_ms=0.5, settle_rel=0.0)
    assert _steady_then(monkeypatch, planned, noise=0.001)[0].stats.runs == 500  # off: the planned runs


def test_a_noisy_kernel_is_timed_for_all_its_planned_runs(monkeypatch):
    policy = TimingPolicy(budget_ms=100.0, min_runs=20, max_runs=500, warmup_ms=0.5, settle_rel=0.005,
                          settle_every=20)
    noisy, checked = _steady_then(monkeypatch, policy, noise=1.0)  # up to 2x from run to run
    assert noisy.stats.runs == 500 and checked == [0, 499]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.0, 0.5, allow_nan=False), min_size=50, max_size=50), st.floats(0.005, 0.05))
def test_neighbours_on_the_gpu_do_not_inflate_the_sync_cost_that_is_subtracted(extra_ms, cost_ms):
    """A shared GPU: other processes' kernels lengthen some no-op gaps (``extra_ms``, up to 0.5 ms each,
    in up to 90% of the samples). The subtracted sync cost stays the step's own (``cost_ms``), so side-
    stream work is never hidden behind the neighbours' work."""
    from plugins.verifiers.performance.timing import GpuTimer

    extra = [e if i % 10 else 0.0 for i, e in enumerate(extra_ms)]  # at least every 10th gap is quiet
    gaps = iter([cost_ms + e for e in extra])
    timer = GpuTimer.__new__(GpuTimer)
    timer._overhead_ms = None
    timer._one = lambda fn, args: (0.0, next(gaps), None, 0.0)  # (stream ms, device ms, out, host us)
    overhead = timer.overhead_ms()
    assert cost_ms <= overhead <= cost_ms + max(sorted(extra)[:6])
    side_work = 0.25  # ms of work on another stream: charged in full, whatever the neighbours did
    assert honest_sample(0.1, 0.1 + side_work + cost_ms, overhead) >= 0.1 + side_work - max(sorted(extra)[:6])


def _naive_profile(x):
    f = x.detach().double().reshape(-1)
    f = f[torch.isfinite(f)]
    return int(f.numel()), float(f.min()), float(f.max()), float(f.mean()), float(f.std()) if f.numel() > 1 else 1.0


@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(1, 9), min_size=1, max_size=3), chunk=st.integers(1, 40),
       transposed=st.booleans(), specials=st.integers(0, 5), seed=st.integers(0, 2**16), shift=st.floats(-1e3, 1e3))
def test_the_input_profile_reads_a_tensor_in_bounded_chunks_and_gets_the_whole_tensors_statistics(
        shape, chunk, transposed, specials, seed, shift):
    # At KernelBench's sizes the profile's boolean-mask indexing took 24 GiB of indices at once (H200,
    # 2026-12-05: the performance stage of 19_ReLU..24_LogSoftmax ran out of memory alone). It reads chunks now.
    from plugins.verifiers.performance.timing import finite_stats

    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=gen) * 3 + shift
    k = min(specials, x.numel() - 1)
    x.view(-1)[:k] = torch.tensor([math.nan, math.inf, -math.inf] * 2)[:k]
    if transposed and x.dim() > 1:
        x = x.transpose(0, -1)  # a strided view: chunks must not copy the whole tensor either
    n, lo, hi, mean, std = finite_stats(x, chunk)
    want = _naive_profile(x)
    assert n == want[0] and lo == want[1] and hi == want[2]
    assert mean == pytest.approx(want[3], rel=1e-9, abs=1e-9)
    assert std == pytest.approx(want[4], rel=1e-7, abs=1e-9)


def test_the_profile_of_a_large_tensor_allocates_a_chunk_not_the_tensor():
    from torch.profiler import ProfilerActivity, profile

    from plugins.verifiers.performance.timing import PROFILE_CHUNK, _Profile

    x = torch.randn(4 * PROFILE_CHUNK // 1024, 1024)  # 4 chunks, 256 MiB of float32
    x[0, 0] = math.nan
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        made = _Profile(x)
    assert made.kind == "normal" and abs(made.a) < 1e-3 and abs(made.b - 1.0) < 1e-3
    largest = max(e.cpu_memory_usage for e in prof.events())
    assert 0 < largest <= 2 * 8 * PROFILE_CHUNK  # one chunk in float64, and its indices; never x's size again

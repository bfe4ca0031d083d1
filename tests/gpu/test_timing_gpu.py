"""The honest GPU timer on a real GPU: bandwidth sanity, side streams charged, repeatability."""

from __future__ import annotations

import pytest
import torch

from plugins.verifiers.performance.check import PerformanceCheck
from plugins.verifiers.performance.timing import MAX_FILLER_US, GpuTimer, TimingPolicy, relative_spread, time_gpu

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; none is visible")]


@pytest.fixture(scope="module")
def big():
    return torch.randn(128 * 1024 * 1024, device="cuda")  # 512 MiB: ~0.25 ms to read + write


def test_a_copy_runs_near_the_measured_bandwidth(big):
    r = time_gpu(lambda a: a * 2.0, [big])
    bandwidth = 2 * big.numel() * 4 / (r.median_ms / 1e3)
    assert 1.0e12 < bandwidth < 5.0e12, bandwidth
    # The check's own bound on work left on other streams: an honest copy is never flagged. Beside five other test
    # processes on one H100 (2026-12-07) its gap reached 0.050 ms, over the 0.02 ms once asserted here; the
    # verifier times with the GPU to itself (the device lock's exclusive turn).
    rule = PerformanceCheck()
    assert r.side_stream_ms <= max(rule.side_stream_ms, rule.side_stream_fraction * r.median_ms)
    assert r.stats.runs >= 10 and r.fresh_inputs


def test_work_hidden_on_a_side_stream_is_charged_not_hidden(big):
    side = torch.cuda.Stream()

    def sneaky(a):
        with torch.cuda.stream(side):
            return a * 2.0

    honest = time_gpu(lambda a: a * 2.0, [big])
    hidden = time_gpu(sneaky, [big])
    # what a naive timer sees: events on the current stream around the call
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    sneaky(big)
    end.record()
    torch.cuda.synchronize()
    naive = start.elapsed_time(end)
    assert naive < 0.5 * honest.median_ms  # the trick is real ...
    assert hidden.median_ms > 0.8 * honest.median_ms  # ... and does not pay here
    assert hidden.side_stream_ms > 0.5 * honest.median_ms


def test_repeated_timings_agree_within_one_percent(big):
    x = big[: 32 * 1024 * 1024]  # 128 MiB: ~60 us
    medians = [time_gpu(lambda a: a * 2.0, [x]).median_ms for _ in range(7)]
    assert min(medians) >= 0.05, medians  # the target applies to kernels of 50 us or more
    assert relative_spread(medians) <= 0.01, medians


def test_overhead_calibration_is_small_and_stable():
    timer = GpuTimer(TimingPolicy())
    assert 0.0 <= timer.overhead_ms() < 0.2


def test_the_launch_filler_holds_the_gpu_and_hides_launch_latency(big):
    x = big[: 1024 * 1024]  # 4 MiB: a few microseconds of kernel, so launch latency dominates a naive window
    plain = time_gpu(lambda a: a * 2.0, [x], TimingPolicy(hide_launch_us=0.0))
    hidden = time_gpu(lambda a: a * 2.0, [x])  # the default policy fills the GPU for >= 100 us
    # at least the policy's 100 us; longer where the host's launches are slower (adaptive length)
    default_us = TimingPolicy().hide_launch_us
    assert hidden.filler_fills_gpu is True and default_us <= hidden.launch_hidden_us <= MAX_FILLER_US
    assert hidden.median_ms < plain.median_ms  # the host's launch no longer sits inside the window


def test_side_stream_work_is_charged_without_the_filler_too(big):
    side = torch.cuda.Stream()

    def sneaky(a):
        with torch.cuda.stream(side):
            return a * 2.0

    policy = TimingPolicy(hide_launch_us=0.0)  # the launch latency timed, no filler before the start event
    honest = time_gpu(lambda a: a * 2.0, [big], policy)
    hidden = time_gpu(sneaky, [big], policy)
    assert hidden.median_ms > 0.8 * honest.median_ms
    assert hidden.side_stream_ms > 0.5 * honest.median_ms

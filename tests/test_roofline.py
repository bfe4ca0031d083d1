"""Roofline math: utilisation, bandwidth efficiency, the speed-of-light floor and device lookup."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.contracts import DeviceSpec
from plugins.verifiers.performance.roofline import (
    UnknownDeviceError,
    find_device,
    from_counters,
    peak_flops_for,
    roofline,
    speed_of_light_s,
)

GPU = DeviceSpec("toy", peak_flops={"float32": 50e12, "bfloat16": 700e12}, peak_bandwidth=4e12)

pos = st.floats(min_value=1e3, max_value=1e15, allow_nan=False, allow_infinity=False)
times = st.floats(min_value=1e-7, max_value=10.0, allow_nan=False)


@given(flops=pos, nbytes=pos, t=times)
@settings(max_examples=200, deadline=None)
def test_terms_are_rates_over_peaks(flops, nbytes, t):
    r = roofline(t, flops=flops, min_bytes=nbytes, device=GPU)
    assert math.isclose(r.flops_utilisation, flops / t / 50e12, rel_tol=1e-9)
    assert math.isclose(r.bandwidth_efficiency, nbytes / t / 4e12, rel_tol=1e-9)
    assert math.isclose(r.floor_s, max(flops / 50e12, nbytes / 4e12), rel_tol=1e-12)
    # implausible exactly when the time beats the floor by more than the slack
    assert r.implausible == (t * r.slack < r.floor_s)
    # at or above the floor, neither term can exceed the slack (the roofs bound both)
    if not r.implausible:
        assert r.flops_utilisation <= r.slack * (1 + 1e-9)
        assert r.bandwidth_efficiency <= r.slack * (1 + 1e-9)
    assert r.bound == ("compute" if flops / 50e12 >= nbytes / 4e12 else "memory")


@given(flops=pos, nbytes=pos, t=times, k=st.floats(min_value=1.01, max_value=100))
@settings(max_examples=100, deadline=None)
def test_slower_is_never_better(flops, nbytes, t, k):
    fast = roofline(t, flops=flops, min_bytes=nbytes, device=GPU)
    slow = roofline(t * k, flops=flops, min_bytes=nbytes, device=GPU)
    assert slow.flops_utilisation < fast.flops_utilisation
    assert slow.bandwidth_efficiency < fast.bandwidth_efficiency
    assert not (slow.implausible and not fast.implausible)


def test_time_under_the_floor_is_flagged_and_explained():
    floor = speed_of_light_s(0, 4e9, 50e12, 4e12)  # 4 GB at 4 TB/s = 1 ms
    assert floor == pytest.approx(1e-3)
    ok = roofline(1.0e-3, flops=0, min_bytes=4e9, device=GPU)
    assert not ok.implausible and ok.bandwidth_efficiency == pytest.approx(1.0)
    cheat = roofline(0.5e-3, flops=0, min_bytes=4e9, device=GPU)
    assert cheat.implausible and "speed-of-light" in cheat.note
    assert roofline(0.0, flops=1, min_bytes=1, device=GPU).implausible


def test_peak_is_the_fastest_float_dtype_of_the_task():
    assert peak_flops_for(GPU, ["float32"]) == ("float32", 50e12)
    assert peak_flops_for(GPU, ["torch.bfloat16", "float32"]) == ("bfloat16", 700e12)
    assert peak_flops_for(GPU, ["int64"]) == ("float32", 50e12)  # no float dtype known
    with pytest.raises(ValueError):
        roofline(1.0, flops=1, min_bytes=1, device=GPU, slack=0.5)


def test_counters_mode_uses_dram_bytes_and_sm_throughput():
    r = from_counters(1e-3, dram_bytes=2e9, sm_throughput_pct=37.5, flops=1e9, min_bytes=1e9, device=GPU)
    assert r.source == "ncu"
    assert r.bandwidth_efficiency == pytest.approx(2e9 / 1e-3 / 4e12)
    assert r.flops_utilisation == pytest.approx(0.375)
    assert "counters" in r.note


def test_registered_devices_cover_the_h200_with_measured_figures(plugin_manager):
    dev = find_device("NVIDIA H200")
    assert dev.name == "H200"
    assert dev.peak_bandwidth == pytest.approx(4.2e12)
    assert dev.peak_flops["bfloat16"] == pytest.approx(708e12)
    assert dev.peak_flops["float32"] == pytest.approx(51e12)
    assert "measured" in dev.source and "NOTES.md" in dev.source
    # the longest matching name wins: an H100 PCIe is not an H100 SXM
    assert find_device("NVIDIA H100 PCIe").name == "H100 PCIe"
    assert find_device("NVIDIA H100 80GB HBM3").name == "H100"
    assert "datasheet" in find_device("NVIDIA A100-SXM4-80GB").source
    with pytest.raises(UnknownDeviceError, match="register_devices"):
        find_device("NVIDIA GeForce GT 710")

"""Roofline terms of a timed kernel: FLOPs utilisation, bandwidth efficiency, speed-of-light floor.

A task carries its FLOPs and its minimum bytes (each input read once, each output written once).
Against a :class:`core.contracts.DeviceSpec` (peak FLOP/s per dtype, peak bandwidth) a measured time
gives:

* ``flops_utilisation = flops / time / peak_flops[dtype]``
* ``bandwidth_efficiency = min_bytes / time / peak_bandwidth``
* the speed-of-light floor ``max(flops / peak_flops, min_bytes / peak_bandwidth)``: no kernel that
  does the task's work can take less. A time below ``floor / slack`` is **implausible** (the kernel
  skipped work, or the timer was fooled); the reward terms give it nothing.

``slack`` (default 1.15) allows for peaks measured a little below what the hardware can do: on the
H200, 4.2 TB/s x 1.15 = 4.83 TB/s, just above the datasheet's 4.8 TB/s.

The published phase-2 reward ``R_perf = 0.7 * flops_utilisation + 0.3 * bandwidth_efficiency`` is
defined on hardware counters; :func:`from_counters` builds the same record from Nsight Compute's
achieved DRAM bytes and SM throughput, with ``source`` saying which was used.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable, Mapping

from core.contracts import DeviceSpec

DEFAULT_SLACK = 1.15

# Peaks a task of these dtypes may use, most precise first. A float32 task's utilisation is against the
# float32 (CUDA-core) peak: plain TF32 loses too much precision for float32 tolerances. Its speed-of-light
# floor is against ``float32_split`` where the device has one (tf32x3/bf16x3 split products on tensor
# cores keep fp32 tolerances and run faster than CUDA-core fp32).
_DTYPE_ALIASES = {"torch.float32": "float32", "float": "float32", "fp32": "float32", "torch.float16": "float16",
                  "half": "float16", "fp16": "float16", "torch.bfloat16": "bfloat16", "bf16": "bfloat16"}


class UnknownDeviceError(LookupError):
    """No registered DeviceSpec matches the GPU's name."""


def normalise_dtype(name: str) -> str:
    return _DTYPE_ALIASES.get(str(name), str(name).replace("torch.", ""))


def peak_flops_for(device: DeviceSpec, dtypes: Iterable[str]) -> tuple[str, float]:
    """The dtype whose peak applies and that peak: the highest peak among the task's float dtypes.

    A mixed task (bf16 inputs, fp32 accumulators) may legitimately run at the faster rate, so the
    floor uses the fastest; a task with no float dtype known falls back to ``float32``.
    """
    best: tuple[str, float] | None = None
    for d in dtypes:
        name = normalise_dtype(d)
        rate = device.peak_flops.get(name)
        if rate and (best is None or rate > best[1]):
            best = (name, float(rate))
    if best is None:
        rate = device.peak_flops.get("float32")
        if not rate:
            raise UnknownDeviceError(f"device {device.name!r} has no float32 peak; registered: {sorted(device.peak_flops)}")
        best = ("float32", float(rate))
    return best


def speed_of_light_s(flops: float, min_bytes: float, peak_flops: float, peak_bandwidth: float) -> float:
    """Least possible time for the work: the slower of the compute bound and the memory bound."""
    compute = flops / peak_flops if peak_flops > 0 else 0.0
    memory = min_bytes / peak_bandwidth if peak_bandwidth > 0 else 0.0
    return max(compute, memory)


@dataclass
class Roofline:
    """One kernel's roofline record, as stored in ``Verdict.roofline`` (``to_dict``)."""

    device: str
    dtype: str
    time_s: float
    flops: float
    min_bytes: float
    peak_flops: float
    peak_bandwidth: float
    achieved_flops: float  # FLOP/s
    achieved_bandwidth: float  # bytes/s
    flops_utilisation: float
    bandwidth_efficiency: float
    floor_s: float  # speed-of-light time
    sol_fraction: float  # floor / time (1.0 = at the speed of light)
    bound: str  # "memory" or "compute": which roof sets the floor
    arithmetic_intensity: float  # flops / byte
    implausible: bool
    slack: float
    source: str  # "events" (CUDA-event timing + task FLOPs/bytes) or "ncu" (hardware counters)
    device_source: str = ""
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def roofline(
    time_s: float,
    *,
    flops: float | None,
    min_bytes: float | None,
    device: DeviceSpec,
    dtypes: Iterable[str] = ("float32",),
    slack: float = DEFAULT_SLACK,
    source: str = "events",
) -> Roofline:
    """Roofline terms for a kernel that took ``time_s`` seconds on ``device``.

    >>> from core.contracts import DeviceSpec
    >>> gpu = DeviceSpec("toy", peak_flops={"float32": 1e12}, peak_bandwidth=1e12)
    >>> r = roofline(1e-3, flops=5e8, min_bytes=2e8, device=gpu)
    >>> round(r.flops_utilisation, 3), round(r.bandwidth_efficiency, 3), r.bound, r.implausible
    (0.5, 0.2, 'compute', False)
    >>> roofline(1e-4, flops=5e8, min_bytes=2e8, device=gpu).implausible  # 5x faster than the floor
    True
    """
    if slack < 1.0:
        raise ValueError(f"slack must be >= 1 (it widens the floor for measurement error), got {slack}")
    flops = float(flops or 0.0)
    min_bytes = float(min_bytes or 0.0)
    dtype, peak_f = peak_flops_for(device, dtypes)
    peak_b = float(device.peak_bandwidth)
    # The floor uses the fastest rate at which the dtype's *accuracy* is reachable: for float32 the
    # tensor cores' split-precision products (tf32x3, bf16x3; ``<dtype>_split`` in the device's peaks)
    # beat plain fp32, so an honest fp32 GEMM may run above the float32 peak. Utilisation stays
    # against the dtype's own peak.
    floor = speed_of_light_s(flops, min_bytes, max(peak_f, float(device.peak_flops.get(f"{dtype}_split", 0.0))),
                             peak_b)
    compute_s = flops / peak_f if peak_f > 0 else 0.0
    memory_s = min_bytes / peak_b if peak_b > 0 else 0.0
    notes = []
    if time_s <= 0 or time_s != time_s:
        implausible = True
        notes.append(f"non-positive time {time_s!r}")
        achieved_f = achieved_b = util_f = util_b = sol = 0.0
    else:
        achieved_f, achieved_b = flops / time_s, min_bytes / time_s
        util_f = achieved_f / peak_f if peak_f > 0 else 0.0
        util_b = achieved_b / peak_b if peak_b > 0 else 0.0
        sol = floor / time_s
        implausible = time_s * slack < floor
        if implausible:
            notes.append(
                f"{time_s * 1e3:.4g} ms is below the speed-of-light floor {floor * 1e3:.4g} ms "
                f"(/{slack:g} slack) on {device.name}: the work cannot have been done"
            )
    if not flops and not min_bytes:
        notes.append("task has no FLOPs or byte counts; utilisation is 0")
    return Roofline(
        device=device.name,
        dtype=dtype,
        time_s=float(time_s),
        flops=flops,
        min_bytes=min_bytes,
        peak_flops=peak_f,
        peak_bandwidth=peak_b,
        achieved_flops=achieved_f,
        achieved_bandwidth=achieved_b,
        flops_utilisation=util_f,
        bandwidth_efficiency=util_b,
        floor_s=floor,
        sol_fraction=sol,
        bound="compute" if compute_s >= memory_s else "memory",
        arithmetic_intensity=flops / min_bytes if min_bytes else 0.0,
        implausible=implausible,
        slack=slack,
        source=source,
        device_source=device.source,
        note="; ".join(notes),
    )


def from_counters(
    time_s: float,
    *,
    dram_bytes: float,
    sm_throughput_pct: float,
    flops: float | None,
    min_bytes: float | None,
    device: DeviceSpec,
    dtypes: Iterable[str] = ("float32",),
    slack: float = DEFAULT_SLACK,
) -> Roofline:
    """The same record from hardware counters (Nsight Compute): ``bandwidth_efficiency`` is the
    achieved DRAM bytes per second over the peak, ``flops_utilisation`` the SM throughput (% of
    peak sustained). The speed-of-light check still uses the task's FLOPs and minimum bytes."""
    base = roofline(time_s, flops=flops, min_bytes=min_bytes, device=device, dtypes=dtypes, slack=slack,
                    source="ncu")
    if time_s > 0 and device.peak_bandwidth > 0:
        base.achieved_bandwidth = dram_bytes / time_s
        base.bandwidth_efficiency = base.achieved_bandwidth / device.peak_bandwidth
    base.flops_utilisation = max(0.0, float(sm_throughput_pct)) / 100.0
    extra = f"counters: {dram_bytes:.4g} DRAM bytes, SM throughput {sm_throughput_pct:.3g}%"
    base.note = f"{base.note}; {extra}" if base.note else extra
    return base


def find_device(gpu_name: str, devices: Mapping[str, DeviceSpec] | None = None) -> DeviceSpec:
    """The registered DeviceSpec whose name is the longest case-insensitive substring of ``gpu_name``.

    ``devices`` defaults to the ``device`` registry (``register_devices``).
    """
    if devices is None:
        from core.plugins import registry

        reg = registry("device")
        devices = {name: reg.get(name) for name in reg.names()}
    matches = [n for n in devices if n.lower() in gpu_name.lower()]
    if not matches:
        raise UnknownDeviceError(
            f"no registered device matches GPU {gpu_name!r}; registered: {sorted(devices)}. Register one with a "
            "register_devices plugin (peak FLOP/s per dtype and bandwidth, see plugins/devices.py)"
        )
    return devices[max(matches, key=len)]

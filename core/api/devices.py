"""GPU facts from the device registry (``register_devices``): what a compiler, a tiler or a check reads
of a GPU (SM count, compile target, warp size) instead of keeping its own copy.

A backend that compiles without a GPU targets :func:`reference_device`; on a GPU, :func:`visible_device`
is the registered GPU whose name the driver reports (None when it is not registered).
"""

from __future__ import annotations

from core.contracts import DeviceSpec


def reference_device() -> DeviceSpec:
    """The registered GPU marked ``reference`` (the project's own: device-less compiles target it)."""
    from core.plugins import registry

    devices = registry("device")
    marked = [spec for spec in (devices.get(name) for name in devices.names()) if spec.reference]  # specs, not factories
    if len(marked) != 1:
        found = ", ".join(s.name for s in marked) or "none"
        raise LookupError(f"exactly one registered GPU must set DeviceSpec(reference=True); found {found}. "
                          "Mark the GPU device-less compiles should target in its register_devices")
    return marked[0]


def visible_device() -> DeviceSpec | None:
    """The registered GPU torch sees (by the longest registered name in the driver's, ``"NVIDIA H200"``
    -> ``H200``), or None without a GPU or when it is not registered."""
    import torch

    if not torch.cuda.is_available():
        return None
    from core.plugins import registry

    reported = torch.cuda.get_device_name().lower()
    devices = registry("device")
    names = sorted((n for n in devices.names() if n.lower() in reported), key=len, reverse=True)
    return devices.get(names[0]) if names else None


def capability(spec: DeviceSpec) -> int:
    """The compute capability as one number (``"sm_90"`` -> 90), as Triton's ``GPUTarget`` takes it."""
    digits = spec.arch.removeprefix("sm_").removeprefix("compute_")
    if not digits.isdigit():
        raise ValueError(f"GPU {spec.name!r} declares arch={spec.arch!r}; expected 'sm_XY'")
    return int(digits)

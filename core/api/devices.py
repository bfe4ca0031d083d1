"""GPU facts from the device registry (``register_devices``): what a compiler, a tiler or a check reads
of a GPU (SM count, compile target, warp size) instead of keeping its own copy.

A backend that compiles without a GPU targets :func:`reference_device`; on a GPU, :func:`visible_device`
is the registered GPU whose name the driver reports (None when it is not registered).
:func:`cuda_visible` says whether torch here can run on a GPU without importing torch.
"""

from __future__ import annotations

import ctypes
import importlib.util
import sys
from pathlib import Path

from core.contracts import DeviceSpec


def cuda_visible() -> bool:
    """Whether torch in this process can run on a GPU: ``torch.cuda.is_available()``, answered without
    importing torch where it is not imported yet. A one-shot ``core.verify --device cuda`` asks this
    before it spawns its workers, and torch's import took 3.6 s of that on the H100 host (2026-12-07).

    Without torch imported: torch is a CUDA build (its ``libtorch_cuda`` library ships beside it) and the
    driver counts at least one device (``cuInit``, ``cuDeviceGetCount``: both honour
    ``CUDA_VISIBLE_DEVICES`` as torch does). What this cannot see, a driver too old for torch's CUDA, the
    caller learns once torch is imported (the :class:`~core.verify.Verifier` asks torch again then).
    """
    if "torch" in sys.modules:
        import torch

        return bool(torch.cuda.is_available())
    return _torch_is_cuda_build() and driver_device_count() > 0


def _torch_is_cuda_build() -> bool:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return False
    return any((Path(spec.origin).parent / "lib").glob("libtorch_cuda*"))


def driver_device_count() -> int:
    """GPUs the CUDA driver lists for this process (0 without a driver, or when it fails to start)."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    count = ctypes.c_int(0)
    try:
        if lib.cuInit(0) != 0 or lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return 0
    except AttributeError:  # not a CUDA driver
        return 0
    return count.value


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

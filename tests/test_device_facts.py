"""GPU facts (SM count, compile target, warp size) come from the device registry: the expert's tiling,
Triton's GPU-target compile and the CUDA backends' device-less target read the reference GPU, and a new
GPU is one register_devices implementation."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from core import hookimpl
from core.api.devices import capability, reference_device
from core.contracts import DeviceSpec

ROOT = Path(__file__).resolve().parent.parent


def test_every_built_in_gpu_declares_its_facts_and_the_h200_is_the_reference():
    from plugins.devices import BUILTIN_DEVICES

    for spec in BUILTIN_DEVICES:
        assert spec.sms > 0 and re.fullmatch(r"sm_\d{2,3}", spec.arch) and spec.warp_size == 32, spec.name
    assert reference_device().name == "H200" and capability(reference_device()) == 90


def test_no_plugin_keeps_its_own_copy_of_a_gpu_fact():
    copies = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in sorted((ROOT / "plugins").rglob("*.py"))
              if p.name != "devices.py"
              for n, line in enumerate(p.read_text().splitlines(), 1)
              if re.match(r"\s*(SMS|GPU_TARGET|DEFAULT_ARCH|WARP_SIZE)\s*=", line)]
    assert copies == []


class _NewGpu:
    @hookimpl
    def register_devices(self, register):
        register("KZ-Test GPU", DeviceSpec(name="KZ-Test GPU", sms=7, arch="sm_120", warp_size=64, reference=True))


@pytest.fixture
def only_the_new_gpu(plugin_manager, register_plugin):
    from core import plugins

    plugin_manager.unregister(name="plugins.devices")
    register_plugin(_NewGpu())
    plugins.set_plugin_manager(plugin_manager)


def test_a_new_gpu_is_one_register_devices_implementation(only_the_new_gpu):
    from plugins.backends import nvrtc
    from plugins.backends.triton_gpu_compile import gpu_target
    from plugins.coders.expert_lowering.tiling import sm_count, tile_score

    assert reference_device().name == "KZ-Test GPU"
    assert sm_count() == 7 and gpu_target() == ("cuda", 120, 64) and nvrtc.default_arch() == "sm_120"
    assert nvrtc.DEFAULT_ARCH == "sm_120"  # the old name, kept for one release, reads the registry too
    assert tile_score(64, 64, 64 * 7, 64)[0] == 1.0  # 7 tiles fill its 7 SMs in one wave


def test_two_reference_gpus_are_refused_with_what_to_do(register_plugin):
    register_plugin(_NewGpu())
    with pytest.raises(LookupError, match="exactly one registered GPU.*H200.*KZ-Test GPU|KZ-Test GPU.*H200"):
        reference_device()

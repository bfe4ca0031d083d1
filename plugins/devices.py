"""Built-in GPU descriptions (peak FLOP/s per dtype, memory bandwidth, L2 size) for roofline terms.

The H200 entry holds rates *measured on the project's H200* (``/work/shared/NOTES.md``, "The GPU
machine", 2026-11): a device-to-device copy moved ~4.2 TB/s (bytes read + written), a bf16 matmul
of 8192^3 ran at ~708 TFLOP/s, an fp32 matmul without TF32 at ~51 TFLOP/s. Measured ceilings are
what a kernel can actually reach, so utilisation against them is meaningful and a time far below
the floor they imply is implausible. float16 uses the bf16 figure (Hopper's tensor cores run both
at the same rate; not separately measured). ``float32_split`` is the rate of fp32-accurate products
on the tensor cores (the expert's ``tf32x3`` dots, or bf16x3: three 16/19-bit products per fp32 one),
a third of the bf16 rate: the speed-of-light floor of a float32 task uses it (roofline.py), since
an honest tf32x3 GEMM runs faster than the float32 (CUDA-core) peak.

SM counts, compile targets (``arch``) and warp sizes are NVIDIA's; the H200 is the ``reference``: what
a compile without a GPU targets. The H100 and A100 entries are NVIDIA datasheet figures (dense, no sparsity), marked as such in
``source``; replace them with measurements where you have the hardware. A new GPU is one more
``register(name, DeviceSpec(...))`` call, here or in a third-party plugin.
"""

from __future__ import annotations

from core import hookimpl
from core.contracts import DeviceSpec

TB = 1e12
MiB = 1 << 20

H200 = DeviceSpec(
    name="H200",
    peak_flops={"bfloat16": 708 * TB, "float16": 708 * TB, "float32": 51 * TB, "float32_split": 708 / 3 * TB},
    peak_bandwidth=4.2 * TB,
    l2_bytes=50 * MiB,
    sms=132,
    arch="sm_90",
    reference=True,  # device-less compiles target the project's GPU
    source="measured on the project's H200 (NOTES.md 'The GPU machine', 2026-11): copy 4.2 TB/s, "
    "bf16 matmul 8192^3 708 TFLOP/s, fp32 (no TF32) 51 TFLOP/s; float16 assumed = bf16; float32_split "
    "(the floor of fp32 tasks: three tensor-core products per fp32 one, tf32x3/bf16x3) = bf16 / 3, derived; "
    "L2 from the datasheet",
)

H100_SXM = DeviceSpec(
    name="H100",
    peak_flops={"bfloat16": 989.4 * TB, "float16": 989.4 * TB, "float32": 66.9 * TB, "tfloat32": 494.7 * TB,
                "float32_split": 989.4 / 3 * TB},
    peak_bandwidth=3.35 * TB,
    l2_bytes=50 * MiB,
    sms=132,
    arch="sm_90",
    source="datasheet: NVIDIA H100 SXM5 80GB (dense tensor-core rates, HBM3 3.35 TB/s); not measured here",
)

H100_PCIE = DeviceSpec(
    name="H100 PCIe",
    peak_flops={"bfloat16": 756.5 * TB, "float16": 756.5 * TB, "float32": 51.2 * TB, "tfloat32": 378 * TB,
                "float32_split": 756.5 / 3 * TB},
    peak_bandwidth=2.0 * TB,
    l2_bytes=50 * MiB,
    sms=114,
    arch="sm_90",
    source="datasheet: NVIDIA H100 PCIe 80GB (dense tensor-core rates, HBM2e 2.0 TB/s); not measured here",
)

A100 = DeviceSpec(
    name="A100",
    peak_flops={"bfloat16": 312 * TB, "float16": 312 * TB, "float32": 19.5 * TB, "tfloat32": 156 * TB,
                "float32_split": 312 / 3 * TB},
    peak_bandwidth=2.039 * TB,
    l2_bytes=40 * MiB,
    sms=108,
    arch="sm_80",
    source="datasheet: NVIDIA A100 SXM4 80GB (dense tensor-core rates, HBM2e 2.039 TB/s); not measured here",
)

BUILTIN_DEVICES: tuple[DeviceSpec, ...] = (H200, H100_SXM, H100_PCIE, A100)


@hookimpl
def register_devices(register):
    for spec in BUILTIN_DEVICES:
        register(spec.name, spec)

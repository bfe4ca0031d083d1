"""Tensor-core precision and tile configurations shared by the GEMM-shaped kernels (matmul, conv,
attention), for Hopper (H100/H200, sm_90) first.

**Precision rule** (what ``tl.dot`` is asked for on a GPU; the interpreter always computes exact
fp32 products of widened operands, ``input_precision="ieee"``):

* float32 tasks: ``tf32x3``. Each operand is split into a TF32 "big" part and a TF32 residual and
  three tensor-core products are summed (big*big + big*small + small*big) in fp32: the dropped terms
  are ~2**-21 relative, near fp32's own rounding and well inside the verifier's fp32 tolerance
  (atol 1e-4 x output RMS, rtol 1e-4), at up to a third of the TF32 tensor-core rate (~165 TFLOP/s
  dense on an H100/H200 by the datasheet, against ~51 TFLOP/s measured for cuBLAS SGEMM).
  Plain ``tf32`` (~5e-4 relative error) fails those tolerances and is never chosen for a float32
  task; it would be only where a task's own tolerance allows it (none does today: ``tf32_allowed``).
* float16 / bfloat16 tasks: the native tensor-core dot of the 16-bit operands, fp32 accumulate.

PyTorch's eager default, the baseline: ``torch.backends.cuda.matmul.allow_tf32`` is False (cuBLAS
SGEMM in full fp32) and ``torch.backends.cudnn.allow_tf32`` is True (cuDNN convolutions in fp32
*do* use TF32 unless told otherwise); ``benchmarks/expert_gpu.py`` sets both to False so that eager
fp32 is held to the precision the verifier asks of a candidate.
"""

from __future__ import annotations

# (BM, BN, BK, GROUP_M, num_warps, num_stages). Short lists: each config is compiled once per shape
# (~1-2 s on the H200's host), and ``pick_configs`` emits only the 3 that fit the shape best.
GEMM_CONFIGS_16 = (
    (128, 256, 64, 8, 8, 3),  # 147 KB of shared memory over 3 stages
    (256, 128, 64, 8, 8, 3),
    (128, 128, 64, 8, 8, 3),
    (128, 128, 64, 8, 4, 4),
    (128, 64, 64, 8, 4, 4),
    (64, 128, 64, 8, 4, 4),
    (64, 64, 64, 8, 4, 4),
)
GEMM_CONFIGS_32 = (  # fp32 tiles are twice the bytes and tf32x3 holds split operands in registers
    (128, 128, 32, 8, 8, 3),
    (128, 64, 32, 8, 4, 4),
    (64, 128, 32, 8, 4, 4),
    (64, 64, 32, 8, 4, 4),
)
# Tiles for a GEMM of at most NARROW_N columns (a convolution to 16 or 24 channels, KernelBench level 2's
# Conv3d tasks): every config above is 64-256 columns wide, so 3/4 or more of each tensor-core step computed padding.
NARROW_N = 32
NARROW_CONFIGS_32 = (
    (128, 16, 32, 8, 4, 4),
    (128, 32, 32, 8, 4, 4),
    (256, 32, 32, 8, 8, 3),
)
NARROW_CONFIGS_16 = (
    (128, 16, 64, 8, 4, 4),
    (128, 32, 64, 8, 4, 4),
    (256, 32, 64, 8, 8, 3),
)
KEEP_CONFIGS = 3


def sm_count() -> int:
    """Multiprocessors of the GPU the kernels are tuned for (the pruning's notion of one wave): the
    visible GPU's, else the reference GPU's, from the device registry (plugins/devices.py)."""
    from core.api.devices import reference_device, visible_device

    spec = visible_device() or reference_device()
    if spec.sms <= 0:
        raise LookupError(f"GPU {spec.name!r} declares no SM count (DeviceSpec.sms); the expert's tiling needs it")
    return spec.sms


def tf32_allowed(dtype: str) -> bool:
    """Whether a task of ``dtype`` may use plain TF32: never for the verifier's fp32 tolerance."""
    return False


def gpu_dot_precision(dtype: str) -> str | None:
    """``input_precision`` of the GPU ``tl.dot`` for a task of ``dtype`` (None: the native dot)."""
    if dtype == "float32":
        return "tf32" if tf32_allowed(dtype) else "tf32x3"
    return None


def interpreter_dot_precision(dtype: str) -> str:
    """The interpreter's dot: exact fp32 products (operands widened first)."""
    return "ieee"


def precision_kwarg(dtype: str) -> str:
    """``, input_precision="..."`` for the GPU branch of an emitted ``tl.dot`` ('' when native)."""
    p = gpu_dot_precision(dtype)
    return f', input_precision="{p}"' if p else ""


def gemm_configs(dtype: str) -> tuple[tuple[int, int, int, int, int, int], ...]:
    return GEMM_CONFIGS_32 if dtype == "float32" else GEMM_CONFIGS_16


def tile_score(bm: int, bn: int, m: int, n: int, batch: int = 1) -> tuple[float, float]:
    """How well BM x BN tiles fit an M x N (x batch) GEMM: the busy fraction of the SMs over all waves
    times the useful fraction of a tile (one larger than the matrix computes padding), rounded so
    near-ties go to the larger tile (more reuse per byte loaded)."""
    tiles = -(-m // bm) * -(-n // bn) * max(1, batch)
    sms = sm_count()
    waves = -(-tiles // sms)
    fill = tiles / (waves * sms)
    useful = (min(m, bm) * min(n, bn)) / (bm * bn)
    return round(fill * useful, 1), bm * bn / (bm + bn)


def pick_configs(dtype: str, shape: tuple[int, int, int] | None):
    """The KEEP_CONFIGS configs of the dtype's list that best fit ``shape`` = (M, N, batch), chosen when
    the kernel is emitted (the program's shapes are static). The verifier's static policy refuses an
    autotuner pruning hook (``prune_configs_by`` runs a callable inside the launch, unaudited), so the
    pruning happens here, not at run time. ``shape`` None (unknown): every config."""
    configs = gemm_configs(dtype)
    if shape is None or min(shape) <= 0:
        return configs
    m, n, batch = shape
    if n <= NARROW_N:
        configs += NARROW_CONFIGS_32 if dtype == "float32" else NARROW_CONFIGS_16
    return tuple(sorted(configs, key=lambda c: tile_score(c[0], c[1], m, n, batch), reverse=True)[:KEEP_CONFIGS])


def autotune_source(name: str, dtype: str, key: list[str], shape: tuple[int, int, int] | None = None) -> str:
    """``<name>_tuned = triton.autotune(...)(<name>)`` over the configs that fit ``shape`` (None without CUDA)."""
    configs = ", ".join(
        f"triton.Config({{'BM': {bm}, 'BN': {bn}, 'BK': {bk}, 'GROUP_M': {g}}}, num_warps={w}, num_stages={s})"
        for bm, bn, bk, g, w, s in pick_configs(dtype, shape))
    return (f"\n{name}_tuned = triton.autotune(configs=[{configs}], key={key!r})({name}) "
            f"if torch.cuda.is_available() else None\n")


def grouped_tile_lines(n: str = "N", cols: str = "rn") -> tuple[str, ...]:
    """Kernel lines giving ``pm, pn, rm`` and the columns ``cols``: this program's BM x BN tile of an
    M x ``n`` grid in GROUP_M-grouped order (consecutive programs share rows of A: better L2 reuse)."""
    return (
        "num_m = tl.cdiv(M, BM)",
        f"num_n = tl.cdiv({n}, BN)",
        "group_size = GROUP_M * num_n",
        "first_m = (pid // group_size) * GROUP_M",
        "rows_in_group = tl.minimum(num_m - first_m, GROUP_M)",
        "pm = first_m + (pid % group_size) % rows_in_group",
        "pn = (pid % group_size) // rows_in_group",
        "rm = pm * BM + tl.arange(0, BM)",
        f"{cols} = pn * BN + tl.arange(0, BN)",
    )


def dot_lines(dtype: str, indent: str = "    ") -> list[str]:
    """``acc += a @ b`` at ``indent``: the precision rule's dot on a GPU; in the interpreter, whose dot
    mishandles bfloat16, exact fp32 products of widened operands."""
    return [
        f"{indent}if ON_CPU:",
        f"{indent}    acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision=\"{interpreter_dot_precision(dtype)}\")",
        f"{indent}else:",
        f"{indent}    acc = tl.dot(a, b, acc{precision_kwarg(dtype)})",
    ]

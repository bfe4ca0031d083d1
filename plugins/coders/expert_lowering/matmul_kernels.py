"""linear / matmul / bmm as one batched tl.dot kernel with a fused elementwise epilogue.

Every operand is read through its strides (a transposed or offset view needs no copy); the bias
and any elementwise ops after the product (activations, a residual add) run on the accumulator
tile before the single store. Dot precision on a GPU follows ``tiling.py``'s rule (fp32: tf32x3,
fp16/bf16: native); the interpreter computes exact fp32 products. On a GPU the tile sizes are
autotuned over the three of the dtype's configs that fit the shape best (``tiling.pick_configs``); in the interpreter they are
fixed and large.
"""

from __future__ import annotations

from plugins.coders.expert_lowering.codegen import Kernel, Lines, value_name
from plugins.coders.expert_lowering.errors import Unsupported
from plugins.coders.expert_lowering.plan import Group, Plan

from plugins.coders.expert_lowering.tiling import GEMM_CONFIGS_16, autotune_source, dot_lines, grouped_tile_lines

GPU_CONFIGS = GEMM_CONFIGS_16  # kept for importers; the emitted list is tiling.gemm_configs(dtype)

# Split-K: a product with few output tiles and a long reduction (KernelBench's matrix-vector product, 2048 x 1M by
# 1M x 1, and its 256 x 256 product over K = 524288) ran 16 and 4 programs on 132 SMs, each looping over all of K:
# 0.02x and 0.05x cuDNN on an H100 (2026-12-07). It splits K into chunks, each program's fp32 partial tile is
# stored, and the epilogue kernel sums the partials in a fixed order (no atomics: the same bits every run).
SPLIT_K_MAX_TILES = 16  # output tiles of 128 x 128 (times the batch) at most
SPLIT_K_MIN_K = 16384
SPLIT_K_CHUNK = 8192  # of K per program at least
SPLIT_K_MAX = 64


def split_k(m: int, n: int, k: int, batch: int) -> int:
    """How many K-chunks a product of these planned sizes is split into (1: not split).

    >>> split_k(2048, 1, 1048576, 1), split_k(256, 256, 524288, 1), split_k(4096, 4096, 65536, 1)
    (64, 64, 1)
    """
    tiles = -(-m // 128) * -(-n // 128) * batch
    if batch < 1 or tiles > SPLIT_K_MAX_TILES or k < SPLIT_K_MIN_K:
        return 1
    return max(2, min(SPLIT_K_MAX, k // SPLIT_K_CHUNK))


def _operands(plan: Plan, group: Group) -> tuple[list[str], dict[str, str]]:
    """Forward lines that bind the GEMM view of the anchor op: _A, _B, batch, M, N, K, strides."""
    n_in = len(plan.program.inputs)
    anchor = plan.node(group.anchor)
    a = value_name(anchor.args[0], n_in)
    i = group.anchor
    if anchor.op == "linear":
        rank = len(plan.shapes[anchor.args[0]])
        weight = plan.tensor(i, "weight")
        if weight is None:
            raise Unsupported("linear without a weight tensor")
        lines = [
            f"_W{i} = {weight}",
            f"_batch{i}, _M{i}, _K{i} = ({a}.shape[0] if {a}.dim() == 3 else 1), {a}.shape[-2], {a}.shape[-1]",
            f"_N{i} = _W{i}.shape[0]",
            f"_sa{i} = (({a}.stride(0) if {a}.dim() == 3 else 0), {a}.stride(-2), {a}.stride(-1))",
            f"_sb{i} = (0, _W{i}.stride(1), _W{i}.stride(0))",
        ]
        if rank not in (2, 3):
            raise Unsupported(f"linear of a rank-{rank} input")
        bias = plan.tensor(i, "bias") if anchor.params.get("bias", True) else None
        return lines, {"a": a, "b": f"_W{i}", "bias": bias or ""}
    b = value_name(anchor.args[1], n_in)
    if anchor.op == "matmul":
        lines = [
            f"_batch{i}, _M{i}, _K{i}, _N{i} = 1, {a}.shape[0], {a}.shape[1], {b}.shape[1]",
            f"_sa{i} = (0, {a}.stride(0), {a}.stride(1))",
            f"_sb{i} = (0, {b}.stride(0), {b}.stride(1))",
        ]
    elif anchor.op == "bmm":
        lines = [
            f"_batch{i}, _M{i}, _K{i}, _N{i} = {a}.shape[0], {a}.shape[1], {a}.shape[2], {b}.shape[2]",
            f"_sa{i} = tuple({a}.stride())",
            f"_sb{i} = tuple({b}.stride())",
        ]
    else:
        raise Unsupported(f"op {anchor.op!r} is not a matmul")
    return lines, {"a": a, "b": b, "bias": ""}


def matmul_kernel(plan: Plan, group: Group, index: int) -> Kernel:
    from plugins.coders.expert_lowering.elementwise_kernels import _node_lines  # shared node emitter

    n_in = len(plan.program.inputs)
    anchor_value = group.anchor
    anchor = plan.node(anchor_value)
    out_rank = len(plan.shapes[anchor_value])
    bind, ops = _operands(plan, group)
    a_value = anchor.args[0]
    b_value = anchor.args[1] if anchor.op != "linear" else None
    # Epilogue reads: every read except the GEMM operands themselves (unless also read elementwise).
    operand_values = {a_value} | ({b_value} if b_value is not None else set())
    epilogue_nodes = [v for v in group.nodes if v != anchor_value]
    ext = [r for r in group.reads if r not in operand_values or
           any(r in plan.node(v).args for v in epilogue_nodes)]
    outs = group.outputs
    has_bias = bool(ops["bias"])
    name = f"_matmul_{index}"
    out_shape = tuple(plan.shapes[anchor_value])  # the planned (M, N, batch), for split-K and the autotune configs
    gemm = (out_shape[-2] if len(out_shape) >= 2 else 1, out_shape[-1] if out_shape else 1,
            out_shape[0] if len(out_shape) == 3 else 1)
    split = split_k(gemm[0], gemm[1], plan.shapes[a_value][-1], gemm[2])
    params = ["a_ptr", "b_ptr"] + (["ws_ptr", "SPLIT"] if split > 1 else []) + (["bias_ptr"] if has_bias else [])
    params += [f"v{r}_ptr" for r in ext] + [f"v{o}_ptr" for o in outs]
    params += ["BATCH", "M", "N", "K", "sa0", "sa1", "sa2", "sb0", "sb1", "sb2"]
    for r in ext:
        params += [f"v{r}_s{d}" for d in range(out_rank)]
    params += ["ON_CPU: tl.constexpr", "BM: tl.constexpr", "BN: tl.constexpr", "BK: tl.constexpr",
               "GROUP_M: tl.constexpr"]
    dtype = plan.program.dtype
    k = Lines()
    k("@triton.jit", f"def {name}({', '.join(params)}):")
    k.indent = 1
    k(
        f"DT = v{outs[0]}_ptr.dtype.element_ty",
        "pid = tl.program_id(0)",
        "bid = tl.program_id(1).to(tl.int64)",
        *grouped_tile_lines(),
        "rk = tl.arange(0, BK)",
        # an empty batch still runs one program (the grid is at least 1): it must touch neither operand
        "m_limit = tl.where(bid < BATCH, M, 0)",
        "mask_m = rm < m_limit",
        "mask_n = rn < tl.where(bid < BATCH, N, 0)",
        "a_base = a_ptr + bid * sa0",
        "b_base = b_ptr + bid * sb0",
        "acc = tl.zeros((BM, BN), dtype=tl.float32)",
        *(_k_loop(dtype) if split == 1 else _partials_sum()),
        "mask = mask_m[:, None] & mask_n[None, :]",
    )
    if has_bias:
        k("acc = acc + tl.load(bias_ptr + rn, mask=mask_n, other=0.0).to(tl.float32)[None, :]")
    from plugins.coders.expert_lowering.pointwise import round_to

    helpers: set[str] = set()
    rounded, needed = round_to(dtype, "acc")
    helpers.update(needed)
    k(f"v{anchor_value} = {rounded}")
    out_idx = ["bid", "rm[:, None]", "rn[None, :]"][-out_rank:]
    for r in ext:
        off = " + ".join(f"{i} * v{r}_s{d}" for d, i in enumerate(out_idx))
        k(f"v{r} = tl.load(v{r}_ptr + {off}, mask=mask, other=0.0).to(tl.float32)")
    for v in epilogue_nodes:
        _node_lines(plan, v, k, helpers, row_group=False)
    for o in outs:
        k(f"tl.store(v{o}_ptr + bid * M * N + rm[:, None] * N + rn[None, :], v{o}.to(DT), mask=mask)")

    i = anchor_value
    call_args = [ops["a"], ops["b"]] + ([f"_ws{i}", str(split)] if split > 1 else []) + \
        ([ops["bias"]] if has_bias else [])
    call_args += [value_name(r, n_in) for r in ext] + [value_name(o, n_in) for o in outs]
    call_args += [f"_batch{i}", f"_M{i}", f"_N{i}", f"_K{i}", f"*_sa{i}", f"*_sb{i}"]
    call_args += [f"*{value_name(r, n_in)}.stride()" for r in ext]
    call_args += [f"ON_CPU=not {ops['a']}.is_cuda"]
    joined = ", ".join(call_args)
    launch = bind + (_split_launch(name, i, ops["a"], ops["b"], split) if split > 1 else []) + [
        f"if {ops['a']}.is_cuda:",
        f"    {name}_tuned[lambda META: (max(1, triton.cdiv(_M{i}, META['BM']) * triton.cdiv(_N{i}, META['BN'])), "
        f"max(1, _batch{i}))]({joined})",
        "else:",
        # the interpreter pays per program and per op, not per element: few, large tiles
        f"    _bm, _bn, _bk = (min(c, max(16, triton.next_power_of_2(d))) for c, d in zip((256, 256, 128), (_M{i}, _N{i}, _K{i})))",
        f"    {name}[(max(1, triton.cdiv(_M{i}, _bm) * triton.cdiv(_N{i}, _bn)), max(1, _batch{i}))]({joined}, "
        "BM=_bm, BN=_bn, BK=_bk, GROUP_M=8)",
    ]
    tuned = autotune_source(name, dtype, ["M", "N", "K", "BATCH"], gemm if out_shape else None)
    part = _partial_kernel(name, dtype) if split > 1 else ""
    return Kernel(name, part + k.text() + tuned, launch, helpers)


def _k_loop(dtype: str, k_from: str = "0", k_to: str = "K", inside: str = "") -> list[str]:
    """The reduction over K (``[k_from, k_from + k_to)`` with ``inside`` the chunk's own bound) into ``acc``."""
    kmask = "(kk < K)" + (f" & ({inside})" if inside else "")
    return [
        f"for k0 in range(0, {k_to}, BK):",
        f"    kk = {k_from} + k0 + rk" if k_from != "0" else "    kk = k0 + rk",
        f"    kmask = {kmask}",
        "    a = tl.load(a_base + rm[:, None] * sa1 + kk[None, :] * sa2, mask=mask_m[:, None] & kmask[None, :], other=0.0)",
        "    b = tl.load(b_base + kk[:, None] * sb1 + rn[None, :] * sb2, mask=kmask[:, None] & mask_n[None, :], other=0.0)",
        *dot_lines(dtype),
    ]


def _partials_sum() -> list[str]:
    """The split-K epilogue kernel's accumulator: the chunks' partial tiles summed in chunk order."""
    return [
        "for s in range(SPLIT):",
        ("    acc += tl.load(ws_ptr + ((s * BATCH + bid) * M + rm[:, None]) * N + rn[None, :], "
         "mask=mask_m[:, None] & mask_n[None, :], other=0.0)"),
    ]


def _partial_kernel(name: str, dtype: str) -> str:
    """Split-K's first kernel: program (tile, batch, chunk) stores its fp32 partial tile of the chunk's K range."""
    k = Lines()
    k("@triton.jit", f"def {name}_part(a_ptr, b_ptr, ws_ptr, BATCH, M, N, K, K_PER, sa0, sa1, sa2, sb0, sb1, sb2, "
      "ON_CPU: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):")
    k.indent = 1
    k(
        "pid = tl.program_id(0)",
        "bid = tl.program_id(1).to(tl.int64)",
        "chunk = tl.program_id(2)",
        *grouped_tile_lines(),
        "rk = tl.arange(0, BK)",
        "mask_m = rm < M",
        "mask_n = rn < N",
        "a_base = a_ptr + bid * sa0",
        "b_base = b_ptr + bid * sb0",
        "acc = tl.zeros((BM, BN), dtype=tl.float32)",
        *_k_loop(dtype, "chunk * K_PER", "K_PER", "k0 + rk < K_PER"),
        "tl.store(ws_ptr + ((chunk * BATCH + bid) * M + rm[:, None]) * N + rn[None, :], acc, "
        "mask=mask_m[:, None] & mask_n[None, :])",
    )
    return k.text()


def _split_launch(name: str, i: int, a: str, b: str, split: int) -> list[str]:
    """Forward lines of split-K's first kernel: the partials' workspace, then one program per tile and chunk
    (fixed tiles on a GPU: the epilogue kernel after it is the autotuned one; large ones in the interpreter)."""
    return [
        f"_ws{i} = torch.empty(({split}, _batch{i}, _M{i}, _N{i}), device={a}.device, dtype=torch.float32)",
        f"_kper{i} = triton.cdiv(_K{i}, {split})",
        f"if {a}.is_cuda:",
        f"    _pbm, _pbn, _pbk = 64, (16 if _N{i} <= 16 else 64), 64",
        "else:",
        (f"    _pbm, _pbn, _pbk = (min(c, max(16, triton.next_power_of_2(d))) for c, d in "
         f"zip((256, 256, 128), (_M{i}, _N{i}, _kper{i})))"),
        (f"{name}_part[(triton.cdiv(_M{i}, _pbm) * triton.cdiv(_N{i}, _pbn), _batch{i}, {split})]({a}, {b}, _ws{i}, "
         f"_batch{i}, _M{i}, _N{i}, _K{i}, _kper{i}, *_sa{i}, *_sb{i}, ON_CPU=not {a}.is_cuda, BM=_pbm, BN=_pbn, "
         "BK=_pbk, GROUP_M=8)"),
    ]

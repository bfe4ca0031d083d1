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
    params = ["a_ptr", "b_ptr"] + (["bias_ptr"] if has_bias else [])
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
        "for k0 in range(0, K, BK):",
        "    kk = k0 + rk",
        "    a = tl.load(a_base + rm[:, None] * sa1 + kk[None, :] * sa2, mask=mask_m[:, None] & (kk[None, :] < K), other=0.0)",
        "    b = tl.load(b_base + kk[:, None] * sb1 + rn[None, :] * sb2, mask=(kk[:, None] < K) & mask_n[None, :], other=0.0)",
        *dot_lines(dtype),
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
    call_args = [ops["a"], ops["b"]] + ([ops["bias"]] if has_bias else [])
    call_args += [value_name(r, n_in) for r in ext] + [value_name(o, n_in) for o in outs]
    call_args += [f"_batch{i}", f"_M{i}", f"_N{i}", f"_K{i}", f"*_sa{i}", f"*_sb{i}"]
    call_args += [f"*{value_name(r, n_in)}.stride()" for r in ext]
    call_args += [f"ON_CPU=not {ops['a']}.is_cuda"]
    joined = ", ".join(call_args)
    launch = bind + [
        f"if {ops['a']}.is_cuda:",
        f"    {name}_tuned[lambda META: (max(1, triton.cdiv(_M{i}, META['BM']) * triton.cdiv(_N{i}, META['BN'])), "
        f"max(1, _batch{i}))]({joined})",
        "else:",
        # the interpreter pays per program and per op, not per element: few, large tiles
        f"    _bm, _bn, _bk = (min(c, max(16, triton.next_power_of_2(d))) for c, d in zip((256, 256, 128), (_M{i}, _N{i}, _K{i})))",
        f"    {name}[(max(1, triton.cdiv(_M{i}, _bm) * triton.cdiv(_N{i}, _bn)), max(1, _batch{i}))]({joined}, "
        "BM=_bm, BN=_bn, BK=_bk, GROUP_M=8)",
    ]
    out_shape = tuple(plan.shapes[anchor_value])
    gemm = (out_shape[-2] if len(out_shape) >= 2 else 1, out_shape[-1], out_shape[0] if len(out_shape) == 3 else 1)
    tuned = autotune_source(name, dtype, ["M", "N", "K", "BATCH"], gemm if out_shape else None)
    return Kernel(name, k.text() + tuned, launch, helpers)

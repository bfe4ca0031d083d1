"""Pointwise and row groups lowered to Triton kernels (masked, stride-aware, any rank)."""

from __future__ import annotations

from plugins.coders.expert_lowering.codegen import FLAT_BLOCK_LINES, Kernel, Lines, module_tensors, offsets, value_name
from plugins.coders.expert_lowering.errors import Unsupported
from plugins.coders.expert_lowering.plan import CHANNEL_OPS, COPY_OP, Group, Plan
from plugins.coders.expert_lowering.pointwise import POINTWISE, pointwise_expr, round_to

# Rows longer than this are not held in registers in one piece; the resident row kernel declines.
MAX_RESIDENT_ROW = 16384


def _node_lines(plan: Plan, value: int, k: Lines, helpers: set[str], row_group: bool) -> None:
    """Kernel lines computing node ``value`` into ``v<value>`` (fp32, rounded as PyTorch rounds)."""
    node = plan.node(value)
    args = [f"v{a}" for a in node.args]
    name = f"v{value}"
    dtype = plan.program.dtype

    def rnd(expr: str) -> str:
        text, needed = round_to(dtype, expr)
        helpers.update(needed)
        return text

    if node.op == COPY_OP:
        k(f"{name} = {args[0]}")
    elif node.op == "batch_norm":
        # Eval-mode batch norm over (N, C, ...): per-channel running statistics and affine weights.
        p = f"p{value}"
        eps = float(node.params.get("eps", 1e-5))
        has = {attr: plan.tensor(value, attr) is not None for attr in ("weight", "bias")}
        k(
            f"{p}_c = i1",
            f"{p}_mean = tl.load({p}_rm + {p}_c, mask=mask, other=0.0).to(tl.float32)",
            f"{p}_var = tl.load({p}_rv + {p}_c, mask=mask, other=1.0).to(tl.float32)",
            f"{p}_wt = tl.load({p}_w + {p}_c, mask=mask, other=0.0).to(tl.float32)" if has["weight"] else f"{p}_wt = 1.0",
            f"{p}_bs = tl.load({p}_b + {p}_c, mask=mask, other=0.0).to(tl.float32)" if has["bias"] else f"{p}_bs = 0.0",
            f"{name} = ({args[0]} - {p}_mean) / tl.sqrt({p}_var + {eps!r}) * {p}_wt + {p}_bs",
        )
    elif node.op in ("triu", "tril"):
        rank = len(plan.shapes[value])
        diagonal = int(node.params.get("diagonal", 0))
        keep = ">=" if node.op == "triu" else "<="
        k(f"{name} = tl.where(i{rank - 1} - i{rank - 2} {keep} {diagonal}, {args[0]}, 0.0)")
    elif node.op == "expand" and row_group:  # a per-row scalar across its row (plan._try_join)
        k(f"{name} = tl.broadcast_to({args[0]}, (BM, BN))")
    elif node.op == "reshape" and row_group:  # a per-row scalar with or without its unit dim
        k(f"{name} = {args[0]}")
    elif node.op in POINTWISE:
        helpers.update(POINTWISE[node.op].helpers)
        k(f"{name} = {pointwise_expr(node.op, args, node.params)}")
    elif row_group:
        (a,) = args
        t = f"_t{value}"
        row_max = f"tl.max(tl.where(m2, {a}, float('-inf')), axis=1)[:, None]"
        if node.op == "sum":
            k(f"{name} = tl.sum(tl.where(m2, {a}, 0.0), axis=1)[:, None]")
        elif node.op == "mean":
            k(f"{name} = tl.sum(tl.where(m2, {a}, 0.0), axis=1)[:, None] / N")
        elif node.op == "amax":
            k(
                f"{t}_max = {row_max}",
                f"{t}_nan = tl.max(tl.where(m2 & ({a} != {a}), 1, 0), axis=1)[:, None]",
                f"{name} = tl.where({t}_nan > 0, float('nan'), {t}_max)",
            )
        elif node.op == "amin":
            k(
                f"{t}_min = tl.min(tl.where(m2, {a}, float('inf')), axis=1)[:, None]",
                f"{t}_nan = tl.max(tl.where(m2 & ({a} != {a}), 1, 0), axis=1)[:, None]",
                f"{name} = tl.where({t}_nan > 0, float('nan'), {t}_min)",
            )
        elif node.op in ("cumsum", "cumprod"):
            # the masked tail is the identity of the scan, so a reverse scan starts from the row's end
            identity = "0.0" if node.op == "cumsum" else "1.0"
            reverse = ", reverse=True" if node.params.get("reverse", False) else ""
            k(f"{name} = tl.{node.op}(tl.where(m2, {a}, {identity}), axis=1{reverse})")
            if node.op == "cumprod":
                # PyTorch's CPU cumprod carries its product in float64 (CUDA's in float32): a product that
                # overflows fp32 before reaching a zero is inf * 0 = NaN here and 0 there
                k("if ON_CPU:",
                  f"    {name} = tl.cumprod(tl.where(m2, {a}, 1.0).to(tl.float64), axis=1{reverse}).to(tl.float32)")
        elif node.op == "logsumexp":
            # ATen's composite: m = amax (0 where infinite); log(sum(exp(x - m))) + m, each step
            # rounded to the tensor dtype.
            shifted = rnd(f"{a} - {t}_max")
            exps = rnd(f"tl.exp({shifted})")
            total = rnd(f"tl.sum(tl.where(m2, {t}_exp, 0.0), axis=1)[:, None]")
            log = rnd(f"tl.log({t}_sum)")
            k(
                f"{t}_max = {row_max}",
                f"{t}_max = tl.where(tl.abs({t}_max) == float('inf'), 0.0, {t}_max)",
                f"{t}_exp = {exps}",
                f"{t}_sum = {total}",
                f"{name} = {log} + {t}_max",
            )
        elif node.op in ("layer_norm", "rms_norm"):
            p = f"p{value}"
            eps = float(node.params.get("eps", 1e-5 if node.op == "layer_norm" else 1e-6))
            if plan.tensor(value, "weight") is not None:
                k(f"{p}_wt = tl.load({p}_w + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]")
            else:
                k(f"{p}_wt = 1.0")
            if node.op == "layer_norm":
                k(
                    f"{p}_bs = tl.load({p}_b + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]"
                    if plan.tensor(value, "bias") is not None else f"{p}_bs = 0.0",
                    f"{t}_mean = tl.sum(tl.where(m2, {a}, 0.0), axis=1)[:, None] / N",
                    f"{t}_dev = tl.where(m2, {a} - {t}_mean, 0.0)",
                    f"{t}_rstd = 1.0 / tl.sqrt(tl.sum({t}_dev * {t}_dev, axis=1)[:, None] / N + {eps!r})",
                    f"{name} = {t}_dev * {t}_rstd * {p}_wt + {p}_bs",
                )
            else:
                # F.rms_norm: normalise in fp32, round to the dtype, then scale by the weight.
                normed = rnd(f"{a} * {t}_rstd")
                k(
                    f"{t}_sq = tl.where(m2, {a} * {a}, 0.0)",
                    f"{t}_rstd = 1.0 / tl.sqrt(tl.sum({t}_sq, axis=1)[:, None] / N + {eps!r})",
                    f"{name} = {normed} * {p}_wt",
                )
        elif node.op == "softmax":
            k(
                f"{t}_max = {row_max}",
                f"{t}_exp = tl.where(m2, tl.exp({a} - {t}_max), 0.0)",
                f"{name} = {t}_exp / tl.sum({t}_exp, axis=1)[:, None]",
            )
        elif node.op == "log_softmax":
            # PyTorch's CPU kernel rounds the row's sum and its log to the tensor dtype; CUDA's does not.
            cpu_log = rnd(f"tl.log({rnd(f'{t}_sum')})")
            k(
                f"{t}_max = {row_max}",
                f"{t}_sum = tl.sum(tl.where(m2, tl.exp({a} - {t}_max), 0.0), axis=1)[:, None]",
                f"{t}_log = tl.log({t}_sum)",
                "if ON_CPU:",
                f"    {t}_log = {cpu_log}",
                f"{name} = {a} - {t}_max - {t}_log",
            )
        else:
            raise Unsupported(f"op {node.op!r} has no row lowering")
    else:
        raise Unsupported(f"op {node.op!r} cannot be fused into a pointwise kernel")
    # PyTorch rounds every op's result to the tensor dtype; do the same so fp16/bf16 match it.
    rounded = rnd(name)
    if rounded != name:
        k(f"{name} = {rounded}")


def pointwise_kernel(plan: Plan, group: Group, index: int) -> Kernel:
    """A flat kernel over every element of the group's shape; inputs at any strides."""
    n_in = len(plan.program.inputs)
    rank = len(group.shape)
    name = f"_pointwise_{index}"
    reads, outs = group.reads, group.outputs
    tensors = module_tensors(plan, group.nodes)
    needs_index = any(plan.node(v).op in CHANNEL_OPS for v in group.nodes)
    params = [f"v{r}_ptr" for r in reads] + [f"v{o}_ptr" for o in outs] + [t for t, _ in tensors] + ["numel"]
    params += [f"D{d}" for d in range(rank)]
    for r in reads:
        params += [f"v{r}_s{d}" for d in range(rank)]
    params += ["CONTIG: tl.constexpr", "ON_CPU: tl.constexpr", "BLOCK: tl.constexpr", "IDX64: tl.constexpr"]
    k = Lines()
    k("@triton.jit", f"def {name}({', '.join(params)}):")
    k.indent = 1
    k(
        f"DT = v{outs[0]}_ptr.dtype.element_ty",
        *FLAT_BLOCK_LINES,
    )
    index_names = [f"i{d}" for d in range(rank)]

    def decompose() -> None:
        k("rem = offs")
        for d in reversed(range(rank)):
            k(f"i{d} = rem % D{d}" if d else "i0 = rem")
            if d:
                k(f"rem = rem // D{d}")

    if needs_index:
        decompose()
    if reads:
        k("if CONTIG:")
        for r in reads:
            k(f"    v{r} = tl.load(v{r}_ptr + offs, mask=mask, other=0.0).to(tl.float32)")
        k("else:")
        k.indent = 2
        if not needs_index:
            decompose()
        for r in reads:
            off = offsets(index_names, [f"v{r}_s{d}" for d in range(rank)])
            k(f"v{r} = tl.load(v{r}_ptr + ({off}), mask=mask, other=0.0).to(tl.float32)")
        k.indent = 1
    helpers: set[str] = set()
    for v in group.nodes:
        _node_lines(plan, v, k, helpers, row_group=False)
    for o in outs:
        k(f"tl.store(v{o}_ptr + offs, v{o}.to(DT), mask=mask)")
    args = [value_name(r, n_in) for r in reads] + [value_name(o, n_in) for o in outs]
    shape = f"s{group.nodes[0]}"
    contig = " and ".join(f"{value_name(r, n_in)}.is_contiguous()" for r in reads) or "True"
    first = value_name(outs[0], n_in)
    launch_args = args + [expr for _, expr in tensors] + [f"{first}.numel()"] + ([f"*{shape}"] if rank else [])
    launch_args += [f"*{value_name(r, n_in)}.stride()" for r in reads if rank]
    launch_args += [f"CONTIG={contig}", f"ON_CPU=not {first}.is_cuda",
                    f"IDX64=_idx64({', '.join(args)})"]
    launch = [
        f"_block = 1024 if {first}.is_cuda else 16384",
        f"{name}[(max(1, triton.cdiv({first}.numel(), _block)),)]({', '.join(launch_args)}, BLOCK=_block)",
    ]
    return Kernel(name, k.text(), launch, helpers)


# The resident kernel holds BM = 4096 // BN rows: from rows of 256 elements on, fewer than 32 adjacent rows share
# a load, so rows that run across memory (a transposed view) would waste most of each sector read.
MAX_COALESCED_ROW = 128


def rows_across_memory(plan: Plan, value: int) -> bool:
    """Whether ``value`` is a view that moved its source's last dim (``transpose``, a ``permute`` not ending
    with it): its rows are strided in memory and its adjacent rows adjacent (a reduction over a middle dim)."""
    n_in = len(plan.program.inputs)
    while value >= n_in:
        node = plan.node(value)
        if node.op == "transpose":
            return True
        if node.op != "permute":
            return False
        dims = [int(d) for d in node.params["dims"]]
        if dims[-1] != len(dims) - 1:
            return True
        value = node.args[0]
    return False


def row_kernel(plan: Plan, group: Group, index: int) -> Kernel:
    """One program per ``BM`` rows; each row of length ``N`` is held whole in a ``BN`` tile."""
    n_in = len(plan.program.inputs)
    base = group.shape
    rank = len(base)
    from plugins.coders.expert_lowering.row_loop_kernels import looped_row_kernel

    if base[-1] > MAX_RESIDENT_ROW:  # too long for one tile: stream it (row_loop_kernels)
        return looped_row_kernel(plan, group, index)
    if base[-1] > MAX_COALESCED_ROW and any(tuple(plan.shapes[r]) == tuple(base) and rows_across_memory(plan, r)
                                            for r in group.reads):
        try:  # a reduction over a middle dim: a whole row per program would read one element per 32-byte sector
            return looped_row_kernel(plan, group, index, across=True)
        except Unsupported:  # an op the streamed kernel lacks: the resident kernel, uncoalesced but right
            pass
    name = f"_rows_{index}"
    reads, outs = group.reads, group.outputs
    read_kinds = {}
    for r in reads:
        shape = tuple(plan.shapes[r])
        if shape == tuple(base):
            read_kinds[r] = "row"
        elif shape in (tuple(base[:-1]), tuple(base[:-1]) + (1,)):
            read_kinds[r] = "scal"
        else:
            raise Unsupported(f"row kernel over {base} cannot read a tensor of shape {shape}")
    tensors = module_tensors(plan, group.nodes)
    params = [f"v{r}_ptr" for r in reads] + [f"v{o}_ptr" for o in outs] + [t for t, _ in tensors] + ["M", "N"]
    params += [f"D{d}" for d in range(rank - 1)]
    for r in reads:
        params += [f"v{r}_s{d}" for d in range(len(plan.shapes[r]))]
    params += ["ON_CPU: tl.constexpr", "BM: tl.constexpr", "BN: tl.constexpr"]
    k = Lines()
    k("@triton.jit", f"def {name}({', '.join(params)}):")
    k.indent = 1
    k(
        f"DT = v{outs[0]}_ptr.dtype.element_ty",
        "pid = tl.program_id(0).to(tl.int64)",
        "rows = pid * BM + tl.arange(0, BM)",
        "rmask = rows < M",
        "cols = tl.arange(0, BN)",
        "cmask = cols < N",
        "m2 = rmask[:, None] & cmask[None, :]",
        "rem = rows",
    )
    for d in reversed(range(rank - 1)):
        if d:
            k(f"i{d} = rem % D{d}", f"rem = rem // D{d}")
        else:
            k("i0 = rem")
    outer = [f"i{d}" for d in range(rank - 1)]
    for r in reads:
        strides = [f"v{r}_s{d}" for d in range(rank - 1)]
        row_off = offsets(outer, strides) if outer else "rows * 0"
        if read_kinds[r] == "row":
            k(
                f"v{r} = tl.load(v{r}_ptr + ({row_off})[:, None] + cols[None, :] * v{r}_s{rank - 1}, "
                f"mask=m2, other=0.0).to(tl.float32)"
            )
        else:
            k(f"v{r} = tl.load(v{r}_ptr + ({row_off})[:, None], mask=rmask[:, None], other=0.0).to(tl.float32)")
    helpers: set[str] = set()
    for v in group.nodes:
        _node_lines(plan, v, k, helpers, row_group=True)
    for o in outs:
        if group.kinds[o] == "row":
            k(f"tl.store(v{o}_ptr + rows[:, None] * N + cols[None, :], v{o}.to(DT), mask=m2)")
        else:
            k(f"tl.store(v{o}_ptr + rows[:, None], v{o}.to(DT), mask=rmask[:, None])")
    args = [value_name(r, n_in) for r in reads] + [value_name(o, n_in) for o in outs]
    shape = f"_S{index}"
    launch_args = args + [expr for _, expr in tensors] + ["_M", "_N"] + ([f"*{shape}[:-1]"] if rank > 1 else [])
    launch_args += [f"*{value_name(r, n_in)}.stride()" for r in reads if len(plan.shapes[r])]
    launch_args.append(f"ON_CPU=not {args[0]}.is_cuda")
    launch = [
        f"{shape} = {_base_shape_expr(plan, group)}",
        f"_N = {shape}[-1]",
        f"_M = _numel({shape}[:-1])",
        "_BN = triton.next_power_of_2(max(1, _N))",
        f"_BM = min(triton.next_power_of_2(max(1, _M)), max(1, (4096 if {args[0]}.is_cuda else 16384) // _BN))",
        "_NW = min(16, max(4, _BM * _BN // 1024))",
        f"{name}[(max(1, triton.cdiv(_M, _BM)),)]({', '.join(launch_args)}, BM=_BM, BN=_BN, num_warps=_NW)",
    ]
    return Kernel(name, k.text(), launch, helpers)


def _base_shape_expr(plan: Plan, group: Group) -> str:
    """The row group's base shape, from the shape variable of a value that has it."""
    for v in group.reads + group.nodes:
        if tuple(plan.shapes[v]) == tuple(group.shape) and (v in group.reads or group.kinds.get(v) == "row"):
            return f"s{v}"
    # A group whose every row-shaped value is internal and whose reads are all per-row cannot exist:
    # a row op's operand is row-shaped and is either read or computed from reads.
    raise Unsupported(f"row group over {group.shape} has no row-shaped value to take its shape from")

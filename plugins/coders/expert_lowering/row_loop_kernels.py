"""Row groups whose rows are too long to hold in registers: every row streamed in chunks.

The resident row kernel (:func:`elementwise_kernels.row_kernel`) keeps a whole row in one tile; a
row of a million elements (a full-tensor ``mean``, a ``layer_norm`` over (C, H, W)) does not fit.
Here each program still owns ``BM`` rows, but walks them ``BN`` columns at a time:

* every per-row scalar the group needs (a reduction's result, softmax's max and sum, a norm's
  mean and variance) gets its own pass over the row, accumulating in fp32 - two passes for the
  variance, as the resident kernel, so there is no cancellation;
* per-row scalar arithmetic (``var + eps``, ``rsqrt``) runs once between passes;
* a last pass recomputes the row-shaped values chunk by chunk and stores the outputs.

Row-shaped values are recomputed from the loaded inputs in each pass that needs them (no
intermediate leaves registers). A ``cumsum`` carries its running total from chunk to chunk
(``cumprod`` and reverse scans are declined on long rows). Float32 only: the half-precision rounding
of the resident kernel's composite ops is not reproduced here.
"""

from __future__ import annotations

from plugins.coders.expert_lowering.codegen import Kernel, Lines, module_tensors, offsets, value_name
from plugins.coders.expert_lowering.errors import Unsupported
from plugins.coders.expert_lowering.plan import Group, Plan
from plugins.coders.expert_lowering.pointwise import POINTWISE, pointwise_expr

# Rows and columns of a chunk when the rows run across memory: a column of 64 adjacent rows is 256 bytes read
# at once. The same tile on the CPU, so that the interpreter runs what the GPU does.
ACROSS_TILE = 64

# Row maps that need per-row statistics first: op -> the statistics' passes, in order.
STATS = {"softmax": ("max", "expsum"), "log_softmax": ("max", "expsum"), "layer_norm": ("mean", "var"),
         "rms_norm": ("meansq",)}


class _Pass:
    """One loop over a row's chunks: the lines of its body, and which chunks it has computed."""

    def __init__(self) -> None:
        self.body = Lines(indent=2)
        self.done: set[int] = set()
        self.carries: list[str] = []  # scan carries: initialised before the loop
        self.after: list[str] = []  # carry updates at the end of each chunk


def looped_row_kernel(plan: Plan, group: Group, index: int, across: bool = False) -> Kernel:
    """``across``: the rows run across memory (a reduction over a middle dim): each program walks
    :data:`ACROSS_TILE` adjacent rows together, so that every column of a chunk is one coalesced read."""
    n_in = len(plan.program.inputs)
    if plan.program.dtype != "float32":
        raise Unsupported(f"a {plan.program.dtype} row of {group.shape[-1]} elements exceeds the resident row limit "
                          "(rows streamed in chunks are lowered in float32 only)")
    base = group.shape
    rank = len(base)
    name = f"_rows_{index}"
    reads, outs = group.reads, group.outputs
    kinds = dict(group.kinds)
    for r in reads:
        shape = tuple(plan.shapes[r])
        kinds[r] = "row" if shape == tuple(base) else "scal"
        if kinds[r] == "scal" and shape not in (tuple(base[:-1]), tuple(base[:-1]) + (1,)):
            raise Unsupported(f"row kernel over {base} cannot read a tensor of shape {shape}")
    tensors = module_tensors(plan, group.nodes)
    helpers: set[str] = set()
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
        "lanes = tl.arange(0, BN)",
        "rem = rows",
    )
    for d in reversed(range(rank - 1)):
        k(f"i{d} = rem % D{d}", f"rem = rem // D{d}") if d else k("i0 = rem")
    outer = [f"i{d}" for d in range(rank - 1)]
    for r in reads:
        row_off = offsets(outer, [f"v{r}_s{d}" for d in range(rank - 1)]) if outer else "rows * 0"
        k(f"off{r} = ({row_off})[:, None]")
        if kinds[r] == "scal":
            k(f"v{r} = tl.load(v{r}_ptr + off{r}, mask=rmask[:, None], other=0.0).to(tl.float32)")

    def chunk(v: int, p: _Pass) -> str:
        """The name of value ``v`` in a pass: a per-row scalar as it is, a row value as its chunk."""
        if kinds.get(v) == "scal":
            return f"v{v}"
        if v in p.done:
            return f"c{v}"
        p.done.add(v)
        b = p.body
        if v in reads:
            b(f"c{v} = tl.load(v{v}_ptr + off{v} + cols[None, :] * v{v}_s{rank - 1}, mask=m2, other=0.0).to(tl.float32)")
            return f"c{v}"
        node = plan.node(v)
        args = [chunk(a, p) for a in node.args]
        t = f"_t{v}"
        if node.op == "expand":
            b(f"c{v} = tl.broadcast_to({args[0]}, (BM, BN))")
        elif node.op in POINTWISE:
            helpers.update(POINTWISE[node.op].helpers)
            b(f"c{v} = {pointwise_expr(node.op, args, node.params)}")
        elif node.op == "softmax":
            b(f"c{v} = tl.exp({args[0]} - {t}_max) / {t}_expsum")
        elif node.op == "log_softmax":
            b(f"c{v} = {args[0]} - {t}_max - tl.log({t}_expsum)")
        elif node.op in ("layer_norm", "rms_norm"):
            pv = f"p{v}"
            weight = f"tl.load({pv}_w + cols, mask=cmask, other=0.0)[None, :]" \
                if plan.tensor(v, "weight") is not None else "1.0"
            if node.op == "layer_norm":
                bias = f"tl.load({pv}_b + cols, mask=cmask, other=0.0)[None, :]" \
                    if plan.tensor(v, "bias") is not None else "0.0"
                b(f"c{v} = ({args[0]} - {t}_mean) * {t}_rstd * {weight} + {bias}")
            else:
                b(f"c{v} = {args[0]} * {t}_rstd * {weight}")
        elif node.op == "cumsum" and not node.params.get("reverse", False):
            # the running total of the chunks before this one, carried along the pass
            p.carries.append(f"carry{v} = tl.zeros((BM, 1), dtype=tl.float32)")
            b(f"c{v} = tl.cumsum(tl.where(m2, {args[0]}, 0.0), axis=1) + carry{v}")
            p.after.append(f"carry{v} = carry{v} + tl.sum(tl.where(m2, {args[0]}, 0.0), axis=1)[:, None]")
        else:
            raise Unsupported(f"op {node.op!r} has no long-row lowering")
        return f"c{v}"

    def emit_pass(p: _Pass, before: list[str], after: list[str]) -> None:
        k(*before, *p.carries, "for n0 in range(0, N, BN):")
        k.indent = 2
        k("cols = n0 + lanes", "cmask = cols < N", "m2 = rmask[:, None] & cmask[None, :]")
        k.lines += p.body.lines
        k(*p.after, *after)
        k.indent = 1

    def reduce_pass(v: int, what: str, operand: int) -> None:
        """Accumulate statistic ``what`` of ``operand``'s row into ``_t<v>_<what>``."""
        p = _Pass()
        x = chunk(operand, p)
        t = f"_t{v}"
        if what in ("sum", "mean", "meansq"):
            term = f"{x} * {x}" if what == "meansq" else x
            emit_pass(p, [f"{t}_acc = tl.zeros((BM, 1), dtype=tl.float32)"],
                      [f"{t}_acc += tl.sum(tl.where(m2, {term}, 0.0), axis=1)[:, None]"])
        elif what in ("max", "amax", "amin"):
            fn, fill = ("min", "float('inf')") if what == "amin" else ("max", "float('-inf')")
            emit_pass(p, [f"{t}_acc = tl.full((BM, 1), {fill}, tl.float32)", f"{t}_nan = tl.zeros((BM, 1), dtype=tl.int32)"],
                      [f"{t}_acc = tl.{'minimum' if fn == 'min' else 'maximum'}({t}_acc, "
                       f"tl.{fn}(tl.where(m2, {x}, {fill}), axis=1)[:, None])",
                       f"{t}_nan = {t}_nan | tl.max(tl.where(m2 & ({x} != {x}), 1, 0), axis=1)[:, None]"])
        elif what in ("expsum", "lse"):
            emit_pass(p, [f"{t}_acc = tl.zeros((BM, 1), dtype=tl.float32)"],
                      [f"{t}_acc += tl.sum(tl.where(m2, tl.exp({x} - {t}_shift), 0.0), axis=1)[:, None]"])
        elif what == "var":
            emit_pass(p, [f"{t}_acc = tl.zeros((BM, 1), dtype=tl.float32)"],
                      [f"{t}_acc += tl.sum(tl.where(m2, ({x} - {t}_mean) * ({x} - {t}_mean), 0.0), axis=1)[:, None]"])
        else:  # pragma: no cover - every caller passes one of the above
            raise Unsupported(f"no long-row pass for {what!r}")

    for v in group.nodes:
        node = plan.node(v)
        t = f"_t{v}"
        a = node.args[0] if node.args else None
        if kinds.get(v) == "scal":
            if node.op in ("sum", "mean"):
                reduce_pass(v, "sum", a)
                k(f"v{v} = {t}_acc" + (" / N" if node.op == "mean" else ""))
            elif node.op in ("amax", "amin"):
                reduce_pass(v, node.op, a)
                k(f"v{v} = tl.where({t}_nan > 0, float('nan'), {t}_acc)")
            elif node.op == "logsumexp":
                reduce_pass(v, "max", a)
                k(f"{t}_shift = tl.where(tl.abs({t}_acc) == float('inf'), 0.0, {t}_acc)")
                reduce_pass(v, "lse", a)
                k(f"v{v} = tl.log({t}_acc) + {t}_shift")
            elif node.op == "reshape":
                k(f"v{v} = v{a}")
            elif node.op in POINTWISE:
                helpers.update(POINTWISE[node.op].helpers)
                k(f"v{v} = {pointwise_expr(node.op, [f'v{x}' for x in node.args], node.params)}")
            else:
                raise Unsupported(f"op {node.op!r} has no long-row lowering")
        elif node.op in ("softmax", "log_softmax"):
            reduce_pass(v, "max", a)
            k(f"{t}_max = {t}_acc", f"{t}_shift = {t}_acc")
            reduce_pass(v, "expsum", a)
            k(f"{t}_expsum = {t}_acc")
        elif node.op == "layer_norm":
            eps = float(node.params.get("eps", 1e-5))
            reduce_pass(v, "sum", a)
            k(f"{t}_mean = {t}_acc / N")
            reduce_pass(v, "var", a)
            k(f"{t}_rstd = 1.0 / tl.sqrt({t}_acc / N + {eps!r})")
        elif node.op == "rms_norm":
            eps = float(node.params.get("eps", 1e-6))
            reduce_pass(v, "meansq", a)
            k(f"{t}_rstd = 1.0 / tl.sqrt({t}_acc / N + {eps!r})")
    row_outs = [o for o in outs if kinds[o] == "row"]
    if row_outs:
        p = _Pass()
        for o in row_outs:
            chunk(o, p)
        emit_pass(p, [], [f"tl.store(v{o}_ptr + rows[:, None] * N + cols[None, :], c{o}.to(DT), mask=m2)"
                          for o in row_outs])
    for o in outs:
        if kinds[o] == "scal":
            k(f"tl.store(v{o}_ptr + rows[:, None], v{o}.to(DT), mask=rmask[:, None])")
    args = [value_name(r, n_in) for r in reads] + [value_name(o, n_in) for o in outs]
    shape = f"_S{index}"
    launch_args = args + [expr for _, expr in tensors] + ["_M", "_N"] + ([f"*{shape}[:-1]"] if rank > 1 else [])
    launch_args += [f"*{value_name(r, n_in)}.stride()" for r in reads if len(plan.shapes[r])]
    launch_args.append(f"ON_CPU=not {args[0]}.is_cuda")
    from plugins.coders.expert_lowering.elementwise_kernels import _base_shape_expr

    launch = [
        f"{shape} = {_base_shape_expr(plan, group)}",
        f"_N = {shape}[-1]",
        f"_M = _numel({shape}[:-1])",
        *((f"_BN = _BM = {ACROSS_TILE}",) if across else (f"_BN = 2048 if {args[0]}.is_cuda else 16384", "_BM = 1")),
        f"{name}[(max(1, triton.cdiv(_M, _BM)),)]({', '.join(launch_args)}, BM=_BM, BN=_BN, num_warps=8)",
    ]
    return Kernel(name, k.text(), launch, helpers)

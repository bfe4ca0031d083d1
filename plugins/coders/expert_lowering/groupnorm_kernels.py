"""group_norm over (N, C, *spatial): one program per (sample, group), two passes for the mean and
the variance (no cancellation), a third that writes the normalised, affine, epilogue-fused output."""

from __future__ import annotations

from plugins.coders.expert_lowering.codegen import Kernel, Lines, value_name
from plugins.coders.expert_lowering.conv_kernels import _epilogue
from plugins.coders.expert_lowering.errors import Unsupported
from plugins.coders.expert_lowering.plan import Group, Plan
from plugins.coders.expert_lowering.pointwise import round_to


def group_norm_kernel(plan: Plan, group: Group, index: int) -> Kernel:
    n_in = len(plan.program.inputs)
    i = group.anchor
    node = plan.node(i)
    extra = set(node.params) - {"num_groups", "eps"}
    if extra:
        raise Unsupported(f"group_norm: parameters {sorted(extra)} are not understood by the expert lowering")
    groups = int(node.params["num_groups"])
    eps = float(node.params.get("eps", 1e-5))
    x_value = node.args[0]
    x = value_name(x_value, n_in)
    rank = len(plan.shapes[x_value])
    if rank not in (3, 4):
        raise Unsupported(f"group_norm of a rank-{rank} tensor")
    epilogue = [v for v in group.nodes if v != i]
    ext = [r for r in group.reads if r != x_value or any(r in plan.node(v).args for v in epilogue)]
    outs = group.outputs
    name = f"_group_norm_{index}"
    params = ["x_ptr", "w_ptr", "b_ptr"] + [f"v{r}_ptr" for r in ext] + [f"v{o}_ptr" for o in outs]
    params += ["NG", "C", "H", "W", "sx0", "sx1", "sx2", "sx3"]
    for r in ext:
        params += [f"v{r}_s{d}" for d in range(4)]
    params += ["ON_CPU: tl.constexpr", "G: tl.constexpr", "HAS_W: tl.constexpr", "HAS_B: tl.constexpr",
               "GB: tl.constexpr", "BLOCK: tl.constexpr"]
    k = Lines()
    k("@triton.jit", f"def {name}({', '.join(params)}):")
    k.indent = 1
    # GB (sample, group) pairs per program, a [GB, BLOCK] tile of each one's elements at a time
    k(
        f"DT = v{outs[0]}_ptr.dtype.element_ty",
        "rows = tl.program_id(0).to(tl.int64) * GB + tl.arange(0, GB)",
        "rmask = rows < NG",
        "nb = (rows // G)[:, None]",
        "g = (rows % G)[:, None]",
        "CG = C // G",
        "L = CG * H * W",
        "lanes = tl.arange(0, BLOCK)[None, :]",
        "acc = tl.zeros((GB, BLOCK), dtype=tl.float32)",
        "for l0 in range(0, L, BLOCK):",
        "    idx = l0 + lanes",
        "    m = rmask[:, None] & (idx < L)",
        "    ch = g * CG + idx // (H * W)",
        "    off = nb * sx0 + ch * sx1 + (idx // W) % H * sx2 + idx % W * sx3",
        "    acc += tl.load(x_ptr + off, mask=m, other=0.0).to(tl.float32)",
        "mean = (tl.sum(acc, axis=1) / L)[:, None]",
        "acc = tl.zeros((GB, BLOCK), dtype=tl.float32)",
        "for l0 in range(0, L, BLOCK):",
        "    idx = l0 + lanes",
        "    m = rmask[:, None] & (idx < L)",
        "    ch = g * CG + idx // (H * W)",
        "    off = nb * sx0 + ch * sx1 + (idx // W) % H * sx2 + idx % W * sx3",
        "    d = tl.where(m, tl.load(x_ptr + off, mask=m, other=0.0).to(tl.float32) - mean, 0.0)",
        "    acc += d * d",
        f"rstd = (1.0 / tl.sqrt(tl.sum(acc, axis=1) / L + {eps!r}))[:, None]",
        "for l0 in range(0, L, BLOCK):",
        "    idx = l0 + lanes",
        "    mask = rmask[:, None] & (idx < L)",
        "    ch = g * CG + idx // (H * W)",
        "    hh = (idx // W) % H",
        "    ww = idx % W",
        "    xv = tl.load(x_ptr + nb * sx0 + ch * sx1 + hh * sx2 + ww * sx3, mask=mask, other=0.0).to(tl.float32)",
        "    wv = tl.load(w_ptr + ch, mask=mask, other=0.0).to(tl.float32) if HAS_W else 1.0",
        "    bv = tl.load(b_ptr + ch, mask=mask, other=0.0).to(tl.float32) if HAS_B else 0.0",
    )
    k.indent = 2
    helpers: set[str] = set()
    rounded, needed = round_to(plan.program.dtype, "(xv - mean) * rstd * wv + bv")
    helpers.update(needed)
    k(f"v{i} = {rounded}")
    _epilogue(plan, group, k, helpers, x_value, ["nb", "ch", "hh", "ww"])
    for o in outs:
        k(f"tl.store(v{o}_ptr + (nb * C + ch) * H * W + hh * W + ww, v{o}.to(DT), mask=mask)")
    # Rank-3 (N, C, L) inputs are handled as (N, C, 1, L): a unit height with stride 0.
    dims = f"{x}.shape[1], {x}.shape[2], {x}.shape[3]" if rank == 4 else f"{x}.shape[1], 1, {x}.shape[2]"
    strides = f"*{x}.stride()" if rank == 4 else f"{x}.stride(0), {x}.stride(1), 0, {x}.stride(2)"
    weight, bias = plan.tensor(i, "weight"), plan.tensor(i, "bias")
    call = [x, weight or x, bias or x] + [value_name(r, n_in) for r in ext]
    call += [value_name(o, n_in) for o in outs] + [f"{x}.shape[0] * {groups}", dims, strides]
    for r in ext:
        ename = value_name(r, n_in)
        call.append(f"*{ename}.stride()" if rank == 4 else f"{ename}.stride(0), {ename}.stride(1), 0, {ename}.stride(2)")
    call += [f"ON_CPU=not {x}.is_cuda", f"G={groups}", f"HAS_W={weight is not None}", f"HAS_B={bias is not None}"]
    launch = [
        # a block no longer than one group's elements (the interpreter computes masked lanes too);
        # on the CPU many groups per program, on a GPU one
        f"_L = max(1, _numel({x}.shape[1:]) // {groups})",
        f"_block = min(1024 if {x}.is_cuda else 16384, triton.next_power_of_2(_L))",
        f"_gb = 1 if {x}.is_cuda else max(1, min(triton.next_power_of_2({x}.shape[0] * {groups}), 16384 // _block))",
        f"{name}[(max(1, triton.cdiv({x}.shape[0] * {groups}, _gb)),)]({', '.join(call)}, GB=_gb, BLOCK=_block)",
    ]
    return Kernel(name, k.text(), launch, helpers)

"""conv2d as an implicit GEMM (tl.dot over im2col tiles gathered on the fly, never materialised)
and 2-D max/avg pooling, each with a fused elementwise epilogue. NCHW, any input strides.

conv2d: rows are output pixels (n, oh, ow), columns output channels of one group, the reduction
runs over (c, kh, kw) of that group; padding is a masked load. Pooling: one program per block of
output elements, the window unrolled (its size is a compile-time constant).
"""

from __future__ import annotations

from plugins.coders.expert_lowering.codegen import Kernel, Lines, value_name
from plugins.coders.expert_lowering.errors import Unsupported
from plugins.coders.expert_lowering.matmul_kernels import GPU_CONFIGS
from plugins.coders.expert_lowering.plan import Group, Plan
from plugins.coders.expert_lowering.pointwise import round_to

CONV_PARAMS = {"out_channels", "kernel_size", "stride", "padding", "dilation", "groups"}
CONV_T_PARAMS = {"out_channels", "kernel_size", "stride", "padding", "output_padding", "dilation"}
POOL_PARAMS = {"kernel_size", "stride", "padding"}


def _ints(node, names) -> dict[str, int]:
    out = {}
    for key in names:
        value = node.params.get(key)
        if not isinstance(value, int) or isinstance(value, bool):
            raise Unsupported(f"{node.op}: parameter {key}={value!r} is not a single integer")
        out[key] = value
    extra = set(node.params) - set(names)
    if extra:
        raise Unsupported(f"{node.op}: parameters {sorted(extra)} are not understood by the expert lowering")
    return out


def _epilogue(plan: Plan, group: Group, k: Lines, helpers: set[str], operand: int | set[int],
              out_idx: list[str]) -> list[int]:
    """Load epilogue operands at the output position and emit the fused elementwise nodes.

    ``operand``: the anchor op's own operand value(s), loaded by the anchor, not by the epilogue
    (unless an epilogue node reads them too)."""
    from plugins.coders.expert_lowering.elementwise_kernels import _node_lines

    operands = operand if isinstance(operand, set) else {operand}
    epilogue = [v for v in group.nodes if v != group.anchor]
    ext = [r for r in group.reads if r not in operands or any(r in plan.node(v).args for v in epilogue)]
    for r in ext:
        off = " + ".join(f"{i} * v{r}_s{d}" for d, i in enumerate(out_idx))
        k(f"v{r} = tl.load(v{r}_ptr + {off}, mask=mask, other=0.0).to(tl.float32)")
    for v in epilogue:
        _node_lines(plan, v, k, helpers, row_group=False)
    return ext


def conv_kernel(plan: Plan, group: Group, index: int) -> Kernel:
    n_in = len(plan.program.inputs)
    i = group.anchor
    node = plan.node(i)
    transposed = node.op == "conv_transpose2d"
    p = _ints(node, CONV_T_PARAMS if transposed else CONV_PARAMS)
    p.setdefault("groups", 1)
    x_value = node.args[0]
    x = value_name(x_value, n_in)
    epilogue = [v for v in group.nodes if v != i]
    ext = [r for r in group.reads if r != x_value or any(r in plan.node(v).args for v in epilogue)]
    outs = group.outputs
    name = f"_conv_{index}"
    # conv2d gathers input pixel (oh*S - P + kh*D); the transposed conv gathers the pixel that
    # scatters into oh: ih = (oh + P - kh*D) / S when that divides exactly. Weights are
    # (OC, C/G, k, k) for conv2d and (C, OC, k, k) for the transposed conv.
    if transposed:
        gather = [
            "    th = oh[:, None] + PAD - kh[None, :] * DIL",
            "    tw = ow[:, None] + PAD - kw[None, :] * DIL",
            "    ih = th // STRIDE",
            "    iw = tw // STRIDE",
            "    valid = (th >= 0) & (tw >= 0) & (th % STRIDE == 0) & (tw % STRIDE == 0) & (ih < H) & (iw < W)",
        ]
        w_offset = "(kk // (KS * KS))[:, None] * sw0 + oc[None, :] * sw1"
    else:
        gather = [
            "    ih = ih0[:, None] + kh[None, :] * DIL",
            "    iw = iw0[:, None] + kw[None, :] * DIL",
            "    valid = (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)",
        ]
        w_offset = "oc[None, :] * sw0 + (kk // (KS * KS))[:, None] * sw1"
    dtype = plan.program.dtype
    params = ["x_ptr", "w_ptr", "bias_ptr"] + [f"v{r}_ptr" for r in ext] + [f"v{o}_ptr" for o in outs]
    params += ["NB", "C", "H", "W", "OC", "OH", "OW", "sx0", "sx1", "sx2", "sx3", "sw0", "sw1", "sw2", "sw3"]
    for r in ext:
        params += [f"v{r}_s{d}" for d in range(4)]
    params += ["ON_CPU: tl.constexpr", "KS: tl.constexpr", "STRIDE: tl.constexpr", "PAD: tl.constexpr",
               "DIL: tl.constexpr", "GROUPS: tl.constexpr", "BM: tl.constexpr", "BN: tl.constexpr",
               "BK: tl.constexpr", "GROUP_M: tl.constexpr"]
    precision = ', input_precision="ieee"' if dtype == "float32" else ""
    k = Lines()
    k("@triton.jit", f"def {name}({', '.join(params)}):")
    k.indent = 1
    k(
        f"DT = v{outs[0]}_ptr.dtype.element_ty",
        "pid = tl.program_id(0)",
        "g = tl.program_id(1)",
        "CG = C // GROUPS",
        "OCG = OC // GROUPS",
        "M = NB * OH * OW",
        "KTOT = CG * KS * KS",
        "num_m = tl.cdiv(M, BM)",
        "num_n = tl.cdiv(OCG, BN)",
        "group_size = GROUP_M * num_n",
        "first_m = (pid // group_size) * GROUP_M",
        "rows_in_group = tl.minimum(num_m - first_m, GROUP_M)",
        "pm = first_m + (pid % group_size) % rows_in_group",
        "pn = (pid % group_size) // rows_in_group",
        "rm = pm * BM + tl.arange(0, BM)",
        "rj = pn * BN + tl.arange(0, BN)",
        "mask_m = rm < M",
        "mask_n = rj < OCG",
        "ow = rm % OW",
        "oh = (rm // OW) % OH",
        "nb = (rm // (OW * OH)).to(tl.int64)",
        "oc = g * OCG + rj",
        "ih0 = oh * STRIDE - PAD",
        "iw0 = ow * STRIDE - PAD",
        "rk = tl.arange(0, BK)",
        "acc = tl.zeros((BM, BN), dtype=tl.float32)",
        "for k0 in range(0, KTOT, BK):",
        "    kk = k0 + rk",
        "    kw = kk % KS",
        "    kh = (kk // KS) % KS",
        "    c = g * CG + kk // (KS * KS)",
        *gather,
        "    a_mask = mask_m[:, None] & (kk[None, :] < KTOT) & valid",
        "    a = tl.load(x_ptr + nb[:, None] * sx0 + c[None, :] * sx1 + ih * sx2 + iw * sx3, mask=a_mask, other=0.0)",
        "    b_mask = (kk[:, None] < KTOT) & mask_n[None, :]",
        f"    b = tl.load(w_ptr + {w_offset} + kh[:, None] * sw2 + kw[:, None] * sw3, mask=b_mask, other=0.0)",
        "    if ON_CPU:",
        "        acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision=\"ieee\")",
        "    else:",
        f"        acc = tl.dot(a, b, acc{precision})",
        "mask = mask_m[:, None] & mask_n[None, :]",
        "acc = acc + tl.load(bias_ptr + oc, mask=mask_n, other=0.0).to(tl.float32)[None, :]",
    )
    helpers: set[str] = set()
    rounded, needed = round_to(dtype, "acc")
    helpers.update(needed)
    k(f"v{i} = {rounded}")
    out_idx = ["nb[:, None]", "oc[None, :]", "oh[:, None]", "ow[:, None]"]
    _epilogue(plan, group, k, helpers, x_value, out_idx)
    for o in outs:
        k(f"tl.store(v{o}_ptr + ((nb[:, None] * OC + oc[None, :]) * OH + oh[:, None]) * OW + ow[:, None], "
          f"v{o}.to(DT), mask=mask)")
    call = [x, f"self.m{i}.weight", f"self.m{i}.bias"] + [value_name(r, n_in) for r in ext]
    call += [value_name(o, n_in) for o in outs]
    call += [f"*{x}.shape", f"s{i}[1]", f"s{i}[2]", f"s{i}[3]", f"*{x}.stride()", f"*self.m{i}.weight.stride()"]
    call += [f"*{value_name(r, n_in)}.stride()" for r in ext]
    call += [f"ON_CPU=not {x}.is_cuda", f"KS={p['kernel_size']}", f"STRIDE={p['stride']}", f"PAD={p['padding']}",
             f"DIL={p['dilation']}", f"GROUPS={p['groups']}"]
    joined = ", ".join(call)
    g = p["groups"]
    launch = [
        f"_M{i} = s{i}[0] * s{i}[2] * s{i}[3]",
        f"_OCG{i} = s{i}[1] // {g}",
        f"if {x}.is_cuda:",
        f"    {name}_tuned[lambda META: (max(1, triton.cdiv(_M{i}, META['BM']) * triton.cdiv(_OCG{i}, META['BN'])), {g})]({joined})",
        "else:",
        f"    _bm = min(64, max(16, triton.next_power_of_2(_M{i})))",
        f"    _bn = min(64, max(16, triton.next_power_of_2(_OCG{i})))",
        f"    _bk = min(64, max(16, triton.next_power_of_2({x}.shape[1] // {g} * {p['kernel_size'] ** 2})))",
        f"    {name}[(max(1, triton.cdiv(_M{i}, _bm) * triton.cdiv(_OCG{i}, _bn)), {g})]({joined}, BM=_bm, BN=_bn, BK=_bk, GROUP_M=8)",
    ]
    configs = ", ".join(
        f"triton.Config({{'BM': {bm}, 'BN': {bn}, 'BK': {bk}, 'GROUP_M': {gm}}}, num_warps={w}, num_stages={st})"
        for bm, bn, bk, gm, w, st in GPU_CONFIGS
    )
    tuned = (f"\n{name}_tuned = triton.autotune(configs=[{configs}], key=['NB', 'C', 'H', 'W', 'OC'])({name}) "
             f"if torch.cuda.is_available() else None\n")
    return Kernel(name, k.text() + tuned, launch, helpers)


def pool_kernel(plan: Plan, group: Group, index: int) -> Kernel:
    n_in = len(plan.program.inputs)
    i = group.anchor
    node = plan.node(i)
    p = _ints(node, POOL_PARAMS)
    x_value = node.args[0]
    x = value_name(x_value, n_in)
    epilogue = [v for v in group.nodes if v != i]
    ext = [r for r in group.reads if r != x_value or any(r in plan.node(v).args for v in epilogue)]
    outs = group.outputs
    is_max = node.op == "max_pool2d"
    name = f"_pool_{index}"
    params = ["x_ptr"] + [f"v{r}_ptr" for r in ext] + [f"v{o}_ptr" for o in outs]
    params += ["numel", "H", "W", "C", "OH", "OW", "sx0", "sx1", "sx2", "sx3"]
    for r in ext:
        params += [f"v{r}_s{d}" for d in range(4)]
    params += ["ON_CPU: tl.constexpr", "KS: tl.constexpr", "STRIDE: tl.constexpr", "PAD: tl.constexpr",
               "BLOCK: tl.constexpr", "IDX64: tl.constexpr"]
    k = Lines()
    k("@triton.jit", f"def {name}({', '.join(params)}):")
    k.indent = 1
    k(
        f"DT = v{outs[0]}_ptr.dtype.element_ty",
        "pid = tl.program_id(0)",
        "if IDX64:",
        "    pid = pid.to(tl.int64)",
        "offs = pid * BLOCK + tl.arange(0, BLOCK)",
        "mask = offs < numel",
        "ow = offs % OW",
        "oh = (offs // OW) % OH",
        "ch = (offs // (OW * OH)) % C",
        "nb = offs // (OW * OH * C)",
        "base = nb * sx0 + ch * sx1",
        "acc = tl.full((BLOCK,), float('-inf') if IS_MAX else 0.0, tl.float32)".replace(
            "float('-inf') if IS_MAX else 0.0", "float('-inf')" if is_max else "0.0"),
        "nan = tl.zeros((BLOCK,), dtype=tl.int32)",
        "for kh in tl.static_range(KS):",
        "    for kw in tl.static_range(KS):",
        "        ih = oh * STRIDE - PAD + kh",
        "        iw = ow * STRIDE - PAD + kw",
        "        ok = mask & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)",
    )
    if is_max:
        k(
            "        v = tl.load(x_ptr + base + ih * sx2 + iw * sx3, mask=ok, other=float('-inf')).to(tl.float32)",
            "        nan = nan | (v != v).to(tl.int32)",
            "        acc = tl.maximum(acc, v)",
            f"v{i} = tl.where(nan > 0, float('nan'), acc)",
        )
    else:
        k(
            "        v = tl.load(x_ptr + base + ih * sx2 + iw * sx3, mask=ok, other=0.0).to(tl.float32)",
            "        acc = acc + v",
            f"v{i} = acc / (KS * KS)",
        )
    helpers: set[str] = set()
    rounded, needed = round_to(plan.program.dtype, f"v{i}")
    helpers.update(needed)
    if rounded != f"v{i}":
        k(f"v{i} = {rounded}")
    _epilogue(plan, group, k, helpers, x_value, ["nb", "ch", "oh", "ow"])
    for o in outs:
        k(f"tl.store(v{o}_ptr + offs, v{o}.to(DT), mask=mask)")
    first = value_name(outs[0], n_in)
    call = [x] + [value_name(r, n_in) for r in ext] + [value_name(o, n_in) for o in outs]
    call += [f"{first}.numel()", f"{x}.shape[2]", f"{x}.shape[3]", f"{x}.shape[1]", f"s{i}[2]", f"s{i}[3]",
             f"*{x}.stride()"]
    call += [f"*{value_name(r, n_in)}.stride()" for r in ext]
    call += [f"ON_CPU=not {x}.is_cuda", f"KS={p['kernel_size']}", f"STRIDE={p['stride']}", f"PAD={p['padding']}",
             f"IDX64=_idx64({', '.join([x] + [value_name(r, n_in) for r in ext] + [value_name(o, n_in) for o in outs])})"]
    launch = [
        f"_block = 1024 if {x}.is_cuda else 16384",
        f"{name}[(max(1, triton.cdiv({first}.numel(), _block)),)]({', '.join(call)}, BLOCK=_block)",
    ]
    return Kernel(name, k.text(), launch, helpers)

"""Convolutions over 1, 2 or 3 spatial dims as an implicit GEMM (tl.dot over im2col tiles gathered
on the fly, never materialised), and max/avg pooling, each with a fused elementwise epilogue.
Channels first, any input strides, per-axis kernel, stride, padding and dilation.

Every kernel works on a 3-D spatial index space ``(D, H, W)``: a 1-D or 2-D op is the same kernel
with unit leading spatial dims (size 1, stride 0), folded away at compile time (they are constexpr).

conv: rows are output positions (n, od, oh, ow), columns output channels of one group, the
reduction runs over (c, kd, kh, kw) of that group; padding is a masked load. The transposed conv
gathers the input position that scatters into each output position, where ``(o + P - k*D)``
divides by the stride. Pooling: one program per block of output elements, the window unrolled.

A depthwise convolution (groups = input channels, one input channel per output channel, any channel
multiplier) is a direct kernel like pooling's, the window unrolled and weighted, one output element per lane: as a
GEMM its reduction is only the window (9 for 3x3), under one tile, and ran at 0.02x cuDNN on an H100 (2026-12-07).

Two faster forms of the ungrouped 2-D convolution (``conv2d``, groups=1), the ResNet shapes:

* a 1x1, stride-1, unpadded conv whose output plane is a multiple of 8 elements is a batched GEMM
  on the NCHW tensors themselves, ``out[n] = W @ x[n]`` (M = out channels, N = H*W, K = channels):
  both operands are read along their contiguous dim, so the loads vectorise and pipeline;
* any other conv2d is an implicit GEMM over channels-last copies of the input and the weight
  (``_channels_last``: one tiled transpose kernel each, coalesced on both sides): the reduction
  runs over (kh, kw, channel block), so each step's A tile is one contiguous run of channels per
  output row, its padding mask one bit per row, and the weight tile is contiguous too.
"""

from __future__ import annotations

import math

from plugins.coders.expert_lowering.codegen import FLAT_BLOCK_LINES, Kernel, Lines, value_name
from plugins.coders.expert_lowering.errors import Unsupported
from plugins.coders.expert_lowering.plan import Group, Plan
from plugins.coders.expert_lowering.pointwise import round_to
from plugins.coders.expert_lowering.tiling import (NARROW_N, autotune_source, dot_lines, gemm_configs,
                                                   grouped_tile_lines)

CONV_PARAMS = {"out_channels", "kernel_size", "stride", "padding", "dilation", "groups", "bias"}
CONV_T_PARAMS = CONV_PARAMS | {"output_padding"}
POOL_PARAMS = {"kernel_size", "stride", "padding"}
MAX_POOL_PARAMS = POOL_PARAMS | {"dilation"}

# Python helper every conv/pool launch uses: (N, C, *spatial) as (N, C, D, H, W).
PAD5_HELPER = '''def _pad5(values, fill):
    """Sizes or strides of (N, C, *spatial) padded to three spatial dims in front (size 1, stride 0)."""
    values = tuple(values)
    return values[:2] + (fill,) * (5 - len(values)) + values[2:]
'''


def _axes(node, key: str, n: int, default: int | None) -> tuple[int, int, int]:
    """One integer per spatial axis, padded in front to three axes with the neutral value."""
    value = node.params.get(key, default)
    if value is None and key == "stride":
        value = node.params["kernel_size"]  # pooling: the stride defaults to the window
    values = tuple(value) if isinstance(value, (list, tuple)) else (value,) * n
    if len(values) != n or any(not isinstance(v, int) or isinstance(v, bool) for v in values):
        raise Unsupported(f"{node.op}: parameter {key}={value!r} is not one integer per spatial axis")
    neutral = {"kernel_size": 1, "stride": 1, "dilation": 1, "padding": 0, "output_padding": 0}[key]
    return (neutral,) * (3 - n) + values


def _check(node, allowed: set[str]) -> None:
    extra = set(node.params) - allowed
    if extra:
        raise Unsupported(f"{node.op}: parameters {sorted(extra)} are not understood by the expert lowering")


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


def _out_index(rank: int, rows: str, cols: str | None) -> list[str]:
    """Index expressions of (nb, channel, *spatial) for an output of ``rank`` (spatial from the back)."""
    spatial = [f"oz{rows}", f"oh{rows}", f"ow{rows}"][5 - rank:]
    return [f"nb{rows}", f"oc{cols}" if cols is not None else "ch"] + spatial


def conv_kernel(plan: Plan, group: Group, index: int) -> Kernel:
    n_in = len(plan.program.inputs)
    i = group.anchor
    node = plan.node(i)
    transposed = node.op.startswith("conv_transpose")
    _check(node, CONV_T_PARAMS if transposed else CONV_PARAMS)
    x_value = node.args[0]
    rank = len(plan.shapes[x_value])
    if rank not in (3, 4, 5):
        raise Unsupported(f"{node.op} of a rank-{rank} input")
    n = rank - 2
    ks, st, pad, dil = (_axes(node, key, n, d) for key, d in
                        (("kernel_size", None), ("stride", 1), ("padding", 0), ("dilation", 1)))
    groups = node.params.get("groups", 1)
    if not isinstance(groups, int) or groups < 1:
        raise Unsupported(f"{node.op}: groups={groups!r}")
    x = value_name(x_value, n_in)
    weight = plan.tensor(i, "weight")
    bias = plan.tensor(i, "bias") if node.params.get("bias", True) else None
    if weight is None:
        raise Unsupported(f"{node.op} without a weight tensor")
    if not transposed and groups > 1 and groups == plan.shapes[x_value][1]:
        return _depthwise_kernel(plan, group, index, x, weight, bias, (ks, st, pad, dil))
    if not transposed and rank == 4 and groups == 1:
        nb_, c_, h_, w_ = plan.shapes[x_value]
        if ks[1:] == (1, 1) and st[1:] == (1, 1) and pad[1:] == (0, 0) and (h_ * w_) % 8 == 0 and nb_ <= 65535:
            return _conv1x1_kernel(plan, group, index, x, weight, bias)
        if nb_ <= 65535:
            return _conv2d_nhwc_kernel(plan, group, index, x, weight, bias, ks[1:], st[1:], pad[1:], dil[1:])
    epilogue = [v for v in group.nodes if v != i]
    ext = [r for r in group.reads if r != x_value or any(r in plan.node(v).args for v in epilogue)]
    outs = group.outputs
    name = f"_conv_{index}"
    axes = ("z", "h", "w")  # depth is "z": "id" would read as Python's builtin
    if transposed:
        # the input position that scatters into o along an axis: (o + P - k*D) / S, when it divides
        gather = []
        for a, up in zip(axes, "DHW"):
            gather += [f"    t{a} = o{a}[:, None] + P{up} - k{a}[None, :] * D{up}",
                       f"    i{a} = t{a} // S{up}"]
        gather.append("    valid = " + " & ".join(
            f"(t{a} >= 0) & (t{a} % S{up} == 0) & (i{a} < I{up})" for a, up in zip(axes, "DHW")))
        w_offset = "c[:, None] * sw0 + rj[None, :] * sw1"
    else:
        gather = [f"    i{a} = (o{a} * S{up} - P{up})[:, None] + k{a}[None, :] * D{up}" for a, up in zip(axes, "DHW")]
        gather.append("    valid = " + " & ".join(f"(i{a} >= 0) & (i{a} < I{up})" for a, up in zip(axes, "DHW")))
        w_offset = "oc[None, :] * sw0 + cl[:, None] * sw1"
    dtype = plan.program.dtype
    params = ["x_ptr", "w_ptr", "bias_ptr"] + [f"v{r}_ptr" for r in ext] + [f"v{o}_ptr" for o in outs]
    params += ["NB", "C", "ID", "IH", "IW", "OC", "OD", "OH", "OW"]
    params += [f"sx{d}" for d in range(5)] + [f"sw{d}" for d in range(5)]
    for r in ext:
        params += [f"v{r}_s{d}" for d in range(rank)]
    params += ["ON_CPU: tl.constexpr"] + [f"{p}{up}: tl.constexpr" for p in "KSPD" for up in "DHW"]
    params += ["GROUPS: tl.constexpr", "HAS_BIAS: tl.constexpr", "BM: tl.constexpr", "BN: tl.constexpr",
               "BK: tl.constexpr", "GROUP_M: tl.constexpr"]
    k = Lines()
    k("@triton.jit", f"def {name}({', '.join(params)}):")
    k.indent = 1
    k(
        f"DT = v{outs[0]}_ptr.dtype.element_ty",
        "pid = tl.program_id(0)",
        "g = tl.program_id(1)",
        "CG = C // GROUPS",
        "OCG = OC // GROUPS",
        "M = NB * OD * OH * OW",
        "KVOL = KD * KH * KW",
        "KTOT = CG * KVOL",
        *grouped_tile_lines("OCG", "rj"),
        "mask_m = rm < M",
        "mask_n = rj < OCG",
        "ow = rm % OW",
        "oh = (rm // OW) % OH",
        "oz = (rm // (OW * OH)) % OD",
        "nb = (rm // (OW * OH * OD)).to(tl.int64)",
        "oc = g * OCG + rj",
        "rk = tl.arange(0, BK)",
        "acc = tl.zeros((BM, BN), dtype=tl.float32)",
        "for k0 in range(0, KTOT, BK):",
        "    kk = k0 + rk",
        "    kw = kk % KW",
        "    kh = (kk // KW) % KH",
        "    kz = (kk // (KW * KH)) % KD",
        "    cl = kk // KVOL",
        "    c = g * CG + cl",
        *gather,
        "    a_mask = mask_m[:, None] & (kk[None, :] < KTOT) & valid",
        "    a = tl.load(x_ptr + nb[:, None] * sx0 + c[None, :] * sx1 + iz * sx2 + ih * sx3 + iw * sx4, "
        "mask=a_mask, other=0.0)",
        "    b_mask = (kk[:, None] < KTOT) & mask_n[None, :]",
        f"    b = tl.load(w_ptr + {w_offset} + kz[:, None] * sw2 + kh[:, None] * sw3 + kw[:, None] * sw4, "
        "mask=b_mask, other=0.0)",
        *dot_lines(dtype),
        "mask = mask_m[:, None] & mask_n[None, :]",
        "if HAS_BIAS:",
        "    acc = acc + tl.load(bias_ptr + oc, mask=mask_n, other=0.0).to(tl.float32)[None, :]",
    )
    helpers: set[str] = {"_pad5"}
    rounded, needed = round_to(dtype, "acc")
    helpers.update(needed)
    k(f"v{i} = {rounded}")
    _epilogue(plan, group, k, helpers, x_value, _out_index(rank, "[:, None]", "[None, :]"))
    for o in outs:
        k(f"tl.store(v{o}_ptr + (((nb[:, None] * OC + oc[None, :]) * OD + oz[:, None]) * OH + oh[:, None]) * OW "
          f"+ ow[:, None], v{o}.to(DT), mask=mask)")
    call = [x, weight, bias or x] + [value_name(r, n_in) for r in ext] + [value_name(o, n_in) for o in outs]
    call += [f"*_pad5({x}.shape, 1)", f"s{i}[1]", f"*_pad5(s{i}, 1)[2:]", f"*_pad5({x}.stride(), 0)",
             f"*_pad5({weight}.stride(), 0)"]
    call += [f"*{value_name(r, n_in)}.stride()" for r in ext]
    call += [f"ON_CPU=not {x}.is_cuda"]
    call += [f"{p}{up}={v}" for p, values in zip("KSPD", (ks, st, pad, dil)) for up, v in zip("DHW", values)]
    call += [f"GROUPS={groups}", f"HAS_BIAS={bias is not None}"]
    joined = ", ".join(call)
    kvol = ks[0] * ks[1] * ks[2]
    launch = [
        f"_M{i} = _numel(_pad5(s{i}, 1)[2:]) * s{i}[0]",
        f"_OCG{i} = s{i}[1] // {groups}",
        f"if {x}.is_cuda:",
        f"    {name}_tuned[lambda META: (max(1, triton.cdiv(_M{i}, META['BM']) * triton.cdiv(_OCG{i}, META['BN'])), "
        f"{groups})]({joined})",
        "else:",
        # the interpreter pays per program and per op, not per element: few, large tiles
        f"    _bm = min(2048, max(16, triton.next_power_of_2(_M{i})))",
        f"    _bn = min(128, max(16, triton.next_power_of_2(_OCG{i})))",
        f"    _bk = min(256, max(16, triton.next_power_of_2({x}.shape[1] // {groups} * {kvol})))",
        f"    {name}[(max(1, triton.cdiv(_M{i}, _bm) * triton.cdiv(_OCG{i}, _bn)), {groups})]({joined}, "
        "BM=_bm, BN=_bn, BK=_bk, GROUP_M=8)",
    ]
    out_shape = plan.shapes[i]
    gemm = (out_shape[0] * math.prod(out_shape[2:]), out_shape[1] // groups, groups)  # (M, N per group, groups)
    # wider outputs keep every config (those of the H200 run of 2026-12-07); narrow ones get narrow tiles
    tuned = autotune_source(name, dtype, ["NB", "C", "ID", "IH", "IW", "OC"], gemm if gemm[1] <= NARROW_N else None)
    return Kernel(name, k.text() + tuned, launch, helpers)


CHANNELS_LAST_HELPER = '''@triton.jit
def _nchw_to_nhwc(x_ptr, y_ptr, C, HW, W, sx0, sx1, sx2, sx3, FLAT: tl.constexpr, BP: tl.constexpr,
                  BC: tl.constexpr):
    # y[n, p, c] (contiguous) <- x[n, c, p]: loads run along p, stores along c (Triton moves the tile
    # through shared memory between the two layouts)
    n = tl.program_id(2).to(tl.int64)
    pp = tl.program_id(0) * BP + tl.arange(0, BP)
    cc = tl.program_id(1) * BC + tl.arange(0, BC)
    mask = (pp < HW)[:, None] & (cc < C)[None, :]
    if FLAT:
        src = x_ptr + n * sx0 + cc[None, :] * sx1 + pp[:, None]
    else:
        src = x_ptr + n * sx0 + cc[None, :] * sx1 + ((pp // W) * sx2 + (pp % W) * sx3)[:, None]
    v = tl.load(src, mask=mask)
    tl.store(y_ptr + n * HW * C + pp[:, None] * C + cc[None, :], v, mask=mask)


def _channels_last(x):
    """A contiguous (N, H, W, C) copy of the (N, C, H, W) tensor ``x`` (any strides), by one kernel."""
    n, c, h, w = x.shape
    y = torch.empty((n, h, w, c), device=x.device, dtype=x.dtype)
    if y.numel() == 0:
        return y
    flat = x.stride(3) == 1 and (h == 1 or x.stride(2) == w)
    if x.is_cuda:
        bp, bc = 64, 64
    else:  # the interpreter pays per program: few, large tiles
        bp, bc = min(4096, max(16, triton.next_power_of_2(h * w))), min(256, max(16, triton.next_power_of_2(c)))
    grid = (triton.cdiv(h * w, bp), triton.cdiv(c, bc), n)
    _nchw_to_nhwc[grid](x, y, c, h * w, w, *x.stride(), FLAT=flat, BP=bp, BC=bc)
    return y


def _plane_rows(x):
    """``x`` (N, C, H, W) if each (n, c) plane is one contiguous run of H*W elements, else such a copy."""
    n, c, h, w = x.shape
    if x.stride(3) == 1 and (h == 1 or x.stride(2) == w):
        return x
    y = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    if y.numel() == 0:
        return y
    block = 1024 if x.is_cuda else 16384
    _strided_copy[(triton.cdiv(x.numel(), block),)](x, y, x.numel(), 1, n, c, h, w, 0, 0, *x.stride(), BLOCK=block)
    return y
'''


def _grouped_tiles(k: Lines) -> None:
    """pm, pn of this program in GROUP_M-grouped order over an M x N grid of BM x BN tiles."""
    k(*grouped_tile_lines(),
      "mask_m = rm < M",
      "mask_n = rn < N",
      "rk = tl.arange(0, BK)",
      "acc = tl.zeros((BM, BN), dtype=tl.float32)")


def _conv_epilogue_and_store(plan: Plan, group: Group, k: Lines, x_value: int, out_idx: list[str],
                             store_offset: str) -> tuple[set[str], list[int]]:
    dtype = plan.program.dtype
    helpers: set[str] = {"_pad5"}
    rounded, needed = round_to(dtype, "acc")
    helpers.update(needed)
    k(f"v{group.anchor} = {rounded}")
    ext = _epilogue(plan, group, k, helpers, x_value, out_idx)
    for o in group.outputs:
        k(f"tl.store(v{o}_ptr + {store_offset}, v{o}.to(DT), mask=mask)")
    return helpers, ext


def _gemm_conv_head(plan: Plan, group: Group, index: int) -> tuple[int, int, int, list[int], list[int], str, list[str]]:
    """What both GEMM forms of conv2d start from: the input count, the anchor, its input value, the
    epilogue's extra reads, the outputs, the kernel's name and its pointer parameters."""
    i = group.anchor
    x_value = plan.node(i).args[0]
    epilogue = [v for v in group.nodes if v != i]
    ext = [r for r in group.reads if r != x_value or any(r in plan.node(v).args for v in epilogue)]
    params = ["x_ptr", "w_ptr", "bias_ptr"] + [f"v{r}_ptr" for r in ext] + [f"v{o}_ptr" for o in group.outputs]
    return len(plan.program.inputs), i, x_value, ext, group.outputs, f"_conv_{index}", params


def _conv1x1_kernel(plan: Plan, group: Group, index: int, x: str, weight: str, bias: str | None) -> Kernel:
    """1x1 stride-1 unpadded conv2d as ``out[n] = W @ x[n]`` on the NCHW tensors (module docstring)."""
    n_in, i, x_value, ext, outs, name, params = _gemm_conv_head(plan, group, index)
    params += ["M", "N", "K", "BATCH", "OW", "sxn", "sxc", "swo", "swc"]
    for r in ext:
        params += [f"v{r}_s{d}" for d in range(4)]
    params += ["ON_CPU: tl.constexpr", "HAS_BIAS: tl.constexpr", "BM: tl.constexpr", "BN: tl.constexpr",
               "BK: tl.constexpr", "GROUP_M: tl.constexpr"]
    k = Lines()
    k("@triton.jit", f"def {name}({', '.join(params)}):")
    k.indent = 1
    k("# out[b, m, n] = sum_k w[m, k] * x[b, k, n]: m an output channel, n a pixel, k an input channel",
      f"DT = v{outs[0]}_ptr.dtype.element_ty",
      "pid = tl.program_id(0)",
      "bid = tl.program_id(1).to(tl.int64)")
    _grouped_tiles(k)
    k(
        "x_base = x_ptr + bid * sxn",
        "for k0 in range(0, K, BK):",
        "    kk = k0 + rk",
        "    a = tl.load(w_ptr + rm[:, None] * swo + kk[None, :] * swc, mask=mask_m[:, None] & (kk[None, :] < K), "
        "other=0.0)",
        "    b = tl.load(x_base + kk[:, None] * sxc + rn[None, :], mask=(kk[:, None] < K) & mask_n[None, :], other=0.0)",
        *dot_lines(plan.program.dtype),
        "mask = mask_m[:, None] & mask_n[None, :]",
        "if HAS_BIAS:",
        "    acc = acc + tl.load(bias_ptr + rm, mask=mask_m, other=0.0).to(tl.float32)[:, None]",
        "nb = bid",
        "oc = rm",
        "oh = rn // OW",
        "ow = rn % OW",
    )
    helpers, _ = _conv_epilogue_and_store(plan, group, k, x_value, ["nb", "oc[:, None]", "oh[None, :]", "ow[None, :]"],
                                          "bid * M * N + rm[:, None] * N + rn[None, :]")
    helpers |= {"_channels_last", "_strided_copy"}
    call = [f"_xr{i}", weight, bias or f"_xr{i}"] + [value_name(r, n_in) for r in ext] + \
        [value_name(o, n_in) for o in outs]
    call += [f"s{i}[1]", f"s{i}[2] * s{i}[3]", f"_xr{i}.shape[1]", f"s{i}[0]", f"s{i}[3]",
             f"_xr{i}.stride(0)", f"_xr{i}.stride(1)", f"{weight}.stride(0)", f"{weight}.stride(1)"]
    call += [f"*{value_name(r, n_in)}.stride()" for r in ext]
    call += [f"ON_CPU=not {x}.is_cuda", f"HAS_BIAS={bias is not None}"]
    joined = ", ".join(call)
    launch = [
        f"_xr{i} = _plane_rows({x})",
        f"if {x}.is_cuda:",
        f"    {name}_tuned[lambda META: (max(1, triton.cdiv(s{i}[1], META['BM']) * triton.cdiv(s{i}[2] * s{i}[3], "
        f"META['BN'])), max(1, s{i}[0]))]({joined})",
        "else:",
        f"    _bm, _bn, _bk = (min(c, max(16, triton.next_power_of_2(d))) for c, d in zip((256, 1024, 128), "
        f"(s{i}[1], s{i}[2] * s{i}[3], _xr{i}.shape[1])))",
        f"    {name}[(max(1, triton.cdiv(s{i}[1], _bm) * triton.cdiv(s{i}[2] * s{i}[3], _bn)), max(1, s{i}[0]))]"
        f"({joined}, BM=_bm, BN=_bn, BK=_bk, GROUP_M=8)",
    ]
    nb_, oc_, oh_, ow_ = plan.shapes[i]
    tuned = autotune_source(name, plan.program.dtype, ["M", "N", "K", "BATCH"], (oc_, oh_ * ow_, nb_))
    return Kernel(name, k.text() + tuned, launch, helpers)


# The reduction loop of the channels-last conv2d: per (kh, kw), a block of BK channels (a tile row is one
# contiguous run of channels).
_CHANNEL_BLOCK_LOOP = (
    "CB = tl.cdiv(C, BK)",
    "for t in range(0, KH * KW * CB):",
    "    kpos = t // CB",
    "    c = (t - kpos * CB) * BK + rk",
    "    kh = kpos // KW",
    "    kw = kpos - kh * KW",
    "    ih = ih0 + kh * DH",
    "    iw = iw0 + kw * DW",
    "    ok = mask_m & (ih >= 0) & (ih < IH) & (iw >= 0) & (iw < IW)",
    "    c_ok = c < C",
    "    a = tl.load((x_rows + ih * sxh + iw * sxw)[:, None] + c[None, :], mask=ok[:, None] & c_ok[None, :], "
    "other=0.0)",
    "    b = tl.load(w_ptr + kh * swh + kw * sww + rn[None, :] * swo + c[:, None], "
    "mask=c_ok[:, None] & mask_n[None, :], other=0.0)",
)

# Few channels: per kh, BK of the window row's KW * C (kw, channel) pairs, one contiguous run of the
# channels-last row where the W dilation is 1. A channel block of 3 in a BK of 32 left 29 of 32 of every
# tensor-core step zero (KernelBench 50_, conv 3 -> 96 with an 11 x 11 window: 0.06x eager, H200 2026-12-07).
_FOLDED_ROW_LOOP = (
    "RW = KW * C",
    "RB = tl.cdiv(RW, BK)",
    "for t in range(0, KH * RB):",
    "    kh = t // RB",
    "    r = (t - kh * RB) * BK + rk",
    "    kw = r // C",
    "    c = r - kw * C",
    "    r_ok = r < RW",
    "    ih = ih0 + kh * DH",
    "    iw = iw0[:, None] + (kw * DW)[None, :]",
    "    ok = (mask_m & (ih >= 0) & (ih < IH))[:, None] & r_ok[None, :] & (iw >= 0) & (iw < IW)",
    "    a = tl.load((x_rows + ih * sxh)[:, None] + iw * sxw + c[None, :], mask=ok, other=0.0)",
    "    b = tl.load(w_ptr + kh * swh + rn[None, :] * swo + (kw * sww + c)[:, None], "
    "mask=r_ok[:, None] & mask_n[None, :], other=0.0)",
)


def fold_window_rows(channels: int, kernel_w: int, dtype: str) -> bool:
    """Whether the channels-last conv2d reduces over a window row's (kw, channel) pairs in one run instead of
    a channel block per tap: where that fills more of the configs' reduction tile (few channels)."""
    bk = min(config[2] for config in gemm_configs(dtype))

    def filled(n: int) -> float:
        return n / (-(-n // bk) * bk)

    return kernel_w > 1 and channels > 0 and filled(kernel_w * channels) > filled(channels)


def _conv2d_nhwc_kernel(plan: Plan, group: Group, index: int, x: str, weight: str, bias: str | None,
                        ks: tuple[int, ...], st: tuple[int, ...], pad: tuple[int, ...], dil: tuple[int, ...]) -> Kernel:
    """Ungrouped conv2d as an implicit GEMM over channels-last copies (module docstring)."""
    n_in, i, x_value, ext, outs, name, params = _gemm_conv_head(plan, group, index)
    fold = fold_window_rows(plan.shapes[x_value][1], ks[1], plan.program.dtype)
    params += ["M", "N", "C", "IH", "IW", "OH", "OW", "sxn", "sxh", "sxw", "swo", "swh", "sww"]
    for r in ext:
        params += [f"v{r}_s{d}" for d in range(4)]
    params += ["ON_CPU: tl.constexpr"] + [f"{p}{up}: tl.constexpr" for p in "KSPD" for up in "HW"]
    params += ["HAS_BIAS: tl.constexpr", "PIXV: tl.constexpr", "BM: tl.constexpr", "BN: tl.constexpr",
               "BK: tl.constexpr", "GROUP_M: tl.constexpr"]
    k = Lines()
    k("@triton.jit", f"def {name}({', '.join(params)}):")
    k.indent = 1
    k("# rows: output pixels (n, oh, ow); columns: output channels; reduction: (kh, kw, channel block)",
      f"DT = v{outs[0]}_ptr.dtype.element_ty",
      "pid = tl.program_id(0)")
    _grouped_tiles(k)
    k(
        "ow = rm % OW",
        "oh = (rm // OW) % OH",
        "nb = (rm // (OW * OH)).to(tl.int64)",
        "oc = rn",
        "x_rows = x_ptr + nb * sxn",
        "ih0 = oh * SH - PH",
        "iw0 = ow * SW - PW",
        *(_FOLDED_ROW_LOOP if fold else _CHANNEL_BLOCK_LOOP),
        *dot_lines(plan.program.dtype),
        "mask = mask_m[:, None] & mask_n[None, :]",
        "if HAS_BIAS:",
        "    acc = acc + tl.load(bias_ptr + oc, mask=mask_n, other=0.0).to(tl.float32)[None, :]",
    )
    k(
        # the output offset of a row, nb*N*OH*OW + oh*OW + ow, told to the compiler as aligned runs of
        # PIXV elements, PIXV the largest of 8, 4, 2 dividing OH*OW (true: a run never crosses an image),
        # so the NCHW store vectorises along the rows
        "row_off = nb * (N * OH * OW) + rm % (OH * OW)",
        "col_off = oc * (OH * OW)",
        "if PIXV > 1:",
        "    row_off = tl.max_contiguous(tl.multiple_of(row_off, PIXV), PIXV)",
        "    col_off = tl.multiple_of(col_off, PIXV)",
    )
    helpers, _ = _conv_epilogue_and_store(
        plan, group, k, x_value, _out_index(4, "[:, None]", "[None, :]"),
        "row_off[:, None] + col_off[None, :]")
    helpers |= {"_channels_last", "_strided_copy"}
    call = [f"_xt{i}", f"_wt{i}", bias or f"_xt{i}"] + [value_name(r, n_in) for r in ext] + \
        [value_name(o, n_in) for o in outs]
    call += [f"_M{i}", f"s{i}[1]", f"{x}.shape[1]", f"{x}.shape[2]", f"{x}.shape[3]", f"s{i}[2]", f"s{i}[3]",
             f"*_xt{i}.stride()[:3]", f"*_wt{i}.stride()[:3]"]
    call += [f"*{value_name(r, n_in)}.stride()" for r in ext]
    call += [f"ON_CPU=not {x}.is_cuda"]
    call += [f"{p}{up}={v}" for p, values in zip("KSPD", (ks, st, pad, dil)) for up, v in zip("HW", values)]
    call += [f"HAS_BIAS={bias is not None}", f"PIXV=next(v for v in (8, 4, 2, 1) if (s{i}[2] * s{i}[3]) % v == 0)"]
    joined = ", ".join(call)
    launch = [
        f"_xt{i} = _channels_last({x})",
        f"_wt{i} = _channels_last({weight})",
        f"_M{i} = s{i}[0] * s{i}[2] * s{i}[3]",
        f"if {x}.is_cuda:",
        f"    {name}_tuned[lambda META: (max(1, triton.cdiv(_M{i}, META['BM']) * triton.cdiv(s{i}[1], META['BN'])),)]"
        f"({joined})",
        "else:",
        f"    _bm, _bn, _bk = (min(c, max(16, triton.next_power_of_2(d))) for c, d in zip((2048, 128, 128), "
        f"(_M{i}, s{i}[1], {x}.shape[1]{f' * {ks[1]}' if fold else ''})))",
        f"    {name}[(max(1, triton.cdiv(_M{i}, _bm) * triton.cdiv(s{i}[1], _bn)),)]({joined}, BM=_bm, BN=_bn, BK=_bk, "
        "GROUP_M=8)",
    ]
    nb_, oc_, oh_, ow_ = plan.shapes[i]
    tuned = autotune_source(name, plan.program.dtype, ["M", "N", "C", "IH", "IW"], (nb_ * oh_ * ow_, oc_, 1))
    return Kernel(name, k.text() + tuned, launch, helpers)


def _window_element_lines(channels: str) -> tuple[str, ...]:
    """Kernel lines of a program of BLOCK output elements of an (N, ``channels``, D, H, W) output: each
    element's indices, flat in that order (pooling, the depthwise conv)."""
    return (
        *FLAT_BLOCK_LINES,
        "ow = offs % OW",
        "oh = (offs // OW) % OH",
        "oz = (offs // (OW * OH)) % OD",
        f"ch = (offs // (OW * OH * OD)) % {channels}",
        f"nb = offs // (OW * OH * OD * {channels})",
    )


# The window's taps, unrolled (KD, KH, KW constexpr): each tap's input position and whether it is inside.
WINDOW_TAP_LINES = (
    "for kz in tl.static_range(KD):",
    "    for kh in tl.static_range(KH):",
    "        for kw in tl.static_range(KW):",
    "            iz = oz * SD - PD + kz * DD",
    "            ih = oh * SH - PH + kh * DH",
    "            iw = ow * SW - PW + kw * DW",
    "            ok = mask & (iz >= 0) & (iz < ID) & (ih >= 0) & (ih < IH) & (iw >= 0) & (iw < IW)",
)


# A window row's taps loaded as one [BLOCK, taps] tile where the W stride is at least this: one output per lane,
# tap by tap, reads addresses a stride apart (KernelBench's 45_Average_Pooling_2D: 11 x 11 window, stride 11,
# at 0.05x eager); the tile's lanes run along each window row's contiguous taps instead.
ROW_TILE_MIN_STRIDE = 4


def _row_taps(kernel_w: int, stride_w: int) -> int:
    """Taps of a window row loaded together: the row's width to a power of two where its stride spreads one output
    per lane, else 1 (tap by tap: small strides already read near-contiguous addresses)."""
    return 1 << (kernel_w - 1).bit_length() if stride_w >= ROW_TILE_MIN_STRIDE and kernel_w > 1 else 1


def _row_tap_lines(taps: int) -> tuple[str, ...]:
    """WINDOW_TAP_LINES with each window row's taps as one [BLOCK, taps] tile (the loop body at 8 spaces)."""
    return (
        f"kwv = tl.arange(0, {taps})[None, :]",
        "base = base[:, None]",
        "for kz in tl.static_range(KD):",
        "    for kh in tl.static_range(KH):",
        "        iz = (oz * SD - PD + kz * DD)[:, None]",
        "        ih = (oh * SH - PH + kh * DH)[:, None]",
        "        iw = (ow * SW - PW)[:, None] + kwv * DW",
        "        ok = mask[:, None] & (kwv < KW) & (iz >= 0) & (iz < ID) & (ih >= 0) & (ih < IH) & (iw >= 0) & (iw < IW)",
    )


def _flat_launch(name: str, x: str, first: str, call: list[str], per_program: int = 1) -> list[str]:
    """Forward lines launching one program per BLOCK elements of ``first`` (the interpreter: few, large blocks);
    ``per_program``: the elements each output loads at once (a row of taps), dividing the block."""
    return [
        f"_block = {max(32, 1024 // per_program)} if {x}.is_cuda else {max(1024, 16384 // per_program)}",
        f"{name}[(max(1, triton.cdiv({first}.numel(), _block)),)]({', '.join(call)}, BLOCK=_block)",
    ]


def _depthwise_kernel(plan: Plan, group: Group, index: int, x: str, weight: str, bias: str | None,
                      axes: tuple[tuple[int, int, int], ...]) -> Kernel:
    """Output channel ``ch`` reads input channel ``ch // MULT`` only (``MULT`` = out / in channels): per output
    element, the window's taps times the channel's weights, accumulated in fp32; the epilogue fused."""
    n_in = len(plan.program.inputs)
    i = group.anchor
    x_value = plan.node(i).args[0]
    rank = len(plan.shapes[x_value])
    epilogue = [v for v in group.nodes if v != i]
    ext = [r for r in group.reads if r != x_value or any(r in plan.node(v).args for v in epilogue)]
    outs = group.outputs
    name = f"_dwconv_{index}"
    params = ["x_ptr", "w_ptr", "bias_ptr"] + [f"v{r}_ptr" for r in ext] + [f"v{o}_ptr" for o in outs]
    params += ["numel", "OC", "ID", "IH", "IW", "OD", "OH", "OW"]
    params += [f"sx{d}" for d in range(5)] + [f"sw{d}" for d in range(5)]
    for r in ext:
        params += [f"v{r}_s{d}" for d in range(rank)]
    params += ["ON_CPU: tl.constexpr"] + [f"{p}{up}: tl.constexpr" for p in "KSPD" for up in "DHW"]
    params += ["MULT: tl.constexpr", "HAS_BIAS: tl.constexpr", "BLOCK: tl.constexpr", "IDX64: tl.constexpr"]
    k = Lines()
    k("@triton.jit", f"def {name}({', '.join(params)}):")
    k.indent = 1
    k(
        f"DT = v{outs[0]}_ptr.dtype.element_ty",
        *_window_element_lines("OC"),
        "base = nb * sx0 + (ch // MULT) * sx1",
        "w_base = ch * sw0",
        "acc = tl.zeros((BLOCK,), dtype=tl.float32)",
        *WINDOW_TAP_LINES,
        "            v = tl.load(x_ptr + base + iz * sx2 + ih * sx3 + iw * sx4, mask=ok, other=0.0).to(tl.float32)",
        "            w = tl.load(w_ptr + w_base + kz * sw2 + kh * sw3 + kw * sw4, mask=mask, other=0.0)",
        "            acc += v * w.to(tl.float32)",
        "if HAS_BIAS:",
        "    acc += tl.load(bias_ptr + ch, mask=mask, other=0.0).to(tl.float32)",
    )
    helpers: set[str] = {"_pad5"}
    rounded, needed = round_to(plan.program.dtype, "acc")
    helpers.update(needed)
    k(f"v{i} = {rounded}")
    _epilogue(plan, group, k, helpers, x_value, _out_index(rank, "", None))
    for o in outs:
        k(f"tl.store(v{o}_ptr + offs, v{o}.to(DT), mask=mask)")
    first = value_name(outs[0], n_in)
    tensors = [x, weight] + [value_name(r, n_in) for r in ext] + [value_name(o, n_in) for o in outs]
    call = [x, weight, bias or x] + tensors[2:]
    call += [f"{first}.numel()", f"s{i}[1]", f"*_pad5({x}.shape, 1)[2:]", f"*_pad5(s{i}, 1)[2:]",
             f"*_pad5({x}.stride(), 0)", f"*_pad5({weight}.stride(), 0)"]
    call += [f"*{value_name(r, n_in)}.stride()" for r in ext]
    call += [f"ON_CPU=not {x}.is_cuda"]
    call += [f"{p}{up}={v}" for p, values in zip("KSPD", axes) for up, v in zip("DHW", values)]
    call += [f"MULT=s{i}[1] // {x}.shape[1]", f"HAS_BIAS={bias is not None}", f"IDX64=_idx64({', '.join(tensors)})"]
    return Kernel(name, k.text(), _flat_launch(name, x, first, call), helpers)


def pool_kernel(plan: Plan, group: Group, index: int) -> Kernel:
    n_in = len(plan.program.inputs)
    i = group.anchor
    node = plan.node(i)
    is_max = node.op.startswith("max_pool")
    _check(node, MAX_POOL_PARAMS if is_max else POOL_PARAMS)
    x_value = node.args[0]
    rank = len(plan.shapes[x_value])
    if rank not in (3, 4, 5):
        raise Unsupported(f"{node.op} of a rank-{rank} input")
    n = rank - 2
    ks, st, pad, dil = (_axes(node, key, n, d) for key, d in
                        (("kernel_size", None), ("stride", None), ("padding", 0), ("dilation", 1)))
    x = value_name(x_value, n_in)
    epilogue = [v for v in group.nodes if v != i]
    ext = [r for r in group.reads if r != x_value or any(r in plan.node(v).args for v in epilogue)]
    outs = group.outputs
    name = f"_pool_{index}"
    params = ["x_ptr"] + [f"v{r}_ptr" for r in ext] + [f"v{o}_ptr" for o in outs]
    params += ["numel", "C", "ID", "IH", "IW", "OD", "OH", "OW"] + [f"sx{d}" for d in range(5)]
    for r in ext:
        params += [f"v{r}_s{d}" for d in range(rank)]
    params += ["ON_CPU: tl.constexpr"] + [f"{p}{up}: tl.constexpr" for p in "KSPD" for up in "DHW"]
    params += ["BLOCK: tl.constexpr", "IDX64: tl.constexpr"]
    k = Lines()
    k("@triton.jit", f"def {name}({', '.join(params)}):")
    k.indent = 1
    taps = _row_taps(ks[2], st[2])
    shape = "(BLOCK,)" if taps == 1 else f"(BLOCK, {taps})"
    k(
        f"DT = v{outs[0]}_ptr.dtype.element_ty",
        *_window_element_lines("C"),
        "base = nb * sx0 + ch * sx1",
        f"acc = tl.full({shape}, " + ("float('-inf')" if is_max else "0.0") + ", tl.float32)",
        f"nan = tl.zeros({shape}, dtype=tl.int32)",
        *(WINDOW_TAP_LINES if taps == 1 else _row_tap_lines(taps)),
    )
    tap = " " * (12 if taps == 1 else 8)
    other = "float('-inf')" if is_max else "0.0"
    k(f"{tap}src = x_ptr + base + iz * sx2 + ih * sx3 + iw * sx4",
      f"{tap}v = tl.load(src, mask=ok, other={other}).to(tl.float32)")
    if is_max:
        k(f"{tap}nan = nan | (v != v).to(tl.int32)", f"{tap}acc = tl.maximum(acc, v)")
    else:
        k(f"{tap}acc = acc + v")
    if taps > 1:  # each output's row of taps, reduced
        k("nan = tl.max(nan, axis=1)", "acc = tl.max(acc, axis=1)" if is_max else "acc = tl.sum(acc, axis=1)")
    k(f"v{i} = tl.where(nan > 0, float('nan'), acc)" if is_max else f"v{i} = acc / (KD * KH * KW)")
    helpers: set[str] = {"_pad5"}
    rounded, needed = round_to(plan.program.dtype, f"v{i}")
    helpers.update(needed)
    if rounded != f"v{i}":
        k(f"v{i} = {rounded}")
    _epilogue(plan, group, k, helpers, x_value, _out_index(rank, "", None))
    for o in outs:
        k(f"tl.store(v{o}_ptr + offs, v{o}.to(DT), mask=mask)")
    first = value_name(outs[0], n_in)
    tensors = [x] + [value_name(r, n_in) for r in ext] + [value_name(o, n_in) for o in outs]
    call = list(tensors)
    call += [f"{first}.numel()", f"*_pad5({x}.shape, 1)[1:]", f"*_pad5(s{i}, 1)[2:]", f"*_pad5({x}.stride(), 0)"]
    call += [f"*{value_name(r, n_in)}.stride()" for r in ext]
    call += [f"ON_CPU=not {x}.is_cuda"]
    call += [f"{p}{up}={v}" for p, values in zip("KSPD", (ks, st, pad, dil)) for up, v in zip("DHW", values)]
    call += [f"IDX64=_idx64({', '.join(tensors)})"]
    return Kernel(name, k.text(), _flat_launch(name, x, first, call, taps), helpers)

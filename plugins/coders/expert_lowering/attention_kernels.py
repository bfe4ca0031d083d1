"""scaled_dot_product_attention over (B, H, L, E): one program per (batch*head, block of queries),
an online (flash-style) softmax over blocks of keys, both products on tl.dot, fused epilogue."""

from __future__ import annotations

import math

from plugins.coders.expert_lowering.codegen import Kernel, Lines, value_name
from plugins.coders.expert_lowering.conv_kernels import _epilogue
from plugins.coders.expert_lowering.tiling import precision_kwarg
from plugins.coders.expert_lowering.errors import Unsupported
from plugins.coders.expert_lowering.plan import Group, Plan
from plugins.coders.expert_lowering.pointwise import round_to

MAX_HEAD_DIM = 256


# Python helper of the generated module: the launch's tiles. On a GPU, key blocks shrink and the
# pipeline gets shallower as a row of K/V grows, so K, V (and tf32x3's split copies) stay within
# sm_90's 227 KB of shared memory (benchmarks/sm90_compile_check.py measures it per head dim).
TILES_HELPER = '''def _attention_tiles(lq, lk, e, ev, itemsize, is_cuda):
    """(BM, BN, BE, BEV, num_stages) of the attention kernel's launch."""
    be, bev = max(16, triton.next_power_of_2(e)), max(16, triton.next_power_of_2(ev))
    if not is_cuda:  # the interpreter pays per program: few, large tiles
        return min(128, max(16, triton.next_power_of_2(lq))), min(256, max(16, triton.next_power_of_2(lk))), be, bev, 1
    row = max(be, bev) * itemsize  # bytes of one key's (or value's) row
    bn = 64 if row <= 256 else 32 if row <= 512 else 16
    return 64, bn, be, bev, 3 if row <= 256 else 2
'''


def attention_kernel(plan: Plan, group: Group, index: int) -> Kernel:
    n_in = len(plan.program.inputs)
    i = group.anchor
    node = plan.node(i)
    extra = set(node.params) - {"is_causal"}
    if extra:
        raise Unsupported(f"scaled_dot_product_attention: parameters {sorted(extra)} are not understood")
    causal = bool(node.params.get("is_causal", False))
    q_v, k_v, v_v = node.args
    e, ev = plan.shapes[q_v][3], plan.shapes[v_v][3]
    # PyTorch's CPU SDPA takes its math path when the value head dim differs from the query's (its flash
    # kernel needs them equal; measured): that path scales q and k by sqrt(scale) each before the dot,
    # where the flash path and CUDA's kernels scale the fp32 scores after it. At large magnitudes the
    # two overflow differently (a stability probe at x5e17), so the CPU kernel follows the path PyTorch
    # takes; the half types' math path also rounds q and k, which is left to the tolerance.
    cpu_math_path = e != ev and plan.program.dtype == "float32"
    scale = 1.0 / math.sqrt(e)
    if max(e, ev) > MAX_HEAD_DIM:
        raise Unsupported(f"attention head dim {max(e, ev)} above {MAX_HEAD_DIM}")
    q, k_, v = (value_name(a, n_in) for a in node.args)
    epilogue = [x for x in group.nodes if x != i]
    ext = [r for r in group.reads if r not in node.args or any(r in plan.node(x).args for x in epilogue)]
    outs = group.outputs
    name = f"_attention_{index}"
    dtype = plan.program.dtype
    # tiling.py's precision rule (fp32: tf32x3 on the GPU), for head dims up to 128; wider fp32 heads
    # keep the exact CUDA-core dot (tf32x3 holds split copies of 64 x 256 fp32 tiles in registers)
    precision = precision_kwarg(dtype) if max(e, ev) <= 128 else ', input_precision="ieee"' if dtype == "float32" else ""
    params = ["q_ptr", "k_ptr", "v_ptr"] + [f"v{r}_ptr" for r in ext] + [f"v{o}_ptr" for o in outs]
    params += ["BH", "H", "LQ", "LK", "E", "EV"] + [f"s{t}{d}" for t in "qkv" for d in range(4)]
    for r in ext:
        params += [f"v{r}_s{d}" for d in range(4)]
    params += ["ON_CPU: tl.constexpr", "BM: tl.constexpr", "BN: tl.constexpr", "BE: tl.constexpr",
               "BEV: tl.constexpr"]

    def dot(a: str, b: str) -> list[str]:
        return ["if ON_CPU:", f"    _p = tl.dot({a}.to(tl.float32), {b}.to(tl.float32), input_precision=\"ieee\")",
                "else:", f"    _p = tl.dot({a}, {b}{precision})"]

    k = Lines()
    k("@triton.jit", f"def {name}({', '.join(params)}):")
    k.indent = 1
    k(
        f"DT = v{outs[0]}_ptr.dtype.element_ty",
        "bh = tl.program_id(1).to(tl.int64)",
        "bb = bh // H",
        "hh = bh % H",
        "rm = tl.program_id(0) * BM + tl.arange(0, BM)",
        "re = tl.arange(0, BE)",
        "rev = tl.arange(0, BEV)",
        # A zero batch or head count still launches one program: it must touch nothing.
        "lq = tl.where(bh < BH, LQ, 0)",
        "lk = tl.where(bh < BH, LK, 0)",
        "mask_m = rm < lq",
        "qt = tl.load(q_ptr + bb * sq0 + hh * sq1 + rm[:, None] * sq2 + re[None, :] * sq3, "
        "mask=mask_m[:, None] & (re[None, :] < E), other=0.0)",
        *(["if ON_CPU:", f"    qt = qt * {math.sqrt(scale)!r}"] if cpu_math_path else []),
        "m_i = tl.full((BM,), float('-inf'), tl.float32)",
        "l_i = tl.zeros((BM,), dtype=tl.float32)",
        "acc = tl.zeros((BM, BEV), dtype=tl.float32)",
        "for n0 in range(0, lk, BN):",
        "    rn = n0 + tl.arange(0, BN)",
        "    mask_n = rn < lk",
        "    kt = tl.load(k_ptr + bb * sk0 + hh * sk1 + rn[None, :] * sk2 + re[:, None] * sk3, "
        "mask=mask_n[None, :] & (re[:, None] < E), other=0.0)",
    )
    k.indent = 2
    if cpu_math_path:
        root = math.sqrt(scale)
        k("if ON_CPU:", f"    kt = kt * {root!r}")
    k(*dot("qt", "kt"))
    if cpu_math_path:
        k("if ON_CPU:", "    s = _p", "else:", f"    s = _p * {scale!r}")
    else:
        k(f"s = _p * {scale!r}")
    # Masked scores are -inf; keys past the end are not in the matrix. One exception: PyTorch's CPU SDPA
    # takes its math path when the value head dim differs from the query's (its flash kernel needs them
    # equal), and that path's causal mask is an additive -inf bias: a masked score that is +inf (an
    # infinite query) becomes NaN there, not -inf. Its flash path and CUDA's kernels skip masked keys.
    keep = "rn[None, :] <= rm[:, None]"
    if causal and e != ev:
        k("if ON_CPU:", f"    s = tl.where(mask_n[None, :], tl.where({keep}, s, s + float('-inf')), float('-inf'))",
          "else:", f"    s = tl.where(mask_n[None, :] & ({keep}), s, float('-inf'))")
    else:
        k(f"s = tl.where(mask_n[None, :]{f' & ({keep})' if causal else ''}, s, float('-inf'))")
    k(
        "m_new = tl.maximum(m_i, tl.max(s, axis=1))",
        "m_safe = tl.where(m_new == float('-inf'), 0.0, m_new)",
        "alpha = tl.exp(m_i - m_safe)",
        "p = tl.exp(s - m_safe[:, None])",
        "l_i = l_i * alpha + tl.sum(p, axis=1)",
        "vt = tl.load(v_ptr + bb * sv0 + hh * sv1 + rn[:, None] * sv2 + rev[None, :] * sv3, "
        "mask=mask_n[:, None] & (rev[None, :] < EV), other=0.0)",
        "pt = p.to(vt.dtype)",
    )
    k(*dot("pt", "vt"))
    k("acc = acc * alpha[:, None] + _p", "m_i = m_new")
    k.indent = 1
    helpers: set[str] = set()
    # a row whose every score is -inf (masked, or overflowed) is 0, as PyTorch's SDPA makes it (its
    # "safe softmax"), not 0/0; a NaN score still makes the row NaN
    rounded, needed = round_to(dtype, "tl.where(l_i[:, None] == 0.0, 0.0, acc / l_i[:, None])")
    helpers.update(needed)
    k("mask = mask_m[:, None] & (rev[None, :] < EV)", f"v{i} = {rounded}")
    _epilogue(plan, group, k, helpers, set(node.args), ["bb", "hh", "rm[:, None]", "rev[None, :]"])
    for o in outs:
        k(f"tl.store(v{o}_ptr + ((bb * H + hh) * LQ + rm[:, None]) * EV + rev[None, :], v{o}.to(DT), mask=mask)")
    call = [q, k_, v] + [value_name(r, n_in) for r in ext] + [value_name(o, n_in) for o in outs]
    call += [f"{q}.shape[0] * {q}.shape[1]", f"{q}.shape[1]", f"{q}.shape[2]", f"{k_}.shape[2]", f"{q}.shape[3]", f"{v}.shape[3]",
             f"*{q}.stride()", f"*{k_}.stride()", f"*{v}.stride()"]
    call += [f"*{value_name(r, n_in)}.stride()" for r in ext] + [f"ON_CPU=not {q}.is_cuda"]
    launch = [
        f"_bm, _bn, _be, _bev, _ns = _attention_tiles({q}.shape[2], {k_}.shape[2], {q}.shape[3], {v}.shape[3], "
        f"{q}.element_size(), {q}.is_cuda)",
        f"{name}[(max(1, triton.cdiv({q}.shape[2], _bm)), max(1, {q}.shape[0] * {q}.shape[1]))]"
        f"({', '.join(call)}, BM=_bm, BN=_bn, BE=_be, BEV=_bev, num_stages=_ns)",
    ]
    helpers.add("_attention_tiles")
    return Kernel(name, k.text(), launch, helpers)

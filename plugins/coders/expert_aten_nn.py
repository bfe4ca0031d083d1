"""ATen neural-network ops -> catalog ops: products, convolutions, pooling, norms, attention.

Weighted ops (``linear``, convolutions, norms) bind their weights to the task model's own tensors
(:meth:`GraphBuilder.expr_of`); a weight computed in ``forward`` is declined rather than guessed.
Ranks the kernels do not take directly are reshaped around the op (a 4-D ``matmul`` as a ``bmm``,
a 5-D ``group_norm`` as 3-D, ``layer_norm`` over several dims as one row).
"""

from __future__ import annotations

from typing import Any

from plugins.coders.expert_aten import handles, reduce
from plugins.coders.expert_graph import GraphBuilder, Ref, numel
from plugins.coders.expert_lowering.errors import Unsupported

# --------------------------------------------------------------------------- products


def _bias(b: GraphBuilder, bias: Any, what: str) -> tuple[str | None, Ref | None]:
    """(the bias as a bound tensor, or None) and a computed bias to add afterwards (or None)."""
    if bias is None:
        return None, None
    if bias.kind == "weight":
        return b.expr_of(bias, what), None
    return None, bias


def _add_after(b: GraphBuilder, y: Ref, extra: Ref | None) -> Ref:
    if extra is None:
        return y
    lhs, rhs = b.broadcast(y, extra)
    return b.op("add", [lhs, rhs])


@handles("aten.linear")
def _linear(b, a, name):
    x, w = a["input"], a["weight"]
    shape = b.shape(x)
    if w.kind != "weight":  # a weight computed in forward: a plain product
        wt = b.permute(w, [1, 0])
        return _add_after(b, matmul(b, x, wt), a.get("bias"))
    out_features = b.shape(w)[0]
    bias_expr, extra = _bias(b, a.get("bias"), "linear bias")
    rows = x if len(shape) in (2, 3) else b.reshape(x, (numel(shape[:-1]), shape[-1]))
    y = b.op("linear", [rows], {"out_features": out_features, "bias": bias_expr is not None},
             tensors={"weight": b.expr_of(w, "linear weight"), "bias": bias_expr})
    return _add_after(b, b.reshape(y, tuple(shape[:-1]) + (out_features,)), extra)


def matmul(b: GraphBuilder, x: Ref, y: Ref) -> Ref:
    """``torch.matmul`` semantics on top of the catalog's 2-D ``matmul`` and 3-D ``bmm``."""
    sx, sy = b.shape(x), b.shape(y)
    if len(sx) == 1:
        out = matmul(b, b.reshape(x, (1, sx[0])), y)
        return b.reshape(out, b.shape(out)[:-2] + b.shape(out)[-1:])
    if len(sy) == 1:
        out = matmul(b, x, b.reshape(y, (sy[0], 1)))
        return b.reshape(out, b.shape(out)[:-1])
    if len(sx) == 2 and len(sy) == 2:
        return b.op("matmul", [x, y])
    if len(sy) == 2:  # (..., M, K) @ (K, N): one product of the flattened rows
        rows = b.reshape(x, (numel(sx[:-1]), sx[-1]))
        out = b.op("matmul", [rows, y])
        return b.reshape(out, tuple(sx[:-1]) + (sy[-1],))
    import torch

    batch = tuple(torch.broadcast_shapes(sx[:-2], sy[:-2]))
    xx = b.reshape(b.expand(x, batch + tuple(sx[-2:])), (numel(batch),) + tuple(sx[-2:]))
    yy = b.reshape(b.expand(y, batch + tuple(sy[-2:])), (numel(batch),) + tuple(sy[-2:]))
    out = b.op("bmm", [xx, yy])
    return b.reshape(out, batch + (sx[-2], sy[-1]))


@handles("aten.matmul", "aten.mm", "aten.bmm")
def _matmul(b, a, name):
    x, y = a["self"], a.get("other", a.get("mat2"))
    return matmul(b, x, y)


@handles("aten.addmm")
def _addmm(b, a, name):
    if a.get("beta", 1) != 1 or a.get("alpha", 1) != 1:
        raise Unsupported("aten.addmm with beta or alpha other than 1 is not lowered")
    return _add_after(b, matmul(b, a["mat1"], a["mat2"]), a["self"])


# --------------------------------------------------------------------------- convolutions


def _axes(value: Any, n: int, what: str) -> tuple[int, ...]:
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if len(values) == 1:
        values = values * n
    if len(values) != n:
        raise Unsupported(f"{what}={value!r} for {n} spatial dims")
    return tuple(int(v) for v in values)


def _padding(padding: Any, n: int, kernel: tuple[int, ...], stride: tuple[int, ...],
             dilation: tuple[int, ...], name: str) -> tuple[int, ...]:
    if padding == "valid":
        return (0,) * n
    if padding == "same":
        total = [d * (k - 1) for k, d in zip(kernel, dilation)]
        if any(s != 1 for s in stride) or any(t % 2 for t in total):
            raise Unsupported(f"{name} with padding='same' that pads unevenly is not lowered")
        return tuple(t // 2 for t in total)
    return _axes(padding, n, f"{name} padding")


def _batched(b: GraphBuilder, x: Ref, n: int, fn) -> Ref:
    """``fn`` on a batched input: an unbatched (C, *spatial) one gets a batch of 1 around it."""
    shape = b.shape(x)
    if len(shape) == n + 1:
        out = fn(b.reshape(x, (1,) + tuple(shape)))
        return b.reshape(out, b.shape(out)[1:])
    if len(shape) != n + 2:
        raise Unsupported(f"a rank-{len(shape)} input to a {n}-D op")
    return fn(x)


def conv(b: GraphBuilder, a: dict[str, Any], n: int, transposed: bool, name: str) -> Ref:
    x, w = a["input"], a["weight"]
    wshape = b.shape(w)
    kernel = tuple(wshape[2:])
    stride = _axes(a.get("stride", 1), n, f"{name} stride")
    dilation = _axes(a.get("dilation", 1), n, f"{name} dilation")
    groups = int(a.get("groups", 1))
    bias_expr, extra = _bias(b, a.get("bias"), f"{name} bias")
    params: dict[str, Any] = {
        "out_channels": wshape[1] * groups if transposed else wshape[0], "kernel_size": kernel, "stride": stride,
        "padding": _padding(a.get("padding", 0), n, kernel, stride, dilation, name), "dilation": dilation,
        "groups": groups, "bias": bias_expr is not None,
    }
    if transposed:
        params["output_padding"] = _axes(a.get("output_padding", 0), n, f"{name} output_padding")
    op = f"conv_transpose{n}d" if transposed else f"conv{n}d"
    tensors = {"weight": b.expr_of(w, f"{name} weight"), "bias": bias_expr}
    y = _batched(b, x, n, lambda xx: b.op(op, [xx], params, tensors=tensors))
    if extra is not None:
        # a computed bias is per channel: (C,) -> (C, 1, ..., 1) before it broadcasts
        extra = b.reshape(extra, (b.shape(extra)[0],) + (1,) * n)
    return _add_after(b, y, extra)


@handles("aten.conv1d", "aten.conv2d", "aten.conv3d")
def _conv(b, a, name):
    return conv(b, a, int(name[-2]), False, name)


@handles("aten.conv_transpose1d", "aten.conv_transpose2d", "aten.conv_transpose3d")
def _conv_t(b, a, name):
    return conv(b, a, int(name[-2]), True, name)


@handles("aten.convolution", "aten._convolution")
def _convolution(b, a, name):
    n = len(b.shape(a["weight"])) - 2
    return conv(b, a, n, bool(a.get("transposed", False)), name)


# --------------------------------------------------------------------------- pooling


def _pool(b: GraphBuilder, a: dict[str, Any], name: str, kind: str, n: int) -> Ref:
    kernel = _axes(a["kernel_size"], n, f"{name} kernel_size")
    stride = _axes(a.get("stride") or kernel, n, f"{name} stride")
    params: dict[str, Any] = {"kernel_size": kernel, "stride": stride,
                              "padding": _axes(a.get("padding", 0), n, f"{name} padding")}
    if kind == "max":
        params["dilation"] = _axes(a.get("dilation", 1), n, f"{name} dilation")
    else:
        if a.get("divisor_override") is not None:
            raise Unsupported(f"{name} with divisor_override is not lowered")
        if not a.get("count_include_pad", True) and any(params["padding"]):
            raise Unsupported(f"{name} with count_include_pad=False and padding is not lowered")
    y = _batched(b, a["self"], n, lambda xx: b.op(f"{kind}_pool{n}d", [xx], params))
    if tuple(b.shape(y)) != tuple(b.current_shape):
        raise Unsupported(f"{name} with ceil_mode=True (it changes the output size) is not lowered")
    return y


@handles("aten.max_pool1d", "aten.max_pool2d", "aten.max_pool3d")
def _max_pool(b, a, name):
    return _pool(b, a, name, "max", int(name[-2]))


@handles("aten.max_pool1d_with_indices", "aten.max_pool2d_with_indices", "aten.max_pool3d_with_indices")
def _max_pool_indices(b, a, name):
    return (_pool(b, a, name, "max", int(name.split("_pool")[1][0])), None)


@handles("aten.avg_pool1d", "aten.avg_pool2d", "aten.avg_pool3d")
def _avg_pool(b, a, name):
    return _pool(b, a, name, "avg", int(name[-2]))


def _adaptive(b: GraphBuilder, a: dict[str, Any], name: str, kind: str) -> Ref:
    x = a["self"]
    shape = b.shape(x)
    n = int(name.split("_pool")[1][0])
    spatial = tuple(shape[-n:])
    wanted = tuple(s if o is None else int(o) for s, o in zip(spatial, _axes(a["output_size"], n, name)))
    rank = len(shape)
    if all(o == 1 for o in wanted):
        return reduce(b, "mean" if kind == "avg" else "amax", x, list(range(rank - n, rank)), True)
    if any(s % o for s, o in zip(spatial, wanted)):
        raise Unsupported(f"{name} to {wanted} from {spatial} (uneven windows) is not lowered")
    window = tuple(s // o for s, o in zip(spatial, wanted))
    return b.op(f"{kind}_pool{n}d", [x], {"kernel_size": window, "stride": window, "padding": (0,) * n,
                                            **({"dilation": (1,) * n} if kind == "max" else {})})


@handles("aten.adaptive_avg_pool1d", "aten.adaptive_avg_pool2d", "aten.adaptive_avg_pool3d",
         "aten._adaptive_avg_pool2d", "aten._adaptive_avg_pool3d")
def _adaptive_avg(b, a, name):
    return _adaptive(b, a, name, "avg")


@handles("aten.adaptive_max_pool1d", "aten.adaptive_max_pool2d", "aten.adaptive_max_pool3d")
def _adaptive_max(b, a, name):
    return (_adaptive(b, a, name, "max"), None)


# --------------------------------------------------------------------------- norms


def _bound(b: GraphBuilder, ref: Any, what: str) -> str | None:
    return None if ref is None else b.expr_of(ref, what)


def batch_norm(b: GraphBuilder, a: dict[str, Any], name: str) -> Ref:
    if a.get("training", False):
        raise Unsupported(f"{name} in training mode (batch statistics) is not lowered; the verifier runs eval mode")
    if a.get("running_mean") is None or a.get("running_var") is None:
        raise Unsupported(f"{name} without running statistics is not lowered")
    tensors = {"weight": _bound(b, a.get("weight"), "batch_norm weight"),
               "bias": _bound(b, a.get("bias"), "batch_norm bias"),
               "running_mean": b.expr_of(a["running_mean"], "batch_norm running_mean"),
               "running_var": b.expr_of(a["running_var"], "batch_norm running_var")}
    return b.op("batch_norm", [a["input"]], {"eps": float(a.get("eps", 1e-5))}, tensors=tensors)


@handles("aten.batch_norm")
def _batch_norm(b, a, name):
    return batch_norm(b, a, name)


@handles("aten._native_batch_norm_legit_no_training")
def _batch_norm_no_training(b, a, name):
    return (batch_norm(b, dict(a, training=False), name), None, None)


def layer_norm(b: GraphBuilder, a: dict[str, Any], name: str) -> Ref:
    x = a["input"]
    shape = b.shape(x)
    k = len(a["normalized_shape"])
    rows = b.reshape(x, (numel(shape[:-k]), numel(shape[-k:])))
    tensors = {"weight": _bound(b, a.get("weight"), "layer_norm weight"),
               "bias": _bound(b, a.get("bias"), "layer_norm bias")}
    y = b.op("layer_norm", [rows], {"eps": float(a.get("eps", 1e-5))}, tensors=tensors)
    return b.reshape(y, shape)


@handles("aten.layer_norm")
def _layer_norm(b, a, name):
    return layer_norm(b, a, name)


@handles("aten.native_layer_norm")
def _native_layer_norm(b, a, name):
    return (layer_norm(b, a, name), None, None)


@handles("aten.rms_norm")
def _rms_norm(b, a, name):
    x = a["input"]
    shape = b.shape(x)
    k = len(a["normalized_shape"])
    eps = a.get("eps")
    if eps is None:
        import torch

        eps = torch.finfo(torch.float32).eps
    rows = b.reshape(x, (numel(shape[:-k]), numel(shape[-k:])))
    y = b.op("rms_norm", [rows], {"eps": float(eps)}, tensors={"weight": _bound(b, a.get("weight"), "rms_norm weight")})
    return b.reshape(y, shape)


@handles("aten.group_norm")
def _group_norm(b, a, name):
    x = a["input"]
    shape = b.shape(x)
    rows = x if len(shape) in (3, 4) else b.reshape(x, tuple(shape[:2]) + (numel(shape[2:]),))
    tensors = {"weight": _bound(b, a.get("weight"), "group_norm weight"),
               "bias": _bound(b, a.get("bias"), "group_norm bias")}
    y = b.op("group_norm", [rows], {"num_groups": int(a["num_groups"]), "eps": float(a.get("eps", 1e-5))},
             tensors=tensors)
    return b.reshape(y, shape)


@handles("aten.instance_norm")
def _instance_norm(b, a, name):
    if not a.get("use_input_stats", True):  # tracked running statistics in eval mode: a batch norm
        return batch_norm(b, dict(a, training=False), name)
    x = a["input"]
    shape = b.shape(x)
    n, c = shape[0], shape[1]
    length = numel(shape[2:])
    rows = b.reshape(x, (n, c, length))
    full = (n, c, length)
    # mean and biased variance per (sample, channel), in one row kernel: every op is per row
    mean = b.op("mean", [rows], {"keepdim": True})
    dev = b.op("sub", [rows, b.expand(mean, full)])
    var = b.op("mean", [b.op("mul", [dev, dev])], {"keepdim": True})
    rstd = b.op("rsqrt", [b.op("add_scalar", [var], {"value": float(a.get("eps", 1e-5))})])
    y = b.op("mul", [dev, b.expand(rstd, full)])
    for key, op in (("weight", "mul"), ("bias", "add")):
        if a.get(key) is not None:
            per_channel = b.expand(b.reshape(a[key], (c, 1)), full)
            y = b.op(op, [y, per_channel])
    return b.reshape(y, shape)


# --------------------------------------------------------------------------- attention


@handles("aten.scaled_dot_product_attention")
def _sdpa(b, a, name):
    q, k, v = a["query"], a["key"], a["value"]
    if a.get("attn_mask") is not None or float(a.get("dropout_p", 0.0)) > 0.0 or a.get("enable_gqa"):
        raise Unsupported(f"{name} with a mask, dropout or grouped-query heads is not lowered")
    if a.get("scale") is not None:
        raise Unsupported(f"{name} with an explicit scale is not lowered")
    if any(len(b.shape(t)) != 4 for t in (q, k, v)):
        raise Unsupported(f"{name} of rank-{len(b.shape(q))} tensors (the kernel takes (B, H, L, E))")
    return b.op("scaled_dot_product_attention", [q, k, v], {"is_causal": bool(a.get("is_causal", False))})


# --------------------------------------------------------------------------- einsum, losses


@handles("aten.einsum")
def _einsum(b, a, name):
    """A two-operand einsum without lone summed indices, as one ``bmm`` (or ``matmul``)."""
    equation = str(a["equation"]).replace(" ", "")
    operands = list(a["tensors"])
    if "..." in equation or "->" not in equation or len(operands) != 2:
        raise Unsupported(f"{name} {equation!r}: only explicit two-operand equations are lowered")
    lhs, out = equation.split("->")
    ia, ib = lhs.split(",")
    x, y = operands
    if len(set(ia)) != len(ia) or len(set(ib)) != len(ib) or len(ia) != len(b.shape(x)) or len(ib) != len(b.shape(y)):
        raise Unsupported(f"{name} {equation!r}: repeated indices are not lowered")
    batch = [c for c in out if c in ia and c in ib]
    left = [c for c in out if c in ia and c not in ib]
    right = [c for c in out if c in ib and c not in ia]
    summed = [c for c in ia if c in ib and c not in out]
    if any(c not in out and c not in summed for c in ia + ib):
        raise Unsupported(f"{name} {equation!r}: an index summed over one operand only is not lowered")
    size = {c: b.shape(x)[ia.index(c)] for c in ia} | {c: b.shape(y)[ib.index(c)] for c in ib}
    prod = lambda cs: numel([size[c] for c in cs])  # noqa: E731
    xa = b.reshape(b.permute(x, [ia.index(c) for c in batch + left + summed]), (prod(batch), prod(left), prod(summed)))
    yb = b.reshape(b.permute(y, [ib.index(c) for c in batch + summed + right]), (prod(batch), prod(summed), prod(right)))
    z = b.op("bmm", [xa, yb])
    z = b.reshape(z, tuple(size[c] for c in batch + left + right))
    order = batch + left + right
    return b.permute(z, [order.index(c) for c in out])


@handles("aten.broadcast_tensors")
def _broadcast_tensors(b, a, name):
    return tuple(b.broadcast(*a["tensors"]))


_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}


def _reduced(b: GraphBuilder, x: Ref, reduction: Any, name: str) -> Ref:
    mode = _REDUCTIONS.get(reduction, reduction)
    if mode == "none":
        return x
    if mode not in ("mean", "sum"):
        raise Unsupported(f"{name} with reduction={reduction!r} is not lowered")
    return reduce(b, mode, x, list(range(len(b.shape(x)))), False)


def _difference(b: GraphBuilder, a: dict[str, Any]) -> Ref:
    x, y = b.broadcast(a["self"], a["target"])
    return b.op("sub", [x, y])


@handles("aten.mse_loss")
def _mse(b, a, name):
    d = _difference(b, a)
    return _reduced(b, b.op("mul", [d, d]), a.get("reduction", 1), name)


@handles("aten.l1_loss")
def _l1(b, a, name):
    return _reduced(b, b.op("abs", [_difference(b, a)]), a.get("reduction", 1), name)


@handles("aten.smooth_l1_loss", "aten.huber_loss")
def _smooth_l1(b, a, name):
    beta = float(a.get("beta", a.get("delta", 1.0)))
    d = _difference(b, a)
    if name == "aten.huber_loss":  # delta * smooth_l1(d, beta=delta)
        loss = b.op("scale", [b.op("smooth_l1", [d], {"beta": beta})], {"factor": beta})
    else:
        loss = b.op("smooth_l1", [d], {"beta": beta})
    return _reduced(b, loss, a.get("reduction", 1), name)


@handles("aten.kl_div")
def _kl_div(b, a, name):
    x, t = b.broadcast(a["self"], a["target"])
    if a.get("log_target", False):
        pointwise = b.op("mul", [b.op("exp", [t]), b.op("sub", [t, x])])
    else:  # target * (log(target) - input); ATen's xlogy makes 0 * log 0 = 0, softmax targets are > 0
        pointwise = b.op("mul", [t, b.op("sub", [b.op("log", [t]), x])])
    return _reduced(b, pointwise, a.get("reduction", 1), name)

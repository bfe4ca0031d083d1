"""ATen ops of an exported graph -> catalog ops of the expert's program IR.

``translate(graph_module, args, weights, catalog)`` walks a ``torch.export`` graph (pre-dispatch
ATen: ``aten.conv2d``, ``aten.linear``, ``aten.add.Tensor`` ...) and writes each op into a
:class:`plugins.coders.expert_graph.GraphBuilder` as catalog ops with their parameters:

* pointwise ops one to one (``aten.hardtanh`` is ``clamp``, a scalar operand picks the
  ``*_scalar`` op), broadcasting as explicit ``expand`` views;
* reductions, softmax and scans over any dims as ``permute``/``reshape`` views that bring the dims
  last, then the row op, then a view back;
* convolutions and pooling over 1-3 spatial dims, ``linear``/``matmul``/``bmm`` (other ranks
  reshaped), norms (``instance_norm`` decomposed into row ops, ``layer_norm`` over several dims
  flattened), attention.

An op with no translation raises :class:`Unsupported` naming it (``aten.argmax is not in the
expert's catalog``); so does one whose parameters the lowering does not model (``ceil_mode`` that
changes the output size, a training-mode ``batch_norm``). The neural-network ops live in
:mod:`plugins.coders.expert_aten_nn`.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from plugins.coders.expert_graph import Flipped, GraphBuilder, Ref, numel
from plugins.coders.expert_lowering.errors import Unsupported

Handler = Callable[[GraphBuilder, dict[str, Any], Any], Any]
HANDLERS: dict[str, Handler] = {}


def handles(*names: str):
    def register(fn: Handler) -> Handler:
        for name in names:
            HANDLERS[name] = fn
        return fn

    return register


def arguments(node: Any, env: Mapping[Any, Any]) -> dict[str, Any]:
    """The node's arguments by schema name (defaults filled in), fx nodes replaced by their values."""
    import torch.fx

    schema = node.target._schema
    bound: dict[str, Any] = {}
    for i, arg in enumerate(schema.arguments):
        if i < len(node.args):
            value = node.args[i]
        elif arg.name in node.kwargs:
            value = node.kwargs[arg.name]
        elif arg.has_default_value():
            value = arg.default_value
        else:
            continue
        bound[arg.name] = _resolve(value, env, torch.fx.Node)
    return bound


def _resolve(value: Any, env: Mapping[Any, Any], node_type: type) -> Any:
    if isinstance(value, node_type):
        return env[value]
    if isinstance(value, (list, tuple)):
        return type(value)(_resolve(v, env, node_type) for v in value)
    return value


def op_name(node: Any) -> str:
    """``aten.conv2d`` (the overload packet, as users know it)."""
    target = node.target
    packet = getattr(target, "overloadpacket", None)
    if packet is not None:
        return f"aten.{packet.__name__}"
    return getattr(target, "__name__", str(target))


# --------------------------------------------------------------------------- pointwise

UNARY = {name: name for name in ("relu", "sigmoid", "tanh", "silu", "mish", "hardswish", "hardsigmoid", "selu",
                                  "abs", "neg", "sqrt", "rsqrt", "exp", "log")}


def _tensor(b: GraphBuilder, x: Any, what: str) -> Ref:
    if not isinstance(x, Ref):
        raise Unsupported(f"{what}: expected a tensor operand, found {type(x).__name__}")
    return x


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


@handles(*(f"aten.{n}" for n in UNARY))
def _unary(b: GraphBuilder, a: dict[str, Any], name: str) -> Ref:
    return b.op(UNARY[name.split(".", 1)[1]], [_tensor(b, a["self"], name)])


@handles("aten.gelu")
def _gelu(b, a, name):
    return b.op("gelu", [a["self"]], {"approximate": a.get("approximate", "none")})


@handles("aten.leaky_relu")
def _leaky(b, a, name):
    return b.op("leaky_relu", [a["self"]], {"negative_slope": float(a.get("negative_slope", 0.01))})


@handles("aten.softplus")
def _softplus(b, a, name):
    return b.op("softplus", [a["self"]], {"beta": float(a.get("beta", 1.0)), "threshold": float(a.get("threshold", 20.0))})


@handles("aten.elu")
def _elu(b, a, name):
    if float(a.get("scale", 1.0)) != 1.0 or float(a.get("input_scale", 1.0)) != 1.0:
        raise Unsupported("aten.elu with scale or input_scale other than 1 is not lowered")
    return b.op("elu", [a["self"]], {"alpha": float(a.get("alpha", 1.0))})


@handles("aten.hardtanh")
def _hardtanh(b, a, name):
    return b.op("clamp", [a["self"]], {"min": float(a.get("min_val", -1.0)), "max": float(a.get("max_val", 1.0))})


@handles("aten.relu6")
def _relu6(b, a, name):
    return b.op("clamp", [a["self"]], {"min": 0.0, "max": 6.0})


@handles("aten.clamp", "aten.clamp_min", "aten.clamp_max")
def _clamp(b, a, name):
    lo = a.get("min") if name != "aten.clamp_max" else None
    hi = a.get("max") if name != "aten.clamp_min" else None
    if isinstance(lo, Ref) or isinstance(hi, Ref):
        raise Unsupported(f"{name} with tensor bounds is not lowered")
    params = {k: float(v) for k, v in (("min", lo), ("max", hi)) if v is not None}
    if not params:
        return a["self"]
    return b.op("clamp", [a["self"]], params)


def _scalar_or_tensor(b: GraphBuilder, x: Ref, other: Any, tensor_op: str, scalar: Callable[[float], tuple]) -> Ref:
    if isinstance(other, Ref):
        lhs, rhs = b.broadcast(x, other)
        return b.op(tensor_op, [lhs, rhs])
    if not _number(other):
        raise Unsupported(f"{tensor_op} with an operand of type {type(other).__name__}")
    op, params = scalar(float(other))
    return b.op(op, [x], params) if op else x


@handles("aten.add", "aten.sub")
def _add_sub(b, a, name):
    x, other, alpha = a["self"], a["other"], a.get("alpha", 1)
    sign = -1.0 if name == "aten.sub" else 1.0
    if not isinstance(x, Ref):  # a number plus a tensor
        if not isinstance(other, Ref) or alpha != 1:
            raise Unsupported(f"{name} of two numbers")
        base = other if sign > 0 else b.op("neg", [other])
        return b.op("add_scalar", [base], {"value": float(x)})
    if isinstance(other, Ref) and alpha != 1:
        other = b.op("scale", [other], {"factor": float(alpha)})
    elif _number(other):
        other = other * alpha
    return _scalar_or_tensor(b, x, other, name.split(".")[1],
                             lambda v: (("add_scalar", {"value": sign * v}) if v else (None, {})))


@handles("aten.rsub")
def _rsub(b, a, name):
    if a.get("alpha", 1) != 1 or isinstance(a["other"], Ref):
        raise Unsupported("aten.rsub with alpha or a tensor minuend is not lowered")
    return b.op("rsub_scalar", [a["self"]], {"value": float(a["other"])})


@handles("aten.mul", "aten.multiply")
def _mul(b, a, name):
    x, other = a["self"], a["other"]
    if not isinstance(x, Ref):
        x, other = other, x
    return _scalar_or_tensor(b, x, other, "mul", lambda v: (("scale", {"factor": v}) if v != 1.0 else (None, {})))


@handles("aten.div", "aten.divide", "aten.true_divide")
def _div(b, a, name):
    if a.get("rounding_mode") is not None:
        raise Unsupported(f"{name} with rounding_mode={a['rounding_mode']!r} is not lowered")
    x, other = a["self"], a["other"]
    if not isinstance(x, Ref):  # c / t: c * (1 / t), within one rounding of the true quotient
        inverse = b.op("pow_scalar", [_tensor(b, other, name)], {"exponent": -1.0})
        return inverse if float(x) == 1.0 else b.op("scale", [inverse], {"factor": float(x)})
    return _scalar_or_tensor(b, x, other, "div", lambda v: (("div_scalar", {"value": v}) if v != 1.0 else (None, {})))


@handles("aten.reciprocal")
def _reciprocal(b, a, name):
    return b.op("pow_scalar", [a["self"]], {"exponent": -1.0})


@handles("aten.maximum", "aten.minimum", "aten.max.other", "aten.min.other")
def _extremum(b, a, name):
    is_max = "max" in name
    x, other = a["self"], a["other"]
    if not isinstance(x, Ref):
        x, other = other, x
    if _number(other):  # against a number: a one-sided clamp (NaN propagates in both)
        return b.op("clamp", [x], {"min" if is_max else "max": float(other)})
    lhs, rhs = b.broadcast(x, _tensor(b, other, name))
    return b.op("maximum" if is_max else "minimum", [lhs, rhs])


@handles("aten.pow")
def _pow(b, a, name):
    if not isinstance(a.get("self"), Ref) or not _number(a.get("exponent")):
        raise Unsupported("aten.pow with a tensor exponent or a number base is not lowered")
    exponent = float(a["exponent"])
    if exponent == 1.0:
        return a["self"]
    return b.op("pow_scalar", [a["self"]], {"exponent": exponent})


@handles("aten.square")
def _square(b, a, name):
    return b.op("pow_scalar", [a["self"]], {"exponent": 2.0})


@handles("aten.triu", "aten.tril")
def _triangle(b, a, name):
    return b.op(name.split(".")[1], [a["self"]], {"diagonal": int(a.get("diagonal", 0))})


# --------------------------------------------------------------------------- identities and views

@handles("aten.contiguous", "aten.clone", "aten.alias", "aten.detach", "aten.lift_fresh_copy", "aten.detach_")
def _identity(b, a, name):
    return a["self"]


@handles("aten.dropout", "aten.feature_dropout", "aten.alpha_dropout")
def _dropout(b, a, name):
    if a.get("train") and float(a.get("p", 0.0)) > 0.0:
        raise Unsupported(f"{name} in training mode is random; the expert lowers eval mode only")
    return a["input"]


@handles("aten.to", "aten._to_copy", "aten.type_as")
def _to(b, a, name):
    return a["self"]  # the walker checks that every value keeps the program's dtype


# Views whose result shape the graph states (the exporter resolved -1 and negative dims already).
@handles("aten.view", "aten.reshape", "aten._unsafe_view", "aten.flatten", "aten.unflatten", "aten.unsqueeze",
         "aten.squeeze", "aten.view_as", "aten.reshape_as")
def _reshape(b, a, name):
    return b.reshape(a["self"], b.current_shape)


@handles("aten.expand", "aten.expand_as", "aten.broadcast_to")
def _expand(b, a, name):
    return b.expand(a["self"], b.current_shape)


@handles("aten.permute")
def _permute(b, a, name):
    rank = len(b.shape(a["self"]))
    return b.permute(a["self"], [d % rank for d in a["dims"]])


@handles("aten.transpose", "aten.swapaxes", "aten.swapdims")
def _transpose(b, a, name):
    x = a["self"]
    rank = len(b.shape(x))
    d0, d1 = (int(a.get(k, a.get(alt))) % rank for k, alt in (("dim0", "axis0"), ("dim1", "axis1")))
    perm = list(range(rank))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return b.permute(x, perm)


@handles("aten.t", "aten.numpy_T", "aten.mT")
def _t(b, a, name):
    x = a["self"]
    rank = len(b.shape(x))
    if name == "aten.mT":
        return b.permute(x, list(range(rank - 2)) + [rank - 1, rank - 2])
    return b.permute(x, list(reversed(range(rank))))


# --------------------------------------------------------------------------- reductions, softmax, scans

def _dims(b: GraphBuilder, x: Ref, dim: Any) -> list[int]:
    rank = len(b.shape(x))
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(rank))
    dims = [dim] if isinstance(dim, int) else list(dim)
    return sorted({d % rank for d in dims}) if rank else []


# A reduction to fewer rows than SPLIT_PROGRAMS, each of at least SPLIT_MIN_ROW elements, runs in two stages: each
# row cut into about SPLIT_PROGRAMS // rows equal chunks reduced in parallel, then the chunks' results. One program
# per row would read a whole row alone (37_FrobeniusNorm_, 1.9e9 elements: one SM) and add its ~10^6 block sums
# one after another in float32, off by ~1e-3 of the sum (H100, 2026-12-06: rejected beyond the 1e-4 tolerance).
SPLIT_OPS = ("sum", "mean", "amax", "amin", "logsumexp")  # associative over equal chunks (mean: of the means)
SPLIT_PROGRAMS = 2048
SPLIT_MIN_ROW = 1 << 20


def split_chunks(op: str, rows: int, length: int) -> int | None:
    """How many equal chunks each of ``rows`` rows of ``length`` elements is reduced in first (a divisor of
    ``length`` near ``SPLIT_PROGRAMS // rows``), or None: one stage."""
    if op not in SPLIT_OPS or rows * 2 > SPLIT_PROGRAMS or length < SPLIT_MIN_ROW:
        return None
    target = SPLIT_PROGRAMS // rows
    near = sorted(range(max(2, target // 2), 2 * target + 1), key=lambda k: abs(k - target))
    return next((k for k in near if length % k == 0), None)


def row_reduce(b: GraphBuilder, op: str, rows: Ref) -> Ref:
    """Row op ``op`` over the last dim of ``rows``, dropping it; in two stages where :func:`split_chunks` says."""
    shape = b.shape(rows)
    chunks = split_chunks(op, numel(shape[:-1]), shape[-1])
    if chunks is None:
        return b.op(op, [rows], {"keepdim": False})
    parts = b.op(op, [b.reshape_for_rows(rows, tuple(shape[:-1]) + (chunks, shape[-1] // chunks))],
                 {"keepdim": False})
    return b.op(op, [parts], {"keepdim": False})


def reduce(b: GraphBuilder, op: str, x: Ref, dims: list[int], keepdim: bool) -> Ref:
    """Row op ``op`` over ``dims`` of ``x``: the dims moved last and merged, reduced, reshaped back."""
    shape = b.shape(x)
    rank = len(shape)
    if rank == 0:
        x = b.reshape(x, (1,))
        shape, rank, dims = (1,), 1, [0]
    if dims == [rank - 1] and split_chunks(op, numel(shape[:-1]), shape[-1]) is None:
        return b.op(op, [x], {"keepdim": keepdim})  # the row op's own keepdim: one row group's scalar
    kept = [d for d in range(rank) if d not in dims]
    moved = b.permute(x, kept + dims)
    kept_shape = tuple(shape[d] for d in kept)
    rows = b.reshape_for_rows(moved, kept_shape + (numel([shape[d] for d in dims]),))
    out = row_reduce(b, op, rows)
    if keepdim:
        return b.reshape(out, tuple(1 if d in dims else shape[d] for d in range(rank)))
    return out


@handles("aten.sum", "aten.mean", "aten.amax", "aten.amin", "aten.logsumexp")
def _reduction(b, a, name):
    if a.get("dtype") is not None:
        raise Unsupported(f"{name} with a dtype argument is not lowered")
    x = a["self"]
    return reduce(b, name.split(".")[1], x, _dims(b, x, a.get("dim")), bool(a.get("keepdim", False)))


@handles("aten.max.dim", "aten.min.dim")
def _max_dim(b, a, name):
    x = a["self"]
    values = reduce(b, "amax" if "max" in name else "amin", x, _dims(b, x, a["dim"]), bool(a.get("keepdim", False)))
    return (values, None)  # the indices are declined if anything reads them


@handles("aten.max", "aten.min")
def _max_all(b, a, name):
    x = a["self"]
    return reduce(b, "amax" if "max" in name else "amin", x, _dims(b, x, None), False)


@handles("aten.linalg_vector_norm", "aten.norm")
def _norm(b, a, name):
    x = a.get("self", a.get("input"))
    order = a.get("ord", a.get("p", 2))
    order = 2.0 if order in (None, "fro") else float(order)
    dims, keep = _dims(b, x, a.get("dim")), bool(a.get("keepdim", False))
    if a.get("dtype") is not None:
        raise Unsupported(f"{name} with a dtype argument is not lowered")
    if order == 2.0:
        return b.op("sqrt", [reduce(b, "sum", b.op("mul", [x, x]), dims, keep)])
    if order == 1.0:
        return reduce(b, "sum", b.op("abs", [x]), dims, keep)
    if order == float("inf"):
        return reduce(b, "amax", b.op("abs", [x]), dims, keep)
    raise Unsupported(f"{name} of order {order} is not lowered")


def along_last(b: GraphBuilder, op: str, x: Ref, dim: int) -> Ref:
    """Row map ``op`` (softmax, cumsum ...) along ``dim``: moved last, mapped, moved back."""
    moved, back = b.move_last(x, dim)
    out = b.op(op, [moved])
    return b.permute(out, back) if back is not None else out


@handles("aten.softmax", "aten._softmax", "aten.log_softmax", "aten._log_softmax", "aten.special_softmax")
def _softmax(b, a, name):
    if a.get("dtype") is not None or a.get("half_to_float"):
        raise Unsupported(f"{name} with a dtype change is not lowered")
    op = "log_softmax" if "log" in name else "softmax"
    return along_last(b, op, a["self"], int(a["dim"]))


@handles("aten.cumsum", "aten.cumprod")
def _scan(b, a, name):
    if a.get("dtype") is not None:
        raise Unsupported(f"{name} with a dtype argument is not lowered")
    x = a["self"]
    if isinstance(x, Flipped):  # x.flip(d).cumsum(d): a scan from the end, still reversed
        rank = len(b.shape(x.ref))
        dim = int(a["dim"]) % rank
        if x.dims != (dim,):
            raise Unsupported(f"{name} along {dim} of a tensor flipped along {x.dims}")
        moved, back = b.move_last(x.ref, dim)
        out = b.op(name.split(".")[1], [moved], {"reverse": True})
        return Flipped(b.permute(out, back) if back is not None else out, x.dims)
    return along_last(b, name.split(".")[1], x, int(a["dim"]))


@handles("aten.flip")
def _flip(b, a, name):
    x = a["self"]
    ref = x.ref if isinstance(x, Flipped) else x
    rank = len(b.shape(ref))
    dims = tuple(sorted({int(d) % rank for d in a["dims"]}))
    if isinstance(x, Flipped):
        if x.dims != dims:
            raise Unsupported(f"{name} along {dims} of a tensor flipped along {x.dims}")
        return x.ref
    return Flipped(x, dims)


@handles("aten.getitem")
def _getitem(b, a, name):
    raise AssertionError("getitem is resolved by the walker")  # pragma: no cover


# the neural-network handlers register themselves on import
import plugins.coders.expert_aten_nn  # noqa: E402,F401

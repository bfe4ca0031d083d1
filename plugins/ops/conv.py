"""Convolutions (tier 3): conv1d/2d/3d (stride, padding, dilation, groups) and conv_transpose1d/2d/3d.

Every spatial parameter is an int or one int per spatial axis (``kernel_size=(3, 5)``), as in
``torch.nn.Conv2d``. ``out_channels`` is solved by z3; the other parameters are buckets.
"""

from __future__ import annotations

import math

from core import hookimpl
from core.program import OpSpec, ProgramError
from plugins.ops.shape_rules import divides, floordiv, need_rank, rule_op

SPATIAL = ("kernel_size", "stride", "padding", "dilation")


def conv_out(size, kernel, stride, padding, dilation):
    """torch's Conv2d output size along one axis."""
    return floordiv(size + 2 * padding - dilation * (kernel - 1) - 1, stride) + 1


def conv_transpose_out(size, kernel, stride, padding, output_padding, dilation):
    return (size - 1) * stride - 2 * padding + dilation * (kernel - 1) + output_padding + 1


def per_axis(p, key: str, n: int, default: int | None = None) -> tuple:
    """``p[key]`` as one value per spatial axis (an int is repeated)."""
    value = p.get(key, default)
    if value is None:
        raise ProgramError(f"missing parameter {key!r}")
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ProgramError(f"{key}={tuple(value)} has {len(value)} entries for {n} spatial dims")
        return tuple(value)
    return (value,) * n


def _spatial(p, n: int) -> tuple[tuple, tuple, tuple, tuple]:
    return (per_axis(p, "kernel_size", n), per_axis(p, "stride", n, 1), per_axis(p, "padding", n, 0),
            per_axis(p, "dilation", n, 1))


def _conv_rule(n: int):
    name = f"conv{n}d"

    def rule(dims, p, need):
        (x,) = dims
        need_rank(x, (n + 2,), name)
        k, s, pad, d = _spatial(p, n)
        g = p.get("groups", 1)
        need(divides(g, x[1]), f"{name} needs in_channels divisible by groups={g}")
        need(divides(g, p["out_channels"]), f"{name} needs out_channels divisible by groups={g}")
        out = []
        for axis in range(n):
            size = x[2 + axis]
            need(size + 2 * pad[axis] - d[axis] * (k[axis] - 1) - 1 >= 0, f"{name} kernel larger than the padded input")
            out.append(conv_out(size, k[axis], s[axis], pad[axis], d[axis]))
        return (x[0], p["out_channels"], *out)

    return rule


def _conv_flops(n: int):
    def flops(s, p):
        x = s[0]
        k, st, pad, d = _spatial(p, n)
        outs = [conv_out(x[2 + i], k[i], st[i], pad[i], d[i]) for i in range(n)]
        return 2 * x[0] * p["out_channels"] * math.prod(outs) * floordiv(x[1], p.get("groups", 1)) * math.prod(k)

    return flops


def _conv_weight_bytes(n: int):
    def weight_bytes(s, p, item):
        k = per_axis(p, "kernel_size", n)
        bias = p["out_channels"] if p.get("bias", True) else 0
        return (p["out_channels"] * floordiv(s[0][1], p.get("groups", 1)) * math.prod(k) + bias) * item

    return weight_bytes


def _conv_t_rule(n: int):
    name = f"conv_transpose{n}d"

    def rule(dims, p, need):
        (x,) = dims
        need_rank(x, (n + 2,), name)
        k, s, pad, d = _spatial(p, n)
        op = per_axis(p, "output_padding", n, 0)
        g = p.get("groups", 1)
        need(divides(g, x[1]), f"{name} needs in_channels divisible by groups={g}")
        need(divides(g, p["out_channels"]), f"{name} needs out_channels divisible by groups={g}")
        out = []
        for axis in range(n):
            # spatial parameters are buckets (plain ints), never solver variables
            need(op[axis] < s[axis] or op[axis] < d[axis], f"{name} needs output_padding < stride or < dilation")
            size = conv_transpose_out(x[2 + axis], k[axis], s[axis], pad[axis], op[axis], d[axis])
            need(size >= 1, f"{name} output size < 1")
            out.append(size)
        return (x[0], p["out_channels"], *out)

    return rule


def _conv_t_flops(n: int):
    def flops(s, p):
        x = s[0]
        k = per_axis(p, "kernel_size", n)
        return 2 * x[0] * x[1] * math.prod(x[2:]) * floordiv(p["out_channels"], p.get("groups", 1)) * math.prod(k)

    return flops


def _conv_t_weight_bytes(n: int):
    def weight_bytes(s, p, item):
        k = per_axis(p, "kernel_size", n)
        bias = p["out_channels"] if p.get("bias", True) else 0
        return (s[0][1] * floordiv(p["out_channels"], p.get("groups", 1)) * math.prod(k) + bias) * item

    return weight_bytes


def _ctor(cls: str, keys: tuple[str, ...]):
    def module(s, p):
        extras = "".join(f", {key}={p[key]!r}" for key in keys if key in p)
        bias = "" if p.get("bias", True) else ", bias=False"
        return f"nn.{cls}({s[0][1]}, {p['out_channels']}, {p['kernel_size']!r}{extras}{bias})"

    return module


_CONV_KEYS = ("stride", "padding", "dilation", "groups")
_CONV_T_KEYS = ("stride", "padding", "output_padding", "groups", "dilation")


def _conv_op(n: int, params: dict) -> OpSpec:
    return rule_op(f"conv{n}d", "conv", 3, 1, f"torch.nn.functional.conv{n}d", _conv_rule(n), _conv_flops(n),
                   lambda a, p, m: f"{m}({a[0]})", params=params, dim_params={"out_channels": (1, 256)},
                   ranks=(n + 2,), module=_ctor(f"Conv{n}d", _CONV_KEYS), weight_bytes=_conv_weight_bytes(n),
                   description=f"{n}-D convolution, channels first (per-axis kernel, stride, padding, dilation)")


def _conv_t_op(n: int, params: dict) -> OpSpec:
    return rule_op(f"conv_transpose{n}d", "conv", 3, 1, f"torch.nn.functional.conv_transpose{n}d", _conv_t_rule(n),
                   _conv_t_flops(n), lambda a, p, m: f"{m}({a[0]})", params=params,
                   dim_params={"out_channels": (1, 256)}, ranks=(n + 2,),
                   module=_ctor(f"ConvTranspose{n}d", _CONV_T_KEYS), weight_bytes=_conv_t_weight_bytes(n),
                   description=f"{n}-D transposed convolution, channels first")


OPS: tuple[OpSpec, ...] = (
    _conv_op(2, {"out_channels": (4, 8, 16, 32), "kernel_size": (1, 3, 5), "stride": (1, 2),
                 "padding": (0, 1, 2), "dilation": (1, 2), "groups": (1, 2, 4)}),
    _conv_t_op(2, {"out_channels": (4, 8, 16), "kernel_size": (2, 3, 4), "stride": (1, 2),
                   "padding": (0, 1), "output_padding": (0, 1), "dilation": (1,)}),
    _conv_op(1, {"out_channels": (4, 8, 16), "kernel_size": (1, 3, 5), "stride": (1, 2),
                 "padding": (0, 1, 2), "dilation": (1, 2), "groups": (1, 2)}),
    _conv_op(3, {"out_channels": (4, 8), "kernel_size": (1, 3), "stride": (1, 2),
                 "padding": (0, 1), "dilation": (1,), "groups": (1, 2)}),
    _conv_t_op(1, {"out_channels": (4, 8, 16), "kernel_size": (2, 3, 4), "stride": (1, 2),
                   "padding": (0, 1), "output_padding": (0, 1), "dilation": (1, 2), "groups": (1, 2)}),
    _conv_t_op(3, {"out_channels": (4, 8), "kernel_size": (2, 3), "stride": (1, 2),
                   "padding": (0, 1), "output_padding": (0, 1), "dilation": (1,), "groups": (1,)}),
)


@hookimpl
def register_ops(register):
    for spec in OPS:
        register(spec.name, spec)

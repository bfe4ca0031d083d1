"""Elementwise arithmetic and activation ops (tier 0): the easiest fusion targets."""

from __future__ import annotations

import math

from core import hookimpl
from core.program import OpSpec, ProgramError


def _same_shape(shapes, params):
    if len(shapes) == 2 and tuple(shapes[0]) != tuple(shapes[1]):
        raise ProgramError(f"elementwise operands differ in shape: {shapes[0]} vs {shapes[1]}")
    return tuple(shapes[0])


def _numel_times(k):
    return lambda shapes, params: k * math.prod(shapes[0])


def _unary(name, call, render, flops_per_elem, params=None, family="activation", tier=0, description=""):
    return OpSpec(
        name=name, family=family, tier=tier, arity=1, call=call, params=params or {},
        infer_shape=_same_shape, flops=_numel_times(flops_per_elem), render=render, description=description,
    )


def _binary(name, call, symbol):
    return OpSpec(
        name=name, family="elementwise", tier=0, arity=2, call=call,
        infer_shape=_same_shape, flops=_numel_times(1),
        render=lambda a, p, m: f"{a[0]} {symbol} {a[1]}",
        description=f"elementwise {name} of two tensors of the same shape",
    )


# FLOP counts per element follow the usual convention for roofline terms: one per add/mul,
# transcendental functions counted as a handful of operations.
OPS: tuple[OpSpec, ...] = (
    _binary("add", "torch.add", "+"),
    _binary("sub", "torch.sub", "-"),
    _binary("mul", "torch.mul", "*"),
    _unary("scale", "torch.mul", lambda a, p, m: f"{a[0]} * {p['factor']!r}", 1,
           {"factor": (0.5, 2.0, -1.5, 3.0)}, family="elementwise", description="multiply by a constant"),
    _unary("add_scalar", "torch.add", lambda a, p, m: f"{a[0]} + {p['value']!r}", 1,
           {"value": (1.0, -0.5, 0.25)}, family="elementwise", description="add a constant"),
    _unary("clamp", "torch.clamp", lambda a, p, m: f"torch.clamp({a[0]}, min={p['min']!r}, max={p['max']!r})", 2,
           {"min": (-1.0, -0.5), "max": (0.5, 1.0)}, family="elementwise"),
    _unary("relu", "torch.relu", lambda a, p, m: f"torch.relu({a[0]})", 1),
    _unary("gelu", "torch.nn.functional.gelu",
           lambda a, p, m: f"F.gelu({a[0]}, approximate={p.get('approximate', 'none')!r})", 8,
           {"approximate": ("none", "tanh")}),
    _unary("silu", "torch.nn.functional.silu", lambda a, p, m: f"F.silu({a[0]})", 4),
    _unary("sigmoid", "torch.sigmoid", lambda a, p, m: f"torch.sigmoid({a[0]})", 4),
    _unary("tanh", "torch.tanh", lambda a, p, m: f"torch.tanh({a[0]})", 4),
    _unary("softplus", "torch.nn.functional.softplus",
           lambda a, p, m: f"F.softplus({a[0]}, beta={p.get('beta', 1.0)!r}, threshold={p.get('threshold', 20.0)!r})",
           4, {"beta": (1.0, 2.0), "threshold": (20.0,)}),
    _unary("hardswish", "torch.nn.functional.hardswish", lambda a, p, m: f"F.hardswish({a[0]})", 4),
    _unary("leaky_relu", "torch.nn.functional.leaky_relu",
           lambda a, p, m: f"F.leaky_relu({a[0]}, negative_slope={p.get('negative_slope', 0.01)!r})", 2,
           {"negative_slope": (0.01, 0.1, 0.2)}),
)


@hookimpl
def register_ops(register):
    for spec in OPS:
        register(spec.name, spec)

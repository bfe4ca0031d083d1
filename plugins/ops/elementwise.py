"""Elementwise arithmetic and activation ops (tier 0): the easiest fusion targets.

Binary ops take two tensors of the same shape; a broadcast is an explicit ``expand`` view first
(``plugins.ops.layout``), which is how captured programs (``plugins.coders.expert_capture``) write
``x + bias`` with a ``(C, 1, 1)`` bias.
"""

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


def _binary(name, call, symbol, function=None):
    render = (lambda a, p, m: f"{function}({a[0]}, {a[1]})") if function else (lambda a, p, m: f"{a[0]} {symbol} {a[1]}")
    return OpSpec(
        name=name, family="elementwise", tier=0, arity=2, call=call,
        infer_shape=_same_shape, flops=_numel_times(1), render=render,
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
    _unary("clamp", "torch.clamp", lambda a, p, m: f"torch.clamp({a[0]}, min={p.get('min')!r}, max={p.get('max')!r})", 2,
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
    # Grown for KernelBench level 1/2 (captured programs use them; the proposers draw them too).
    _binary("div", "torch.div", "/"),
    _binary("maximum", "torch.maximum", "", "torch.maximum"),
    _binary("minimum", "torch.minimum", "", "torch.minimum"),
    _unary("div_scalar", "torch.div", lambda a, p, m: f"{a[0]} / {p['value']!r}", 1,
           {"value": (2.0, -3.0, 0.7)}, family="elementwise", description="divide by a constant"),
    _unary("rsub_scalar", "torch.rsub", lambda a, p, m: f"{p['value']!r} - {a[0]}", 1,
           {"value": (1.0, 0.5)}, family="elementwise", description="a constant minus the tensor"),
    _unary("pow_scalar", "torch.pow", lambda a, p, m: f"torch.pow({a[0]}, {p['exponent']!r})", 2,
           {"exponent": (2.0, 3.0, 0.5, -1.0)}, family="elementwise", description="raise to a constant power"),
    _unary("abs", "torch.abs", lambda a, p, m: f"torch.abs({a[0]})", 1, family="elementwise"),
    _unary("neg", "torch.neg", lambda a, p, m: f"torch.neg({a[0]})", 1, family="elementwise"),
    _unary("sqrt", "torch.sqrt", lambda a, p, m: f"torch.sqrt({a[0]})", 2, family="elementwise"),
    _unary("rsqrt", "torch.rsqrt", lambda a, p, m: f"torch.rsqrt({a[0]})", 2, family="elementwise"),
    _unary("exp", "torch.exp", lambda a, p, m: f"torch.exp({a[0]})", 4, family="elementwise"),
    _unary("log", "torch.log", lambda a, p, m: f"torch.log({a[0]})", 4, family="elementwise"),
    _unary("mish", "torch.nn.functional.mish", lambda a, p, m: f"F.mish({a[0]})", 8),
    _unary("hardsigmoid", "torch.nn.functional.hardsigmoid", lambda a, p, m: f"F.hardsigmoid({a[0]})", 3),
    _unary("elu", "torch.nn.functional.elu", lambda a, p, m: f"F.elu({a[0]}, alpha={p.get('alpha', 1.0)!r})", 4,
           {"alpha": (1.0, 0.5)}),
    _unary("selu", "torch.nn.functional.selu", lambda a, p, m: f"F.selu({a[0]})", 5),
    _unary("smooth_l1", "torch.nn.functional.smooth_l1_loss",
           lambda a, p, m: (f"F.smooth_l1_loss({a[0]}, torch.zeros_like({a[0]}), reduction='none', "
                            f"beta={p.get('beta', 1.0)!r})"), 4, {"beta": (1.0, 0.5)}, family="elementwise",
           description="the elementwise smooth-L1 (Huber) loss of a difference"),
)


@hookimpl
def register_ops(register):
    for spec in OPS:
        register(spec.name, spec)

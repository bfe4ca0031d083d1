"""Pooling (tier 2): max and average pooling over 1, 2 or 3 spatial dims, channels first.

Spatial parameters are an int or one int per axis. ``max_pool*`` take a ``dilation``; ``avg_pool*``
count padding in the divisor (PyTorch's ``count_include_pad=True``). ``ceil_mode`` is not modelled.
"""

from __future__ import annotations

import math

from core import hookimpl
from core.program import OpSpec, ProgramError
from plugins.ops.conv import conv_out, per_axis
from plugins.ops.shape_rules import need_rank, rule_op


def _window(p, n: int, dilated: bool):
    k = per_axis(p, "kernel_size", n)
    s = per_axis(p, "stride", n, None) if p.get("stride") is not None else k
    pad = per_axis(p, "padding", n, 0)
    d = per_axis(p, "dilation", n, 1) if dilated else (1,) * n
    return k, s, pad, d


def _pool_rule(n: int, dilated: bool):
    def rule(dims, p, need):
        (x,) = dims
        need_rank(x, (n + 2,), f"{n}-D pooling")
        k, s, pad, d = _window(p, n, dilated)
        out = []
        for axis in range(n):
            if 2 * pad[axis] > k[axis]:
                raise ProgramError(f"pooling padding {pad[axis]} must be at most half the kernel size {k[axis]}")
            size = x[2 + axis]
            need(size + 2 * pad[axis] >= d[axis] * (k[axis] - 1) + 1, "pooling window larger than the padded input")
            out.append(conv_out(size, k[axis], s[axis], pad[axis], d[axis]))
        return (x[0], x[1], *out)

    return rule


def _pool_flops(n: int, dilated: bool):
    def flops(shapes, p):
        x = shapes[0]
        k, s, pad, d = _window(p, n, dilated)
        outs = [conv_out(x[2 + i], k[i], s[i], pad[i], d[i]) for i in range(n)]
        return x[0] * x[1] * math.prod(outs) * math.prod(k)

    return flops


def _render(fn: str, dilated: bool):
    def render(a, p, m):
        extra = f", dilation={p['dilation']!r}" if dilated and "dilation" in p else ""
        return f"F.{fn}({a[0]}, {p['kernel_size']!r}, stride={p.get('stride')!r}, padding={p.get('padding', 0)!r}{extra})"

    return render


_PARAMS = {"kernel_size": (2, 3, 4), "stride": (1, 2, 3), "padding": (0, 1)}
_PARAMS_3D = {"kernel_size": (2, 3), "stride": (1, 2), "padding": (0, 1)}


def _pool(kind: str, n: int, params: dict) -> OpSpec:
    dilated = kind == "max"
    name = f"{kind}_pool{n}d"
    what = "max" if dilated else "average (padding counted)"
    return rule_op(name, "pool", 2, 1, f"torch.nn.functional.{name}", _pool_rule(n, dilated), _pool_flops(n, dilated),
                   _render(name, dilated), params=params, ranks=(n + 2,),
                   description=f"{what} pooling over {n} spatial dim(s)")


OPS: tuple[OpSpec, ...] = (
    _pool("max", 2, _PARAMS),
    _pool("avg", 2, _PARAMS),
    _pool("max", 1, dict(_PARAMS, dilation=(1, 2))),
    _pool("avg", 1, _PARAMS),
    _pool("max", 3, _PARAMS_3D),
    _pool("avg", 3, _PARAMS_3D),
)


@hookimpl
def register_ops(register):
    for spec in OPS:
        register(spec.name, spec)

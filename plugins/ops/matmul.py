"""Matrix products (tier 2): linear (weights in an nn.Linear), matmul of two inputs, bmm."""

from __future__ import annotations

import math

from core import hookimpl
from core.program import OpSpec
from plugins.ops.shape_rules import need_rank, rule_op


def _linear_rule(dims, params, need):
    (shape,) = dims
    need_rank(shape, (2, 3), "linear")
    need(params["out_features"] >= 1, "linear needs out_features >= 1")
    return tuple(shape[:-1]) + (params["out_features"],)


def _matmul_rule(dims, params, need):
    a, b = dims
    need_rank(a, (2,), "matmul")
    need_rank(b, (2,), "matmul")
    need(a[1] == b[0], f"matmul inner dimensions differ: {tuple(a)} @ {tuple(b)}")
    return (a[0], b[1])


def _bmm_rule(dims, params, need):
    a, b = dims
    need_rank(a, (3,), "bmm")
    need_rank(b, (3,), "bmm")
    need(a[0] == b[0], f"bmm batch sizes differ: {tuple(a)} vs {tuple(b)}")
    need(a[2] == b[1], f"bmm inner dimensions differ: {tuple(a)} @ {tuple(b)}")
    return (a[0], a[1], b[2])


def _linear_flops(s, p):
    return 2 * math.prod(s[0]) * p["out_features"]


def _linear_weight_bytes(s, p, item):
    return (s[0][-1] * p["out_features"] + (p["out_features"] if p.get("bias", True) else 0)) * item


OPS: tuple[OpSpec, ...] = (
    rule_op("linear", "matmul", 2, 1, "torch.nn.functional.linear", _linear_rule, _linear_flops,
            lambda a, p, m: f"{m}({a[0]})",
            params={"out_features": (16, 32, 48, 64, 96, 128), "bias": (True, False)},
            dim_params={"out_features": (1, 4096)}, ranks=(2, 3),
            module=lambda s, p: f"nn.Linear({s[0][-1]}, {p['out_features']}, bias={bool(p.get('bias', True))})",
            weight_bytes=_linear_weight_bytes, description="x @ W.T + b over the last dim (out_features solved)"),
    rule_op("matmul", "matmul", 2, 2, "torch.matmul", _matmul_rule,
            lambda s, p: 2 * s[0][0] * s[0][1] * s[1][1], lambda a, p, m: f"torch.matmul({a[0]}, {a[1]})",
            ranks=(2,), description="(M, K) @ (K, N)"),
    rule_op("bmm", "matmul", 2, 2, "torch.bmm", _bmm_rule,
            lambda s, p: 2 * s[0][0] * s[0][1] * s[0][2] * s[1][2], lambda a, p, m: f"torch.bmm({a[0]}, {a[1]})",
            ranks=(3,), description="(B, M, K) @ (B, K, N)"),
)


@hookimpl
def register_ops(register):
    for spec in OPS:
        register(spec.name, spec)

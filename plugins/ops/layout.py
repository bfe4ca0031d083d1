"""Layout ops (tier 1): transposes, permutes and reshapes. No arithmetic, all data movement."""

from __future__ import annotations

import math

from core import hookimpl
from core.program import OpSpec, ProgramError
from plugins.ops.shape_rules import divides, floordiv, need_rank, rule_op

# Permutations of a rank-3 and a rank-4 tensor the proposers pick from (identity excluded).
PERMUTATIONS = ((0, 2, 1), (1, 0, 2), (2, 0, 1), (0, 2, 1, 3), (0, 1, 3, 2), (0, 3, 1, 2), (0, 2, 3, 1))


def _transpose_rule(dims, p, need):
    (x,) = dims
    need_rank(x, (2, 3, 4), "transpose")
    return tuple(x[:-2]) + (x[-1], x[-2])


def _permute_rule(dims, p, need):
    (x,) = dims
    perm = tuple(p["dims"])
    if sorted(perm) != list(range(len(x))):
        raise ProgramError(f"permute dims {perm} do not permute a rank-{len(x)} tensor")
    return tuple(x[i] for i in perm)


def _flatten_rule(dims, p, need):
    (x,) = dims
    need_rank(x, (3, 4), "flatten")
    return (x[0], math.prod(x[1:]))


def _split_rule(dims, p, need):
    (x,) = dims
    need_rank(x, (1, 2, 3), "split_last")
    f = p["factor"]
    need(divides(f, x[-1]), f"split_last needs the last dim divisible by factor={f}")
    return tuple(x[:-1]) + (floordiv(x[-1], f), f)


def _numel(s, p):
    return 0


OPS: tuple[OpSpec, ...] = (
    rule_op("transpose", "layout", 1, 1, "torch.transpose", _transpose_rule, _numel,
            lambda a, p, m: f"{a[0]}.transpose(-1, -2)", ranks=(2, 3, 4),
            description="swap the last two dims (a strided view; later ops read it non-contiguously)"),
    rule_op("permute", "layout", 1, 1, "torch.permute", _permute_rule, _numel,
            lambda a, p, m: f"{a[0]}.permute{tuple(p['dims'])!r}", params={"dims": PERMUTATIONS}, ranks=(3, 4),
            description="reorder dims by `dims` (a view)"),
    rule_op("flatten", "layout", 1, 1, "torch.flatten", _flatten_rule, _numel,
            lambda a, p, m: f"torch.flatten({a[0]}, 1)", ranks=(3, 4),
            description="flatten every dim after the first (reshape to (N, -1))"),
    rule_op("split_last", "layout", 1, 1, "torch.reshape", _split_rule, _numel,
            lambda a, p, m: f"{a[0]}.unflatten(-1, (-1, {p['factor']}))", params={"factor": (2, 4, 8)},
            ranks=(1, 2, 3), description="reshape the last dim D into (D // factor, factor)"),
)


@hookimpl
def register_ops(register):
    for spec in OPS:
        register(spec.name, spec)

"""Layout ops (tier 1): transposes, permutes, reshapes and broadcasts (views, no arithmetic), and the
triangular masks ``triu``/``tril``."""

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


def _reshape_rule(dims, p, need):
    (x,) = dims
    target = tuple(p["shape"])
    if sum(1 for d in target if d == -1) > 1:
        raise ProgramError(f"reshape to {target}: at most one -1")
    if any(isinstance(d, int) and d < -1 for d in target):
        raise ProgramError(f"reshape to {target}: negative size")
    total = math.prod(x) if x else 1
    known = math.prod(d for d in target if d != -1)
    if -1 in target:
        need(known >= 1, f"reshape to {target}: -1 next to a zero size")
        need(divides(known, total), f"reshape to {target}: {known} does not divide the element count")
        return tuple(floordiv(total, known) if d == -1 else d for d in target)
    need(total == known, f"reshape to {target}: element counts differ")
    return target


def _expand_rule(dims, p, need):
    """Broadcast to ``shape`` (new dims in front; -1 keeps a dim), as ``Tensor.expand``."""
    (x,) = dims
    target = tuple(p["shape"])
    if len(target) < len(x):
        raise ProgramError(f"expand to {target}: fewer dims than the rank-{len(x)} input")
    lead = len(target) - len(x)
    out = []
    for i, t in enumerate(target):
        if i < lead:
            if t == -1:
                raise ProgramError(f"expand to {target}: -1 for a new leading dim")
            out.append(t)
            continue
        d = x[i - lead]
        if t == -1:
            out.append(d)
        else:
            need((d == 1) | (d == t) if not isinstance(d, int) else (d == 1 or d == t),
                 f"expand to {target}: dim {i} is neither 1 nor {t}")
            out.append(t)
    return tuple(out)


def _triangle_rule(dims, p, need):
    (x,) = dims
    need_rank(x, (2, 3, 4), "triu/tril")
    return tuple(x)


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
    rule_op("reshape", "layout", 1, 1, "torch.reshape", _reshape_rule, _numel,
            lambda a, p, m: f"{a[0]}.reshape{tuple(p['shape'])!r}", params={"shape": ([-1],)}, ranks=(2, 3, 4),
            description="reshape to `shape` (one -1 inferred); a view when the strides allow"),
    rule_op("expand", "layout", 1, 1, "torch.Tensor.expand", _expand_rule, _numel,
            lambda a, p, m: f"{a[0]}.expand{tuple(p['shape'])!r}",
            params={"shape": ([2, -1], [3, -1, -1], [2, -1, -1, -1])}, ranks=(1, 2, 3),  # lists: JSON round trips
            description="broadcast to `shape` (new dims in front, -1 keeps a dim; a stride-0 view)"),
    # Masks by position, not views: elementwise kernels that read their element's (row, column).
    rule_op("triu", "elementwise", 1, 1, "torch.triu", _triangle_rule, lambda s, p: math.prod(s[0]),
            lambda a, p, m: f"torch.triu({a[0]}, diagonal={p.get('diagonal', 0)})", params={"diagonal": (0, 1, -1)},
            ranks=(2, 3), description="zero below the `diagonal`-th diagonal of the last two dims"),
    rule_op("tril", "elementwise", 1, 1, "torch.tril", _triangle_rule, lambda s, p: math.prod(s[0]),
            lambda a, p, m: f"torch.tril({a[0]}, diagonal={p.get('diagonal', 0)})", params={"diagonal": (0, 1, -1)},
            ranks=(2, 3), description="zero above the `diagonal`-th diagonal of the last two dims"),
)


@hookimpl
def register_ops(register):
    for spec in OPS:
        register(spec.name, spec)

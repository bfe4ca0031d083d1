"""Row reductions and softmax-like ops over the last dimension (tier 1)."""

from __future__ import annotations

import math

from core import hookimpl
from core.program import OpSpec, ProgramError


def _reduce_shape(shapes, params):
    shape = tuple(shapes[0])
    if not shape:
        raise ProgramError("cannot reduce a 0-d tensor")
    return shape[:-1] + (1,) if params.get("keepdim", False) else shape[:-1]


def _keep_shape(shapes, params):
    if not shapes[0]:
        raise ProgramError("softmax needs at least one dimension")
    return tuple(shapes[0])


def _reduction(name, call, fn, flops_per_elem):
    return OpSpec(
        name=name, family="reduction", tier=1, arity=1, call=call, params={"keepdim": (False, True)},
        infer_shape=_reduce_shape, flops=lambda s, p: flops_per_elem * math.prod(s[0]),
        render=lambda a, p, m: f"{fn}({a[0]}, dim=-1, keepdim={bool(p.get('keepdim', False))})",
        description=f"{name} over the last dimension",
    )


OPS: tuple[OpSpec, ...] = (
    _reduction("sum", "torch.sum", "torch.sum", 1),
    _reduction("mean", "torch.mean", "torch.mean", 1),
    _reduction("amax", "torch.amax", "torch.amax", 1),
    _reduction("logsumexp", "torch.logsumexp", "torch.logsumexp", 5),
    OpSpec(name="softmax", family="softmax", tier=1, arity=1, call="torch.softmax",
           infer_shape=_keep_shape, flops=lambda s, p: 5 * math.prod(s[0]),
           render=lambda a, p, m: f"torch.softmax({a[0]}, dim=-1)", description="softmax over the last dim"),
    OpSpec(name="log_softmax", family="softmax", tier=1, arity=1, call="torch.log_softmax",
           infer_shape=_keep_shape, flops=lambda s, p: 5 * math.prod(s[0]),
           render=lambda a, p, m: f"torch.log_softmax({a[0]}, dim=-1)", description="log-softmax over the last dim"),
)


@hookimpl
def register_ops(register):
    for spec in OPS:
        register(spec.name, spec)

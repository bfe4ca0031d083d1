"""Row reductions and softmax-like ops over the last dimension (tier 1)."""

from __future__ import annotations

import math

from core import hookimpl
from core.program import OpSpec
from plugins.ops.shape_rules import need_rank, rule_op

RANKS = (1, 2, 3, 4)


def _reduce_rule(dims, params, need):
    (shape,) = dims
    need_rank(shape, RANKS, "a reduction")
    need(shape[-1] >= 1, "cannot reduce an empty last dimension")
    return tuple(shape[:-1]) + (1,) if params.get("keepdim", False) else tuple(shape[:-1])


def _keep_rule(dims, params, need):
    (shape,) = dims
    need_rank(shape, RANKS, "softmax")
    return tuple(shape)


def _reduction(name, call, fn, flops_per_elem):
    return rule_op(
        name, "reduction", 1, 1, call, _reduce_rule, lambda s, p: flops_per_elem * math.prod(s[0]),
        lambda a, p, m: f"{fn}({a[0]}, dim=-1, keepdim={bool(p.get('keepdim', False))})",
        params={"keepdim": (False, True)}, ranks=RANKS, description=f"{name} over the last dimension",
    )


def _softmax(name, fn, description):
    return rule_op(name, "softmax", 1, 1, fn, _keep_rule, lambda s, p: 5 * math.prod(s[0]),
                   lambda a, p, m: f"{fn}({a[0]}, dim=-1)", ranks=RANKS, description=description)


OPS: tuple[OpSpec, ...] = (
    _reduction("sum", "torch.sum", "torch.sum", 1),
    _reduction("mean", "torch.mean", "torch.mean", 1),
    _reduction("amax", "torch.amax", "torch.amax", 1),
    _reduction("logsumexp", "torch.logsumexp", "torch.logsumexp", 5),
    _softmax("softmax", "torch.softmax", "softmax over the last dim"),
    _softmax("log_softmax", "torch.log_softmax", "log-softmax over the last dim"),
)


@hookimpl
def register_ops(register):
    for spec in OPS:
        register(spec.name, spec)

"""Row reductions, scans and softmax-like ops over the last dimension (tier 1).

A reduction over other dims is a ``permute``/``reshape`` that brings them last, then one of these
(how captured programs write ``x.mean(dim=(2, 3))``).
"""

from __future__ import annotations

import math

from core import hookimpl
from core.program import OpSpec
from plugins.ops.shape_rules import need_rank, rule_op

RANKS = (1, 2, 3, 4)  # what the proposers draw
RULE_RANKS = (1, 2, 3, 4, 5, 6)  # what the rule (and the row kernel) accepts: captured 3-D convs are rank 5


def _reduce_rule(dims, params, need):
    (shape,) = dims
    need_rank(shape, RULE_RANKS, "a reduction")
    need(shape[-1] >= 1, "cannot reduce an empty last dimension")
    return tuple(shape[:-1]) + (1,) if params.get("keepdim", False) else tuple(shape[:-1])


def _keep_rule(dims, params, need):
    (shape,) = dims
    need_rank(shape, RULE_RANKS, "softmax")
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


def _scan_render(fn):
    def render(a, p, m):
        if p.get("reverse", False):
            return f"{fn}({a[0]}.flip(-1), dim=-1).flip(-1)"
        return f"{fn}({a[0]}, dim=-1)"

    return render


def _scan(name, fn):
    return rule_op(name, "reduction", 1, 1, fn, _keep_rule, lambda s, p: math.prod(s[0]), _scan_render(fn),
                   params={"reverse": (False, True)}, ranks=RANKS,
                   description=f"inclusive {name} along the last dim (a scan; reverse: from the end)")


OPS: tuple[OpSpec, ...] = (
    _reduction("sum", "torch.sum", "torch.sum", 1),
    _reduction("amin", "torch.amin", "torch.amin", 1),
    _scan("cumsum", "torch.cumsum"),
    _scan("cumprod", "torch.cumprod"),
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

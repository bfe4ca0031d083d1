"""Attention (tier 3): torch.nn.functional.scaled_dot_product_attention over (B, H, L, E)."""

from __future__ import annotations

from core import hookimpl
from core.program import OpSpec
from plugins.ops.shape_rules import need_rank, rule_op


def _sdpa_rule(dims, p, need):
    q, k, v = dims
    for name, t in (("query", q), ("key", k), ("value", v)):
        need_rank(t, (4,), f"scaled_dot_product_attention {name}")
    need(q[0] == k[0], "attention batch sizes differ (query vs key)")
    need(q[1] == k[1], "attention head counts differ (query vs key)")
    need(q[3] == k[3], "attention query and key embedding sizes differ")
    need(k[0] == v[0], "attention batch sizes differ (key vs value)")
    need(k[1] == v[1], "attention head counts differ (key vs value)")
    need(k[2] == v[2], "attention key and value lengths differ")
    need(k[2] >= 1, "attention needs at least one key")
    if p.get("is_causal", False):
        need(q[2] == k[2], "causal attention here uses equal query and key lengths")
    return (q[0], q[1], q[2], v[3])


def _sdpa_flops(s, p):
    q, k, v = s
    return 2 * q[0] * q[1] * q[2] * k[2] * (q[3] + v[3]) + 5 * q[0] * q[1] * q[2] * k[2]


OPS: tuple[OpSpec, ...] = (
    rule_op("scaled_dot_product_attention", "attention", 3, 3, "torch.nn.functional.scaled_dot_product_attention",
            _sdpa_rule, _sdpa_flops,
            lambda a, p, m: f"F.scaled_dot_product_attention({a[0]}, {a[1]}, {a[2]}, is_causal={bool(p.get('is_causal', False))})",
            params={"is_causal": (False, True)}, ranks=(4,),
            description="softmax(q k^T / sqrt(E) [+ causal mask]) v"),
)


@hookimpl
def register_ops(register):
    for spec in OPS:
        register(spec.name, spec)

"""Normalisations (tier 2): layer_norm, rms_norm, group_norm, batch_norm in eval mode (rank 2 to 5).

Each keeps its input's shape and owns its affine weights as an ``nn.Module`` built in ``__init__``.
"""

from __future__ import annotations

import math

from core import hookimpl
from core.program import OpSpec
from plugins.ops.shape_rules import divides, need_rank, rule_op


def _last_dim_rule(dims, params, need):
    (shape,) = dims
    need_rank(shape, (2, 3, 4), "a last-dimension norm")
    need(shape[-1] >= 2, "normalising over a single element gives a constant")
    return tuple(shape)


def _group_rule(dims, params, need):
    (shape,) = dims
    need_rank(shape, (3, 4), "group_norm")
    need(divides(params["num_groups"], shape[1]), f"group_norm needs channels divisible by num_groups={params['num_groups']}")
    return tuple(shape)


def _channel_rule(dims, params, need):
    (shape,) = dims
    need_rank(shape, (2, 3, 4, 5), "batch_norm (eval)")
    return tuple(shape)


_BATCH_NORM = {2: "BatchNorm1d", 3: "BatchNorm1d", 4: "BatchNorm2d", 5: "BatchNorm3d"}


def _affine_bytes(channel_axis):
    return lambda s, p, item: 2 * s[0][channel_axis] * item


OPS: tuple[OpSpec, ...] = (
    rule_op("layer_norm", "norm", 2, 1, "torch.nn.functional.layer_norm", _last_dim_rule,
            lambda s, p: 8 * math.prod(s[0]), lambda a, p, m: f"{m}({a[0]})",
            params={"eps": (1e-5,)}, ranks=(2, 3, 4),
            module=lambda s, p: f"nn.LayerNorm({s[0][-1]}, eps={p.get('eps', 1e-5)!r})",
            weight_bytes=_affine_bytes(-1), description="LayerNorm over the last dim, affine weights"),
    rule_op("rms_norm", "norm", 2, 1, "torch.nn.functional.rms_norm", _last_dim_rule,
            lambda s, p: 5 * math.prod(s[0]), lambda a, p, m: f"{m}({a[0]})",
            params={"eps": (1e-6,)}, ranks=(2, 3, 4),
            module=lambda s, p: f"nn.RMSNorm({s[0][-1]}, eps={p.get('eps', 1e-6)!r})",
            weight_bytes=lambda s, p, item: s[0][-1] * item, description="RMSNorm over the last dim, learned scale"),
    rule_op("group_norm", "norm", 2, 1, "torch.nn.functional.group_norm", _group_rule,
            lambda s, p: 8 * math.prod(s[0]), lambda a, p, m: f"{m}({a[0]})",
            params={"num_groups": (1, 2, 4, 8), "eps": (1e-5,)}, ranks=(3, 4),
            module=lambda s, p: f"nn.GroupNorm({p['num_groups']}, {s[0][1]}, eps={p.get('eps', 1e-5)!r})",
            weight_bytes=_affine_bytes(1), description="GroupNorm over (N, C, ...), channels split in num_groups"),
    rule_op("batch_norm", "norm", 2, 1, "torch.nn.functional.batch_norm", _channel_rule,
            lambda s, p: 2 * math.prod(s[0]),
            lambda a, p, m: (f"F.batch_norm({a[0]}, {m}.running_mean, {m}.running_var, {m}.weight, {m}.bias, "
                             f"training=False, eps={p.get('eps', 1e-5)!r})"),
            params={"eps": (1e-5,)}, ranks=(4,),
            module=lambda s, p: f"nn.{_BATCH_NORM[len(s[0])]}({s[0][1]}, eps={p.get('eps', 1e-5)!r})",
            weight_bytes=lambda s, p, item: 4 * s[0][1] * item,
            description="BatchNorm2d in eval mode (running statistics, no update)"),
)


@hookimpl
def register_ops(register):
    for spec in OPS:
        register(spec.name, spec)

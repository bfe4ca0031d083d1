"""2-D pooling (tier 2): max_pool2d and avg_pool2d over NCHW."""

from __future__ import annotations

from core import hookimpl
from core.program import OpSpec, ProgramError
from plugins.ops.conv import conv_out
from plugins.ops.shape_rules import need_rank, rule_op


def _pool_rule(dims, p, need):
    (x,) = dims
    need_rank(x, (4,), "pooling")
    n, c, h, w = x
    k, s, pad = p["kernel_size"], p["stride"], p["padding"]
    if 2 * pad > k:
        raise ProgramError(f"pooling padding {pad} must be at most half the kernel size {k}")
    need(h + 2 * pad >= k, "pooling window larger than the padded height")
    need(w + 2 * pad >= k, "pooling window larger than the padded width")
    return (n, c, conv_out(h, k, s, pad, 1), conv_out(w, k, s, pad, 1))


def _pool_flops(s, p):
    n, c, h, w = s[0]
    k, st, pad = p["kernel_size"], p["stride"], p["padding"]
    return n * c * conv_out(h, k, st, pad, 1) * conv_out(w, k, st, pad, 1) * k * k


_PARAMS = {"kernel_size": (2, 3, 4), "stride": (1, 2, 3), "padding": (0, 1)}

OPS: tuple[OpSpec, ...] = (
    rule_op("max_pool2d", "pool", 2, 1, "torch.nn.functional.max_pool2d", _pool_rule, _pool_flops,
            lambda a, p, m: f"F.max_pool2d({a[0]}, {p['kernel_size']}, stride={p['stride']}, padding={p['padding']})",
            params=_PARAMS, ranks=(4,), description="max pooling, square window"),
    rule_op("avg_pool2d", "pool", 2, 1, "torch.nn.functional.avg_pool2d", _pool_rule, _pool_flops,
            lambda a, p, m: f"F.avg_pool2d({a[0]}, {p['kernel_size']}, stride={p['stride']}, padding={p['padding']})",
            params=_PARAMS, ranks=(4,), description="average pooling, square window (padding counted)"),
)

@hookimpl
def register_ops(register):
    for spec in OPS:
        register(spec.name, spec)

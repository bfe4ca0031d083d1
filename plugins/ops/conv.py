"""Convolutions (tier 3): conv2d (stride, padding, dilation, groups) and conv_transpose2d.

``out_channels`` is solved by z3; kernel size, stride, padding, dilation and groups are buckets.
"""

from __future__ import annotations

from core import hookimpl
from core.program import OpSpec
from plugins.ops.shape_rules import divides, floordiv, need_rank, rule_op


def conv_out(size, kernel, stride, padding, dilation):
    """torch's Conv2d output size along one axis."""
    return floordiv(size + 2 * padding - dilation * (kernel - 1) - 1, stride) + 1


def conv_transpose_out(size, kernel, stride, padding, output_padding, dilation):
    return (size - 1) * stride - 2 * padding + dilation * (kernel - 1) + output_padding + 1


def _conv_rule(dims, p, need):
    (x,) = dims
    need_rank(x, (4,), "conv2d")
    n, c, h, w = x
    k, s, pad, d, g = p["kernel_size"], p["stride"], p["padding"], p["dilation"], p["groups"]
    need(divides(g, c), f"conv2d needs in_channels divisible by groups={g}")
    need(divides(g, p["out_channels"]), f"conv2d needs out_channels divisible by groups={g}")
    need(h + 2 * pad - d * (k - 1) - 1 >= 0, "conv2d kernel larger than the padded height")
    need(w + 2 * pad - d * (k - 1) - 1 >= 0, "conv2d kernel larger than the padded width")
    return (n, p["out_channels"], conv_out(h, k, s, pad, d), conv_out(w, k, s, pad, d))


def _conv_flops(s, p):
    n, c, h, w = s[0]
    k, st, pad, d = p["kernel_size"], p["stride"], p["padding"], p["dilation"]
    ho, wo = conv_out(h, k, st, pad, d), conv_out(w, k, st, pad, d)
    return 2 * n * p["out_channels"] * ho * wo * floordiv(c, p["groups"]) * k * k


def _conv_weight_bytes(s, p, item):
    c = s[0][1]
    return (p["out_channels"] * floordiv(c, p["groups"]) * p["kernel_size"] ** 2 + p["out_channels"]) * item


def _conv_t_rule(dims, p, need):
    (x,) = dims
    need_rank(x, (4,), "conv_transpose2d")
    n, c, h, w = x
    k, s, pad, op, d = p["kernel_size"], p["stride"], p["padding"], p["output_padding"], p["dilation"]
    need(op < s or op < d, "conv_transpose2d needs output_padding < stride or < dilation")
    ho = conv_transpose_out(h, k, s, pad, op, d)
    wo = conv_transpose_out(w, k, s, pad, op, d)
    need(ho >= 1, "conv_transpose2d output height < 1")
    need(wo >= 1, "conv_transpose2d output width < 1")
    return (n, p["out_channels"], ho, wo)


def _conv_t_flops(s, p):
    n, c, h, w = s[0]
    return 2 * n * c * h * w * p["out_channels"] * p["kernel_size"] ** 2


def _conv_t_weight_bytes(s, p, item):
    return (s[0][1] * p["out_channels"] * p["kernel_size"] ** 2 + p["out_channels"]) * item


OPS: tuple[OpSpec, ...] = (
    rule_op("conv2d", "conv", 3, 1, "torch.nn.functional.conv2d", _conv_rule, _conv_flops,
            lambda a, p, m: f"{m}({a[0]})",
            params={"out_channels": (4, 8, 16, 32), "kernel_size": (1, 3, 5), "stride": (1, 2),
                    "padding": (0, 1, 2), "dilation": (1, 2), "groups": (1, 2, 4)},
            dim_params={"out_channels": (1, 256)}, ranks=(4,),
            module=lambda s, p: (f"nn.Conv2d({s[0][1]}, {p['out_channels']}, {p['kernel_size']}, "
                                 f"stride={p['stride']}, padding={p['padding']}, dilation={p['dilation']}, "
                                 f"groups={p['groups']})"),
            weight_bytes=_conv_weight_bytes, description="2-D convolution, NCHW, square kernel"),
    rule_op("conv_transpose2d", "conv", 3, 1, "torch.nn.functional.conv_transpose2d", _conv_t_rule,
            _conv_t_flops, lambda a, p, m: f"{m}({a[0]})",
            params={"out_channels": (4, 8, 16), "kernel_size": (2, 3, 4), "stride": (1, 2),
                    "padding": (0, 1), "output_padding": (0, 1), "dilation": (1,)},
            dim_params={"out_channels": (1, 256)}, ranks=(4,),
            module=lambda s, p: (f"nn.ConvTranspose2d({s[0][1]}, {p['out_channels']}, {p['kernel_size']}, "
                                 f"stride={p['stride']}, padding={p['padding']}, "
                                 f"output_padding={p['output_padding']}, dilation={p['dilation']})"),
            weight_bytes=_conv_t_weight_bytes, description="2-D transposed convolution, NCHW, square kernel"),
)


@hookimpl
def register_ops(register):
    for spec in OPS:
        register(spec.name, spec)

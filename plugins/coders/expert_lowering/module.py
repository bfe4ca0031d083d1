"""Assemble a lowered program into a KernelBench ``ModelNew`` module."""

from __future__ import annotations

from typing import Mapping

from core.program import _TORCH_DTYPE, OpSpec, Program
from plugins.coders.expert_lowering.attention_kernels import TILES_HELPER, attention_kernel
from plugins.coders.expert_lowering.binding import Binding
from plugins.coders.expert_lowering.codegen import Kernel, Lines, value_name
from plugins.coders.expert_lowering.conv_kernels import CHANNELS_LAST_HELPER, PAD5_HELPER, conv_kernel, pool_kernel
from plugins.coders.expert_lowering.elementwise_kernels import pointwise_kernel, row_kernel
from plugins.coders.expert_lowering.errors import Unsupported
from plugins.coders.expert_lowering.groupnorm_kernels import group_norm_kernel
from plugins.coders.expert_lowering.layout import COPY_HELPER, view_kernel
from plugins.coders.expert_lowering.matmul_kernels import matmul_kernel
from plugins.coders.expert_lowering.plan import COPY_OP, ROW_REDUCTIONS, Plan, plan_program
from plugins.coders.expert_lowering.pointwise import HELPERS, POINTWISE

# Group kind -> kernel emitter.
EMITTERS = {"pointwise": pointwise_kernel, "row": row_kernel, "view": view_kernel, "matmul": matmul_kernel,
            "conv": conv_kernel, "pool": pool_kernel, "group_norm": group_norm_kernel,
            "attention": attention_kernel}
ALL_HELPERS = dict(HELPERS, _strided_copy=COPY_HELPER, _pad5=PAD5_HELPER, _channels_last=CHANNELS_LAST_HELPER,
                   _attention_tiles=TILES_HELPER)

_SAME_SHAPE = ("softmax", "log_softmax", "layer_norm", "rms_norm", "batch_norm", "group_norm", "cumsum", "cumprod",
               "triu", "tril", COPY_OP)

# Op name -> forward expression of its output shape from its operands' shape variables.
SHAPE_RULES = {
    "transpose": lambda a, p: f"{a[0]}[:-2] + ({a[0]}[-1], {a[0]}[-2])",
    "permute": lambda a, p: "(" + ", ".join(f"{a[0]}[{int(d)}]" for d in p["dims"]) + ",)",
    "flatten": lambda a, p: f"({a[0]}[0], _numel({a[0]}[1:]))",
    "split_last": lambda a, p: f"{a[0]}[:-1] + ({a[0]}[-1] // {int(p['factor'])}, {int(p['factor'])})",
    "linear": lambda a, p: f"{a[0]}[:-1] + ({int(p['out_features'])},)",
    "matmul": lambda a, p: f"({a[0]}[0], {a[1]}[1])",
    "bmm": lambda a, p: f"({a[0]}[0], {a[0]}[1], {a[1]}[2])",
    "scaled_dot_product_attention": lambda a, p: f"{a[0]}[:3] + ({a[2]}[3],)",
    "conv2d": lambda a, p: _conv_shape(a[0], p),
    "conv_transpose2d": lambda a, p: _conv_t_shape(a[0], p),
    "max_pool2d": lambda a, p: _conv_shape(a[0], dict(p, dilation=p.get("dilation", 1), out_channels=None)),
    "avg_pool2d": lambda a, p: _conv_shape(a[0], dict(p, dilation=1, out_channels=None)),
}


def _conv_t_shape(x: str, p) -> str:
    k, s, pad, op, d = (int(p[key]) for key in ("kernel_size", "stride", "padding", "output_padding", "dilation"))
    size = lambda i: f"({x}[{i}] - 1) * {s} - {2 * pad} + {d * (k - 1)} + {op} + 1"  # noqa: E731
    return f"({x}[0], {int(p['out_channels'])}, {size(2)}, {size(3)})"


def _conv_shape(x: str, p) -> str:
    k, s, pad, d = (int(p[key]) for key in ("kernel_size", "stride", "padding", "dilation"))
    size = lambda i: f"({x}[{i}] + {2 * pad} - {d * (k - 1)} - 1) // {s} + 1"  # noqa: E731
    channels = x + "[1]" if p.get("out_channels") is None else str(int(p["out_channels"]))
    return f"({x}[0], {channels}, {size(2)}, {size(3)})"

SUPPORTED_DTYPES = ("float32", "float16", "bfloat16")

_PRELUDE = '''"""Expert lowering of: {summary}

Every op runs in the Triton kernels below; forward only allocates outputs, makes views and launches.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def _idx64(*tensors):
    # 64-bit index math only when an element offset may pass 2**31 - 1 (it costs a lot of issue slots)
    reach = 0
    for t in tensors:
        reach = max(reach, t.numel(), t.storage_offset() + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride())) + 1)
    return reach + 4096 >= 2 ** 31
'''


def _shape_line(plan: Plan, value: int, n_in: int) -> str:
    """``s<v> = ...``: the value's shape, computed in ``forward`` from its operands' shapes."""
    if value < n_in:
        return f"s{value} = tuple(x{value}.shape)"
    node = plan.node(value)
    a = [f"s{x}" for x in node.args]
    if node.op in POINTWISE or node.op in _SAME_SHAPE:
        return f"s{value} = {a[0]}"
    if node.op in ROW_REDUCTIONS:
        keep = bool(node.params.get("keepdim", False))
        return f"s{value} = {a[0]}[:-1] + (1,)" if keep else f"s{value} = {a[0]}[:-1]"
    rule = SHAPE_RULES.get(node.op)
    if rule is None or not _square(node.params):
        # Every task runs at the sizes it was written for: the planned shape is the shape.
        return f"s{value} = {tuple(int(d) for d in plan.shapes[value])!r}"
    return f"s{value} = {rule(a, node.params)}"


def _square(params) -> bool:
    """The shape rules above take one int per spatial parameter (a square kernel ...)."""
    return not any(isinstance(v, (list, tuple)) for k, v in params.items() if k != "dims")


def lower_program(program: Program, catalog: Mapping[str, OpSpec], binding: Binding | None = None) -> str:
    """The candidate module source for ``program``; raises :class:`Unsupported` with the reason.

    :param binding: where the weights come from when they are not the program's own modules
        (a program captured from a task's ``Model``); see :mod:`plugins.coders.expert_lowering.binding`.
    """
    dtypes = {t.dtype for t in program.inputs}
    if len(dtypes) > 1:
        raise Unsupported(f"inputs of mixed dtypes {sorted(dtypes)}")
    if program.dtype not in SUPPORTED_DTYPES:
        raise Unsupported(f"dtype {program.dtype!r} is not lowered (supported: {SUPPORTED_DTYPES})")
    plan = plan_program(program, catalog, binding.tensors if binding else None)
    n_in = len(program.inputs)
    n_args = binding.n_args if binding else n_in
    kernels: list[Kernel] = []
    for index, group in enumerate(plan.groups):
        emit = EMITTERS.get(group.kind)
        if emit is None:
            raise Unsupported(f"no kernel emitter for {group.kind!r} groups")
        kernels.append(emit(plan, group, index))

    init = Lines(indent=2)
    if binding is not None:
        init(*binding.init)
    for i, node in enumerate(program.nodes):
        spec = catalog[node.op]
        if spec.module is not None and binding is None:
            shapes = [plan.shapes[a] for a in node.args]
            ctor = spec.module(shapes, node.params)
            if program.dtype != "float32":
                ctor = f"{ctor}.to({_TORCH_DTYPE[program.dtype]})"
            init(f"self.m{n_in + i} = {ctor}")

    fwd = Lines(indent=2)
    for i in range(n_args, n_in):
        fwd(f"x{i} = {binding.inputs[i]}")
    stored = {o for g in plan.groups for o in g.outputs}
    for v in list(range(n_in)) + sorted(plan.group_of):
        fwd(_shape_line(plan, v, n_in))
    for group, kernel in zip(plan.groups, kernels):
        if group.kind != "view":
            for o in group.outputs:
                fwd(f"v{o} = torch.empty(s{o}, device=x0.device, dtype=x0.dtype)")
        fwd(*kernel.launch)
    assert plan.output in stored
    fwd(f"return {value_name(plan.output, n_in)}")

    helpers = sorted(set().union(*(k.helpers for k in kernels)))
    parts = [_PRELUDE.format(summary=" -> ".join(program.ops))]
    parts += ["\n" + ALL_HELPERS[h] for h in helpers]
    parts += ["\n" + k.source for k in kernels if k.source]
    if binding is not None and binding.preamble:
        parts.append("\n" + binding.preamble)
    args = ", ".join(binding.arg_names if binding is not None and binding.arg_names is not None
                     else [f"x{i}" for i in range(n_args)])
    signature = f"self, {binding.signature}" if binding is not None and binding.signature else "self"
    cls = Lines()
    cls("", "class ModelNew(nn.Module):", f"    def __init__({signature}):", "        super().__init__()")
    cls.lines += init.lines
    cls("", f"    def forward(self, {args}):")
    cls.lines += fwd.lines
    parts.append("\n" + cls.text())
    return "\n".join(p.rstrip("\n") + "\n" for p in parts)

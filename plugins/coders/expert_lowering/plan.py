"""Partition a program into fusion groups; each group becomes one Triton kernel.

Values inside a group live in registers; a value leaves its group (is stored to memory) only when a
later group reads it or it is the program's output.

Group kinds:

``pointwise``  elementwise ops over one shape, a flat masked kernel.
``row``        ops over rows of a base shape ``S`` (row length ``S[-1]``): elementwise ops on whole
               rows, row reductions (sum, mean, amax, logsumexp), softmax/log_softmax and norms over
               the last dimension, and elementwise ops on the per-row results. Each value in a row
               group is of kind ``row`` (shape ``S``) or ``scal`` (one value per row).
other kinds    one "anchor" op (matmul, conv, pool, layout ...) with a fused elementwise epilogue.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from core.program import Node, OpSpec, Program, Shape
from plugins.coders.expert_lowering.errors import Unsupported
from plugins.coders.expert_lowering.pointwise import POINTWISE

ROW_REDUCTIONS = ("sum", "mean", "amax", "amin", "logsumexp")
ROW_NORMS = ("layer_norm", "rms_norm")  # row -> row, with affine weights over the last dim
ROW_SCANS = ("cumsum", "cumprod")  # row -> row, inclusive scans
ROW_MAPS = ("softmax", "log_softmax") + ROW_NORMS + ROW_SCANS
ROW_OPS = ROW_REDUCTIONS + ROW_MAPS
# Pointwise ops that read their element's index (its channel, its row and column): flat kernels only.
CHANNEL_OPS = ("batch_norm", "triu", "tril")
LAYOUT_OPS = ("transpose", "permute", "flatten", "split_last", "reshape", "expand")  # views (or a copy, then a view)
RESHAPES = ("flatten", "split_last", "reshape")  # a view of a contiguous tensor stays contiguous
MATMUL_OPS = ("linear", "matmul", "bmm")
CONV_OPS = ("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")
POOL_OPS = ("max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "avg_pool2d", "avg_pool3d")
GROUP_NORM_OPS = ("group_norm",)
ATTENTION_OPS = ("scaled_dot_product_attention",)
COPY_OP = "_copy"  # a synthetic identity node: materialises an output that would alias an input


@dataclass
class Group:
    kind: str
    shape: Shape  # pointwise: the shape of every value; row: the base shape S
    nodes: list[int] = field(default_factory=list)  # value ids defined here, in order
    kinds: dict[int, str] = field(default_factory=dict)  # row groups: value -> "row" | "scal"
    outputs: list[int] = field(default_factory=list)  # values stored to memory
    reads: list[int] = field(default_factory=list)  # values loaded from memory (inputs or earlier groups)
    anchor: int | None = None  # the value of the anchor op (non-pointwise, non-row groups)
    channel: bool = False  # holds a per-channel op (batch_norm): must stay a flat pointwise kernel

    def defines(self, value: int) -> bool:
        return value in self.nodes


@dataclass
class Plan:
    program: Program
    shapes: list[Shape]
    groups: list[Group]
    group_of: dict[int, int]  # value id -> index of the group defining it
    extra: dict[int, Node] = field(default_factory=dict)  # synthetic nodes (an output copy)
    output: int = -1  # the value forward returns
    # (value, attribute) -> forward expression of a weight tensor, or None for an absent one (no bias);
    # unbound pairs read the op's own module, ``self.m<value>.<attribute>``
    tensors: dict[tuple[int, str], str | None] = field(default_factory=dict)

    def node(self, value: int) -> Node:
        if value in self.extra:
            return self.extra[value]
        return self.program.nodes[value - len(self.program.inputs)]

    def tensor(self, value: int, attr: str) -> str | None:
        """Forward expression of weight ``attr`` of the op defining ``value`` (None: it has none)."""
        if (value, attr) in self.tensors:
            return self.tensors[(value, attr)]
        return f"self.m{value}.{attr}"


def _row_kind_of_shape(shape: Shape, base: Shape) -> str | None:
    if tuple(shape) == tuple(base):
        return "row"
    if tuple(shape) in (tuple(base[:-1]), tuple(base[:-1]) + (1,)):
        return "scal"
    return None


def _check_reduction_params(op: str, params: Mapping[str, Any]) -> None:
    allowed = {"keepdim"} if op in ROW_REDUCTIONS else {"reverse"} if op in ROW_SCANS else set()
    allowed |= {"dim"}
    extra = set(params) - allowed
    if extra:
        raise Unsupported(f"{op}: parameters {sorted(extra)} are not understood by the expert lowering")
    dim = params.get("dim", -1)
    if dim not in (-1, None):
        raise Unsupported(f"{op}: only the last dimension (dim=-1) is lowered, found dim={dim!r}")


def is_pointwise(op: str) -> bool:
    return op in POINTWISE or op in CHANNEL_OPS or op == COPY_OP


def _try_join(group: Group, op: str, value: int, args: tuple[int, ...], shapes: list[Shape]) -> bool:
    """Add the node to ``group`` if the group can compute it in registers; return whether it did."""
    out_shape = shapes[value]
    if op in ("expand", "reshape") and group.kind == "row":
        # A per-row scalar broadcast along its row (x - x.mean(-1, keepdim=True)), or re-viewed with
        # or without its unit dim: no data moves, the value stays in registers.
        (a,) = args
        kind = None
        if group.kinds.get(a) == "scal":
            if op == "expand" and tuple(out_shape) == tuple(group.shape) \
                    and tuple(shapes[a]) == tuple(group.shape[:-1]) + (1,):
                kind = "row"
            elif op == "reshape" and _row_kind_of_shape(out_shape, group.shape) == "scal":
                kind = "scal"
        if kind is None:
            return False
        group.nodes.append(value)
        group.kinds[value] = kind
        return True
    if op in CHANNEL_OPS and group.kind != "pointwise":
        return False
    if is_pointwise(op):
        if group.kind == "pointwise":
            if tuple(out_shape) != tuple(group.shape):
                return False
            if any(tuple(shapes[a]) != tuple(group.shape) for a in args):
                return False
            group.nodes.append(value)
            return True
        if group.kind == "row":
            kinds = []
            for a in args:
                kind = group.kinds.get(a) or _row_kind_of_shape(shapes[a], group.shape)
                if kind is None:
                    return False
                kinds.append(kind)
            out_kind = "row" if "row" in kinds else "scal"
            if _row_kind_of_shape(out_shape, group.shape) is None:
                return False
            group.nodes.append(value)
            group.kinds[value] = out_kind
            return True
        if op in CHANNEL_OPS:
            return False
        if group.anchor is not None and group.kind in EPILOGUE_KINDS:
            # Elementwise epilogue of an anchor op: every operand has the anchor's output shape.
            anchor_shape = tuple(shapes[group.anchor])
            if tuple(out_shape) != anchor_shape or any(tuple(shapes[a]) != anchor_shape for a in args):
                return False
            group.nodes.append(value)
            return True
        return False
    if op in ROW_OPS:
        (a,) = args
        # A group with channel ops stays a flat kernel (their channel index comes from the flat index).
        if group.kind == "pointwise" and group.defines(a) and len(shapes[a]) >= 1 and not group.channel:
            group.kind = "row"
            group.kinds = {v: "row" for v in group.nodes}
        if group.kind != "row" or group.kinds.get(a) != "row":
            return False
        group.nodes.append(value)
        group.kinds[value] = "scal" if op in ROW_REDUCTIONS else "row"
        return True
    return False


# Anchor kinds whose output an elementwise epilogue may extend.
EPILOGUE_KINDS: set[str] = {"matmul", "conv", "pool", "group_norm", "attention"}


def _check_params(op: str, params: Mapping[str, Any], allowed: set[str]) -> None:
    extra = set(params) - allowed
    if extra:
        raise Unsupported(f"{op}: parameters {sorted(extra)} are not understood by the expert lowering")


def _live_values(program: Program) -> set[int]:
    """Values the output depends on (nodes outside this set are dead code)."""
    n_in = len(program.inputs)
    live = {program.output}
    for i in reversed(range(len(program.nodes))):
        if n_in + i in live:
            live.update(program.nodes[i].args)
    return live


def _view_root(plan_nodes, value: int, n_in: int) -> tuple[int, bool]:
    """(the value a chain of views starts from, whether every view in it is a reshape)."""
    only_reshapes = True
    while value >= n_in and plan_nodes(value).op in LAYOUT_OPS:
        only_reshapes &= plan_nodes(value).op in RESHAPES
        value = plan_nodes(value).args[0]
    return value, only_reshapes


def plan_program(program: Program, catalog: Mapping[str, OpSpec],
                 tensors: Mapping[tuple[int, str], str | None] | None = None) -> Plan:
    """Greedy fusion in program order: a node joins the last group when it can, else opens one."""
    shapes = program.value_shapes(catalog)
    n_in = len(program.inputs)
    groups: list[Group] = []
    group_of: dict[int, int] = {}
    live = _live_values(program)
    for i, node in enumerate(program.nodes):
        value = n_in + i
        if value not in live:
            continue  # its result is never used: no kernel computes it
        op = node.op
        if op in ROW_OPS and op not in ROW_NORMS:
            _check_reduction_params(op, node.params)
            if len(shapes[node.args[0]]) == 0:
                raise Unsupported(f"{op} of a 0-d tensor")
        if op in ROW_NORMS:
            _check_params(op, node.params, {"eps"})
        if op in CHANNEL_OPS:
            _check_params(op, node.params, {"eps"} if op == "batch_norm" else {"diagonal"})
        if groups and _try_join(groups[-1], op, value, node.args, shapes):
            group_of[value] = len(groups) - 1
            groups[-1].channel |= op in CHANNEL_OPS
            continue
        if is_pointwise(op):
            group = Group("pointwise", tuple(shapes[value]), [value], channel=op in CHANNEL_OPS)
        elif op in ROW_OPS:
            base = tuple(shapes[node.args[0]])
            group = Group("row", base, [value], {value: "scal" if op in ROW_REDUCTIONS else "row"})
        elif op in LAYOUT_OPS:
            group = Group("view", tuple(shapes[value]), [value], anchor=value)
        elif op in MATMUL_OPS:
            _check_params(op, node.params, {"out_features", "bias"} if op == "linear" else set())
            group = Group("matmul", tuple(shapes[value]), [value], anchor=value)
        elif op in CONV_OPS:
            group = Group("conv", tuple(shapes[value]), [value], anchor=value)
        elif op in POOL_OPS:
            group = Group("pool", tuple(shapes[value]), [value], anchor=value)
        elif op in ATTENTION_OPS:
            group = Group("attention", tuple(shapes[value]), [value], anchor=value)
        elif op in GROUP_NORM_OPS:
            group = Group("group_norm", tuple(shapes[value]), [value], anchor=value)
        else:
            raise Unsupported(f"op {op!r} ({catalog[op].family}) has no expert lowering yet")
        groups.append(group)
        group_of[value] = len(groups) - 1
    # Which values cross group boundaries: stored by their producer, loaded by their consumers.
    for i, node in enumerate(program.nodes):
        if n_in + i not in live:
            continue
        consumer = group_of[n_in + i]
        for a in node.args:
            producer = group_of.get(a)
            if producer != consumer:
                if a not in groups[consumer].reads:
                    groups[consumer].reads.append(a)
                if producer is not None and a not in groups[producer].outputs:
                    groups[producer].outputs.append(a)
    out = program.output
    extra: dict[int, Node] = {}
    root, only_reshapes = _view_root(lambda v: program.nodes[v - n_in], out, n_in)
    if groups[group_of[out]].kind == "view" and (root < n_in or not only_reshapes):
        # The output would be a view of an input, or a permuted or broadcast view of a kernel's
        # result: copy it out with a kernel, so the caller gets a fresh, dense tensor that some
        # kernel wrote. A reshape of a kernel's own (contiguous) result is returned as it is.
        copy = len(shapes)
        extra[copy] = Node(COPY_OP, (out,))
        shapes.append(tuple(shapes[out]))
        groups.append(Group("pointwise", tuple(shapes[out]), [copy], reads=[out]))
        group_of[copy] = len(groups) - 1
        groups[group_of[out]].outputs.append(out)
        out = copy
    if out not in groups[group_of[out]].outputs:
        groups[group_of[out]].outputs.append(out)
    return Plan(program, shapes, groups, group_of, extra, out, dict(tensors or {}))

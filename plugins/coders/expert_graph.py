"""Building a :class:`core.program.Program` from a captured graph: values, weights, views, broadcasts.

:class:`GraphBuilder` is what :mod:`plugins.coders.expert_aten` writes into. Values are :class:`Ref`
s until :meth:`GraphBuilder.finish` numbers them: forward arguments first, then the weights the
graph read (each bound to an expression on the task's model, ``self.w.conv.weight``), then the
nodes that are views of inputs only (hoisted, so that ``conv -> x + bias`` still fuses the add into
the conv's epilogue: the bias's broadcast view is made before the conv), then the rest in graph
order. Every op goes through the catalog's shape rule, so a wrong translation fails here, loudly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from core.program import Node, OpSpec, Program, ProgramError, Shape, TensorSpec
from plugins.coders.expert_lowering.binding import Binding
from plugins.coders.expert_lowering.errors import Unsupported
from plugins.coders.expert_lowering.plan import LAYOUT_OPS, RESHAPES
from plugins.coders.expert_lowering.pointwise import POINTWISE


@dataclass(frozen=True)
class Ref:
    """A value while capturing: a forward argument, a weight, or the result of node ``index``."""

    kind: str  # "arg" | "weight" | "node"
    index: int


@dataclass(frozen=True)
class Flipped:
    """``ref`` reversed along ``dims``: only a scan along those dims (or a flip back) consumes it."""

    ref: Ref
    dims: tuple[int, ...]


@dataclass
class _Pending:
    op: str
    args: tuple[Ref, ...]
    params: dict[str, Any]
    tensors: dict[str, str | None] = field(default_factory=dict)


class GraphBuilder:
    """Collects inputs, weights and nodes; shapes come from the catalog's rules as they are added."""

    def __init__(self, catalog: Mapping[str, OpSpec], dtype: str = "float32") -> None:
        self.catalog = catalog
        self.dtype = dtype
        self.args: list[TensorSpec] = []
        self.weights: list[tuple[TensorSpec, str]] = []
        self._weight_of: dict[str, Ref] = {}
        self.nodes: list[_Pending] = []
        self.shapes: dict[Ref, Shape] = {}
        self.current_shape: Shape = ()  # the graph's shape of the value being translated

    def expr_of(self, ref: Ref, what: str) -> str:
        """The model expression of a weight (``self.w.conv.weight``); a computed value has none."""
        if ref.kind != "weight":
            raise Unsupported(f"{what} is computed in forward, not a tensor of the model; the expert binds "
                              "weights only to the model's own parameters and buffers")
        return self.weights[ref.index][1]

    # ------------------------------------------------------------------ values

    def arg(self, shape: Sequence[int]) -> Ref:
        ref = Ref("arg", len(self.args))
        self.args.append(TensorSpec(tuple(shape), dtype=self.dtype))
        self.shapes[ref] = tuple(int(d) for d in shape)
        return ref

    def weight(self, shape: Sequence[int], expr: str) -> Ref:
        """A tensor the task's model holds (parameter, buffer or constant), read through ``expr``."""
        if expr in self._weight_of:
            return self._weight_of[expr]
        ref = Ref("weight", len(self.weights))
        self.weights.append((TensorSpec(tuple(shape), dtype=self.dtype), expr))
        self._weight_of[expr] = ref
        self.shapes[ref] = tuple(int(d) for d in shape)
        return ref

    def shape(self, ref: Ref) -> Shape:
        return self.shapes[ref]

    def op(self, name: str, args: Sequence[Ref], params: Mapping[str, Any] | None = None,
           tensors: Mapping[str, str | None] | None = None) -> Ref:
        """Append catalog op ``name``; ``tensors``: the op's weights by attribute (``{"weight": expr}``)."""
        spec = self.catalog.get(name)
        if spec is None:
            raise Unsupported(f"op {name!r} is not in the expert's catalog")
        params = dict(params or {})
        try:
            shape = tuple(int(d) for d in spec.infer_shape([self.shapes[a] for a in args], params))
        except ProgramError as exc:
            raise Unsupported(f"{name}: {exc}") from None
        ref = Ref("node", len(self.nodes))
        self.nodes.append(_Pending(name, tuple(args), params, dict(tensors or {})))
        self.shapes[ref] = shape
        return ref

    # ------------------------------------------------------------------ views and broadcasts

    def reshape(self, ref: Ref, shape: Sequence[int], force: bool = False) -> Ref:
        shape = tuple(int(d) for d in shape)
        if shape == self.shapes[ref] and not force:
            return ref
        return self.op("reshape", [ref], {"shape": shape})

    def reshape_for_rows(self, ref: Ref, shape: Sequence[int]) -> Ref:
        """``ref`` reshaped into the rows a reduction reads: a reshape of an elementwise result is moved onto
        that op's operands, so the op joins the reduction's row kernel instead of writing an input-sized
        intermediate (``torch.norm``'s ``x * x``: 7.5 GB at ``37_FrobeniusNorm_``'s size). Only through ops whose
        operands all have its shape and are an input, a weight or a kernel's own result (a contiguous tensor,
        which a reshape only relabels): a permuted or broadcast view keeps the reshape where it is."""
        shape = tuple(int(d) for d in shape)
        if shape == self.shapes[ref]:
            return ref
        if ref.kind == "node":
            node = self.nodes[ref.index]
            if node.op in RESHAPES:  # a reshape of a reshape: one reshape of its source
                return self.reshape_for_rows(node.args[0], shape)
            if node.op in POINTWISE and node.args and not node.tensors and all(
                    self.shapes[a] == self.shapes[ref] and self._contiguous(a) for a in node.args):
                return self.op(node.op, [self.reshape_for_rows(a, shape) for a in node.args], node.params)
        return self.reshape(ref, shape)

    def _contiguous(self, ref: Ref) -> bool:
        """An input, a weight, a kernel's result, or a reshape of one: what a reshape only relabels."""
        while ref.kind == "node" and self.nodes[ref.index].op in RESHAPES:
            ref = self.nodes[ref.index].args[0]
        return ref.kind != "node" or self.nodes[ref.index].op not in LAYOUT_OPS

    def permute(self, ref: Ref, perm: Sequence[int]) -> Ref:
        perm = tuple(int(p) for p in perm)
        rank = len(self.shapes[ref])
        if perm == tuple(range(rank)):
            return ref
        if rank >= 2 and perm == tuple(range(rank - 2)) + (rank - 1, rank - 2):
            return self.op("transpose", [ref])
        return self.op("permute", [ref], {"dims": perm})

    def expand(self, ref: Ref, shape: Sequence[int]) -> Ref:
        shape = tuple(int(d) for d in shape)
        if shape == self.shapes[ref]:
            return ref
        return self.op("expand", [ref], {"shape": shape})

    def broadcast(self, *refs: Ref) -> list[Ref]:
        """Every operand expanded to their common broadcast shape."""
        try:
            import torch

            shape = tuple(torch.broadcast_shapes(*(self.shapes[r] for r in refs)))
        except RuntimeError as exc:
            raise Unsupported(f"operands do not broadcast: {exc}") from None
        return [self.expand(r, shape) for r in refs]

    def move_last(self, ref: Ref, dim: int) -> tuple[Ref, tuple[int, ...] | None]:
        """``ref`` with ``dim`` moved last, and the permutation that moves it back (None: it was last)."""
        rank = len(self.shapes[ref])
        dim = dim % rank if rank else 0
        if dim == rank - 1 or rank == 0:
            return ref, None
        perm = tuple(d for d in range(rank) if d != dim) + (dim,)
        back = tuple(perm.index(d) for d in range(rank))
        return self.permute(ref, perm), back

    # ------------------------------------------------------------------ the program

    def _pure_views(self) -> set[int]:
        """Nodes that are views of inputs only: they may run first."""
        pure: set[int] = set()
        for i, node in enumerate(self.nodes):
            if node.op in LAYOUT_OPS and all(a.kind != "node" or a.index in pure for a in node.args):
                pure.add(i)
        return pure

    def finish(self, output: Ref) -> tuple[Program, Binding]:
        """The program computing ``output`` (dead nodes dropped) and where its weights come from."""
        if output.kind != "node":
            output = self.reshape(output, self.shapes[output], force=True)  # forward returns an input
        live: set[int] = set()
        todo = [output]
        while todo:
            ref = todo.pop()
            if ref.kind == "node" and ref.index not in live:
                live.add(ref.index)
                todo.extend(self.nodes[ref.index].args)
        used_weights = sorted({a.index for i in live for a in self.nodes[i].args if a.kind == "weight"})
        n_args = len(self.args)
        ids: dict[Ref, int] = {Ref("arg", i): i for i in range(n_args)}
        inputs = list(self.args)
        bound: dict[int, str] = {}
        for w in used_weights:
            spec, expr = self.weights[w]
            ids[Ref("weight", w)] = len(inputs)
            bound[len(inputs)] = expr
            inputs.append(spec)
        pure = self._pure_views()
        order = [i for i in sorted(live) if i in pure] + [i for i in sorted(live) if i not in pure]
        nodes: list[Node] = []
        tensors: dict[tuple[int, str], str | None] = {}
        for i in order:
            pending = self.nodes[i]
            value = len(inputs) + len(nodes)
            ids[Ref("node", i)] = value
            nodes.append(Node(pending.op, tuple(ids[a] for a in pending.args), pending.params))
            for attr, expr in pending.tensors.items():
                tensors[(value, attr)] = expr
        program = Program(inputs, nodes)
        if ids[output] != program.output:
            raise Unsupported("the captured output is not the last value (internal ordering error)")
        return program, Binding(n_args=n_args, inputs=bound, tensors=tensors)


def numel(shape: Sequence[int]) -> int:
    return math.prod(shape) if shape else 1

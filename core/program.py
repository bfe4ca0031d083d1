"""The proposer IR: a typed graph of PyTorch API calls, and its rendering to a KernelBench task.

A :class:`Program` holds input tensor specs and a list of :class:`Node` s in topological order.
Values are numbered: ``0 .. len(inputs)-1`` are the inputs, then node ``i`` defines value
``len(inputs) + i``. The last node's value is the program's output.

An :class:`OpSpec` (registered through ``register_ops``) says how one PyTorch API call renders,
which parameters it takes, its shape rule and its cost. The proposers build programs from op specs;
the expert coder lowers programs to kernels; :func:`render_task_source` turns a program into the
KernelBench module text that every other part of the system sees.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Sequence

Shape = tuple[int, ...]

DTYPES: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2}

# Input layouts. Every layout yields a tensor of the declared shape; only its memory differs.
LAYOUTS = ("contiguous", "transposed", "offset", "strided")
# Value distributions of generated inputs.
DISTRIBUTIONS = ("randn", "rand", "specials")


class ProgramError(ValueError):
    """A program is malformed: unknown op, bad arity, inconsistent shapes or parameters."""


@dataclass(frozen=True)
class OpSpec:
    """One PyTorch API the proposers may compose.

    :param name: catalog name (``"relu"``, ``"linear"`` ...).
    :param family: ``elementwise``, ``activation``, ``reduction``, ``softmax``, ``norm``, ``matmul``,
        ``conv``, ``pool``, ``layout``, ``attention``; coders and summaries group by it.
    :param tier: curriculum tier (0 = easiest); curricula introduce higher tiers over time.
    :param arity: number of tensor arguments.
    :param call: the PyTorch API, for humans and prompts (``"torch.nn.functional.gelu"``).
    :param params: parameter space: name -> the values (or buckets) a proposer may choose.
    :param infer_shape: ``(input_shapes, params) -> output shape``; raises ``ProgramError`` if invalid.
    :param flops: ``(input_shapes, params) -> floating-point operations``.
    :param render: ``(arg_names, params, module) -> Python expression`` for ``forward``;
        ``module`` is the attribute holding the op's ``nn.Module`` (``"self.m3"``) or ``None``.
    :param module: optional ``(input_shapes, params) -> constructor expression`` of an
        ``nn.Module`` built in ``__init__`` (weights); the renderer assigns it to ``self.m<k>``.
    :param weight_bytes: optional ``(input_shapes, params, itemsize) -> bytes`` of weights read.
    :param constrain: optional z3 hook ``(ctx, input_dims, params) -> output_dims``; see
        ``plugins.proposers.solver.ShapeContext`` for the context object. Ops without it are
        shape-preserving (every tensor argument has the first one's shape).
    :param ranks: ranks the first tensor argument may have (``()`` = any rank from 1 to 4). Further
        tensor arguments get the first one's rank; ``constrain`` ties their dimensions.
    """

    name: str
    family: str
    tier: int
    arity: int
    call: str
    params: Mapping[str, tuple] = field(default_factory=dict)
    infer_shape: Callable[[Sequence[Shape], Mapping[str, Any]], Shape] = lambda shapes, p: tuple(shapes[0])
    flops: Callable[[Sequence[Shape], Mapping[str, Any]], int] = lambda shapes, p: math.prod(shapes[0])
    render: Callable[[Sequence[str], Mapping[str, Any], str | None], str] | None = None
    module: Callable[[Sequence[Shape], Mapping[str, Any]], str] | None = None
    weight_bytes: Callable[[Sequence[Shape], Mapping[str, Any], int], int] | None = None
    constrain: Callable[..., Any] | None = None
    description: str = ""
    ranks: tuple[int, ...] = ()


@dataclass(frozen=True)
class TensorSpec:
    shape: Shape
    dtype: str = "float32"
    layout: str = "contiguous"
    distribution: str = "randn"
    scale: float = 1.0  # values are drawn, then multiplied by this (extreme magnitudes)

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if self.dtype not in DTYPES:
            raise ProgramError(f"unknown dtype {self.dtype!r}; expected one of {sorted(DTYPES)}")
        if self.layout not in LAYOUTS:
            raise ProgramError(f"unknown layout {self.layout!r}; expected one of {LAYOUTS}")
        if self.distribution not in DISTRIBUTIONS:
            raise ProgramError(f"unknown distribution {self.distribution!r}; expected one of {DISTRIBUTIONS}")
        if any(d < 0 for d in self.shape):
            raise ProgramError(f"negative dimension in shape {self.shape}")


@dataclass(frozen=True)
class Node:
    op: str
    args: tuple[int, ...]
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", tuple(int(a) for a in self.args))
        object.__setattr__(self, "params", dict(self.params))


@dataclass
class Program:
    inputs: list[TensorSpec]
    nodes: list[Node]

    # ------------------------------------------------------------------ structure

    @property
    def output(self) -> int:
        return len(self.inputs) + len(self.nodes) - 1

    @property
    def dtype(self) -> str:
        return self.inputs[0].dtype if self.inputs else "float32"

    @property
    def ops(self) -> list[str]:
        return [n.op for n in self.nodes]

    def value_shapes(self, catalog: Mapping[str, OpSpec]) -> list[Shape]:
        """Shapes of every value; raises :class:`ProgramError` on any inconsistency."""
        if not self.nodes:
            raise ProgramError("a program needs at least one op")
        shapes: list[Shape] = [t.shape for t in self.inputs]
        for i, node in enumerate(self.nodes):
            spec = _lookup(catalog, node.op)
            if len(node.args) != spec.arity:
                raise ProgramError(f"node {i} ({node.op}) takes {spec.arity} tensors, got {len(node.args)}")
            for a in node.args:
                if not 0 <= a < len(shapes):
                    raise ProgramError(f"node {i} ({node.op}) reads value {a}, defined are 0..{len(shapes) - 1}")
            out = tuple(int(d) for d in spec.infer_shape([shapes[a] for a in node.args], node.params))
            if any(d < 0 for d in out):
                raise ProgramError(f"node {i} ({node.op}) infers a negative dimension {out}")
            shapes.append(out)
        return shapes

    def flops(self, catalog: Mapping[str, OpSpec]) -> int:
        shapes = self.value_shapes(catalog)
        return int(sum(_lookup(catalog, n.op).flops([shapes[a] for a in n.args], n.params) for n in self.nodes))

    def min_bytes(self, catalog: Mapping[str, OpSpec]) -> int:
        """Fewest bytes a fused kernel must move: inputs and weights read once, output written once."""
        shapes = self.value_shapes(catalog)
        item = DTYPES[self.dtype]
        total = sum(math.prod(t.shape) for t in self.inputs) * item + math.prod(shapes[-1]) * item
        for n in self.nodes:
            spec = _lookup(catalog, n.op)
            if spec.weight_bytes is not None:
                total += spec.weight_bytes([shapes[a] for a in n.args], n.params, item)
        return int(total)

    def intermediates(self) -> int:
        """Values computed and consumed inside the program (each needs a temporary unless fused)."""
        return max(0, len(self.nodes) - 1)

    # ------------------------------------------------------------------ serialisation

    def to_dict(self) -> dict[str, Any]:
        return {
            "inputs": [asdict(t) | {"shape": list(t.shape)} for t in self.inputs],
            "nodes": [{"op": n.op, "args": list(n.args), "params": dict(n.params)} for n in self.nodes],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Program":
        return cls(
            inputs=[TensorSpec(**t) for t in data["inputs"]],
            nodes=[Node(n["op"], tuple(n["args"]), n.get("params", {})) for n in data["nodes"]],
        )

    @classmethod
    def from_json(cls, text: str) -> "Program":
        return cls.from_dict(json.loads(text))


def _lookup(catalog: Mapping[str, OpSpec], name: str) -> OpSpec:
    try:
        return catalog[name]
    except KeyError:
        raise ProgramError(f"unknown op {name!r}; known ops: {', '.join(sorted(catalog))}") from None


# ---------------------------------------------------------------------- rendering

_TORCH_DTYPE = {"float32": "torch.float32", "float16": "torch.float16", "bfloat16": "torch.bfloat16"}


def _render_input(t: TensorSpec) -> str:
    """Expression that draws one input with the spec's value distribution, then its layout.

    Values are drawn (and scaled, and specials planted) on a contiguous base tensor; the layout
    is a view of that base, so non-contiguous and offset inputs keep their strides.
    """
    dims = list(t.shape)
    dt = _TORCH_DTYPE[t.dtype]
    draw = "torch.rand" if t.distribution == "rand" else "torch.randn"

    def base(base_dims: list[int]) -> str:
        expr = f"{draw}({', '.join([*map(str, base_dims), f'dtype={dt}'])})"
        if t.scale != 1.0:
            expr = f"({expr} * {t.scale!r})"
        return expr

    if t.layout == "transposed" and len(dims) >= 2:
        expr = f"{base(dims[:-2] + [dims[-1], dims[-2]])}.transpose(-1, -2)"
    elif t.layout == "strided" and dims:
        expr = f"{base(dims[:-1] + [dims[-1] * 2])}[..., ::2]"
    elif t.layout == "offset":
        # One extra element in front: the view starts misaligned for any vector width > 1.
        expr = f"{base([math.prod(dims) + 1])}[1:].view({', '.join(map(str, dims)) or '()'})"
    else:
        expr = base(dims)
    return f"_with_specials({expr})" if t.distribution == "specials" else expr


_SPECIALS_HELPER = '''

def _with_specials(t):
    """Plant NaN, +Inf and -Inf at the first, middle and last element (in place, any layout)."""
    n = t.numel()
    if n >= 3:
        for flat_index, value in ((0, float("nan")), (n // 2, float("inf")), (n - 1, float("-inf"))):
            t[torch.unravel_index(torch.tensor(flat_index), t.shape)] = value
    return t
'''


def render_task_source(program: Program, catalog: Mapping[str, OpSpec], *, docstring: str = "") -> str:
    """The KernelBench-format module (``Model``, ``get_inputs``, ``get_init_inputs``) of a program."""
    shapes = program.value_shapes(catalog)
    n_in = len(program.inputs)
    names = [f"x{i}" for i in range(n_in)] + [f"v{n_in + i}" for i in range(len(program.nodes))]
    init_lines: list[str] = []
    body: list[str] = []
    for i, node in enumerate(program.nodes):
        spec = _lookup(catalog, node.op)
        in_shapes = [shapes[a] for a in node.args]
        mod = None
        if spec.module is not None:
            mod = f"self.m{n_in + i}"
            ctor = spec.module(in_shapes, node.params)
            if program.dtype != "float32":
                ctor = f"{ctor}.to({_TORCH_DTYPE[program.dtype]})"
            init_lines.append(f"        {mod} = {ctor}")
        if spec.render is None:
            raise ProgramError(f"op {node.op!r} has no render function")
        expr = spec.render([names[a] for a in node.args], node.params, mod)
        body.append(f"        {names[n_in + i]} = {expr}")
    body.append(f"        return {names[-1]}")
    doc = docstring or " -> ".join(program.ops)
    uses_specials = any(t.distribution == "specials" for t in program.inputs)
    lines = [
        '"""' + doc.replace('"""', "'''") + '"""',
        "import torch",
        "import torch.nn as nn",
        "import torch.nn.functional as F",
        "",
        "",
        "class Model(nn.Module):",
        "    def __init__(self):",
        "        super().__init__()",
        *(init_lines or []),
        "",
        f"    def forward(self, {', '.join(names[:n_in])}):",
        *body,
        "",
        "",
        "def get_inputs():",
        f"    return [{', '.join(_render_input(t) for t in program.inputs)}]",
        "",
        "",
        "def get_init_inputs():",
        "    return []",
    ]
    source = "\n".join(lines) + "\n"
    if uses_specials:
        source += _SPECIALS_HELPER
    return source

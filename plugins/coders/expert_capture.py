"""Capture any KernelBench task's ``Model.forward`` as the expert's program IR.

``capture(task, catalog)`` builds the task's ``Model`` from its own ``get_init_inputs()`` and traces
``forward`` on its own ``get_inputs()`` with ``torch.export`` on the ``meta`` device (shapes only:
no weights are drawn and nothing is computed, so a task at full KernelBench size captures in well
under a second). The exported graph is ATen: every ``nn.Module``, ``F.*`` function, tensor method
and operator arrives as one small, fixed vocabulary with normalised arguments (``aten.conv2d``
with its stride/padding/dilation/groups, ``aten.add.Tensor`` with ``alpha``), parameters and
buffers arrive as named graph inputs (``conv.weight``), and Python control flow and shape
arithmetic are already resolved at the traced sizes. That is why export, not
``torch.fx.symbolic_trace``: symbolic tracing keeps modules and methods (hundreds of spellings of
one op) and fails on shape-dependent code; ``make_fx`` decomposes too far (``linear`` becomes
``t`` + ``addmm``, ``gelu`` becomes ``erf`` arithmetic) and loses the parameter names.

:mod:`plugins.coders.expert_aten` translates the graph into catalog ops. The candidate builds its
weights by running the task's own ``__init__`` (the ``Model`` class, renamed ``_TaskInit``, without
``forward``), so the verifier's seed gives it exactly the reference's parameters, however the
task initialises them; each kernel reads its weights from that module (``self.w.conv.weight``).
"""

from __future__ import annotations

import ast
import importlib.util
import itertools
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator, Mapping

from core.program import OpSpec, Program
from core.task import Task
from plugins.coders.expert_aten import HANDLERS, arguments, op_name
from plugins.coders.expert_graph import Flipped, GraphBuilder, Ref
from plugins.coders.expert_lowering.binding import Binding
from plugins.coders.expert_lowering.errors import CaptureFailed, MissingOp, Unsupported

INIT_CLASS = "_TaskInit"
MODEL_ATTR = "w"
_counter = itertools.count()
_TORCH_DTYPES = {"torch.float32": "float32", "torch.float16": "float16", "torch.bfloat16": "bfloat16"}


@dataclass
class Captured:
    """A task's forward as the expert's IR, and how the candidate binds its weights."""

    program: Program
    binding: Binding
    aten_ops: list[str] = field(default_factory=list)  # the graph's ATen ops, in order of first use


@dataclass(frozen=True)
class Foreign:
    """A model tensor of another dtype (``num_batches_tracked``): fine unless an op reads it."""

    fqn: str
    dtype: str


def load_task_module(source: str) -> ModuleType:
    """Import a task's source from a real file under a fresh module name."""
    name = f"_kz_capture_{next(_counter)}"
    path = Path(tempfile.mkdtemp(prefix="kz_capture_")) / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(name, None)
    return module


@contextmanager
def _kept_rng() -> Iterator[None]:
    """Run task code without moving the caller's random generators (torch, Python, numpy)."""
    import random

    import torch

    state = random.getstate()
    try:
        import numpy

        np_state = numpy.random.get_state()
    except ImportError:  # pragma: no cover - numpy comes with torch
        numpy, np_state = None, None
    with torch.random.fork_rng(devices=[]):
        try:
            yield
        finally:
            random.setstate(state)
            if numpy is not None:
                numpy.random.set_state(np_state)


def _on_meta(module: ModuleType) -> tuple[Any, list[Any]]:
    """The task's model and inputs with meta tensors (shapes and dtypes, no storage)."""
    import torch

    with _kept_rng(), torch.device("meta"):
        init = list(module.get_init_inputs())
        torch.manual_seed(0)
        model = module.Model(*init)
        inputs = list(module.get_inputs())
    return model.eval(), inputs


def _check_constant_scalars(module: ModuleType, inputs: list[Any]) -> None:
    """Non-tensor inputs are baked into the graph: only numbers get_inputs returns under every seed."""
    import torch

    from core.api.numerics import seed_everything

    scalars = [(i, x) for i, x in enumerate(inputs) if not isinstance(x, torch.Tensor)]
    for i, x in scalars:
        if not isinstance(x, (int, float, bool)):
            raise Unsupported(f"get_inputs()[{i}] is a {type(x).__name__}, not a tensor or a number")
    if not scalars:
        return
    with _kept_rng(), torch.device("meta"):
        seed_everything(12345)
        again = list(module.get_inputs())
    for i, x in scalars:
        if again[i] != x:
            raise Unsupported(f"get_inputs()[{i}] is a number that changes with the seed; the expert bakes numbers in")


REAL_TRACE_LIMIT = 1 << 26  # elements of inputs + weights: above it a real trace is not attempted


def _export(model: Any, inputs: list[Any]) -> Any:
    import torch

    try:
        return torch.export.export(model, tuple(inputs))
    except Exception as exc:
        raise CaptureFailed(f"torch.export could not trace Model.forward: {type(exc).__name__}: {str(exc)[:300]}") from None


def _meta_constants(exported: Any, model: Any) -> bool:
    constants = dict(getattr(exported, "constants", {}) or {})
    return any(getattr(t, "is_meta", False) and not _has_attribute(model, fqn) for fqn, t in constants.items())


def _on_cpu(module: ModuleType, meta_model: Any, meta_inputs: list[Any]) -> tuple[Any, list[Any]]:
    import torch

    size = sum(t.numel() for t in list(meta_model.parameters()) + [x for x in meta_inputs if isinstance(x, torch.Tensor)])
    if size > REAL_TRACE_LIMIT:
        raise Unsupported("forward creates a tensor from a number on its input's device; at these sizes the expert "
                          "does not trace it with real tensors")
    with _kept_rng():
        torch.manual_seed(0)
        return module.Model(*module.get_init_inputs()).eval(), list(module.get_inputs())


def _attribute_path(fqn: str) -> str:
    """``layers.0.weight`` -> ``self.w.layers[0].weight`` (numbered children are indexed)."""
    parts = [f"[{p}]" if p.isdigit() else f".{p}" for p in fqn.split(".")]
    return f"self.{MODEL_ATTR}" + "".join(parts)


def _dtype_name(value: Any) -> str | None:
    return _TORCH_DTYPES.get(str(getattr(value, "dtype", None)))


def capture(task: Task, catalog: Mapping[str, OpSpec]) -> Captured:
    """The task's program IR and weight binding; raises :class:`Unsupported` naming what is missing."""
    import torch

    try:
        module = load_task_module(task.source)
        model, inputs = _on_meta(module)
    except Exception as exc:  # the task's own code failed on the meta device
        raise CaptureFailed(f"could not build the task's Model on the meta device: {type(exc).__name__}: {exc}") from None
    _check_constant_scalars(module, inputs)
    dtypes = {_dtype_name(x) for x in inputs if isinstance(x, torch.Tensor)}
    if len(dtypes) != 1 or None in dtypes:
        raise Unsupported(f"inputs of dtypes {sorted(str(x.dtype) for x in inputs)} (one floating dtype is lowered)")
    dtype = dtypes.pop()
    exported = _export(model, inputs)
    if _meta_constants(exported, model):
        # forward makes a tensor from a number on its input's device (torch.tensor(v, device=x.device)):
        # on meta its value is unknown, so trace once more with real tensors when they are small
        model, inputs = _on_cpu(module, model, inputs)
        exported = _export(model, inputs)
    builder = GraphBuilder(catalog, dtype)
    output, seen = _walk(exported, builder, dtype, model)
    program, binding = builder.finish(output)
    if any(not isinstance(x, torch.Tensor) for x in inputs):
        names, k = [], 0
        for i, x in enumerate(inputs):
            if isinstance(x, torch.Tensor):
                names.append(f"x{k}")
                k += 1
            else:
                names.append(f"_c{i}")  # a number get_inputs always returns: the graph holds its value
        binding.arg_names = names
    binding.preamble = init_source(task.source)
    binding.init = [f"self.{MODEL_ATTR} = {INIT_CLASS}(*args, **kwargs)  # the task's own __init__: its weights"]
    return Captured(program, binding, seen)


def _has_attribute(model: Any, fqn: str) -> bool:
    obj = model
    for part in fqn.split("."):
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


def _walk(exported: Any, builder: GraphBuilder, dtype: str, model: Any) -> tuple[Ref, list[str]]:
    import operator

    signature = exported.graph_signature
    targets: dict[str, str] = {}
    for spec in signature.input_specs:
        if spec.target is not None:
            targets[spec.arg.name] = spec.target
    constants = dict(getattr(exported, "constants", {}) or {})
    env: dict[Any, Any] = {}
    seen: list[str] = []
    for node in exported.graph_module.graph.nodes:
        value = node.meta.get("val")
        if node.op == "placeholder":
            fqn = targets.get(node.name)
            if fqn in constants and not _has_attribute(model, fqn):
                # a tensor made in forward (torch.tensor(self.value)): a 0-d one is its number, baked in
                made = constants[fqn]
                if made.dim() != 0 or made.is_meta:
                    raise Unsupported(f"forward creates a constant tensor of shape {tuple(made.shape)}; not lowered")
                env[node] = made.item()
            elif node.name in targets and _dtype_name(value) != dtype:
                env[node] = Foreign(targets[node.name], str(getattr(value, "dtype", type(value).__name__)))
            elif node.name in targets:
                env[node] = builder.weight(tuple(value.shape), _attribute_path(targets[node.name]))
            elif not hasattr(value, "shape"):
                env[node] = value  # a number input, specialised by export (checked constant)
            elif _dtype_name(value) != dtype:
                raise Unsupported(f"input {node.name} is {value.dtype}, the program is {dtype}")
            else:
                env[node] = builder.arg(tuple(value.shape))
        elif node.op == "call_function" and node.target is operator.getitem:
            parts, index = env[node.args[0]], node.args[1]
            env[node] = parts[index] if isinstance(parts, tuple) else None
        elif node.op == "call_function":
            env[node] = _translate(node, env, builder, dtype, seen)
        elif node.op == "output":
            outs = node.args[0]
            if len(outs) != 1:
                raise Unsupported(f"forward returns {len(outs)} values; the expert lowers one output")
            result = env[outs[0]]
            if not isinstance(result, Ref):
                raise Unsupported("forward returns something other than one tensor")
            return result, seen
        else:
            raise Unsupported(f"graph node {node.op} {node.target} is not lowered")
    raise Unsupported("the exported graph has no output")


def _translate(node: Any, env: dict[Any, Any], builder: GraphBuilder, dtype: str, seen: list[str]) -> Any:
    name = op_name(node)
    overload = getattr(node.target, "_overloadname", "")
    key = f"{name}.{overload}" if f"{name}.{overload}" in HANDLERS else name
    if name not in seen:
        seen.append(name)
    handler = HANDLERS.get(key)
    if handler is None:
        raise MissingOp(name)
    for arg in node.all_input_nodes:
        if env.get(arg) is None:
            raise Unsupported(f"{name} reads an output the expert does not compute (an index tensor)")
        if isinstance(env[arg], Foreign):
            raise Unsupported(f"{name} reads {env[arg].fqn}, a {env[arg].dtype} tensor (the program is {dtype})")
        if isinstance(env[arg], Flipped) and name not in ("aten.cumsum", "aten.cumprod", "aten.flip"):
            raise MissingOp("aten.flip", "aten.flip is lowered only around a cumsum or cumprod along the flipped dim")
    value = node.meta.get("val")
    values = value if isinstance(value, (tuple, list)) else (value,)
    first = values[0]
    if first is not None and _dtype_name(first) != dtype:
        raise Unsupported(f"{name} produces {getattr(first, 'dtype', type(first).__name__)}; the program is {dtype}")
    builder.current_shape = tuple(first.shape) if first is not None else ()
    try:
        result = handler(builder, arguments(node, env), key)
    except MissingOp:
        raise
    except Unsupported as exc:  # the op is known but not these parameters: still this op's decline
        text = str(exc)
        raise MissingOp(name, text if text.startswith(name) else f"{name}: {text}") from None
    out = result[0] if isinstance(result, tuple) else result
    if isinstance(out, Ref) and first is not None and tuple(builder.shape(out)) != tuple(first.shape):
        raise Unsupported(f"{name}: the translation has shape {builder.shape(out)}, the graph {tuple(first.shape)}")
    return result


# --------------------------------------------------------------------------- the task's __init__, verbatim


class _Rename(ast.NodeTransformer):
    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def visit_Name(self, node: ast.Name) -> ast.Name:
        if node.id == self.old:
            node.id = self.new
        return node


def init_source(task_source: str) -> str:
    """The task module without its inputs, ``Model`` renamed ``_TaskInit`` and stripped of ``forward``.

    Imports of modules outside the Triton backend's static policy are dropped (an ``__init__`` that
    needs them is then refused for the name it cannot bind, instead of for the import)."""
    from core.contracts import optional
    from core.plugins import registry

    # the Triton backend's own declaration, read through the registry: a coder does not import a backend
    STATIC_POLICY = optional(registry("backend").create("triton"), "Backend", "static_policy")

    tree = ast.parse(task_source)
    body = []
    for stmt in tree.body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name in ("get_inputs", "get_init_inputs"):
            continue
        if isinstance(stmt, ast.If) and "__name__" in ast.unparse(stmt.test):
            continue
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue  # the module docstring
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in stmt.names] if isinstance(stmt, ast.Import) else [stmt.module or ""]
            if any(STATIC_POLICY.rule(n) is None for n in names):
                continue
        if isinstance(stmt, ast.ClassDef) and stmt.name == "Model":
            stmt.name = INIT_CLASS
            stmt.body = [s for s in stmt.body if not (isinstance(s, ast.FunctionDef) and s.name == "forward")] \
                or [ast.Pass()]
        body.append(stmt)
    tree.body = body
    tree = _Rename("Model", INIT_CLASS).visit(tree)
    header = "# The task's module (its inputs dropped): _TaskInit is its Model without forward; ModelNew\n" \
             "# builds one so that the verifier's seed gives it exactly the task's weights.\n"
    return header + ast.unparse(ast.fix_missing_locations(tree)) + "\n"


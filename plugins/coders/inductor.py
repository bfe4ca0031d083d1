"""The inductor teacher: the Triton kernels ``torch.compile`` (Inductor) generates for a task,
wrapped into a self-contained KernelBench candidate. GPU only; registered as ``inductor``.

How a task becomes a candidate:

1. the task's ``Model`` runs once under ``torch.compile(fullgraph=True, dynamic=False)`` on the GPU;
   the Dynamo backend records the graph's inputs (so each can be mapped to a model parameter or a
   forward argument) and ``run_and_get_code`` returns Inductor's output module;
2. anything but Triton is declined: extern kernels (cuBLAS/cuDNN via ``extern_kernels``), ATen
   fallbacks (``aten.`` / ``torch.ops``), template kernels (their launch grid is not plain);
3. the output module is loaded and run once so Inductor's autotuner picks each kernel's config;
4. the candidate holds each kernel as a plain ``@triton.jit`` function, a small launcher that
   computes the grid from the kernel's ``*numel`` arguments and the chosen block sizes, Inductor's
   ``call`` function verbatim (it only allocates, reinterprets and launches), and ``ModelNew``: the
   task's ``Model.__init__`` (same parameters, same seed) with a ``forward`` that calls ``call``.

On a machine without CUDA every task is declined with a message saying a GPU is needed.
"""

from __future__ import annotations

import ast
import io
import re
import textwrap
import tokenize
from dataclasses import dataclass
from typing import Any, Sequence

from core import hookimpl
from core.task import Candidate, Task

_KERNEL_DEF = re.compile(
    r"^(?P<var>\w+)\s*=\s*async_compile\.triton\(\s*'(?P<name>\w+)'\s*,\s*'''(?P<src>.*?)'''", re.S | re.M)
_FORBIDDEN_CALLS = re.compile(r"\bextern_kernels\.\w+|\baten\.\w+|torch\.ops\.\w+")
_PID_SIMPLE = re.compile(r"(?P<axis>[xyz])offset = tl\.program_id\((?P<pid>\d)\) \* (?P<block>[XYZ])BLOCK")
_PID_SPLIT_Y = re.compile(r"yoffset = \(tl\.program_id\(1\) \+ tl\.program_id\(2\) \* tl\.num_programs\(1\)\) \* YBLOCK")

NO_GPU = ("the inductor teacher needs a CUDA GPU (torch.compile emits Triton kernels only for CUDA); "
          "none is visible here. Use coder=expert on CPU, or run on a machine with a GPU")


class Declined(Exception):
    pass


@dataclass
class KernelInfo:
    var: str  # the name `call` uses
    jit_name: str
    source: str  # the @triton.jit function, decorators of Inductor removed
    axes: str  # grid axes in program_id order, e.g. "x", "xy", or "xs" (y split over ids 1 and 2)


def parse_kernels(code: str) -> list[KernelInfo]:
    """Every ``async_compile.triton`` kernel of an Inductor output module, as plain ``@triton.jit``."""
    kernels = []
    for match in _KERNEL_DEF.finditer(code):
        src = match.group("src")
        if "triton_heuristics.template" in src or "@triton_heuristics.foreach" in src:
            raise Declined(f"kernel {match.group('name')} is an Inductor template/foreach kernel "
                           "(its launch grid is not a plain tiling)")
        lines = src.splitlines()
        start = next((i for i, line in enumerate(lines) if line.startswith("@triton.jit")), None)
        if start is None:
            raise Declined(f"kernel {match.group('name')} has no @triton.jit function")
        body = "\n".join(lines[start:])
        jit_name = "_jit_" + match.group("var")
        body = re.sub(r"^def \w+\(", f"def {jit_name}(", body.split("\n", 1)[1], count=1, flags=re.M)
        axes = ""
        if _PID_SPLIT_Y.search(src):
            axes = "x" + "s"
        else:
            found = {m.group("pid"): m.group("axis") for m in _PID_SIMPLE.finditer(src)
                     if m.group("block") == m.group("axis").upper()}
            for pid in sorted(found):
                axes += found[pid]
            if sorted(found) != [str(i) for i in range(len(found))] or not found:
                raise Declined(f"kernel {match.group('name')}: cannot read its launch grid from program_id use")
        kernels.append(KernelInfo(match.group("var"), jit_name, "@triton.jit\n" + body, axes))
    return kernels


def forbidden_calls(code: str) -> list[str]:
    """The extern (cuBLAS/cuDNN) and ATen calls of the module's ``call`` function, sorted.

    Comments and strings are left out: Inductor annotates every kernel launch with a comment such
    as ``# Original ATen: [aten.gelu, aten._softmax]`` naming the ops the Triton kernel replaced.
    """
    body = code[code.find("def call("):]
    lines = body.splitlines(keepends=True)
    try:
        for tok in tokenize.generate_tokens(io.StringIO(body).readline):
            if tok.type in (tokenize.COMMENT, tokenize.STRING) and tok.start[0] == tok.end[0]:
                row, (c0, c1) = tok.start[0] - 1, (tok.start[1], tok.end[1])
                lines[row] = lines[row][:c0] + " " * (c1 - c0) + lines[row][c1:]
    except (tokenize.TokenError, IndentationError, SyntaxError):  # a partial body: drop comments by line
        lines = [re.sub(r"#.*", "", line) for line in lines]
    body = "".join(lines)
    return sorted(set(_FORBIDDEN_CALLS.findall(body)))


def kernel_imports(code: str) -> list[str]:
    """The imports Inductor's kernel sources use (helpers such as ``triton_helpers``, ``libdevice``)."""
    seen: list[str] = []
    for match in _KERNEL_DEF.finditer(code):
        for line in match.group("src").splitlines():
            stripped = line.strip()
            if (stripped.startswith("import ") or stripped.startswith("from ")) and stripped not in seen:
                seen.append(stripped)
    return seen


def wrapper_parts(code: str) -> list[str]:
    """The module's top-level imports, assignments, functions and classes in their order (``call``
    among them), leaving out everything that compiles kernels (``async_compile``) or benchmarks."""
    tree = ast.parse(code)
    kept: list[str] = []
    for node in tree.body:
        text = ast.get_source_segment(code, node) or ""
        if "async_compile" in text or "AsyncCompile" in text:
            continue
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == "benchmark_compiled_module":
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.Assign, ast.FunctionDef, ast.ClassDef)):
            kept.append(text)
    if not any(re.search(r"def call\(", text) for text in kept):
        raise Declined("Inductor's output has no call() function")
    return kept


_LAUNCHER = '''
class _InductorLaunch:
    """Launch a kernel the way Inductor's launcher does: grid from the *numel args and the config."""

    def __init__(self, fn, axes, meta, num_warps, num_stages):
        self.fn, self.axes, self.meta = fn, axes, meta
        self.num_warps, self.num_stages = num_warps, num_stages

    def run(self, *args, stream=None, grid=None, **unused):
        named = dict(zip(self.fn.arg_names, args))
        dims = []
        for axis in self.axes:
            if axis == "s":  # y split over program ids 1 and 2
                blocks = triton.cdiv(named["ynumel"], self.meta["YBLOCK"])
                dims += [min(blocks, 65535), triton.cdiv(blocks, 65535)]
            else:
                dims.append(triton.cdiv(named[axis + "numel"], self.meta[axis.upper() + "BLOCK"]))
        grid = tuple(max(1, d) for d in dims)
        self.fn[grid](*args, **self.meta, num_warps=self.num_warps, num_stages=self.num_stages)
'''


# Inductor's module takes the raw stream from torch._C, which candidates may not import; our
# launcher runs every kernel on torch's current stream, which is what this returns.
_RAW_STREAM = '''
def get_raw_stream(index):
    return torch.cuda.current_stream(index).cuda_stream
'''


def prune_imports(parts: list[str]) -> list[str]:
    """``parts`` (top-level statements) with each import cut down to the names the other
    statements use, and the header's assignments to those used: Inductor's header imports os,
    tempfile, ctypes ... and binds ``torch.ops`` namespaces that its ``call`` never touches, and
    that a candidate may not name. ``get_raw_stream`` (from torch._C) is replaced by
    :data:`_RAW_STREAM`."""
    nodes = [ast.parse(text).body[0] for text in parts]
    # Header assignments (aten = torch.ops.aten, ...) stay only when a kept statement uses their name.
    named = [isinstance(n, ast.Assign) and all(isinstance(t, ast.Name) for t in n.targets) for n in nodes]
    kept = [not (isinstance(n, (ast.Import, ast.ImportFrom)) or named[i]) for i, n in enumerate(nodes)]
    used: set[str] = set()
    while True:
        used = {x.id for n, k in zip(nodes, kept) if k for x in ast.walk(n) if isinstance(x, ast.Name)}
        more = [i for i, n in enumerate(nodes) if named[i] and not kept[i]
                and {t.id for t in n.targets} & used]  # type: ignore[attr-defined]
        if not more:
            break
        for i in more:
            kept[i] = True
    out: list[str] = []
    for text, node, keep_it in zip(parts, nodes, kept):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            if keep_it:
                out.append(text)
            continue
        keep = [a for a in node.names
                if (a.asname or a.name.split(".")[0]) in used and (a.asname or a.name) != "get_raw_stream"]
        if keep:
            node.names = keep
            out.append(ast.unparse(node))
    if "get_raw_stream" in used:
        out.insert(0, _RAW_STREAM)
    return out


def build_candidate_source(task_source: str, code: str, kernels: list[KernelInfo], configs: dict[str, Any],
                           arg_exprs: list[str], forward_args: list[str]) -> str:
    kept = prune_imports(wrapper_parts(code))
    imports = kernel_imports(code)
    parts = ['"""Triton kernels generated by torch.compile (Inductor), wrapped as a KernelBench candidate."""',
             "import torch", "import torch.nn as nn", "import triton", "import triton.language as tl"]
    parts += [line for line in imports if line not in parts]
    parts.append(_LAUNCHER)
    for k in kernels:
        meta, warps, stages = configs[k.var]
        parts.append(k.source)
        parts.append(f"{k.var} = _InductorLaunch({k.jit_name}, {k.axes!r}, {meta!r}, {warps}, {stages})\n")
    parts += [text for text in kept if text not in parts]
    parts.append(_model_new(task_source, arg_exprs, forward_args))
    return "\n\n".join(parts) + "\n"


def static_findings(source: str, backend: str = "triton") -> str:
    """What the verifier's static stages (``static``, ``static_integrity``) say against ``source``;
    empty when both pass."""
    from core.api.evidence import Evidence
    from core.plugins import registry
    from core.task import Candidate, Task

    evidence = Evidence(task=Task(source=""), candidate=Candidate(source=source, backend=backend),
                        backend=backend, device="cuda", tree=ast.parse(source))
    checks = registry("verifier")  # the verifier's own checks, by name: a coder does not import the verifiers
    failed = [r.detail for r in (checks.create(name).evaluate(evidence) for name in ("static", "static_integrity"))
              if not r.passed]
    return "; ".join(failed)


def _model_new(task_source: str, arg_exprs: list[str], forward_args: list[str]) -> str:
    """``Model``'s class renamed ``ModelNew`` (same ``__init__``) with a forward that calls ``call``."""
    tree = ast.parse(task_source)
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)
    if cls is None:
        raise Declined("the task defines no class Model")
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    init_src = textwrap.indent(ast.get_source_segment(task_source, init), "    ") if init else ""
    args = ", ".join(["self"] + forward_args)
    return (f"class ModelNew(nn.Module):\n{init_src}\n\n"
            f"    def forward({args}):\n"
            f"        outputs = call([{', '.join(arg_exprs)}])\n"
            f"        return outputs[0]\n")


def _load_task(source: str):
    from plugins.coders.expert_lowering.selfcheck import load_module

    return load_module(source, "inductor_task")


@dataclass
class InductorCoder:
    name: str = "inductor"
    seed: int = 0

    def generate(self, tasks: Sequence[Task], backend: str, num_samples: int = 1) -> list[list[Candidate]]:
        out = []
        for task in tasks:
            cand = self.teach(task, backend)
            out.append([cand] + [Candidate.from_dict(cand.to_dict()) for _ in range(num_samples - 1)])
        return out

    def teach(self, task: Task, backend: str) -> Candidate:
        if backend != "triton":
            return self._declined(task, backend, f"the inductor teacher emits Triton, not {backend!r}")
        import torch

        if not torch.cuda.is_available():
            return self._declined(task, backend, NO_GPU)
        try:
            source = self._compile(task)
        except Declined as exc:
            return self._declined(task, backend, str(exc))
        except Exception as exc:  # torch.compile failures are the teacher's, not the task's
            return self._declined(task, backend, f"torch.compile failed: {type(exc).__name__}: {str(exc)[:300]}")
        return Candidate(source=source, backend=backend, task_id=task.id, coder=self.name, completion=source)

    def _compile(self, task: Task) -> str:
        import torch
        from torch._inductor.utils import run_and_get_code

        ref = _load_task(task.source)
        torch.manual_seed(self.seed)
        model = ref.Model(*ref.get_init_inputs()).cuda().eval()
        inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in ref.get_inputs()]
        recorded: dict[str, list] = {}

        def backend_fn(gm, example_inputs):
            from torch._inductor.compile_fx import compile_fx

            recorded["inputs"] = list(example_inputs)
            return compile_fx(gm, example_inputs)

        torch._dynamo.reset()
        compiled = torch.compile(model, backend=backend_fn, fullgraph=True, dynamic=False)
        with torch.no_grad():
            _, codes = run_and_get_code(compiled, *inputs)
        if len(codes) != 1:
            raise Declined(f"torch.compile produced {len(codes)} output modules (expected 1)")
        code = codes[0]
        forbidden = forbidden_calls(code)
        if forbidden:
            raise Declined(f"Inductor used non-Triton kernels: {', '.join(forbidden[:5])}")
        kernels = parse_kernels(code)
        if not kernels:
            raise Declined("Inductor generated no Triton kernel for this task")
        arg_exprs = _map_graph_inputs(recorded.get("inputs", []), model, inputs)
        configs = _autotuned_configs(code, recorded["inputs"], [k.var for k in kernels])
        forward_args = [f"x{i}" for i in range(len(inputs))]
        source = build_candidate_source(task.source, code, kernels, configs, arg_exprs, forward_args)
        refused = static_findings(source)
        if refused:  # never hand out a candidate the verifier's static stage is certain to reject
            raise Declined(f"the wrapped module would fail the static checks: {refused}")
        return source

    def _declined(self, task: Task, backend: str, reason: str) -> Candidate:
        return Candidate(source="", backend=backend, task_id=task.id, coder=self.name, declined=reason)


def _map_graph_inputs(graph_inputs: list, model, inputs: list) -> list[str]:
    """Each graph input as an expression in ModelNew.forward: ``x<i>`` or ``self.<param path>``."""
    named = {}
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        named.setdefault((t.data_ptr(), tuple(t.shape), tuple(t.stride())), "self." + name)
    exprs = []
    for g in graph_inputs:
        key = (g.data_ptr(), tuple(g.shape), tuple(g.stride()))
        match = next((f"x{i}" for i, x in enumerate(inputs) if x is g or
                      (hasattr(x, "data_ptr") and (x.data_ptr(), tuple(x.shape), tuple(x.stride())) == key)), None)
        if match is None:
            match = named.get(key)
        if match is None:
            raise Declined("a compiled-graph input is neither a forward argument nor a model parameter/buffer")
        exprs.append(match)
    return exprs


def _autotuned_configs(code: str, graph_inputs: list, names: list[str]) -> dict[str, Any]:
    """Load Inductor's module, run it once (its autotuner picks configs), read each kernel's choice."""
    from torch._inductor.codecache import PyCodeCache

    module = PyCodeCache.load(code)
    module.call([t.clone() if hasattr(t, "clone") else t for t in graph_inputs])
    configs = {}
    for name in names:
        launchers = getattr(getattr(module, name, None), "launchers", None)
        if not launchers:
            raise Declined(f"cannot read the autotuned config of {name} in this torch version")
        config = launchers[0].config
        configs[name] = (dict(config.kwargs), int(config.num_warps), int(config.num_stages))
    return configs


@hookimpl
def register_coders(register):
    register("inductor", InductorCoder)

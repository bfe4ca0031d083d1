"""The static stage of the ``cuda`` backend: what a candidate's AST says, with no code run.

:func:`analyse_source` checks the candidate's shape (``ModelNew``, a ``RawModule``/``RawKernel``
construction, a ``__global__`` kernel in a string) and resolves the CUDA sources passed as
``code=`` from literals and module-level names, so the compile stage can build them without
executing the module (:mod:`plugins.backends.cuda_backend`).
"""

from __future__ import annotations

import ast
import textwrap
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from core.api.evidence import parse_python

MAX_SOURCE_BYTES = 200_000

_KERNEL_CLASSES = ("RawModule", "RawKernel")


@dataclass
class KernelSource:
    """One CUDA source a candidate compiles, with the options it passes to CuPy."""

    code: str
    options: tuple[str, ...] = ()
    name_expressions: tuple[str, ...] = ()
    kind: str = "RawModule"  # or "RawKernel"
    kernel_name: str | None = None  # RawKernel's name argument
    origin: str = ""  # "line 12" (static) or "recorded" (worker)

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "options": list(self.options),
            "name_expressions": list(self.name_expressions),
            "kind": self.kind,
            "kernel_name": self.kernel_name,
            "origin": self.origin,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "KernelSource":
        return cls(
            code=d["code"],
            options=tuple(d.get("options") or ()),
            name_expressions=tuple(d.get("name_expressions") or ()),
            kind=d.get("kind", "RawModule"),
            kernel_name=d.get("kernel_name"),
            origin=d.get("origin", ""),
        )


@dataclass
class StaticReport:
    """What the static stage found, without running the candidate.

    ``sources`` is the list of CUDA sources when every ``RawModule``/``RawKernel`` call passes a
    statically known string, else ``None`` (the worker records them by executing the module).
    """

    ok: bool
    problems: list[str] = field(default_factory=list)
    constructions: int = 0
    sources: list[KernelSource] | None = None

    @property
    def detail(self) -> str:
        if not self.ok:
            return "; ".join(self.problems)
        how = f"{len(self.sources)} CUDA source(s) read from literals" if self.sources is not None else (
            "CUDA source built at run time (recorded in the worker)"
        )
        return f"ModelNew defined, {self.constructions} RawModule/RawKernel construction(s), {how}"


class _StringResolver:
    """Resolve an expression to a string using only literals and module-level assignments."""

    def __init__(self, tree: ast.Module):
        self.assignments: dict[str, list[ast.expr]] = {}
        for node in tree.body:
            targets: list[ast.expr] = []
            value: ast.expr | None = None
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
                self.assignments.setdefault(node.target.id, []).append(node)  # type: ignore[arg-type]
                continue
            for t in targets:
                if isinstance(t, ast.Name) and value is not None:
                    self.assignments.setdefault(t.id, []).append(value)
        # a name bound more than once anywhere (loops, functions, globals) cannot be trusted statically
        stores = Counter(n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))
        self.rebound = {name for name, count in stores.items() if count > 1}

    def resolve(self, node: ast.expr | None, depth: int = 0) -> str | None:
        if node is None or depth > 20:
            return None
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            vals = self.assignments.get(node.id, [])
            if len(vals) != 1 or node.id in self.rebound or not isinstance(vals[0], ast.expr):
                return None
            return self.resolve(vals[0], depth + 1)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = self.resolve(node.left, depth + 1), self.resolve(node.right, depth + 1)
            return None if left is None or right is None else left + right
        if isinstance(node, ast.JoinedStr):
            parts = [self.resolve(v, depth + 1) if isinstance(v, ast.Constant) else None for v in node.values]
            return None if any(p is None for p in parts) else "".join(parts)  # type: ignore[arg-type]
        if isinstance(node, ast.Call) and not node.keywords and len(node.args) == 1:
            func = node.func
            fname = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if fname == "dedent":
                inner = self.resolve(node.args[0], depth + 1)
                return None if inner is None else textwrap.dedent(inner)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and not node.args:
            if node.func.attr in ("strip", "lstrip", "rstrip"):
                inner = self.resolve(node.func.value, depth + 1)
                return None if inner is None else getattr(inner, node.func.attr)()
        return None

    def resolve_strings(self, node: ast.expr | None) -> tuple[str, ...] | None:
        if node is None:
            return ()
        if isinstance(node, ast.Name):
            vals = self.assignments.get(node.id, [])
            if len(vals) != 1 or node.id in self.rebound:
                return None
            node = vals[0]
        if isinstance(node, (ast.Tuple, ast.List)):
            items = [self.resolve(e) for e in node.elts]
            return None if any(i is None for i in items) else tuple(items)  # type: ignore[arg-type]
        return None


def kernel_class_of(call: ast.Call) -> str | None:
    """``"RawModule"`` or ``"RawKernel"`` when ``call`` constructs one, else ``None``."""
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr in _KERNEL_CLASSES:
        return func.attr
    if isinstance(func, ast.Name) and func.id in _KERNEL_CLASSES:
        return func.id
    return None


def _argument(call: ast.Call, position: int, keyword: str) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == keyword:
            return kw.value
    return call.args[position] if len(call.args) > position else None


def analyse_source(source: str) -> StaticReport:
    """The static stage for a CUDA candidate: no code runs, only the AST is read."""
    problems: list[str] = []
    if len(source.encode("utf-8", "replace")) > MAX_SOURCE_BYTES:
        return StaticReport(False, [f"source is {len(source)} bytes; the limit is {MAX_SOURCE_BYTES}"])
    try:
        tree = parse_python(source)
    except SyntaxError as exc:
        return StaticReport(False, [f"Python syntax error at line {exc.lineno}: {exc.msg}"])
    if not any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body):
        problems.append("no top-level `class ModelNew(nn.Module)` found; the candidate must define ModelNew")
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and kernel_class_of(n)]
    if any(
        (isinstance(n, ast.Attribute) and n.attr in ("load_inline", "cpp_extension"))
        or (isinstance(n, ast.ImportFrom) and "cpp_extension" in (n.module or ""))
        for n in ast.walk(tree)
    ):
        problems.append(
            "uses torch.utils.cpp_extension; backend 'cuda' expects CUDA C compiled with "
            "cupy.RawModule(code=...) (see the backend guide)"
        )
    if not calls:
        problems.append("no cupy.RawModule(code=...) or cupy.RawKernel(code, name) construction found")
    strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    if not any("__global__" in s for s in strings):
        problems.append("no CUDA `__global__` kernel found in any string of the candidate")

    resolver = _StringResolver(tree)
    sources: list[KernelSource] | None = []
    for call in calls:
        kind = kernel_class_of(call) or "RawModule"
        if _argument(call, 99, "path") is not None:
            problems.append(
                f"line {call.lineno}: {kind}(path=...) loads a prebuilt binary; candidates must carry "
                "their CUDA source and pass it as code="
            )
            continue
        code = resolver.resolve(_argument(call, 0, "code"))
        options = resolver.resolve_strings(_argument(call, 99, "options"))
        names = resolver.resolve_strings(_argument(call, 99, "name_expressions"))
        kernel_name = resolver.resolve(_argument(call, 1, "name")) if kind == "RawKernel" else None
        if code is None or options is None or names is None or (kind == "RawKernel" and kernel_name is None):
            sources = None
            continue
        if sources is not None:
            sources.append(
                KernelSource(code, options, names, kind=kind, kernel_name=kernel_name, origin=f"line {call.lineno}")
            )
    if sources is not None and calls and not any("__global__" in s.code for s in sources):
        problems.append("the CUDA source passed to RawModule/RawKernel defines no `__global__` kernel")
    return StaticReport(not problems, problems, constructions=len(calls), sources=sources)

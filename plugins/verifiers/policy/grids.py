"""Launch arithmetic: the only expressions a launch grid (and any callable a launch runs) may be.

Triton calls a callable grid, ``triton.heuristics`` values and autotune hooks *inside* the launch,
where the judge's ATen audit does not look (the launcher's own tensor copies happen there). A grid
is therefore a tuple, or a lambda of its meta-parameters, built from numbers, names, subscripts
(``meta["BLOCK"]``, ``x.shape[0]``), arithmetic, comparisons and a few pure calls: ``max``, ``min``,
``int``, ``triton.cdiv``, ``triton.next_power_of_2`` ... and tensor metadata (``x.numel()``,
``x.stride(0)``) when the candidate defines no method of that name.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Callable

from core.api.policy import GRID_BUILTINS, GRID_METHODS

_OPS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.LShift, ast.RShift)


@dataclass
class GridContext:
    """What the grammar needs to know about the candidate.

    :ivar path_of: the dotted import path an expression names (``triton.cdiv``), else ``None``.
    :ivar is_builtin: whether a name refers to the builtin (the candidate does not rebind it).
    :ivar own_callables: names of every function and method the candidate defines.
    """

    path_of: Callable[[ast.expr], str | None]
    is_builtin: Callable[[ast.Name], bool]
    grid_functions: frozenset[str]
    own_callables: set[str] = field(default_factory=set)


def offence(node: ast.AST | None, ctx: GridContext, lambda_ok: bool = False) -> tuple[ast.AST, str] | None:
    """The first sub-expression of ``node`` that is not launch arithmetic, with why; ``None`` if all is."""
    if node is None or isinstance(node, ast.Constant):
        return None
    if isinstance(node, ast.Lambda):
        if not lambda_ok:
            return node, "a lambda nested inside launch arithmetic"
        return offence(node.body, ctx)
    if isinstance(node, ast.Name):
        return None
    if isinstance(node, ast.Attribute):
        return offence(node.value, ctx)
    if isinstance(node, ast.Subscript):
        return offence(node.value, ctx) or offence(node.slice, ctx)
    if isinstance(node, ast.Slice):
        return offence(node.lower, ctx) or offence(node.upper, ctx) or offence(node.step, ctx)
    if isinstance(node, ast.BinOp):
        if not isinstance(node.op, _OPS):
            return node, f"the operator {type(node.op).__name__}"
        return offence(node.left, ctx) or offence(node.right, ctx)
    if isinstance(node, ast.UnaryOp):
        return offence(node.operand, ctx)
    if isinstance(node, (ast.BoolOp, ast.Compare, ast.IfExp, ast.Tuple, ast.List)):
        children = {ast.BoolOp: lambda n: n.values, ast.Compare: lambda n: [n.left, *n.comparators],
                    ast.IfExp: lambda n: [n.test, n.body, n.orelse], ast.Tuple: lambda n: n.elts,
                    ast.List: lambda n: n.elts}[type(node)](node)
        for child in children:
            found = offence(child, ctx)
            if found:
                return found
        return None
    if isinstance(node, ast.Starred):
        return offence(node.value, ctx)
    if isinstance(node, ast.Call):
        return _call_offence(node, ctx)
    return node, f"a {type(node).__name__} expression"


def _call_offence(node: ast.Call, ctx: GridContext) -> tuple[ast.AST, str] | None:
    func = node.func
    allowed = False
    if isinstance(func, ast.Name):
        allowed = func.id in GRID_BUILTINS and ctx.is_builtin(func)
        what = f"{func.id}()" + ("" if allowed or func.id not in GRID_BUILTINS else " (rebound by the candidate)")
    elif isinstance(func, ast.Attribute):
        path = ctx.path_of(func)
        if path is not None:
            allowed, what = path in ctx.grid_functions, f"{path}()"
        else:
            allowed = func.attr in GRID_METHODS and func.attr not in ctx.own_callables
            what = f".{func.attr}()" + (" (the candidate defines a function of that name)"
                                         if func.attr in ctx.own_callables else "")
            if allowed:
                found = offence(func.value, ctx)
                if found:
                    return found
    else:
        what = "a call of a computed callable"
    if not allowed:
        return node, f"a call of {what}"
    for arg in [*node.args, *[k.value for k in node.keywords]]:
        if isinstance(arg, (ast.GeneratorExp, ast.ListComp)):
            found = _comprehension_offence(arg, ctx)
        else:
            found = offence(arg, ctx)
        if found:
            return found
    return None


def _comprehension_offence(node: ast.GeneratorExp | ast.ListComp, ctx: GridContext) -> tuple[ast.AST, str] | None:
    for gen in node.generators:
        if gen.is_async:
            return gen.iter, "an async comprehension"
        for part in [gen.iter, *gen.ifs]:
            found = offence(part, ctx)
            if found:
                return found
    return offence(node.elt, ctx)

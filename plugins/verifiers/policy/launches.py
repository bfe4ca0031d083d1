"""Launch rules: grids (``kernel[grid]``, ``grid=``, CUDA-style ``kernel(grid, block, args)``) and
the callables launch configurators run (``triton.heuristics`` values, autotune and config hooks)
must be launch arithmetic (:mod:`plugins.verifiers.policy.grids`)."""

from __future__ import annotations

import ast

from core.api.policy import LAUNCH_HOOK_KEYWORDS
from plugins.verifiers.policy.grids import GridContext, offence
from plugins.verifiers.policy.kernels import KernelRules
from plugins.verifiers.policy.scope import Binding


def _grid_rule(what: str) -> str:
    return "launch-grid" if what == "launch grid" else "launch-hook"


class LaunchRules(KernelRules):
    """Rules ``launch-grid`` and ``launch-hook``."""

    def __init__(self, tree: ast.Module, policy) -> None:
        super().__init__(tree, policy)
        self.grid = GridContext(self._path_of, self._is_builtin, policy.grid_functions, self.own_callables)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        value, parent = node.value, self.parent.get(id(node))
        called = isinstance(parent, ast.Call) and parent.func is node
        if isinstance(value, ast.Name) and self._names_kernel(value):
            self._check_grid(node.slice, node, strict=True)
        elif called or isinstance(node.slice, ast.Lambda):
            # x[grid](...) where x may be a kernel: a callable grid runs inside the launch. Once a kernel
            # object escapes into containers or other objects, every such grid must be launch arithmetic.
            self._check_grid(node.slice, node, strict=called and self.kernel_escapes)

    def _check_grid(self, grid: ast.expr, site: ast.AST, strict: bool, what: str = "launch grid") -> None:
        """``strict``: ``grid`` is the grid of a known kernel; else only callables in grid position are checked."""
        if isinstance(grid, ast.Lambda):
            self._report_offence(offence(grid, self.grid, lambda_ok=True), what)
            return
        if isinstance(grid, ast.Name):
            found = self._bindings(grid)
            if not found:
                if strict:
                    self.add(_grid_rule(what), grid, f"the {what} {grid.id} is not defined by the candidate")
                return
            for b in found:
                self._check_grid_binding(grid, b, strict, what)
            return
        if strict:
            if isinstance(grid, ast.Attribute):
                self.add(_grid_rule(what), grid, f"the {what} is read from {ast.unparse(grid)}, which may hold any "
                                              "callable; build it at the launch or in a local name")
                return
            self._report_offence(offence(grid, self.grid), what)

    def _check_grid_binding(self, use: ast.Name, b: Binding, strict: bool, what: str) -> None:
        if b.kind == "assign":
            value = b.value
            if isinstance(value, ast.Lambda):
                self._report_offence(offence(value, self.grid, lambda_ok=True), what)
            elif strict:
                self._report_offence(offence(value, self.grid), what)
        elif b.kind == "function":
            body = [s for s in b.node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]  # type: ignore[attr-defined]
            if len(body) != 1 or not isinstance(body[0], ast.Return):
                self.add(_grid_rule(what), use, f"the {what} {use.id} is a function whose body is more than "
                                             "`return <launch arithmetic>`")
            else:
                self._report_offence(offence(body[0].value, self.grid), what)
        elif strict and not (b.kind == "param" and self._killed(use, b)) and not self._range_target(b):
            self.add(_grid_rule(what), use, f"the {what} {use.id} is bound by {b.kind} (line "
                                         f"{getattr(b.node, 'lineno', '?')}); bind it to a tuple or a lambda")

    def _range_target(self, b: Binding) -> bool:
        """``for i in range(...)``: the name holds ints."""
        loop = self.parent.get(id(b.node))
        return isinstance(loop, (ast.For, ast.comprehension)) and loop.target is b.node \
            and isinstance(loop.iter, ast.Call) and isinstance(loop.iter.func, ast.Name) \
            and loop.iter.func.id == "range" and self._is_builtin(loop.iter.func)

    def _killed(self, use: ast.Name, param: Binding) -> bool:
        """A parameter reassigned at the top of its function before the statement that uses it."""
        fn = param.scope.node
        body = getattr(fn, "body", [])
        line = getattr(use, "lineno", 0)
        for stmt in body:
            if stmt.lineno <= line <= (stmt.end_lineno or stmt.lineno):
                return False
            if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == use.id for t in stmt.targets):
                return True
        return False

    def _report_offence(self, found: tuple[ast.AST, str] | None, what: str) -> None:
        if found is not None:
            node, why = found
            self.add(_grid_rule(what), node, f"the {what} contains {why}: it may only be arithmetic on numbers, shapes and "
                                 "meta-parameters (max, min, triton.cdiv, x.numel() ...)")

    def _check_configurator(self, node: ast.Call, path: str) -> None:
        for kw in node.keywords:
            if kw.arg in LAUNCH_HOOK_KEYWORDS and not (isinstance(kw.value, ast.Constant) and kw.value.value is None):
                self.add("launch-hook", kw.value, f"{path}({kw.arg}=...) runs a callable inside the launch, "
                                                  "where the audit does not look")
        takes_callables = path in self.policy.callable_configurators
        for arg in [*node.args, *[k.value for k in node.keywords if k.arg not in LAUNCH_HOOK_KEYWORDS]]:
            values = arg.values if isinstance(arg, ast.Dict) else [arg]
            for value in values:
                if takes_callables and isinstance(arg, ast.Dict) and not isinstance(value, (ast.Lambda, ast.Name)):
                    self.add("launch-hook", value, f"a value given to {path} is computed: each must be a lambda "
                                                   "or a def of launch arithmetic")
                elif isinstance(value, (ast.Lambda, ast.Name)):
                    self._check_grid(value, node, strict=takes_callables and isinstance(arg, ast.Dict),
                                     what=f"callable given to {path}")
                for inner in ast.walk(value):
                    if isinstance(inner, ast.Lambda) and inner is not value:
                        self._report_offence(offence(inner, self.grid, lambda_ok=True), f"callable given to {path}")

    def _check_raw_launch(self, node: ast.Call) -> None:
        """CUDA-style launches ``kernel(grid, block, args)`` of objects from the policy's kernel factories."""
        if not (self.policy.kernel_getters or self.policy.kernel_factories) or not self._is_raw_kernel(node.func):
            return
        for position, what in ((0, "launch grid"), (1, "launch grid")):
            if len(node.args) > position:
                self._check_grid(node.args[position], node, strict=True, what=what)

    def _is_raw_kernel(self, func: ast.expr) -> bool:
        if self._makes_raw_kernel(func):
            return True
        if isinstance(func, ast.Name):
            found = self._bindings(func)
            return bool(found) and all(b.kind == "assign" and self._makes_raw_kernel(b.value) for b in found)
        if isinstance(func, ast.Attribute) and self._own(func.value):
            return func.attr in self._raw_kernel_attributes()
        return False

    def _makes_raw_kernel(self, value: ast.expr | None) -> bool:
        if not isinstance(value, ast.Call):
            return False
        if isinstance(value.func, ast.Attribute) and value.func.attr in self.policy.kernel_getters:
            return True
        return self._path_of(value.func) in self.policy.kernel_factories if isinstance(
            value.func, (ast.Name, ast.Attribute)) else False

    def _raw_kernel_attributes(self) -> set[str]:
        if not hasattr(self, "_raw_attrs"):
            self._raw_attrs = {t.attr for n in ast.walk(self.tree) if isinstance(n, ast.Assign)
                               and self._makes_raw_kernel(n.value) for t in n.targets if isinstance(t, ast.Attribute)}
        return self._raw_attrs

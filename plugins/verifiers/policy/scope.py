"""Which binding each name of a candidate refers to, by Python's scoping rules, from the AST alone.

The rules of :mod:`plugins.verifiers.policy.rules` ask: is this name an import (of which module or
member), the candidate's own class, the ``self`` of one of its methods, a local, or a builtin?
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field


@dataclass
class Binding:
    """One place a name is bound.

    :ivar kind: ``import`` (``import a.b [as x]``), ``from`` (``from m import n``), ``class``,
        ``function``, ``param``, ``assign`` (a single-target assignment, ``value`` set) or ``other``
        (loop and ``with`` targets, augmented assignments, ``except ... as``, deletions ...).
    :ivar target: for imports, the dotted name bound (``"torch.nn"``; ``"torch.nn.Module"`` for a
        from-import); else ``""``.
    """

    kind: str
    node: ast.AST
    scope: "Scope"
    target: str = ""
    value: ast.expr | None = None


@dataclass(eq=False)
class Scope:
    kind: str  # module | class | function | lambda | comprehension
    node: ast.AST
    parent: "Scope | None"
    bindings: dict[str, list[Binding]] = field(default_factory=dict)
    declared_global: set[str] = field(default_factory=set)
    declared_nonlocal: set[str] = field(default_factory=set)
    self_name: str | None = None  # a method's first parameter (not for staticmethods)

    def bind(self, name: str, binding: Binding) -> None:
        self.bindings.setdefault(name, []).append(binding)

    @property
    def module(self) -> "Scope":
        scope = self
        while scope.parent is not None:
            scope = scope.parent
        return scope


def _decorator_names(node: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    out = set()
    for d in node.decorator_list:
        d = d.func if isinstance(d, ast.Call) else d
        out.add(d.attr if isinstance(d, ast.Attribute) else getattr(d, "id", ""))
    return out


class ScopeMap(ast.NodeVisitor):
    """Builds every scope of a module and remembers, for each node, the scope it is evaluated in."""

    def __init__(self, tree: ast.Module):
        self.root = Scope("module", tree, None)
        self.scope_of: dict[int, Scope] = {}
        self._scope = self.root
        self.visit(tree)

    # -- helpers
    def generic_visit(self, node: ast.AST) -> None:
        self.scope_of[id(node)] = self._scope
        super().generic_visit(node)

    def _store(self, name: str, binding_kind: str, node: ast.AST, value: ast.expr | None = None,
               target: str = "") -> None:
        scope = self._scope
        if scope.kind == "comprehension" and isinstance(node, ast.NamedExpr):
            while scope.kind == "comprehension" and scope.parent is not None:
                scope = scope.parent
        if name in scope.declared_global:
            scope = scope.module
        elif name in scope.declared_nonlocal:
            found = self._enclosing_function_with(scope, name)
            scope = found or scope
        scope.bind(name, Binding(binding_kind, node, scope, target, value))

    @staticmethod
    def _enclosing_function_with(scope: Scope, name: str) -> Scope | None:
        parent = scope.parent
        while parent is not None and parent.kind != "module":
            if parent.kind in ("function", "lambda") and name in parent.bindings:
                return parent
            parent = parent.parent
        return None

    def _targets(self, target: ast.expr, kind: str, value: ast.expr | None = None) -> None:
        if isinstance(target, ast.Name):
            self._store(target.id, kind, target, value)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                self._targets(elt, "other")
        elif isinstance(target, ast.Starred):
            self._targets(target.value, "other")
        self.visit(target)

    def _in_scope(self, scope: Scope, body: list[ast.AST] | ast.AST) -> None:
        saved, self._scope = self._scope, scope
        try:
            for node in body if isinstance(body, list) else [body]:
                self.visit(node)
        finally:
            self._scope = saved

    def _bind_arguments(self, scope: Scope, args: ast.arguments) -> None:
        every = [*args.posonlyargs, *args.args, *args.kwonlyargs]
        every += [a for a in (args.vararg, args.kwarg) if a is not None]
        for arg in every:
            scope.bind(arg.arg, Binding("param", arg, scope))

    # -- bindings
    def visit_Import(self, node: ast.Import) -> None:
        self.scope_of[id(node)] = self._scope
        for alias in node.names:
            if alias.asname:
                self._store(alias.asname, "import", node, target=alias.name)
            else:
                top = alias.name.split(".")[0]
                self._store(top, "import", node, target=top)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        self.scope_of[id(node)] = self._scope
        for alias in node.names:
            if alias.name != "*":
                self._store(alias.asname or alias.name, "from", node, target=f"{node.module or ''}.{alias.name}")

    def visit_Global(self, node: ast.Global) -> None:
        self.scope_of[id(node)] = self._scope
        self._scope.declared_global.update(node.names)

    def visit_Nonlocal(self, node: ast.Nonlocal) -> None:
        self.scope_of[id(node)] = self._scope
        self._scope.declared_nonlocal.update(node.names)

    def visit_Assign(self, node: ast.Assign) -> None:
        self.scope_of[id(node)] = self._scope
        self.visit(node.value)
        for target in node.targets:
            single = len(node.targets) == 1 and isinstance(target, ast.Name)
            self._targets(target, "assign" if single else "other", node.value if single else None)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.scope_of[id(node)] = self._scope
        self.visit(node.annotation)
        if node.value is not None:
            self.visit(node.value)
        self._targets(node.target, "assign" if node.value is not None else "other", node.value)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self.scope_of[id(node)] = self._scope
        self.visit(node.value)
        self._targets(node.target, "other")

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.scope_of[id(node)] = self._scope
        self.visit(node.value)
        self._store(node.target.id, "other", node)
        self.visit(node.target)

    def visit_For(self, node: ast.For | ast.AsyncFor) -> None:
        self.scope_of[id(node)] = self._scope
        self.visit(node.iter)
        self._targets(node.target, "other")
        for stmt in node.body + node.orelse:
            self.visit(stmt)

    visit_AsyncFor = visit_For

    def visit_withitem(self, node: ast.withitem) -> None:
        self.scope_of[id(node)] = self._scope
        self.visit(node.context_expr)
        if node.optional_vars is not None:
            self._targets(node.optional_vars, "other")

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        self.scope_of[id(node)] = self._scope
        if node.type is not None:
            self.visit(node.type)
        if node.name:
            self._store(node.name, "other", node)
        for stmt in node.body:
            self.visit(stmt)

    def visit_Delete(self, node: ast.Delete) -> None:
        self.scope_of[id(node)] = self._scope
        for target in node.targets:
            if isinstance(target, ast.Name):
                self._store(target.id, "other", target)
            self.visit(target)

    def visit_MatchAs(self, node: ast.MatchAs) -> None:
        if node.name:
            self._store(node.name, "other", node)
        self.generic_visit(node)

    def visit_MatchStar(self, node: ast.MatchStar) -> None:
        if node.name:
            self._store(node.name, "other", node)
        self.generic_visit(node)

    def visit_MatchMapping(self, node: ast.MatchMapping) -> None:
        if node.rest:
            self._store(node.rest, "other", node)
        self.generic_visit(node)

    # -- new scopes
    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.scope_of[id(node)] = self._scope
        for d in node.decorator_list:
            self.visit(d)
        self.visit(node.args)  # defaults and annotations are evaluated where the def is
        if node.returns is not None:
            self.visit(node.returns)
        self._store(node.name, "function", node)
        scope = Scope("function", node, self._scope)
        self._bind_arguments(scope, node.args)
        positional = [*node.args.posonlyargs, *node.args.args]
        if self._scope.kind == "class" and positional and "staticmethod" not in _decorator_names(node):
            scope.self_name = positional[0].arg
        self._in_scope(scope, node.body)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_arguments(self, node: ast.arguments) -> None:
        self.scope_of[id(node)] = self._scope
        for default in [*node.defaults, *[d for d in node.kw_defaults if d is not None]]:
            self.visit(default)
        for arg in [*node.posonlyargs, *node.args, *node.kwonlyargs, node.vararg, node.kwarg]:
            if arg is not None:
                self.scope_of[id(arg)] = self._scope
                if arg.annotation is not None:
                    self.visit(arg.annotation)

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self.scope_of[id(node)] = self._scope
        self.visit(node.args)
        scope = Scope("lambda", node, self._scope)
        self._bind_arguments(scope, node.args)
        self._in_scope(scope, node.body)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.scope_of[id(node)] = self._scope
        for expr in [*node.decorator_list, *node.bases, *[k.value for k in node.keywords]]:
            self.visit(expr)
        self._store(node.name, "class", node)
        self._in_scope(Scope("class", node, self._scope), node.body)

    def _comprehension(self, node: ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp) -> None:
        self.scope_of[id(node)] = self._scope
        first, *rest = node.generators
        self.visit(first.iter)  # the first iterable is evaluated in the enclosing scope
        scope = Scope("comprehension", node, self._scope)
        saved, self._scope = self._scope, scope
        try:
            for i, gen in enumerate(node.generators):
                self.scope_of[id(gen)] = scope
                if i:
                    self.visit(gen.iter)
                self._targets(gen.target, "other")
                for cond in gen.ifs:
                    self.visit(cond)
            for part in ((node.key, node.value) if isinstance(node, ast.DictComp) else (node.elt,)):
                self.visit(part)
        finally:
            self._scope = saved

    visit_ListComp = visit_SetComp = visit_GeneratorExp = visit_DictComp = _comprehension

    # -- queries
    def resolve(self, name: str, node: ast.AST) -> list[Binding]:
        """The bindings ``name`` may refer to where ``node`` is evaluated (empty: a builtin or undefined)."""
        scope = self.scope_of.get(id(node), self.root)
        return self.lookup(name, scope)

    def lookup(self, name: str, scope: Scope) -> list[Binding]:
        if name in scope.declared_global:
            return scope.module.bindings.get(name, [])
        first = True
        while scope is not None:
            visible = first or scope.kind != "class"  # a class body is not visible to functions inside it
            if visible and name in scope.bindings and name not in scope.declared_nonlocal:
                return scope.bindings[name]
            first = False
            scope = scope.parent
        return []

    def scopes(self) -> list[Scope]:
        seen: dict[int, Scope] = {}
        for scope in self.scope_of.values():
            while scope is not None and id(scope) not in seen:
                seen[id(scope)] = scope
                scope = scope.parent
        return list(seen.values())

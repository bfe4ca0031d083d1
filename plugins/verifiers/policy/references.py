"""Reading a candidate's AST: what each name and dotted path refers to (imports walked against the
policy, the candidate's own classes and ``self``, locals, builtins), and the findings record."""

from __future__ import annotations

import ast
import types
from dataclasses import dataclass

from core.api.policy import StaticPolicy
from plugins.verifiers.policy.paths import Ref, refuse, step, walk
from plugins.verifiers.policy.scope import Binding, ScopeMap


def _introspection_names() -> frozenset[str]:
    """Attribute names of CPython's frames, code objects, generators, coroutines and tracebacks."""
    def gen():
        yield

    async def coro():
        pass

    async def agen():
        yield

    running = coro()
    kinds = [types.FrameType, types.CodeType, types.TracebackType, type(gen()), type(running), type(agen())]
    running.close()
    names = {n for k in kinds for n in dir(k) if n.split("_")[0] in ("f", "co", "tb", "gi", "cr", "ag")}
    return frozenset(names)


INTROSPECTION = _introspection_names()


@dataclass(frozen=True)
class Finding:
    rule: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"rule {self.rule} at line {self.line}: {self.message}"


def chain(node: ast.Attribute) -> tuple[ast.expr, list[ast.Attribute]]:
    """The base of an attribute chain and its Attribute nodes, innermost first."""
    nodes: list[ast.Attribute] = []
    cur: ast.expr = node
    while isinstance(cur, ast.Attribute):
        nodes.append(cur)
        cur = cur.value
    return cur, nodes[::-1]


def is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def binds_none(b: Binding) -> bool:
    return b.kind == "assign" and isinstance(b.value, ast.Constant) and b.value.value is None


def is_constant(node: ast.expr | None) -> bool:
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.UnaryOp):
        return is_constant(node.operand)
    if isinstance(node, ast.BinOp):
        return is_constant(node.left) and is_constant(node.right)
    if isinstance(node, ast.Tuple):
        return all(is_constant(e) for e in node.elts)
    return False


class Reader:
    """The references of one parsed module under one policy, and the findings made about it."""

    def __init__(self, tree: ast.Module, policy: StaticPolicy):
        self.tree, self.policy = tree, policy
        self.scopes = ScopeMap(tree)
        self.parent: dict[int, ast.AST] = {}
        self.nodes: list[ast.AST] = []
        for node in ast.walk(tree):
            self.nodes.append(node)
            for child in ast.iter_child_nodes(node):
                self.parent[id(child)] = node
        self.findings: list[Finding] = []
        self._seen: set[tuple[str, int, str]] = set()
        self._handled: set[int] = set()  # attribute nodes an import walk already judged
        self._binding_cache: dict[int, list[Binding]] = {}
        self._ref_cache: dict[int, Ref | None] = {}
        self._fakes: list[ast.AST] = []
        self.own_callables = {n.name for n in self.nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}

    def add(self, rule: str, node: ast.AST, message: str) -> None:
        line = getattr(node, "lineno", 0)
        key = (rule, line, message)
        if key not in self._seen:
            self._seen.add(key)
            self.findings.append(Finding(rule, line, message))

    def _bindings(self, node: ast.Name) -> list[Binding]:
        found = self._binding_cache.get(id(node))
        if found is None:
            found = self._binding_cache[id(node)] = self.scopes.resolve(node.id, node)
        return found

    def ref_of(self, node: ast.expr, depth: int = 0) -> Ref | None:
        """What ``node`` (a name or attribute chain) names through imports; ``None`` if not an import."""
        key = id(node)
        if key in self._ref_cache:
            return self._ref_cache[key]
        ref = self._ref_of(node, depth)
        self._ref_cache[key] = ref
        return ref

    def _ref_of(self, node: ast.expr, depth: int) -> Ref | None:
        if depth > 8:
            return None
        if isinstance(node, ast.Name):
            found = self._bindings(node)
            if not found:
                return None
            imports = [b for b in found if b.kind in ("import", "from")]
            if imports and all(b in imports or binds_none(b) for b in found):
                return self._import_ref(imports[-1])  # also `except ImportError: x = None`
            if len(found) == 1 and found[0].kind == "assign" and isinstance(found[0].value, (ast.Name, ast.Attribute)):
                return self.ref_of(found[0].value, depth + 1)  # an alias: x = torch.nn.functional
            return None
        if isinstance(node, ast.Attribute):
            base, nodes = chain(node)
            root = self.ref_of(base, depth + 1) if isinstance(base, ast.Name) else None
            if root is None or root.refused:
                return root
            ref, used = walk(self.policy, root, [n.attr for n in nodes])
            if used < len(nodes):
                rest = ".".join(n.attr for n in nodes[used:])
                return Ref("object", f"{ref.path}.{rest}") if ref.kind == "object" else None
            return ref
        return None

    def _import_ref(self, b: Binding) -> Ref:
        policy = self.policy
        if b.kind == "import":
            if policy.rule(b.target) is not None:
                return Ref("module", b.target)
            if any(m.startswith(b.target + ".") for m in policy.module_names):
                return Ref("transit", b.target)
            return refuse("import", f"{b.target} is not allowed")
        module_name, _, name = b.target.rpartition(".")
        if b.target in policy.module_names:
            return Ref("module", b.target)
        if b.target in policy.exact_paths:
            return Ref("object", b.target)
        if policy.rule(module_name) is None:
            return refuse("import", f"{module_name} is not allowed")
        return step(policy, Ref("module", module_name), name)

    def _path_of(self, node: ast.expr) -> str | None:
        ref = self.ref_of(node)
        return ref.path if ref is not None and not ref.refused else None

    def _is_builtin(self, node: ast.Name) -> bool:
        return not self._bindings(node)

    def _own(self, node: ast.expr) -> bool:
        """``self``/``cls`` of one of the candidate's methods, or one of its classes."""
        if not isinstance(node, ast.Name):
            return False
        found = self._bindings(node)
        if len(found) == 1 and found[0].kind == "param" and found[0].scope.self_name == node.id:
            return True
        return bool(found) and all(b.kind == "class" for b in found)

    def _decorator_path(self, node: ast.expr) -> str | None:
        try:
            return self._path_of(node)
        except Exception:  # noqa: BLE001 - a decorator the walk cannot follow is not a kernel decorator
            return None

    @staticmethod
    def _describe(node: ast.expr) -> str:
        text = ast.unparse(node)
        return text if len(text) <= 40 else text[:37] + "..."

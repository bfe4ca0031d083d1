"""Definition rules: what the candidate's classes may derive from, which special methods and module
dunders it may define, and no coroutines."""

from __future__ import annotations

import ast

from core.api.policy import CLASS_DUNDERS, MODULE_DUNDERS
from plugins.verifiers.policy.paths import MISSING, real_object
from plugins.verifiers.policy.references import Reader, is_dunder

PROTOCOL_HOOKS = frozenset({
    "__torch_function__", "__torch_dispatch__", "__array__", "__array_interface__", "__array_struct__",
    "__array_function__", "__array_ufunc__", "__array_priority__", "__array_wrap__", "__array_finalize__",
    "__array_prepare__", "__cuda_array_interface__", "__dlpack__", "__dlpack_device__"})


class DefinitionRules(Reader):
    """Rules ``class-base``, ``protocol-hook``, ``dunder-def`` and ``async``."""

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for kw in node.keywords:
            self.add("class-base", node, f"class {node.name} passes {kw.arg}=: metaclasses and class keywords "
                                         "change how the class behaves")
        for base in node.bases:
            problem = self._base_problem(base)
            if problem:
                self.add("class-base", base, f"class {node.name} {problem}")
        for stmt in node.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and is_dunder(stmt.name):
                self._dunder_def(stmt, stmt.name)

    def _dunder_def(self, node: ast.AST, name: str) -> None:
        if name in PROTOCOL_HOOKS:
            self.add("protocol-hook", node, f"defines {name}: torch and array protocol hooks let an object "
                                            "compute when the judge or a library touches it")
        elif name not in CLASS_DUNDERS:
            self.add("dunder-def", node, f"defines {name}: a special method runs when the judge, a launcher "
                                         f"or torch converts or inspects the object (allowed: {', '.join(sorted(CLASS_DUNDERS))})")

    def _base_problem(self, base: ast.expr) -> str | None:
        if isinstance(base, ast.Name) and self._own(base):
            return None
        if isinstance(base, ast.Name) and base.id == "object" and self._is_builtin(base):
            return None
        ref = self.ref_of(base) if isinstance(base, (ast.Name, ast.Attribute)) else None
        if ref is None or ref.refused:
            return f"derives from {self._describe(base)}, which the policy cannot check"
        import torch

        cls = real_object(ref.path)
        if isinstance(cls, type) and issubclass(cls, torch.Tensor):
            return (f"subclasses {ref.path}, a tensor type: a tensor subclass can compute when the judge "
                    "first touches the output")
        if isinstance(cls, type):
            for allowed in self.policy.class_bases:
                target = real_object(allowed)
                if isinstance(target, type) and issubclass(cls, target):
                    return None
        elif cls is MISSING and ref.path in self.policy.class_bases:
            return None
        return (f"derives from {ref.path}; classes may derive from "
                f"{', '.join(sorted(self.policy.class_bases))}, object or the candidate's own classes")

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        scope = self.scopes.scope_of.get(id(node))
        if scope is self.scopes.root and is_dunder(node.name) and node.name not in MODULE_DUNDERS:
            if node.name in PROTOCOL_HOOKS:
                self._dunder_def(node, node.name)
            else:
                self.add("dunder-def", node, f"defines the module hook {node.name}")

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self.add("async", node, f"async def {node.name}: coroutines run where the audit cannot follow them")

    def visit_Await(self, node: ast.Await) -> None:
        self.add("async", node, "await: coroutines run where the audit cannot follow them")

    def visit_AsyncFor(self, node: ast.AsyncFor) -> None:
        self.add("async", node, "async for: coroutines run where the audit cannot follow them")

    def visit_AsyncWith(self, node: ast.AsyncWith) -> None:
        self.add("async", node, "async with: coroutines run where the audit cannot follow them")

    def visit_comprehension(self, node: ast.comprehension) -> None:
        if node.is_async:
            self.add("async", node.iter, "an async comprehension: coroutines run where the audit cannot follow them")

"""Kernels: which functions are device code, which names alias a kernel object, whether one escapes
into containers or other objects, and what a kernel body may name."""

from __future__ import annotations

import ast

from plugins.verifiers.policy.references import Reader, is_constant
from plugins.verifiers.policy.scope import Binding


class KernelRules(Reader):
    """Rule ``device-code``, and the kernel facts the launch rules build on."""

    def __init__(self, tree: ast.Module, policy) -> None:
        super().__init__(tree, policy)
        # kernels anywhere: module level, in classes, in functions
        self.kernels = [n for n in self.nodes if isinstance(n, ast.FunctionDef) and self._is_kernel(n)]
        self._wrapped_by_call()
        self._kernel_nodes = {id(k) for k in self.kernels}
        self._alias_bindings: set[int] = set()
        self.kernel_escapes = self._follow_kernels()

    def _is_kernel(self, fn: ast.FunctionDef) -> bool:
        for d in fn.decorator_list:
            d = d.func if isinstance(d, ast.Call) else d
            if self._decorator_path(d) in self.policy.kernel_decorators:
                return True
        return False

    def _wrapped_by_call(self) -> None:
        """``k = triton.jit(fn)``: ``fn`` is a kernel too (its body is device code)."""
        decorators = {id(d) for n in self.nodes if isinstance(n, (ast.FunctionDef, ast.ClassDef)) for d in n.decorator_list}
        for node in self.nodes:
            if not isinstance(node, ast.Call) or id(node) in decorators:
                continue
            if self._decorator_path(node.func) not in self.policy.kernel_decorators:
                continue
            fn = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "fn"), None)
            if fn is None:
                continue  # triton.jit(**options) used as a decorator factory
            found = self._bindings(fn) if isinstance(fn, ast.Name) else []
            if found and all(b.kind == "function" for b in found):
                self.kernels.extend(b.node for b in found if b.node not in self.kernels)  # type: ignore[misc]
            else:
                self.add("device-code", node, "a kernel decorator applied to an expression: kernels are "
                                              "def functions")

    def check_decorator_use(self, node: ast.expr, path: str | None) -> None:
        """A kernel decorator (``triton.jit``) may only decorate, be called, or be bound to a name:
        hidden in a container it would make kernels the rules cannot see."""
        if path not in self.policy.kernel_decorators:
            return
        parent = self.parent.get(id(node))
        if isinstance(parent, (ast.FunctionDef, ast.ClassDef)) and node in parent.decorator_list:
            return
        if isinstance(parent, ast.Call) and parent.func is node:
            return
        if isinstance(parent, ast.Assign) and parent.value is node and len(parent.targets) == 1 \
                and isinstance(parent.targets[0], ast.Name):
            return
        self.add("device-code", node, f"{path} used as a value: kernel decorators may only decorate a def, "
                                      "be called, or be bound to a name")

    def _follow_kernels(self) -> bool:
        """Mark the names that alias a kernel (``k2 = k``, ``tuned = triton.autotune(...)(k)``);
        return whether a kernel object escapes anywhere else (a container, an argument, an attribute)."""
        escapes, changed = False, True
        while changed:
            changed = False
            for node in self.nodes:
                if not (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and self._names_kernel(node)):
                    continue
                use, target = self._kernel_use(node)
                if use == "alias" and target is not None:
                    for b in self.scopes.scope_of[id(target)].bindings.get(target.id, []):
                        if b.node is target and id(b) not in self._alias_bindings:
                            self._alias_bindings.add(id(b))
                            changed = True
                escapes |= use == "escape"
        return escapes

    def _kernel_use(self, node: ast.expr) -> tuple[str, ast.Name | None]:
        """How a kernel reference is used: ``launch`` (``k[grid]``), ``attribute`` (``k.run``),
        ``alias`` (bound to a name, possibly through launch configurators), else ``escape``."""
        parent = self.parent.get(id(node))
        if isinstance(parent, ast.Subscript) and parent.value is node:
            return "launch", None
        if isinstance(parent, ast.Attribute) and parent.value is node:
            return "attribute", None
        cur = node
        while True:
            parent = self.parent.get(id(cur))
            if isinstance(parent, ast.IfExp) and cur is not parent.test:
                cur = parent
            elif isinstance(parent, ast.Call) and cur in parent.args and self._wraps_kernels(parent.func):
                cur = parent
            elif isinstance(parent, ast.Assign) and parent.value is cur and len(parent.targets) == 1 \
                    and isinstance(parent.targets[0], ast.Name):
                return "alias", parent.targets[0]
            else:
                return "escape", None

    def _wraps_kernels(self, func: ast.expr) -> bool:
        wrappers = self.policy.launch_configurators | self.policy.kernel_decorators
        if isinstance(func, ast.Call):
            func = func.func
        return isinstance(func, (ast.Name, ast.Attribute)) and self._decorator_path(func) in wrappers

    def _names_kernel(self, node: ast.Name) -> bool:
        """``node`` refers to one of the candidate's kernels or a name bound to one."""
        found = self._bindings(node)
        return bool(found) and all(
            (b.kind == "function" and id(b.node) in self._kernel_nodes) or id(b) in self._alias_bindings
            for b in found)

    def _kernel_scope(self, node: ast.AST):
        """The scope of the kernel whose body ``node`` is in, else ``None``."""
        if not self._kernel_nodes:
            return None
        scope = self.scopes.scope_of.get(id(node))
        while scope is not None and id(scope.node) not in self._kernel_nodes:
            scope = scope.parent
        return scope

    @staticmethod
    def _inside(scope, outer) -> bool:
        while scope is not None:
            if scope is outer:
                return True
            scope = scope.parent
        return False

    def _check_device_name(self, node: ast.Name, found: list[Binding]) -> None:
        kernel_scope = self._kernel_scope(node)
        if any(self._inside(b.scope, kernel_scope) for b in found):
            return  # an argument or a local of the kernel
        ok = False
        if all(b.kind in ("import", "from") for b in found):
            ref = self._import_ref(found[-1])
            ok = not ref.refused and self._device_path(ref.path)
        elif all(b.kind == "function" for b in found):
            ok = all(id(b.node) in self._kernel_nodes for b in found)
        elif len(found) == 1 and found[0].kind == "assign" and found[0].scope is self.scopes.root:
            ok = self._is_constexpr(found[0].value)
            if not ok and is_constant(found[0].value):
                self.add("device-code", node, f"a kernel uses the module constant {node.id}: Triton accepts only "
                                              f"globals declared {node.id} = tl.constexpr(...)")
                return
        if not ok:
            kernel = kernel_scope.node.name if kernel_scope else "?"  # type: ignore[attr-defined]
            self.add("device-code", node, f"kernel {kernel} uses {node.id}: a kernel may only use its arguments, "
                                          "device modules (triton.language), other kernels and tl.constexpr globals")

    def _is_constexpr(self, value: ast.expr | None) -> bool:
        """``tl.constexpr(<constant>)``: the only module global Triton lets a kernel read."""
        return isinstance(value, ast.Call) and len(value.args) == 1 and not value.keywords \
            and is_constant(value.args[0]) and self._path_of(value.func) in self.policy.device_constants

    def _device_path(self, path: str) -> bool:
        parts = path.split(".")
        for cut in range(len(parts), 0, -1):
            rule = self.policy.rule(".".join(parts[:cut]))
            if rule is not None:
                return rule.device
        return False

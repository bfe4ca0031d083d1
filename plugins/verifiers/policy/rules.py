"""The static policy's rules, applied to a candidate's AST. Every finding names its rule and line.

Rule ids (stable; they appear in rejections as ``rule <id> at line N: ...``):

=====================  ===================================================================
``import``             a module outside the allow-list, a member the policy does not allow,
                       or an import alias rebound
``import-star``        ``from m import *``
``import-relative``    ``from . import x``
``module-member``      a path that names a module or member outside the allow-list
                       (``torch.jit``, ``torch.os``, ``torch.from_numpy``, ``cp.asarray``)
``module-value``       a module used as a value instead of through its members
``private-attribute``  an underscore attribute of anything that is not the candidate's own
``introspection``      frame, code, generator or traceback internals (``f_back``, ``gi_frame``)
``barred-attribute``   an attribute name no kernel needs on any object (``.numpy()``)
``builtin``            a builtin outside the allow-list (``eval``, ``open``, ``__import__``)
``undefined-name``     a name the candidate never binds (``np``, put into its globals by the
                       Triton interpreter at run time)
``dynamic-attribute``  ``getattr``/``setattr``/``delattr``/``hasattr`` with a computed name
``patch``              assigning or deleting attributes of imports or builtins
``class-base``         a class deriving from ``torch.Tensor`` or anything but ``nn.Module``,
                       ``torch.autograd.Function``, ``object`` or the candidate's classes
``protocol-hook``      torch, array or DLPack protocol hooks (``__torch_function__`` ...)
``dunder-def``         any other special method or module dunder (``__index__``, ``__getattr__``)
``async``              ``async def``, ``await``, ``async for``/``with``
``launch-grid``        a launch grid that is not launch arithmetic
``launch-hook``        a callable a launch runs (heuristics, autotune hooks) that is not arithmetic
``device-code``        a kernel body naming anything but device code, its arguments and constants
=====================  ===================================================================
"""

from __future__ import annotations

import ast
import builtins

from core.api.policy import ATTRIBUTE_FAMILIES, MODULE_DUNDERS, StaticPolicy
from plugins.verifiers.policy.definitions import DefinitionRules
from plugins.verifiers.policy.launches import LaunchRules
from plugins.verifiers.policy.paths import step
from plugins.verifiers.policy.references import INTROSPECTION, Finding, binds_none, chain, is_dunder
from plugins.verifiers.policy.scope import Binding

READABLE_DUNDERS = frozenset({"__name__", "__doc__", "__qualname__"})
MODULE_GLOBALS = frozenset({"__name__", "__doc__"})
_NAMED_ACCESS = {"getattr": 1, "hasattr": 1, "setattr": 1, "delattr": 1}
_DIRECT_ONLY = frozenset({*_NAMED_ACCESS, "type"})


class PolicyChecker(DefinitionRules, LaunchRules):
    """Applies a :class:`StaticPolicy` to one parsed module; :meth:`run` returns the findings.
    Imports, names, attributes, stores and calls here; the rest in the mixins."""

    def run(self) -> list[Finding]:
        self._check_rebound_imports()
        for node in self.nodes:
            visit = getattr(self, f"visit_{type(node).__name__}", None)
            if visit is not None:
                visit(node)
        self.findings.sort(key=lambda f: (f.line, f.rule))
        return self.findings

    def _check_rebound_imports(self) -> None:
        for scope in self.scopes.scopes():
            for name, found in scope.bindings.items():
                kinds = {b.kind in ("import", "from") for b in found if not binds_none(b)}
                if kinds == {True, False}:
                    other = next(b for b in found if b.kind not in ("import", "from") and not binds_none(b))
                    self.add("import", other.node, f"rebinds {name}, which names an import")

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if self.policy.rule(alias.name) is None:
                self.add("import", node, f"imports {alias.name}, which the {self.policy.backend} policy does not "
                                         f"allow (allowed: {self._allowed_modules()})")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            self.add("import-relative", node, "a relative import: the candidate is a single module")
            return
        mod = node.module or ""
        for alias in node.names:
            if alias.name == "*":
                self.add("import-star", node, f"from {mod} import *: every name must be imported by name")
                continue
            ref = self._import_ref(Binding("from", node, self.scopes.root, f"{mod}.{alias.name}"))
            if ref.refused:
                why = ref.why if ref.rule != "import" else (f"imports from {mod}, which the {self.policy.backend} "
                                                            f"policy does not allow (allowed: {self._allowed_modules()})")
                self.add("import", node, why)

    def _allowed_modules(self) -> str:
        return ", ".join(sorted(n for n in self.policy.module_names if not n.startswith("_") and "._" not in n))

    def visit_Name(self, node: ast.Name) -> None:
        if not isinstance(node.ctx, ast.Load):
            if is_dunder(node.id) and self.scopes.scope_of.get(id(node)) is self.scopes.root \
                    and node.id not in MODULE_DUNDERS:
                self.add("dunder-def", node, f"binds the module attribute {node.id}")
            return
        device = self._kernel_scope(node) is not None
        found = self._bindings(node)
        if not found:
            allowed = self.policy.device_builtins if device else self.policy.builtins
            parent = self.parent.get(id(node))
            if node.id in _DIRECT_ONLY and not (isinstance(parent, ast.Call) and parent.func is node):
                self.add("builtin", node, f"uses {node.id} as a value: it may only be called directly, "
                                          "where its arguments are checked")
                return
            if node.id in allowed or (not device and node.id in MODULE_GLOBALS):
                return
            if hasattr(builtins, node.id) or is_dunder(node.id):
                where = "a kernel" if device else "the candidate"
                rule = "device-code" if device else "builtin"
                self.add(rule, node, f"{where} uses the builtin {node.id}, which the {self.policy.backend} policy does "
                                     "not allow" + (" (dynamic code, files or interpreter state)" if not device else ""))
                return
            # A name nothing in the source binds: at run time it could only be one that another
            # module put into the candidate's globals (the Triton interpreter copies its own, numpy
            # among them, into a kernel's module at the first launch).
            self.add("undefined-name", node, f"uses the name {node.id}, which the candidate never binds (a global "
                                             "put into its module at run time, outside the policy)")
            return
        if device:
            self._check_device_name(node, found)
        ref = self.ref_of(node)
        if ref is not None and ref.kind == "object":
            self.check_decorator_use(node, ref.path)
        if ref is not None and ref.kind in ("module", "transit"):
            parent = self.parent.get(id(node))
            if not (isinstance(parent, ast.Attribute) and parent.value is node):
                self.add("module-value", node, f"uses the module {ref.path} as a value; use its members "
                                               "(modules may not be passed, stored or returned)")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        parent = self.parent.get(id(node))
        if not (isinstance(parent, ast.Attribute) and parent.value is node):
            self._check_chain(node, parent)
        self._check_attribute(node, node.value, node.attr, parent, walked=id(node) in self._handled)

    def _check_chain(self, node: ast.Attribute, parent: ast.AST | None) -> None:
        base, nodes = chain(node)
        if not isinstance(base, ast.Name):
            return
        root = self.ref_of(base)
        if root is None or root.refused:
            return
        ref = root
        for i, attr_node in enumerate(nodes):
            if ref.kind not in ("module", "transit"):
                break
            self._handled.add(id(attr_node))
            ref = step(self.policy, ref, attr_node.attr)
            if ref.refused:
                self.add(ref.rule, attr_node, ref.why)
                self._handled.update(id(n) for n in nodes[i:])  # what follows is named by the refusal
                return
        if ref.kind == "object" and len(nodes) == len([n for n in nodes if id(n) in self._handled]):
            self.check_decorator_use(node, ref.path)
        if ref.kind == "transit":
            self.add("private-attribute", node, f"{ref.path} is private")
        elif ref.kind == "module" and not (isinstance(parent, ast.Attribute) and parent.value is node):
            self.add("module-value", node, f"uses the module {ref.path} as a value; import it by name instead")

    def _check_attribute(self, node: ast.AST, value: ast.expr, attr: str, parent: ast.AST | None,
                         walked: bool = False) -> None:
        """``walked``: an import path's step, whose module and privacy rules :func:`step` applied."""
        device = self._kernel_scope(node) is not None
        if walked:
            pass
        elif is_dunder(attr):
            called_init = attr == "__init__" and isinstance(parent, ast.Call) and parent.func is node
            if attr not in READABLE_DUNDERS and not called_init:
                self.add("private-attribute", node, f"uses .{attr}: special attributes lead to the interpreter's "
                                                    "internals (classes, globals, code, frames)")
        elif attr.startswith("_") and not self._own(value):
            self.add("private-attribute", node, f"uses .{attr} of {self._describe(value)}, which is not the "
                                                "candidate's own (only self._x and its classes' private names)")
        if attr in INTROSPECTION:
            self.add("introspection", node, f"uses .{attr}: frame, code and generator internals reach the judge")
        if attr in self.policy.barred_attributes:
            self.add("barred-attribute", node, f".{attr}: {ATTRIBUTE_FAMILIES.get(attr, 'refused by the policy')}")
        if device and attr in self.policy.device_barred_attributes:
            self.add("device-code", node, f"a kernel uses .{attr}: the interpreter's storage of a tensor")

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._check_store(target, node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._check_store(node.target, node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._check_store(node.target, node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            self._check_store(target, node)

    def _check_store(self, target: ast.expr, stmt: ast.AST) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                self._check_store(elt, stmt)
            return
        if isinstance(target, ast.Starred):
            self._check_store(target.value, stmt)
            return
        if isinstance(target, ast.Name) and self.scopes.scope_of.get(id(target)) is not None:
            scope = self.scopes.scope_of[id(target)]
            if scope.kind == "class" and is_dunder(target.id) and target.id != "__doc__":
                self._dunder_def(target, target.id)
            return
        if isinstance(target, (ast.Attribute, ast.Subscript)):
            base = target
            while isinstance(base, (ast.Attribute, ast.Subscript)):
                base = base.value
            self._check_patch_base(base, target, ast.unparse(target))

    def _check_patch_base(self, base: ast.expr, site: ast.AST, text: str) -> None:
        if isinstance(base, ast.Name):
            found = self._bindings(base)
            if not found:
                self.add("patch", site, f"assigns {text}, part of the builtin {base.id}")
            elif self.ref_of(base) is not None or any(self._import_derived(b) for b in found):
                self.add("patch", site, f"assigns {text}, part of an imported module or its members")
            elif self._names_kernel(base):
                self.add("patch", site, f"assigns {text}, part of a kernel object (its launcher runs it)")
            return
        self.add("patch", site, f"assigns {text}, an attribute of a computed object")

    def _import_derived(self, b: Binding) -> bool:
        """The binding may hold an imported module's member (not a fresh object one of them made)."""
        if b.kind in ("import", "from"):
            return True
        value = b.value
        if b.kind == "other":
            stmt = self.parent.get(id(b.node))
            while stmt is not None and not isinstance(stmt, (ast.stmt, ast.comprehension, ast.withitem)):
                stmt = self.parent.get(id(stmt))
            value = getattr(stmt, "value", None) or getattr(stmt, "iter", None) or getattr(stmt, "context_expr", None)
        if value is None:
            return False
        for sub in ast.walk(value):
            if isinstance(sub, (ast.Name, ast.Attribute)) and self.ref_of(sub) is not None:
                parent = self.parent.get(id(sub))
                if not (isinstance(parent, ast.Call) and parent.func is sub) and \
                        not (isinstance(parent, ast.Attribute) and parent.value is sub):
                    return True
        return False

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and self._is_builtin(func):
            if func.id in _NAMED_ACCESS:
                self._named_access(node, func.id)
            elif func.id == "type" and len(node.args) != 1:
                self.add("builtin", node, "type() with three arguments builds a class at run time")
        for kw in node.keywords:
            if kw.arg == "grid":
                on_kernel = isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) \
                    and self._names_kernel(func.value)
                self._check_grid(kw.value, node, strict=on_kernel or self.kernel_escapes)
        self._check_raw_launch(node)
        path = self._path_of(func) if isinstance(func, (ast.Name, ast.Attribute)) else None
        if path in self.policy.launch_configurators:
            self._check_configurator(node, path)

    def _named_access(self, node: ast.Call, name: str) -> None:
        if len(node.args) < 2 or not (isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            self.add("dynamic-attribute", node, f"{name}() with a computed attribute name")
            return
        obj, attr = node.args[0], node.args[1].value
        fake = ast.Attribute(value=obj, attr=attr, ctx=ast.Load())
        ast.copy_location(fake, node)
        self._fakes.append(fake)  # kept alive: the caches are keyed by id()
        self.parent[id(fake)] = node
        self.parent[id(obj)] = fake
        self._check_chain(fake, node)
        self._check_attribute(fake, obj, attr, None, walked=id(fake) in self._handled)
        if name in ("setattr", "delattr"):
            base = obj
            while isinstance(base, (ast.Attribute, ast.Subscript)):
                base = base.value
            self._check_patch_base(base, node, f"{ast.unparse(obj)}.{attr}")


def check(tree: ast.Module, policy: StaticPolicy) -> list[Finding]:
    """Every construct of ``tree`` the policy refuses, in source order."""
    return PolicyChecker(tree, policy).run()

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
import types
from dataclasses import dataclass

from plugins.verifiers.policy.declaration import (
    ATTRIBUTE_FAMILIES,
    CLASS_DUNDERS,
    LAUNCH_HOOK_KEYWORDS,
    MODULE_DUNDERS,
    StaticPolicy,
)
from plugins.verifiers.policy.grids import GridContext, offence
from plugins.verifiers.policy.paths import MISSING, Ref, real_object, refuse, step, walk
from plugins.verifiers.policy.scope import Binding, ScopeMap

PROTOCOL_HOOKS = frozenset({
    "__torch_function__", "__torch_dispatch__", "__array__", "__array_interface__", "__array_struct__",
    "__array_function__", "__array_ufunc__", "__array_priority__", "__array_wrap__", "__array_finalize__",
    "__array_prepare__", "__cuda_array_interface__", "__dlpack__", "__dlpack_device__"})
READABLE_DUNDERS = frozenset({"__name__", "__doc__", "__qualname__"})
MODULE_GLOBALS = frozenset({"__name__", "__doc__"})
_NAMED_ACCESS = {"getattr": 1, "hasattr": 1, "setattr": 1, "delattr": 1}


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


def _chain(node: ast.Attribute) -> tuple[ast.expr, list[ast.Attribute]]:
    """The base of an attribute chain and its Attribute nodes, innermost first."""
    nodes: list[ast.Attribute] = []
    cur: ast.expr = node
    while isinstance(cur, ast.Attribute):
        nodes.append(cur)
        cur = cur.value
    return cur, nodes[::-1]


def _is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def _binds_none(b: Binding) -> bool:
    return b.kind == "assign" and isinstance(b.value, ast.Constant) and b.value.value is None


def _is_constant(node: ast.expr | None) -> bool:
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.UnaryOp):
        return _is_constant(node.operand)
    if isinstance(node, ast.BinOp):
        return _is_constant(node.left) and _is_constant(node.right)
    if isinstance(node, ast.Tuple):
        return all(_is_constant(e) for e in node.elts)
    return False


class PolicyChecker:
    """Applies a :class:`StaticPolicy` to one parsed module; :meth:`run` returns the findings."""

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
        self.kernels = [n for n in tree.body if isinstance(n, ast.FunctionDef) and self._is_kernel(n)]
        self.kernel_names = {k.name for k in self.kernels}
        self._kernel_nodes = {id(k) for k in self.kernels}
        self.grid = GridContext(self._path_of, self._is_builtin, policy.grid_functions, self.own_callables)

    # ------------------------------------------------------------------ reporting
    def add(self, rule: str, node: ast.AST, message: str) -> None:
        line = getattr(node, "lineno", 0)
        key = (rule, line, message)
        if key not in self._seen:
            self._seen.add(key)
            self.findings.append(Finding(rule, line, message))

    # ------------------------------------------------------------------ references
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
            if imports and all(b in imports or _binds_none(b) for b in found):
                return self._import_ref(imports[-1])  # also `except ImportError: x = None`
            if len(found) == 1 and found[0].kind == "assign" and isinstance(found[0].value, (ast.Name, ast.Attribute)):
                return self.ref_of(found[0].value, depth + 1)  # an alias: x = torch.nn.functional
            return None
        if isinstance(node, ast.Attribute):
            base, nodes = _chain(node)
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

    def _is_kernel(self, fn: ast.FunctionDef) -> bool:
        for d in fn.decorator_list:
            d = d.func if isinstance(d, ast.Call) else d
            if self._decorator_path(d) in self.policy.kernel_decorators:
                return True
        return False

    def _decorator_path(self, node: ast.expr) -> str | None:
        try:
            return self._path_of(node)
        except Exception:  # noqa: BLE001 - a decorator the walk cannot follow is not a kernel decorator
            return None

    # ------------------------------------------------------------------ entry
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
                kinds = {b.kind in ("import", "from") for b in found if not _binds_none(b)}
                if kinds == {True, False}:
                    other = next(b for b in found if b.kind not in ("import", "from") and not _binds_none(b))
                    self.add("import", other.node, f"rebinds {name}, which names an import")

    # ------------------------------------------------------------------ imports
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

    # ------------------------------------------------------------------ names
    def visit_Name(self, node: ast.Name) -> None:
        if not isinstance(node.ctx, ast.Load):
            if _is_dunder(node.id) and self.scopes.scope_of.get(id(node)) is self.scopes.root \
                    and node.id not in MODULE_DUNDERS:
                self.add("dunder-def", node, f"binds the module attribute {node.id}")
            return
        device = self._kernel_scope(node) is not None
        found = self._bindings(node)
        if not found:
            allowed = self.policy.device_builtins if device else self.policy.builtins
            if node.id in allowed or (not device and node.id in MODULE_GLOBALS):
                return
            if hasattr(builtins, node.id) or _is_dunder(node.id):
                where = "a kernel" if device else "the candidate"
                rule = "device-code" if device else "builtin"
                self.add(rule, node, f"{where} uses the builtin {node.id}, which the {self.policy.backend} policy does "
                                     "not allow" + (" (dynamic code, files or interpreter state)" if not device else ""))
            return
        if device:
            self._check_device_name(node, found)
        ref = self.ref_of(node)
        if ref is not None and ref.kind in ("module", "transit"):
            parent = self.parent.get(id(node))
            if not (isinstance(parent, ast.Attribute) and parent.value is node):
                self.add("module-value", node, f"uses the module {ref.path} as a value; use its members "
                                               "(modules may not be passed, stored or returned)")

    def _check_device_name(self, node: ast.Name, found: list[Binding]) -> None:
        kernel_scope = self._kernel_scope(node)
        if any(self._inside(b.scope, kernel_scope) for b in found):
            return  # an argument or a local of the kernel
        ok = False
        if all(b.kind in ("import", "from") for b in found):
            ref = self._import_ref(found[-1])
            ok = not ref.refused and self._device_path(ref.path)
        elif all(b.kind == "function" for b in found):
            ok = all(b.node.name in self.kernel_names for b in found)  # type: ignore[attr-defined]
        elif len(found) == 1 and found[0].kind == "assign" and found[0].scope is self.scopes.root:
            ok = self._is_constexpr(found[0].value)
            if not ok and _is_constant(found[0].value):
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
            and _is_constant(value.args[0]) and self._path_of(value.func) in self.policy.device_constants

    def _device_path(self, path: str) -> bool:
        parts = path.split(".")
        for cut in range(len(parts), 0, -1):
            rule = self.policy.rule(".".join(parts[:cut]))
            if rule is not None:
                return rule.device
        return False

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

    # ------------------------------------------------------------------ attributes
    def visit_Attribute(self, node: ast.Attribute) -> None:
        parent = self.parent.get(id(node))
        if not (isinstance(parent, ast.Attribute) and parent.value is node):
            self._check_chain(node, parent)
        if id(node) in self._handled:
            return
        self._check_attribute(node, node.value, node.attr, parent)

    def _check_chain(self, node: ast.Attribute, parent: ast.AST | None) -> None:
        base, nodes = _chain(node)
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
        if ref.kind == "transit":
            self.add("private-attribute", node, f"{ref.path} is private")
        elif ref.kind == "module" and not (isinstance(parent, ast.Attribute) and parent.value is node):
            self.add("module-value", node, f"uses the module {ref.path} as a value; import it by name instead")

    def _check_attribute(self, node: ast.AST, value: ast.expr, attr: str, parent: ast.AST | None) -> None:
        device = self._kernel_scope(node) is not None
        if _is_dunder(attr):
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

    @staticmethod
    def _describe(node: ast.expr) -> str:
        text = ast.unparse(node)
        return text if len(text) <= 40 else text[:37] + "..."

    # ------------------------------------------------------------------ stores (patching)
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
            if scope.kind == "class" and _is_dunder(target.id) and target.id != "__doc__":
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
            elif self.ref_of(base) is not None:
                self.add("patch", site, f"assigns {text}, part of an imported module or its members")
            return
        self.add("patch", site, f"assigns {text}, an attribute of a computed object")

    # ------------------------------------------------------------------ calls
    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and self._is_builtin(func):
            if func.id in _NAMED_ACCESS:
                self._named_access(node, func.id)
            elif func.id == "type" and len(node.args) != 1:
                self.add("builtin", node, "type() with three arguments builds a class at run time")
        for kw in node.keywords:
            if kw.arg == "grid":
                self._check_grid(kw.value, node, strict=False)
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
        if id(fake) not in self._handled:
            self._check_attribute(fake, obj, attr, None)
        if name in ("setattr", "delattr"):
            base = obj
            while isinstance(base, (ast.Attribute, ast.Subscript)):
                base = base.value
            self._check_patch_base(base, node, f"{ast.unparse(obj)}.{attr}")

    # ------------------------------------------------------------------ classes, functions, async
    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for kw in node.keywords:
            self.add("class-base", node, f"class {node.name} passes {kw.arg}=: metaclasses and class keywords "
                                         "change how the class behaves")
        for base in node.bases:
            problem = self._base_problem(base)
            if problem:
                self.add("class-base", base, f"class {node.name} {problem}")
        for stmt in node.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and _is_dunder(stmt.name):
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
        if scope is self.scopes.root and _is_dunder(node.name) and node.name not in MODULE_DUNDERS:
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

    # ------------------------------------------------------------------ launches
    def visit_Subscript(self, node: ast.Subscript) -> None:
        value, parent = node.value, self.parent.get(id(node))
        if isinstance(value, ast.Name) and self._names_kernel(value):
            self._check_grid(node.slice, node, strict=True)
        elif isinstance(parent, ast.Call) and parent.func is node or isinstance(node.slice, ast.Lambda):
            self._check_grid(node.slice, node, strict=False)  # x[grid](...): a callable grid runs in the launch

    def _names_kernel(self, node: ast.Name) -> bool:
        found = self._bindings(node)
        if found and all(b.kind == "function" and b.node.name in self.kernel_names for b in found):  # type: ignore[attr-defined]
            return True
        return len(found) == 1 and found[0].kind == "assign" and isinstance(found[0].value, ast.Name) \
            and found[0].value.id in self.kernel_names

    def _check_grid(self, grid: ast.expr, site: ast.AST, strict: bool, what: str = "launch grid") -> None:
        """``strict``: ``grid`` is the grid of a known kernel; else only callables in grid position are checked."""
        if isinstance(grid, ast.Lambda):
            self._report_offence(offence(grid, self.grid, lambda_ok=True), what)
            return
        if isinstance(grid, ast.Name):
            found = self._bindings(grid)
            if not found:
                if strict:
                    self.add("launch-grid", grid, f"the {what} {grid.id} is not defined by the candidate")
                return
            for b in found:
                self._check_grid_binding(grid, b, strict, what)
            return
        if strict:
            if isinstance(grid, ast.Attribute):
                self.add("launch-grid", grid, f"the {what} is read from {ast.unparse(grid)}, which may hold any "
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
                self.add("launch-grid" if what == "launch grid" else "launch-hook", use, f"the {what} {use.id} is a function whose body is more than "
                                             "`return <launch arithmetic>`")
            else:
                self._report_offence(offence(body[0].value, self.grid), what)
        elif strict and not (b.kind == "param" and self._killed(use, b)):
            self.add("launch-grid", use, f"the {what} {use.id} is bound by {b.kind} (line "
                                         f"{getattr(b.node, 'lineno', '?')}); bind it to a tuple or a lambda")

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
            rule = "launch-hook" if what != "launch grid" else "launch-grid"
            self.add(rule, node, f"the {what} contains {why}: it may only be arithmetic on numbers, shapes and "
                                 "meta-parameters (max, min, triton.cdiv, x.numel() ...)")

    def _check_configurator(self, node: ast.Call, path: str) -> None:
        for kw in node.keywords:
            if kw.arg in LAUNCH_HOOK_KEYWORDS and not (isinstance(kw.value, ast.Constant) and kw.value.value is None):
                self.add("launch-hook", kw.value, f"{path}({kw.arg}=...) runs a callable inside the launch, "
                                                  "where the audit does not look")
        for arg in [*node.args, *[k.value for k in node.keywords if k.arg not in LAUNCH_HOOK_KEYWORDS]]:
            values = arg.values if isinstance(arg, ast.Dict) else [arg]
            for value in values:
                if isinstance(value, (ast.Lambda, ast.Name)):
                    self._check_grid(value, node, strict=False, what=f"callable given to {path}")
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


def check(tree: ast.Module, policy: StaticPolicy) -> list[Finding]:
    """Every construct of ``tree`` the policy refuses, in source order."""
    return PolicyChecker(tree, policy).run()

"""Static checks: run in the judging process on the parsed source, before anything executes."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from core.verdict import CheckResult
from core.verification.evidence import STATIC, Evidence, parse_python


@dataclass
class StaticCheck:
    """Parses, stays under a size limit, defines ``ModelNew``, contains a kernel for the backend."""

    name: str = "static"
    stage: int = STATIC
    hard: bool = True
    where: str = "judge"
    needs: frozenset[str] = frozenset()
    max_bytes: int = 200_000

    def applies(self, backend: str, device: str) -> bool:
        return True

    def evaluate(self, evidence: Evidence) -> CheckResult:
        from core.plugins import registry

        source = evidence.candidate.source
        size = len(source.encode("utf-8"))
        if size > self.max_bytes:
            return CheckResult(False, f"source is {size} bytes; the limit is {self.max_bytes}")
        if evidence.tree is None:
            try:
                evidence.tree = parse_python(source)
            except SyntaxError as exc:
                return CheckResult(False, f"does not parse: {exc.msg} (line {exc.lineno})")
        tree = evidence.tree
        if not any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body):
            return CheckResult(False, "defines no top-level class ModelNew (KernelBench solution format)")
        kernels = registry("backend").create(evidence.backend).detect_kernels(tree)
        if not kernels:
            return CheckResult(False, f"contains no {evidence.backend} kernel{_other_backend_hint(tree, evidence.backend)}")
        return CheckResult(True, f"{len(kernels)} {evidence.backend} kernel(s): {', '.join(kernels[:6])}",
                           data={"kernels": kernels})


def _other_backend_hint(tree: ast.Module, backend: str) -> str:
    """``"; it looks like a <language> candidate ...: use backend=<name>"`` when another registered
    backend finds its kernels in the candidate (a load_inline module judged as triton), else ``""``."""
    from core.plugins import registry

    for name in registry("backend").names():
        if name == backend:
            continue
        other = registry("backend").create(name)
        found = other.detect_kernels(tree)
        if found:
            return (f"; it looks like a {other.language} candidate ({', '.join(found[:3])}): "
                    f"use backend={name} (--backend {name})")
    return ""


# Modules a kernel never needs and a hack often does (process, memory and interpreter access).
FORBIDDEN_MODULES = frozenset({
    "ctypes", "_ctypes", "cffi", "subprocess", "socket", "multiprocessing", "importlib", "inspect", "gc",
    "builtins", "signal", "threading", "_thread", "pickle", "marshal", "shutil", "sys", "os", "io",
    "numpy", "pathlib", "tempfile", "urllib", "http", "requests", "time", "timeit", "traceback",
    "torch.utils._python_dispatch", "torch._C", "mmap", "resource", "pty", "fcntl", "code", "types",
    "weakref", "atexit", "unittest", "contextlib", "cupy",
})
FORBIDDEN_CALLS = frozenset({"eval", "exec", "compile", "__import__", "globals", "locals", "vars", "setattr",
                             "delattr", "open", "breakpoint", "input", "memoryview"})
FORBIDDEN_ATTRS = frozenset({"numpy", "tolist", "__globals__", "__builtins__", "__code__", "__subclasses__",
                             "__class__", "__bases__", "__mro__", "__dict__", "__getattribute__", "f_back",
                             "f_globals", "f_locals", "_getframe", "__torch_dispatch__", "__torch_function__",
                             "__setattr__", "modules", "data_ptr"})
PROTECTED_ROOTS = frozenset({"torch", "triton", "tl", "F", "nn", "math"})


@dataclass
class StaticIntegrityCheck:
    """Refuses constructs that only serve to escape or fool the judge: patching torch/triton,
    importing process or interpreter internals, computing on the host through numpy, dynamic code.

    Honest kernels need none of these; each finding is flagged as a hack attempt.
    """

    name: str = "static_integrity"
    stage: int = STATIC
    hard: bool = True
    where: str = "judge"
    needs: frozenset[str] = frozenset()
    extra_allowed_modules: list[str] = field(default_factory=list)

    def applies(self, backend: str, device: str) -> bool:
        return True

    def _module_denied(self, name: str, backend: str) -> bool:
        if name in self.extra_allowed_modules or (backend == "cuda" and name.split(".")[0] == "cupy"):
            return False
        parts = name.split(".")
        return any(".".join(parts[:i]) in FORBIDDEN_MODULES for i in range(1, len(parts) + 1))

    def evaluate(self, evidence: Evidence) -> CheckResult:
        tree = evidence.tree
        if tree is None:
            return CheckResult(True, "not parsed (see static)")
        findings: list[str] = []

        def add(node: ast.AST, text: str) -> None:
            findings.append(f"line {getattr(node, 'lineno', '?')}: {text}")

        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if self._module_denied(alias.name, evidence.backend):
                        add(node, f"imports {alias.name}")
            elif isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                if node.level == 0 and self._module_denied(mod, evidence.backend):
                    add(node, f"imports from {mod}")
                for alias in node.names:
                    if self._module_denied(f"{mod}.{alias.name}", evidence.backend) and not self._module_denied(mod, evidence.backend):
                        add(node, f"imports {mod}.{alias.name}")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FORBIDDEN_CALLS:
                add(node, f"calls {node.func.id}()")
            elif isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_ATTRS and not (
                    evidence.backend == "cuda" and node.attr == "data_ptr"):
                add(node, f"uses .{node.attr}")
            elif isinstance(node, ast.Name) and node.id in ("__builtins__", "__loader__", "__spec__"):
                add(node, f"uses {node.id}")
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
                for target in targets:
                    for sub in ast.walk(target):
                        if isinstance(sub, ast.Attribute):
                            root = sub
                            while isinstance(root, ast.Attribute):
                                root = root.value
                            if isinstance(root, ast.Name) and root.id in PROTECTED_ROOTS:
                                add(node, f"patches {ast.unparse(sub)}")
        if findings:
            shown = "; ".join(findings[:4]) + (f" (+{len(findings) - 4} more)" if len(findings) > 4 else "")
            return CheckResult(False, f"forbidden construct(s): {shown}", data={"findings": findings[:32]}, hack=True)
        return CheckResult(True, "no forbidden constructs")

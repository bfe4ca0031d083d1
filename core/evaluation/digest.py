"""The digest of every source file that can change a verdict, derived rather than listed.

A cached verdict (:mod:`core.evaluation.cache`) is only valid while the code that reached it is
unchanged. The files that count are found, not kept in a list a person must remember to update:

* the **roots**: the whole verification engine (``core/verification/``) and its public face
  (``core/api/``), the data model and the contracts it judges by (:data:`ENGINE_MODULES`), and the source of every plugin registered as a
  backend, a verifier check or a device (:data:`VERDICT_KINDS`): the module of each registered
  factory and of the plugin that registered it, each with its sibling modules in its package;
* then, transitively, every module those files import (at module level or inside a function) from
  the same top-level packages (``core``, ``plugins``, a third-party plugin's own package), with the
  ``__init__`` of each package on the way. GPU timing and the roofline are found so, wherever they
  live, because the worker and the performance check import them.

A file is read when the digest is computed, so an edit is seen by the next digest; nothing is imported.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import types
from collections.abc import Iterable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
ENGINE_PACKAGES = ("core.verification", "core.api")  # the engine and the public contract plugins judge by
ENGINE_MODULES = ("core.task", "core.verdict", "core.contracts", "core.program")
VERDICT_KINDS = ("backend", "verifier", "device")


def _module_file(name: str, bases: dict[str, Path]) -> Path | None:
    """The source file of module ``name`` (``a.b`` -> ``a/b.py`` or ``a/b/__init__.py``) if its
    top-level package is one of ``bases`` (top-level name -> the folder that holds it)."""
    base = bases.get(name.split(".")[0])
    if base is None:
        return None
    path = base.joinpath(*name.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _module_name(path: Path, bases: dict[str, Path]) -> str | None:
    for top, base in bases.items():
        try:
            rel = path.relative_to(base)
        except ValueError:
            continue
        if rel.parts and rel.parts[0] in (top, f"{top}.py"):
            parts = list(rel.with_suffix("").parts)
            return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    return None


def _imported(tree: ast.AST, module: str, is_package: bool) -> Iterable[str]:
    """Every module name an import statement anywhere in ``tree`` may load, parents included."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".")[: max(0, len(package.split(".")) - node.level + 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names = [base] + [f"{base}.{a.name}" for a in node.names]  # ``from pkg import submodule``
        for name in names:
            parts = name.split(".")
            yield from (".".join(parts[:k]) for k in range(1, len(parts) + 1))


def _source_of(obj: Any) -> tuple[Path, str] | None:
    """(source file, module name) of a plugin module or of a factory (class, function, partial).
    An instance (a registered ``DeviceSpec``) has none of its own: the module that registered it counts."""
    obj = getattr(obj, "func", obj)  # functools.partial
    if isinstance(obj, types.ModuleType):
        module = obj
    elif inspect.isclass(obj) or inspect.isroutine(obj):
        module = inspect.getmodule(obj)
    else:
        return None
    try:
        path = inspect.getsourcefile(module) if module is not None else None
    except TypeError:  # a built-in module
        return None
    return (Path(path).resolve(), module.__name__) if path else None


def _base_of(path: Path, module: str) -> Path:
    """The folder holding the top-level package of ``module`` whose file is ``path``."""
    depth = module.count(".") + (1 if path.name == "__init__.py" else 0)
    return path.parents[depth]


def _plugin_roots(pm: Any, kinds: Iterable[str]) -> list[tuple[Path, str]]:
    from core.plugins import build_registry, get_plugin_manager

    pm = pm or get_plugin_manager()
    found: list[tuple[Path, str]] = []
    for kind in kinds:
        reg = build_registry(kind, pm)
        for name, factory in reg.entries.items():
            for obj in (pm.get_plugin(reg.owners[name]), factory):
                source = _source_of(obj) if obj is not None else None
                if source is not None:
                    found.append(source)
    return found


def verdict_sources(pm: Any = None, kinds: Iterable[str] = VERDICT_KINDS) -> dict[str, Path]:
    """Every source file that can change a verdict, by a stable name (its path from the folder that
    holds its top-level package). ``pm``: the plugin manager whose registries count (default: the
    process-wide one)."""
    bases: dict[str, Path] = {"core": REPO_ROOT}
    roots: list[Path] = []
    for package in ENGINE_PACKAGES:
        folder = REPO_ROOT.joinpath(*package.split("."))
        roots += sorted(folder.rglob("*.py"))
    roots += [p for p in (_module_file(m, bases) for m in ENGINE_MODULES) if p is not None]
    for path, module in _plugin_roots(pm, kinds):
        bases.setdefault(module.split(".")[0], _base_of(path, module))
        roots.append(path)
        if "." in module or path.name == "__init__.py":  # inside a package: its siblings too
            roots += sorted(path.parent.glob("*.py"))

    seen: dict[Path, None] = {}
    todo = list(roots)
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen[path] = None
        module = _module_name(path, bases)
        if module is None:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue  # still hashed below; it imports nothing we can see
        for name in _imported(tree, module, path.name == "__init__.py"):
            dep = _module_file(name, bases)
            if dep is not None and dep not in seen:
                todo.append(dep)

    named: dict[str, Path] = {}
    for path in seen:
        module = _module_name(path, bases)
        named[str(path.relative_to(bases[module.split(".")[0]])) if module else str(path)] = path
    return dict(sorted(named.items()))


def code_digest(pm: Any = None) -> str:
    """SHA-256 (16 hex digits) over the names and contents of :func:`verdict_sources`."""
    h = hashlib.sha256()
    for name, path in verdict_sources(pm).items():
        h.update(name.encode())
        h.update(b"\0")
        try:
            h.update(path.read_bytes())
        except OSError:
            h.update(b"<unreadable>")
        h.update(b"\0")
    return h.hexdigest()[:16]


__all__ = ["ENGINE_MODULES", "ENGINE_PACKAGES", "VERDICT_KINDS", "code_digest", "verdict_sources"]

"""The identity of everything the judge relies on in a candidate worker, recorded once and verified
after every candidate call.

Recorded after the worker's set-up (the backend's ``prepare_worker``, the import wrappers, the
audit hook), so what is recorded is the instrumentation as installed:

* **namespaces**: the dict of every module of the worker's own code (:data:`WORKER_CODE`) and of
  every class defined in one; and of :data:`EXTRA_MODULES` and :data:`EXTRA_CLASSES`, what that code
  calls while it runs and reports a candidate (builtins, os, pickle, hashlib, torch, its tensor and
  module classes, its dispatch-mode machinery and RNG, numpy, Triton's launch classes). Every name
  recorded must still be bound to the same object. A class must also have gained no name (a
  method added on ``torch.Tensor`` shadows its C base); a module may (lazy submodules, caches).
* **pinned objects**: what the backend says it patched (``Backend.instrumentation()``) and what the
  worker installed itself (its import wrappers, the ATen audit, the guard's own rule objects), read
  again by name; for each function among them also its code and what its closure cells hold.

The expected values live in this object only, which the worker keeps in a local of its loop, not
in a module attribute a candidate's module could name. :meth:`Snapshot.verify` compares by
identity (``is``), so nothing of a candidate's (an ``__eq__``) runs while it checks: ~7000 names,
about a millisecond on this machine (the cost is reading that many objects' memory).
"""

from __future__ import annotations

import operator
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Callable

MISSING = object()

# Modules whose every name the judge relies on besides those the harness imports itself.
# A backend's toolchain adds its own (``SandboxNeeds.snapshot_modules``, ``snapshot_classes``).
EXTRA_MODULES = ("builtins", "sys", "os", "posixpath", "importlib", "threading", "_thread", "pickle", "copyreg",
                 "hashlib", "random", "torch", "torch.nn.functional", "torch.random", "torch.utils._python_dispatch",
                 "torch.overrides", "torch.testing", "numpy", "numpy.random")
# Classes whose every attribute the judge relies on (the outputs' and inputs' methods, the modes).
EXTRA_CLASSES = ("torch.Tensor", "torch._C.TensorBase", "torch.nn.Module", "torch.nn.Parameter",
                 "torch.utils._python_dispatch.TorchDispatchMode", "torch.Generator")
# Names that change by design while the worker serves (each with why), so are not recorded.
MUTABLE = {
    "sys": frozenset({"last_type", "last_value", "last_traceback"}),  # the last uncaught error
    "builtins": frozenset({"_"}),  # the interactive result
}
# The harness modules a candidate worker runs (the others, proposers or coders, are loaded in a
# worker only because the registry imports every plugin; they never touch a verdict).
WORKER_CODE = ("core.verification", "core.contracts", "core.plugins", "core.verdict", "core.task",
               "plugins.backends", "plugins.verifiers")


def resolve(dotted: str) -> Any:
    """The object a dotted name means now: the longest prefix that is a loaded module, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = sys.modules.get(".".join(parts[:cut]))
        if module is not None:
            value: Any = module
            for attr in parts[cut:]:
                value = getattr(value, attr)
            return value
    raise LookupError(f"{dotted}: no such loaded module")


@dataclass
class Namespace:
    """One recorded namespace: ``mapping`` (a live dict or mappingproxy) held ``values`` under ``keys``."""

    label: str
    mapping: Any
    keys: tuple[str, ...]
    values: tuple[Any, ...]
    closed: bool  # a class: no name may be added
    getter: Any = None  # operator.itemgetter(*keys): every value in one C call

    @classmethod
    def of(cls, label: str, mapping: Any, closed: bool, skip: frozenset[str] = frozenset()) -> "Namespace":
        items = [(k, v) for k, v in dict(mapping).items() if k not in skip]
        keys = tuple(k for k, _ in items)
        return cls(label, mapping, keys, tuple(v for _, v in items), closed,
                   operator.itemgetter(*keys) if len(keys) > 1 else None)

    def intact(self) -> bool:
        if self.closed and len(self.mapping) != len(self.keys):
            return False
        if self.getter is None:
            return all(self.mapping.get(k, MISSING) is v for k, v in zip(self.keys, self.values))
        try:
            now = self.getter(self.mapping)
        except KeyError:
            return False
        return all(map(operator.is_, now, self.values))  # identity: no __eq__ of a replacement runs

    def differences(self) -> list[str]:
        get = self.mapping.get
        changed = [f"{self.label}.{k}" for k, v in zip(self.keys, self.values) if get(k, MISSING) is not v]
        if self.closed:
            known = set(self.keys)
            changed += [f"{self.label}.{k} (added)" for k in list(self.mapping) if k not in known]
        return changed


@dataclass
class Pinned:
    """A named object read again through ``read``; for a function also its code, defaults and cells."""

    name: str
    read: Callable[[], Any]
    expected: Any
    internals: tuple[Any, ...] = ()

    @staticmethod
    def internals_of(value: Any) -> tuple[Any, ...]:
        """A function's code and what its closure cells hold (a cell can be rebound without any
        audit event; a function's defaults cannot be set without one, which the hook refuses)."""
        if type(value) is not types.FunctionType:
            return ()
        cells = tuple(c.cell_contents if _filled(c) else MISSING for c in value.__closure__ or ())
        return (value.__code__, *cells)

    def intact(self) -> bool:
        value = self.read()
        if value is not self.expected:
            return False
        now = self.internals_of(value)
        return len(now) == len(self.internals) and all(map(operator.is_, now, self.internals))


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


@dataclass
class Snapshot:
    namespaces: list[Namespace] = field(default_factory=list)
    pinned: list[Pinned] = field(default_factory=list)

    @classmethod
    def take(cls, pinned: dict[str, Any], classes: dict[str, type] | None = None,
             modules: tuple[str, ...] = (), class_paths: tuple[str, ...] = ()) -> "Snapshot":
        """Record the namespaces above, ``classes`` (label -> class: their dicts too) and ``pinned``
        (label -> a dotted path :func:`resolve` reads again, or a :func:`reader`); ``modules`` and
        ``class_paths`` add to :data:`EXTRA_MODULES` and :data:`EXTRA_CLASSES` (a toolchain's state)."""
        snap = cls()
        seen: set[int] = set()

        def add_module(module: types.ModuleType) -> None:
            if id(module) in seen:
                return
            seen.add(id(module))
            name = module.__name__
            snap.namespaces.append(Namespace.of(name, module.__dict__, closed=False, skip=MUTABLE.get(name, frozenset())))

        def add_class(label: str, klass: type) -> None:
            if id(klass) in seen:
                return
            seen.add(id(klass))
            snap.namespaces.append(Namespace.of(label, vars(klass), closed=True))

        harness = [m for n, m in list(sys.modules.items()) if n.startswith(WORKER_CODE) and isinstance(m, types.ModuleType)]
        for module in harness:
            add_module(module)
            for key, value in list(vars(module).items()):
                if isinstance(value, type) and getattr(value, "__module__", None) == module.__name__:
                    add_class(f"{module.__name__}.{key}", value)
        for name in EXTRA_MODULES + tuple(modules):
            if name in sys.modules:
                add_module(sys.modules[name])
        for name in EXTRA_CLASSES + tuple(class_paths):
            try:
                klass = resolve(name)
            except (LookupError, AttributeError):
                continue  # not loaded in this worker (an interpreter's classes on a GPU ...)
            if isinstance(klass, type):
                add_class(name, klass)
        for label, klass in (classes or {}).items():
            add_class(label, klass)
        for name, value in pinned.items():
            read = value if callable(value) and getattr(value, "_kz_reader", False) else _reader(str(value))
            current = read()
            snap.pinned.append(Pinned(name, read, current, Pinned.internals_of(current)))
        return snap

    def verify(self) -> list[str]:
        """The names whose object changed since :meth:`take` (empty: intact). A check that cannot
        run names itself (fail closed)."""
        try:
            if all(ns.intact() for ns in self.namespaces) and all(p.intact() for p in self.pinned):
                return []
            found = [d for ns in self.namespaces for d in ns.differences()]
            for p in self.pinned:
                try:
                    ok = p.intact()
                except Exception:
                    ok = False
                if not ok:
                    found.append(p.name)
            return found or ["the instrumentation (changed, then changed back while it was checked)"]
        except Exception as exc:
            return [f"the instrumentation check itself ({type(exc).__name__})"]


def _reader(name: str) -> Callable[[], Any]:
    """Read ``name`` again through the module it starts in (found once, now) and its attributes."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module = sys.modules.get(".".join(parts[:cut]))
        if module is not None:
            attrs = tuple(parts[cut:])

            def read() -> Any:
                value: Any = module
                for attr in attrs:
                    value = getattr(value, attr)
                return value

            return read
    raise LookupError(f"{name}: no such loaded module")


def reader(read: Callable[[], Any]) -> Callable[[], Any]:
    """Mark a zero-argument function as the reader of a pinned value (not the value itself)."""
    read._kz_reader = True  # type: ignore[attr-defined]
    return read

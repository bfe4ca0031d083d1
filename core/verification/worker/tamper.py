"""The identity of everything the judge relies on in a candidate worker, recorded once and verified
after every candidate call.

Recorded after the worker's set-up (the backend's ``prepare_worker``, the import wrappers, the
audit hook), so what is recorded is the instrumentation as installed:

* **namespaces**: the dict of every harness module (``core.*``, ``plugins.*``) and of every class
  defined in one; the dicts of the modules the harness names at module level (torch, sys, os,
  pickle, hashlib, numpy, builtins ...); and :data:`EXTRA_MODULES` and :data:`EXTRA_CLASSES` (torch's
  tensor and module classes, its dispatch-mode machinery and RNG, Triton's launch classes). Every
  name recorded must still be bound to the same object. A class must also have gained no name (a
  method added on ``torch.Tensor`` shadows its C base); a module may (lazy submodules, caches).
* **pinned objects**: what the backend says it patched (``Backend.instrumentation()``) and what the
  worker installed itself (its import wrappers, the ATen audit), read again by name; for each
  function among them also its code, defaults and closure cells.

The expected values live in this object only, which the worker keeps in a local of its loop, not
in a module attribute a candidate's module could name. :meth:`Snapshot.verify` compares by
identity (``is``), so nothing of a candidate's (an ``__eq__``) runs while it checks; it is a few
thousand identity checks, well under a millisecond.
"""

from __future__ import annotations

import operator
import sys
import types
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Callable

from core.verification.worker.callers import is_harness

MISSING = object()

# Modules whose every name the judge relies on besides those the harness imports itself.
EXTRA_MODULES = ("builtins", "importlib", "threading", "_thread", "torch", "torch.nn.functional", "torch.random",
                 "torch.utils._python_dispatch", "torch.overrides", "torch.testing", "numpy", "numpy.random",
                 "random", "hashlib", "pickle", "copyreg", "triton", "triton.runtime.jit", "triton.runtime.interpreter")
# Classes whose every attribute the judge relies on (the outputs' and inputs' methods, the modes).
EXTRA_CLASSES = ("torch.Tensor", "torch._C.TensorBase", "torch.nn.Module", "torch.nn.Parameter",
                 "torch.utils._python_dispatch.TorchDispatchMode", "torch.Generator",
                 "triton.runtime.jit.JITFunction", "triton.runtime.jit.KernelInterface",
                 "triton.runtime.interpreter.InterpretedFunction", "triton.runtime.interpreter.InterpreterBuilder",
                 "triton.runtime.interpreter.GridExecutor")
# Names that change by design while the worker serves (each with why), so are not recorded.
MUTABLE = {
    "sys": {"last_type", "last_value", "last_traceback", "exc_info"},  # the last uncaught error
    "builtins": {"_"},  # the interactive result
    "random": set(),
}


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
    """One recorded namespace: ``mapping`` (a live dict or mappingproxy) held ``expected``."""

    label: str
    mapping: Any
    keys: tuple[str, ...]
    values: tuple[Any, ...]
    closed: bool  # a class: no name may be added

    @classmethod
    def of(cls, label: str, mapping: Any, closed: bool, skip: set[str] = frozenset()) -> "Namespace":  # type: ignore[assignment]
        items = [(k, v) for k, v in dict(mapping).items() if k not in skip]
        return cls(label, mapping, tuple(k for k, _ in items), tuple(v for _, v in items), closed)

    def intact(self) -> bool:
        get = self.mapping.get
        if not all(map(operator.is_, map(get, self.keys, repeat(MISSING)), self.values)):
            return False
        return not self.closed or len(self.mapping) == len(self.keys)

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
        if not isinstance(value, types.FunctionType):
            return ()
        cells = tuple(c.cell_contents if _filled(c) else MISSING for c in value.__closure__ or ())
        return (value.__code__, value.__defaults__, value.__kwdefaults__, *cells)

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
    def take(cls, pinned: dict[str, Any], classes: dict[str, type] | None = None) -> "Snapshot":
        """Record the namespaces above, ``classes`` (label -> class: their dicts too) and ``pinned``
        (label -> a dotted path :func:`resolve` reads again, or a :func:`reader`)."""
        snap = cls()
        seen: set[int] = set()

        def add_module(module: types.ModuleType) -> None:
            if id(module) in seen:
                return
            seen.add(id(module))
            name = module.__name__
            snap.namespaces.append(Namespace.of(name, module.__dict__, closed=False, skip=MUTABLE.get(name, set())))

        def add_class(label: str, klass: type) -> None:
            if id(klass) in seen:
                return
            seen.add(id(klass))
            snap.namespaces.append(Namespace.of(label, vars(klass), closed=True))

        harness = [m for n, m in list(sys.modules.items()) if is_harness(n) and isinstance(m, types.ModuleType)]
        named: list[types.ModuleType] = []
        for module in harness:
            add_module(module)
            for key, value in list(vars(module).items()):
                if isinstance(value, type) and getattr(value, "__module__", None) == module.__name__:
                    add_class(f"{module.__name__}.{key}", value)
                elif isinstance(value, types.ModuleType) and not is_harness(value.__name__):
                    named.append(value)
        for module in named:
            add_module(module)
        for name in EXTRA_MODULES:
            if name in sys.modules:
                add_module(sys.modules[name])
        for name in EXTRA_CLASSES:
            try:
                klass = resolve(name)
            except (LookupError, AttributeError):
                continue  # not loaded in this worker (triton's interpreter on a GPU ...)
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
    return lambda: resolve(name)


def reader(read: Callable[[], Any]) -> Callable[[], Any]:
    """Mark a zero-argument function as the reader of a pinned value (not the value itself)."""
    read._kz_reader = True  # type: ignore[attr-defined]
    return read

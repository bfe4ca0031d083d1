"""The runtime import allow-list: what a candidate's own code may import, however it spells it.

Every import statement and ``__import__`` call goes through ``builtins.__import__``; the public
importlib entry points (``importlib.import_module``, ``importlib.__import__``) are wrapped too, and
the audit hook (:mod:`.events`) refuses the loads that bypass all three. An import *asked by the
candidate's code* (:class:`~core.verification.worker.callers.Callers`) of a module outside the
backend's allowed set is refused with ``ImportError`` and recorded as a sandbox violation, also
when the module is loaded already (the worker's own ``core.*`` and ``plugins.*``, ``sys``, ``os``,
``ctypes`` ...). ``from P import x`` is judged by what it hands over: a module ``x`` must be
allowed itself (``from torch import sys`` is refused). Imports that torch or triton make on the
candidate's behalf are judged by *their* frame, so lazy submodules keep working; but nothing other
than the harness may import the harness while a candidate is loaded (a confused deputy such as
pickle's ``find_class`` or ``pydoc.locate``).
"""

from __future__ import annotations

import builtins
import dis
import importlib
import sys
import threading
import types
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from core.contracts import optional
from core.verification.worker.callers import Callers, is_harness, root_of

_IMPORT_NAME = dis.opmap["IMPORT_NAME"]
BOOTSTRAP = frozenset({"importlib._bootstrap", "importlib._bootstrap_external"})  # the frozen import system


def import_statement(frame: Any) -> bool:
    """Whether ``frame`` is executing an import statement (else the import was asked through a call:
    ``__import__()``, or C code such as torch's dispatcher importing one of its modules while the
    candidate's frame is the newest Python frame)."""
    if frame is None:
        return False
    code, at = frame.f_code.co_code, frame.f_lasti
    return 0 <= at < len(code) and code[at] == _IMPORT_NAME

# What a backend that declares no ``static_policy`` allows: torch's core modules and math, the
# same modules as the static check's default policy (plugins.verifiers.policy.STRICTEST).
STRICTEST = ("torch", "torch.nn", "torch.nn.functional", "torch.nn.init", "torch.nn.parameter", "torch.cuda",
             "torch.autograd", "math", "__future__")


@dataclass(frozen=True)
class AllowedImports:
    """The modules a candidate may import: ``exact`` names, and ``trees`` with their public submodules."""

    backend: str
    exact: frozenset[str]
    trees: frozenset[str] = frozenset()

    def allows(self, name: str) -> bool:
        if name in self.exact or name in self.trees:
            return True
        parts = name.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            if ".".join(parts[:cut]) in self.trees:
                return not any(p.startswith("_") for p in parts[cut:])
        return False

    def describe(self) -> str:
        names = sorted(self.exact) + [f"{t}.*" for t in sorted(self.trees)]
        return ", ".join(names)

    @classmethod
    def from_policy(cls, backend: str, policy: Any) -> "AllowedImports":
        """From a backend's ``static_policy`` (plugins.verifiers.policy.StaticPolicy: its module rules,
        each with ``name`` and ``submodules``)."""
        rules = list(policy.modules)
        return cls(backend, frozenset(r.name for r in rules if not r.submodules),
                   frozenset(r.name for r in rules if r.submodules))


def runtime_imports(backend: Any) -> AllowedImports:
    """The allowed set of ``backend`` (a plugin object): the modules of its ``static_policy`` (the
    same allow-list the static check applies to the source), else :data:`STRICTEST`."""
    name = str(backend.name)
    policy = optional(backend, "Backend", "static_policy")
    if policy is not None:
        return AllowedImports.from_policy(name, policy)
    return AllowedImports(name, frozenset(STRICTEST))


def exact_text(value: Any) -> str:
    """``value`` as a plain ``str``: a subclass could compare equal to an allowed name while the
    import system reads its real characters."""
    if type(value) is not str:
        raise TypeError(f"module names must be str, not {type(value).__name__}")
    return value


def exact_names(fromlist: Any) -> tuple[str, ...] | None:
    """``fromlist`` read once into a tuple of plain strings (what is checked is what is imported)."""
    if fromlist is None:
        return None
    return tuple(exact_text(item) for item in tuple(fromlist))


class ImportRefused(ImportError):
    """An import the runtime allow-list refused (the candidate may catch it; it is recorded anyway)."""


class ImportGuard:
    """Judges imports (:meth:`judge`) and installs the wrappers that ask it (:meth:`install`).

    :param allowed: what the candidate's code may import.
    :param callers: who is asking.
    :param record: records a violation (the sandbox's list, reported with the call it happened in).
    """

    def __init__(self, allowed: AllowedImports, callers: Callers, record: Callable[[str], None]):
        self.allowed, self.callers, self.record = allowed, callers, record
        # Packages of the allowed set (torch, triton, cupy): their C code imports their own modules
        # while the candidate's frame is the newest Python frame, which must keep working.
        roots = {root_of(n) for n in allowed.exact | allowed.trees}
        self.libraries = frozenset(r for r in roots if hasattr(sys.modules.get(r), "__path__"))
        self._local = threading.local()  # depth of candidate imports this guard allowed, in progress

    def vetted(self) -> bool:
        """Whether the machinery is loading what a candidate's allowed import asked for."""
        return getattr(self._local, "depth", 0) > 0

    def _run_vetted(self, call: Callable[..., Any], *args: Any) -> Any:
        self._local.depth = getattr(self._local, "depth", 0) + 1
        try:
            return call(*args)
        finally:
            self._local.depth -= 1

    # -- the rule

    def refusal(self, name: str, asker_module: str | None, statement: bool = True) -> str | None:
        """Why importing ``name`` is refused when asked by a frame of ``asker_module`` (None: the
        candidate's code), or None when it is allowed. Not by an import ``statement``, the
        candidate's frame may also stand for C code of an allowed package importing its own modules."""
        if asker_module is None:
            if not self.allowed.allows(name) and (statement or root_of(name) not in self.libraries):
                return (f"importing {name!r} (a {self.allowed.backend} candidate may import only "
                        f"{self.allowed.describe()})")
            return None
        if is_harness(name) and not is_harness(asker_module) and self.callers.candidate_loaded:
            return f"importing the verifier's own module {name!r} on a candidate's behalf (asked by {asker_module})"
        return None

    def refuse(self, why: str) -> None:
        self.record(why)
        raise ImportRefused(f"sandbox: {why} is not allowed in a candidate")

    def judge(self, frame: Any, name: str, fromlist: Iterable[str] | None, level: int = 0,
              package: str | None = None) -> bool:
        """Raise for a refused import asked from ``frame``; True when the candidate asked (what
        ``from ... import`` hands over must then be checked after the import, :meth:`check_handed`).
        A relative import (``level`` > 0, or a name starting with a dot) is judged by its package."""
        if self.callers.module_of(frame.f_globals) in BOOTSTRAP:
            return False  # the import system's own needs while it loads something (``_io``, ``marshal``)
        asker, asker_module = self.callers.asker(frame)
        if level > 0 or name.startswith("."):
            if asker_module is None:  # the candidate is a top-level module: nothing is relative to it
                self.refuse(f"a relative import of {name!r}")
            if package and is_harness(package) and not is_harness(asker_module) and self.callers.candidate_loaded:
                self.refuse(f"importing from the verifier's own package {package!r} on a candidate's behalf")
            return False
        why = self.refusal(name, asker_module, import_statement(asker))
        if why is not None and asker_module is None and fromlist:
            # ``from torch._inductor.runtime import triton_helpers``: the package is a means, what
            # is handed over must be allowed (checked after the import)
            items = [i for i in fromlist if i != "*"]
            if items and all(self.allowed.allows(f"{name}.{i}") for i in items):
                why = None
        if why is not None:
            self.refuse(why)
        return asker_module is None

    def check_handed(self, module: Any, name: str, fromlist: Iterable[str]) -> None:
        """After ``from name import a, b`` asked by the candidate: every module handed over is
        allowed, and anything else comes from an allowed module."""
        items = list(fromlist)
        if "*" in items:
            items = [i for i in items if i != "*"] + list(getattr(module, "__all__", ()) or ())
        for item in items:
            value = getattr(module, item, None)
            if isinstance(value, types.ModuleType):
                inner = getattr(value, "__name__", f"{name}.{item}")
                if not self.allowed.allows(str(inner)):
                    self.refuse(f"importing {inner!r} (as {name}.{item}; a {self.allowed.backend} candidate may "
                                f"import only {self.allowed.describe()})")
            elif not self.allowed.allows(name):
                self.refuse(f"importing {item!r} from {name!r} (a {self.allowed.backend} candidate may import "
                            f"only {self.allowed.describe()})")

    # -- the wrappers

    def install(self) -> dict[str, Any]:
        """Wrap ``builtins.__import__``, ``importlib.import_module`` and ``importlib.__import__``;
        returns what was installed, by name (the instrumentation snapshot verifies they stay)."""
        import sys

        getframe = sys._getframe
        guard = self
        original_import = builtins.__import__
        original_import_module = importlib.import_module
        original_dunder = importlib.__import__

        def __import__(name, globals=None, locals=None, fromlist=(), level=0):  # noqa: A002
            # judged by the asking frame, never by the ``globals`` argument (a caller may pass any dict)
            name, fromlist = exact_text(name), exact_names(fromlist)
            package = globals.get("__package__") if level and type(globals) is dict else None
            if not guard.judge(getframe(1), name, fromlist, level, package):
                return original_import(name, globals, locals, fromlist, level)
            module = guard._run_vetted(original_import, name, globals, locals, fromlist, level)
            if fromlist:
                guard.check_handed(module, name, fromlist)
            return module

        def import_module(name, package=None):
            name, package = exact_text(name), None if package is None else exact_text(package)
            if not guard.judge(getframe(1), name, None, 0, package):
                return original_import_module(name, package)
            return guard._run_vetted(original_import_module, name, package)

        def dunder_import(name, globals=None, locals=None, fromlist=(), level=0):  # noqa: A002
            name, fromlist = exact_text(name), exact_names(fromlist)
            package = globals.get("__package__") if level and type(globals) is dict else None
            if not guard.judge(getframe(1), name, fromlist, level, package):
                return original_dunder(name, globals, locals, fromlist, level)
            module = guard._run_vetted(original_dunder, name, globals, locals, fromlist, level)
            if fromlist:
                guard.check_handed(module, name, fromlist)
            return module

        import_module.__doc__ = original_import_module.__doc__
        builtins.__import__ = __import__
        importlib.import_module = import_module
        importlib.__import__ = dunder_import
        return {"builtins.__import__": __import__, "importlib.import_module": import_module,
                "importlib.__import__": dunder_import}

"""Audit events a candidate's code may not cause: the ways to reach the judge's objects without
importing them, and the loads that bypass the import wrappers.

Consulted by the worker's audit hook (:class:`~core.verification.worker.process.AuditGuard`) for
every event, armed or not: candidate code can also run outside ``forward`` (a finaliser, a
performance stage's timed calls). Families, each judged by who raised the event
(:class:`~core.verification.worker.callers.Callers`):

* **loads** (``import``, and ``exec``/``compile`` of module code by the import machinery): the
  import allow-list of :class:`~core.verification.worker.imports.ImportGuard`, so ``importlib.util``,
  ``importlib.reload`` and private importlib entry points cannot load what an import may not.
* **dynamic code** (``exec``, ``compile``, ``function.__new__``, ``code.__new__``, ``marshal.loads``)
  raised by the candidate's own frames, or by a library outside :data:`CODE_MAKERS` while the
  candidate is on the stack (``timeit``, ``code``, ``pdb`` would run a string for it).
* **frames** (``sys._getframe``, a traceback's ``tb_frame``, a generator's ``gi_frame`` ...): a
  frame that the candidate is on (or below) leads through ``f_back`` into the harness, so only
  :data:`FRAME_USERS` (libraries that read frames and never hand them out) may take one.
* **introspection and memory** (``gc.get_objects``/``get_referrers``/``get_referents``,
  ``sys._current_frames``, ``sys.addaudithook``, every ``ctypes`` event, setting a function's
  ``__code__``): refused whenever the candidate is on the stack, unless torch, a backend's toolchain
  or the harness itself raised them.

The toolchains each family trusts are what the registered backends declare
(``core.api.sandbox.SandboxNeeds``: ``reads_frames``, ``makes_code``, ``touches_memory``); the sets
below are the Python and torch libraries every backend shares.

Each refusal is a sentence naming what was refused; the hook records it and raises ``PermissionError``.
"""

from __future__ import annotations

import types
from typing import Any

from core.api.sandbox import NO_NEEDS, SandboxNeeds
from core.verification.worker.callers import IMPORT_MACHINERY, Callers, is_harness, root_of
from core.verification.worker.imports import ImportGuard

# Libraries that read frames for a candidate (namedtuple's and TypeVar's caller module, warnings,
# dataclasses) and never return them; inspect, traceback and logging hand frames out, so are not here.
FRAME_USERS = frozenset({"collections", "typing", "typing_extensions", "enum", "warnings", "dataclasses", "functools", "abc",
                         "torch", "core", "plugins"})
# Libraries that compile or exec for a candidate (namedtuple and dataclasses generate methods,
# ast.parse compiles to an AST).
CODE_MAKERS = frozenset({"collections", "ast", "dataclasses", "typing", "typing_extensions", "enum", "functools", "torch",
                         "core", "plugins"})
# Libraries that may introspect memory, the collector or ctypes while a candidate is on the stack.
NATIVE_USERS = frozenset({"torch", "core", "plugins"})

DYNAMIC_CODE = frozenset({"exec", "compile", "function.__new__", "code.__new__", "marshal.loads", "marshal.load"})
FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})
INTROSPECTION = frozenset({"gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames",
                           "sys._current_exceptions", "sys.addaudithook"})
# Setting a function's __code__ (and the other audited writes): only the candidate's own frames are refused,
# namedtuple sets __module__ this way for it.
WRITES = frozenset({"object.__setattr__", "object.__delattr__"})
WATCHED = frozenset({"import", "sys._getframe", "object.__getattr__", "pickle.find_class"}) | DYNAMIC_CODE | \
    INTROSPECTION | WRITES


class CandidateEvents:
    """The rules above; :meth:`check` answers one event (raised in frame ``issuer``)."""

    def __init__(self, callers: Callers, imports: ImportGuard, toolchains: SandboxNeeds = NO_NEEDS):
        self.callers, self.imports = callers, imports
        self.frame_users = FRAME_USERS | toolchains.reads_frames
        self.code_makers = CODE_MAKERS | toolchains.makes_code
        self.native_users = NATIVE_USERS | toolchains.touches_memory

    @staticmethod
    def watches(event: str) -> bool:
        return event in WATCHED or event.startswith("ctypes.")

    def check(self, event: str, args: tuple, issuer: Any) -> str | None:
        """Why ``event`` (raised by the Python frame ``issuer``) is refused, or None."""
        callers = self.callers
        issuer_module = callers.frame_module(issuer) if issuer is not None else None
        if event == "import":
            return self._load(_text(args[0] if args else None), issuer)
        if event in DYNAMIC_CODE:
            if issuer_module in IMPORT_MACHINERY:  # a module load: code read from its .pyc, compiled, run
                return self._load(_code_name(args), issuer)
            if issuer_module is None:
                return f"running dynamic code ({event}) in the candidate's code"
            if root_of(issuer_module) not in self.code_makers and callers.candidate_on_stack(issuer):
                return f"running dynamic code ({event}) through {issuer_module} for the candidate"
            return None
        if event == "sys._getframe":
            return self._frame(args[0] if args else None, issuer_module, "sys._getframe")
        if event == "object.__getattr__":
            name = _text(args[1] if len(args) > 1 else None)
            if issuer_module is None:
                return f"reading the restricted attribute {name!r} in the candidate's code"
            if name in FRAME_ATTRIBUTES:
                return self._frame(getattr(args[0], name, None), issuer_module, name)
            return None
        if event == "pickle.find_class":  # pickle finds loaded modules without an import
            module = _text(args[0] if args else None)
            if is_harness(module) and (issuer_module is None or callers.candidate_on_stack(issuer)):
                return f"unpickling a global of the verifier's own module {module!r}"
            return None
        if event in WRITES:
            what = _text(args[1] if len(args) > 1 else None)
            return f"setting the restricted attribute {what!r} in the candidate's code" if issuer_module is None else None
        # introspection, memory and ctypes
        if issuer_module is None:
            return f"{event} in the candidate's code"
        if root_of(issuer_module) not in self.native_users and callers.candidate_on_stack(issuer):
            return f"{event} (through {issuer_module}) while the candidate runs"
        return None

    def _load(self, name: str, issuer: Any) -> str | None:
        """A module load asked for from ``issuer``: the asker (past the import machinery) must be
        allowed to import it."""
        _, asker_module = self.callers.asker(issuer)
        if asker_module is None and self.imports.vetted():
            return None  # the import wrapper allowed this import; the machinery now loads it
        return self.imports.refusal(name, asker_module)

    def _frame(self, frame: Any, issuer_module: str | None, how: str) -> str | None:
        if issuer_module is None:
            return f"taking a frame ({how}) in the candidate's code"
        if root_of(issuer_module) in self.frame_users or frame is None:
            return None
        if self.callers.candidate_on_stack(frame):
            return f"taking a frame of the candidate's call ({how} through {issuer_module})"
        return None


def _text(value: Any) -> str:
    """An event argument as text without running anything of the candidate's (no ``__str__``)."""
    return str.__str__(value) if isinstance(value, str) else "?"


def _code_name(args: tuple) -> str:
    """The file of the module code an ``exec`` (a code object) or ``compile`` (source, filename) event is about."""
    if len(args) > 1 and isinstance(args[1], str):
        return _text(args[1])
    code = args[0] if args else None
    return _text(code.co_filename) if type(code) is types.CodeType else "module code"


def guard_threads(callers: Callers, refuse: Any, starters: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Refuse starting a Python thread while the candidate is on the stack: the ATen audit is a
    dispatch mode, and dispatch modes are thread-local, so work on another thread is unaudited.
    ``threading.Thread.start`` and ``_thread.start_new_thread`` both end in the primitive wrapped
    here (no audit event is raised for a thread start). ``starters``: packages a backend declares
    start threads for its candidates (``SandboxNeeds.starts_threads``), allowed when the code that
    asked for the thread (past ``threading``) is theirs. Returns what was installed, by name."""
    import _thread
    import sys
    import threading

    original = _thread.start_new_thread
    getframe = sys._getframe

    def started_by_a_starter(frame: Any) -> bool:
        while frame is not None and callers.frame_module(frame) in ("threading", "_thread"):
            frame = frame.f_back
        return frame is not None and root_of(callers.frame_module(frame)) in starters

    def start_new_thread(function, args, kwargs=None):
        caller = getframe(1)
        if callers.candidate_on_stack(caller) and not (starters and started_by_a_starter(caller)):
            refuse("starting a thread while the candidate runs (the ATen audit sees only the calling thread)")
        return original(function, args) if kwargs is None else original(function, args, kwargs)

    _thread.start_new_thread = _thread.start_new = threading._start_new_thread = start_new_thread  # type: ignore[attr-defined]
    return {"_thread.start_new_thread": start_new_thread, "_thread.start_new": start_new_thread,
            "threading._start_new_thread": start_new_thread}

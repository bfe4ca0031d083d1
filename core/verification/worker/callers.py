"""Who is asking: the candidate's code or trusted code, judged by the globals of the asking frame.

A frame is *trusted* when its globals are the real ``__dict__`` of a module registered in
``sys.modules`` under that module's own ``__name__``, and that module is not the candidate. Every
other frame is the candidate's: the candidate module itself, functions it defines, code it had
compiled, the kernels the Triton interpreter rewrites from its source (they keep its globals),
code generated into a plain dict. Judging by the asking frame rather than by the whole stack lets
torch and triton import lazily and inspect functions on the candidate's behalf; the few things no
trusted library does for a candidate (handing out frames, loading ctypes, starting threads) are
judged by the stack instead (:meth:`Callers.candidate_on_stack`).
"""

from __future__ import annotations

import sys
import types
from typing import Any

CANDIDATE_MODULE = "kz_candidate"

# The worker's own code (the harness): a candidate may not import it, and nothing but the harness
# may import it while a candidate is loaded.
HARNESS_ROOTS = frozenset({"core", "plugins"})

# The import system's own frames, skipped when looking for the frame an import was asked from.
IMPORT_MACHINERY = frozenset({"importlib", "importlib._bootstrap", "importlib._bootstrap_external",
                              "importlib.util", "importlib.machinery", "importlib.abc"})

_MODULE_DICT = types.ModuleType.__dict__["__dict__"]  # a module's real dict, whatever a subclass claims
_MAX_DEPTH = 400  # deeper stacks are treated as the candidate's (fail closed)


def is_harness(name: str) -> bool:
    return name.partition(".")[0] in HARNESS_ROOTS


def root_of(name: str | None) -> str:
    return (name or "").partition(".")[0]


class Callers:
    """Classifies frames. ``candidate_globals`` is the loaded candidate module's ``__dict__`` (set by
    the candidate role before the module's code runs; None when no candidate is loaded).

    :param own: modules whose frames belong to the guard itself (its import wrappers): skipped,
        like the import machinery, when looking for the frame that asked for an import.
    """

    def __init__(self, own: frozenset[str]):
        self.own = own
        self.candidate_globals: dict[str, Any] | None = None
        self.modules = sys.modules  # the interpreter's own dict, even if a candidate rebinds sys.modules

    @property
    def candidate_loaded(self) -> bool:
        return self.candidate_globals is not None

    def module_of(self, frame_globals: Any) -> str | None:
        """The trusted module whose globals these are, or None (the candidate's code)."""
        if frame_globals is self.candidate_globals or type(frame_globals) is not dict:
            return None
        name = dict.get(frame_globals, "__name__")
        if type(name) is not str or name == CANDIDATE_MODULE:
            return None
        module = dict.get(self.modules, name)
        if not issubclass(type(module), types.ModuleType) or _MODULE_DICT.__get__(module) is not frame_globals:
            return None
        return name

    def frame_module(self, frame: Any) -> str | None:
        """The trusted module ``frame`` runs code of, or None (the candidate's). Besides a registered
        module's code, the body of a module that the import machinery is executing counts as trusted
        (a library may load a module without registering it: triton loads its ``language.extra``
        backends so); the load itself was judged when the machinery began it, and the candidate's
        own module body is never trusted."""
        frame_globals = frame.f_globals
        name = self.module_of(frame_globals)
        if name is not None or frame_globals is self.candidate_globals or type(frame_globals) is not dict:
            return name
        back = frame.f_back
        if frame.f_code.co_name != "<module>" or back is None or self.module_of(back.f_globals) not in IMPORT_MACHINERY:
            return None
        claimed = dict.get(frame_globals, "__name__")
        return claimed if type(claimed) is str and claimed != CANDIDATE_MODULE else "<a module being loaded>"

    def trusted(self, frame: Any) -> bool:
        return frame is not None and self.frame_module(frame) is not None

    def asker(self, frame: Any) -> tuple[Any, str | None]:
        """The first frame from ``frame`` outwards that is neither the import machinery nor the
        guard's own, with its trusted module name (None: the candidate's; no frame: ``(None, None)``)."""
        depth = 0
        while frame is not None and depth < _MAX_DEPTH:
            name = self.frame_module(frame)
            if name is None or (name not in IMPORT_MACHINERY and name not in self.own):
                return frame, name
            frame, depth = frame.f_back, depth + 1
        return None, None

    def candidate_on_stack(self, frame: Any) -> bool:
        """Whether a frame of the candidate's is on the stack from ``frame`` outwards, before any
        frame of the import machinery (frames older than a candidate frame are the harness, so
        whoever holds ``frame`` can walk into it). Code that runs inside a module load is that
        module's own: the load itself was judged by the import rules."""
        if not self.candidate_loaded:
            return False
        depth = 0
        while frame is not None:
            if depth >= _MAX_DEPTH:
                return True
            name = self.frame_module(frame)
            if name is None:
                return True
            if name in IMPORT_MACHINERY:
                return False
            frame, depth = frame.f_back, depth + 1
        return False

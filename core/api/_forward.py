"""Public names whose implementation lives in the private engine, looked up when first read.

Looked up on every read, not copied at import: a test (or a debugging user) that patches the engine's
object is seen through the public name too, and importing ``core.api`` stays cheap.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def forwarding(public: str, homes: dict[str, tuple[str, ...]]) -> tuple[list[str], Callable[[str], Any]]:
    """``(__all__, __getattr__)`` for module ``public``: ``homes`` maps an engine module to the names
    ``public`` offers of it (``{"core.verification.sandbox": ("WorkerPool",)}``)."""
    where = {name: module for module, names in homes.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {public!r} has no attribute {name!r}; it offers {sorted(where)}")
        return getattr(importlib.import_module(where[name]), name)

    return sorted(where), __getattr__

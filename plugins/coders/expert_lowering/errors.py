"""The one exception the lowering raises: a program (or part of one) it will not lower."""

from __future__ import annotations


class Unsupported(Exception):
    """The expert declines: the reason names the op, parameter, dtype or shape it cannot lower.

    The coder turns this into ``Candidate.declined``; it never emits a kernel it knows is wrong.
    """


class CaptureFailed(Unsupported):
    """The task's ``Model`` could not be built or traced (before any op was looked at)."""


class MissingOp(Unsupported):
    """The captured graph uses an op the expert has no translation or lowering for."""

    def __init__(self, op: str, message: str | None = None) -> None:
        super().__init__(message or f"{op} is not in the expert's catalog")
        self.op = op

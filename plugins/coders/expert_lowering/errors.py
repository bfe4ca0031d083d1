"""The one exception the lowering raises: a program (or part of one) it will not lower."""

from __future__ import annotations


class Unsupported(Exception):
    """The expert declines: the reason names the op, parameter, dtype or shape it cannot lower.

    The coder turns this into ``Candidate.declined``; it never emits a kernel it knows is wrong.
    """

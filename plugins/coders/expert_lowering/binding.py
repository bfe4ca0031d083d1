"""How a lowered module gets its weights when they are not the program's own modules.

A proposer program builds its weights itself (``self.m<k> = nn.Linear(...)``, in program order, so
the task's seed gives the task's weights). A program *captured* from someone else's ``Model``
(:mod:`plugins.coders.expert_capture`) cannot: that model built its parameters in its own order,
with its own initialisers. Its candidate therefore runs the task's own ``__init__`` (``preamble``
defines it, ``init`` calls it) and reads each weight through the expression recorded here.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Binding:
    """Where a captured program's weights live in ``ModelNew``.

    :param n_args: program inputs ``0 .. n_args - 1`` are ``forward``'s arguments.
    :param inputs: every further program input -> the expression that reads it (``"self.w.bias"``).
    :param tensors: ``(value, attribute)`` of a weighted op (``(5, "weight")`` of a conv) -> the
        expression of that tensor, or None where the op has none (a conv without bias).
    :param preamble: module-level source placed before ``ModelNew`` (defines what ``init`` calls).
    :param init: ``__init__`` body lines after ``super().__init__()``.
    :param signature: ``__init__``'s parameters after ``self``.
    :param arg_names: ``forward``'s parameters after ``self`` when some are not tensors (a scalar the
        capture baked in, ``_c1``); by default ``x0 .. x<n_args - 1>``.
    """

    n_args: int
    inputs: dict[int, str] = field(default_factory=dict)
    tensors: dict[tuple[int, str], str | None] = field(default_factory=dict)
    preamble: str = ""
    init: list[str] = field(default_factory=list)
    signature: str = "*args, **kwargs"
    arg_names: list[str] | None = None

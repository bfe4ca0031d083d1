"""The judge <-> worker wire: every request a worker answers, by name, in one module both sides import.

A message is a plain dict (it travels as a pickle frame, :mod:`core.verification.sandbox`) whose
``"op"`` is one of the names below; the rest of its keys are that request's fields. Every answer
carries ``"ok"`` and, when it is false, ``"error"``. The worker starts by sending a ``HELLO``.
"""

from __future__ import annotations

from typing import Any


class Op:
    """Request names. Plain strings, so a frame never needs a class to unpickle."""

    HELLO = "hello"  # worker -> judge, once at start-up: pid, isolation, role, backend, warm-up
    EXIT = "exit"  # judge -> worker: leave now
    PING = "ping"  # any role: still alive?
    UNLOAD = "unload"  # any role: forget the loaded candidate or task
    TAKE_HELD = "take_held"  # any role: the tensors a ``hold`` request kept back
    # reference role
    REFERENCE = "reference"  # draw a trial's inputs from its seed and run the task's Model
    BASELINE = "baseline"  # time eager / torch.compile for a check (the performance stage)
    FOOTPRINT = "footprint"  # the task's tensors' bytes on the meta device (core.verification.gpumemory)
    ADOPT = "adopt"  # keeper: take over a candidate worker's exported outputs
    COMPARE = "compare"  # keeper: compare held outputs (on the device)
    EQUAL = "equal"  # keeper: are two held outputs bitwise equal
    FETCH = "fetch"  # keeper: send held tensors' values
    FORGET = "forget"  # keeper: drop a verification's vault
    RELEASE = "release"  # keeper: drop candidate outputs no check still to be evaluated reads
    # candidate role
    PRECOMPILE = "precompile"  # compile what the candidate's text shows, before the GPU turn
    COMPILE_AHEAD = "compile_ahead"  # compile the loaded candidate's kernels for the task's shapes, no GPU work
    LOAD = "load"  # import the candidate, build ModelNew, compile its kernels
    RUN = "run"  # call forward on trials under instrumentation
    COLLECT = "collect"  # a check's own measurement (``Check.collect``) in the worker
    DROP_EXPORTS = "drop_exports"  # forget outputs handed to a keeper
    # tests only (KERNELZERO_SANDBOX_TESTING=1)
    EXEC_TEST = "exec_test"


# How a candidate worker reports that the instrumentation changed under a candidate: a sandbox
# finding (``sandbox`` of an answer) that starts with this, followed by what changed.
TAMPERED = "instrumentation tampered: "

KEEPER_OPS = frozenset({Op.ADOPT, Op.COMPARE, Op.EQUAL, Op.FETCH, Op.FORGET, Op.RELEASE})

# Which role answers which request; anything else is refused with a message naming both.
ROLE_OPS: dict[str, frozenset[str]] = {
    "reference": frozenset({Op.REFERENCE, Op.BASELINE, Op.FOOTPRINT, *KEEPER_OPS}),
    "candidate": frozenset({Op.PRECOMPILE, Op.COMPILE_AHEAD, Op.LOAD, Op.RUN, Op.COLLECT, Op.DROP_EXPORTS}),
}
ANY_ROLE_OPS = frozenset({Op.PING, Op.UNLOAD, Op.TAKE_HELD, Op.EXIT})


def request(op: str, **fields: Any) -> dict[str, Any]:
    """A request frame: ``request(Op.LOAD, source=..., init_seed=0)``."""
    if op not in _ALL_OPS:
        raise ValueError(f"unknown worker request {op!r}; known: {', '.join(sorted(_ALL_OPS))}")
    return {"op": op, **fields}


def refusal(role: str, op: Any) -> dict[str, Any]:
    """The answer to a request this role does not serve."""
    return {"ok": False, "error": f"worker of role {role!r} does not answer {op!r}"}


_ALL_OPS = frozenset(v for k, v in vars(Op).items() if k.isupper())

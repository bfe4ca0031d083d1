"""The session a worker-side check receives: its optional ``prepare(session)`` and ``collect(session)``
run inside a candidate worker with the candidate loaded (``core.contracts.OPTIONAL_MEMBERS["Check"]``).

The worker's session (``core.verification.worker.session.Session``) is the one implementation; a
check reads it only through the members below.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class AuditGuard(Protocol):
    """The sandbox's audit hook as a check sees it: while ``armed`` is True, what the candidate does
    (imports, files, processes) is audited and refused; a check that calls candidate code itself arms
    it around the call, as the trials do."""

    armed: bool


@runtime_checkable
class CheckSession(Protocol):
    """A loaded candidate in a candidate worker.

    :ivar model: the candidate's ``ModelNew`` instance, built with the verification's init seed.
    :ivar module: the imported candidate module (its kernels, its autotune configs).
    :ivar backend: the candidate's backend plugin (``launch_tracker()``, ``capabilities(device)`` ...).
    :ivar device: ``"cpu"`` or ``"cuda"``.
    :ivar task: the task as plain data (``{"source": ..., "init_seed": ...}``), or None before one is set.
    :ivar init_seed: the seed ``ModelNew`` and the reference ``Model`` were built with.
    :ivar prepared: check name -> what its ``prepare`` returned, for its ``collect``.
    :ivar late_findings: the sandbox's findings after the trials (a check's own calls ran candidate code).
    :ivar scratch: the worker's private scratch directory (the only writable place).
    :ivar guard: the sandbox's :class:`AuditGuard`.
    """

    model: Any
    module: Any
    backend: Any
    device: str
    task: dict[str, Any] | None
    init_seed: int
    prepared: dict[str, Any]
    late_findings: list[str]

    @property
    def scratch(self) -> str: ...

    @property
    def guard(self) -> AuditGuard: ...

    def call(self, inputs: list[Any], order_seed: int | None = None, inputs_as_digest: bool = False,
             export: bool = False) -> dict[str, Any]:
        """Run ``forward`` once as a trial does (launch counting, the ATen audit, the backend's checks)
        and return what was observed (``launches``, ``kernels``, ``output``, ``error``, ``sandbox`` ...)."""

    def verify_instrumentation(self) -> list[str]:
        """Names of the instrumentation candidate code has replaced since the worker installed it."""

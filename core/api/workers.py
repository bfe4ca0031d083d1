"""Sandboxed workers and the GPU lock, for a check that runs work of its own beside the verification
(``interp_races`` judges a Triton candidate a second time in CPU workers; the sanitizer and the timer
take the GPU lock).

``WorkerPool(role, backend, device, size=, limits=, env=)`` starts workers of a role (``"candidate"``,
``"reference"``) with ``Limits`` and an environment from ``worker_env(backend, device, size)``; a request
is ``request(Op.X, ...)``; a worker that dies raises ``WorkerFailure``. ``DeviceLock`` is the host-wide
reader-writer lock of one physical GPU (shared for ordinary work, exclusive for timing).
"""

from __future__ import annotations

from core.api._forward import forwarding

__all__, __getattr__ = forwarding(__name__, {
    "core.verification.devicelock": ("DeviceLock",),
    "core.verification.judge": ("worker_env",),
    "core.verification.protocol": ("Op", "request"),
    "core.verification.sandbox": ("Limits", "WorkerFailure", "WorkerPool"),
})

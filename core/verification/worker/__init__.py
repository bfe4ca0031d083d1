"""The sandboxed worker: ``python -m core.verification.worker`` (started by :mod:`core.verification.sandbox`, never by hand).

It isolates itself (namespaces where the kernel allows, limits, an audit hook), imports the
toolchain once (torch + the backend), warms up (:mod:`.warmup`), then answers requests on its
private channel (every request is named in :mod:`core.verification.protocol`):

``reference``  run the *task* (never a candidate): draw inputs from the given seeds, return
               inputs and reference outputs (reference workers only)
``load``       import a candidate from source and build ``ModelNew`` (candidate workers only)
``run``        call the loaded ``ModelNew.forward`` on given inputs and report what happened
``collect``    run a check's worker-side ``collect(session)`` (GPU timing, sanitizers ...)
``unload``     forget the candidate
``exit``

Observations go back as plain data; nothing is decided here (see :mod:`core.verification.evidence`).

By role: :mod:`.process` (isolation, limits, the audit hook and the ATen audit, error texts),
:mod:`.session` (a loaded candidate, the float64 truth), :mod:`.reference` (the task's trials, the
keeper, baselines), :mod:`.candidate` (precompile, load, run, collect), :mod:`.loop` (the set-up,
the dispatch, the main loop). The candidate worker's runtime guard: :mod:`.callers` (whose frame
is asking), :mod:`.imports` (the import allow-list), :mod:`.events` (audit events candidate code
may not cause), :mod:`.tamper` (the instrumentation, recorded and verified after every call),
:mod:`.runtime_guard` (installs them).
"""

from __future__ import annotations

from core.verification.inputs import draw_inputs, seed_everything
from core.verification.worker.candidate import CANDIDATE_MODULE, CandidateRole
from core.verification.worker.loop import WorkerMain, main
from core.verification.worker.process import (
    ALLOWED_ATEN,
    MAX_ERROR_CHARS,
    AuditGuard,
    describe,
    isolate,
    make_audit_mode,
    sandbox_escape,
    set_cpu_budget,
    set_limits,
)
from core.verification.worker.reference import ReferenceRole
from core.verification.worker.session import Float64Truth, Session, cpu_copy, flatten_outputs, load_module, synchronize
from core.verification.worker.warmup import warm_gpu, warm_up

__all__ = [
    "ALLOWED_ATEN", "CANDIDATE_MODULE", "MAX_ERROR_CHARS", "AuditGuard", "CandidateRole", "Float64Truth",
    "ReferenceRole", "Session", "WorkerMain", "cpu_copy", "describe", "draw_inputs", "flatten_outputs", "isolate",
    "load_module", "main", "make_audit_mode", "sandbox_escape", "seed_everything", "set_cpu_budget", "set_limits",
    "synchronize", "warm_gpu", "warm_up",
]

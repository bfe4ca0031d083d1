"""The candidate worker's runtime guard, installed once at the end of its set-up.

It puts together: who is asking (:mod:`.callers`), the import allow-list (:mod:`.imports`), the
audit events a candidate may not cause and the thread guard (:mod:`.events`), and the record of
the instrumentation as installed (:mod:`.tamper`). What the worker gets back is the classifier
(the candidate role tells it which module is the candidate's) and a verifier, a closure over the
recorded identities, that the session calls after every candidate call.
"""

from __future__ import annotations

from typing import Any, Callable

import core.verification.worker.imports as imports_module
from core.api.sandbox import registered_needs
from core.contracts import optional
from core.verification.worker.callers import Callers
from core.verification.worker.events import CandidateEvents, guard_threads
from core.verification.worker.imports import ImportGuard, runtime_imports
from core.verification.worker.process import AuditGuard, audit_mode_class, make_audit_mode
from core.verification.worker.tamper import Snapshot, reader


def exercise(backend: Any) -> None:
    """Run a few ops under the launch tracker and the ATen audit before recording: the first op
    under a dispatch mode makes torch import ~800 modules (torch._dynamo among them), and some of
    them rebind torch functions (``torch.manual_seed``), which would otherwise read as tampering."""
    import torch

    with backend.launch_tracker() as tracker, torch.no_grad(), make_audit_mode(tracker):
        x = torch.zeros(4)
        torch.empty_like(x).copy_(x + 1)


def install_runtime_guard(backend: Any, guard: AuditGuard) -> tuple[Callers, Callable[[], list[str]]]:
    """Install the guard for candidates of ``backend`` in this process (refusals are recorded in
    ``guard``); returns the frame classifier and the instrumentation verifier."""
    toolchains = registered_needs()  # what every registered backend declares of its toolchain
    callers = Callers(own=frozenset({imports_module.__name__}))
    import_guard = ImportGuard(runtime_imports(backend), callers, guard.record)
    guard.candidate_rules = CandidateEvents(callers, import_guard, toolchains)
    installed = {**import_guard.install(), **guard_threads(callers, guard._refuse, toolchains.starts_threads)}
    exercise(backend)
    audit_class = audit_mode_class()
    rules = guard.candidate_rules
    patched = dict(optional(backend, "Backend", "instrumentation")())
    pinned: dict[str, Any] = {
        **{name: name for name in installed},
        **{name: name for name in patched},
        "the ATen audit's class": reader(audit_mode_class),
        # the guard's own state: the objects its rules consult (not the lists and flags that change)
        "the sandbox guard's rules": reader(lambda: guard.candidate_rules),
        "the sandbox guard's re-entry flag": reader(lambda: guard._local),
        "the event rules' classifier": reader(lambda: rules.callers),
        "the event rules' import guard": reader(lambda: rules.imports),
        "the import guard's allowed set": reader(lambda: import_guard.allowed),
        "the allowed modules": reader(lambda: import_guard.allowed.exact),
        "the allowed module trees": reader(lambda: import_guard.allowed.trees),
        "the import guard's classifier": reader(lambda: import_guard.callers),
        "the import guard's record": reader(lambda: import_guard.record.__func__),
        "the classifier's module table": reader(lambda: callers.modules),
        "the classifier's own modules": reader(lambda: callers.own),
    }
    snapshot = Snapshot.take(pinned, classes={"the ATen audit (AtenAudit)": audit_class},
                             modules=toolchains.snapshot_modules, class_paths=toolchains.snapshot_classes)
    for name, value in {**installed, **patched}.items():
        recorded = next(p.expected for p in snapshot.pinned if p.name == name)
        if recorded is not value:  # what the backend says it patched is not what is installed
            raise RuntimeError(f"instrumentation {name!r}: the backend reports {value!r}, the worker finds {recorded!r}")

    def verify_instrumentation() -> list[str]:
        return snapshot.verify()

    return callers, verify_instrumentation

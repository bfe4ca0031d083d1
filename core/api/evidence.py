"""Evidence and findings: what a check's ``evaluate`` receives and the names its findings carry.

``Evidence`` holds everything one verification observed (the parsed source, the ``Trial`` s, what each
check's ``collect`` returned, under its name, in ``extra``). The stage numbers order the checks
(``Check.stage``: ``STATIC`` ... ``PERFORMANCE``); ``OBSERVATIONS`` are what a check may ask the worker to
make (``Check.needs``). The prefixes mark a finding's family in the sandbox's record and in a check's
detail: ``RACE_FINDING``, ``RACE_SUMMARY``, ``UNPRODUCED`` (an output byte no kernel wrote), ``TAMPERED``.
"""

from __future__ import annotations

from core.api._forward import forwarding

__all__, __getattr__ = forwarding(__name__, {
    "core.verification.evidence": (
        "CORRECTNESS", "DETERMINISM", "INTEGRITY", "MEMORY", "OBSERVATIONS", "PERFORMANCE", "RACES", "RACE_FINDING",
        "RACE_SUMMARY", "STABILITY", "STATIC", "UNPRODUCED", "Evidence", "HeldTensor", "RunObservation", "Trial",
        "parse_python"),
    "core.verification.protocol": ("TAMPERED",),
})

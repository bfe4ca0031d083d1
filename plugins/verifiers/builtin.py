"""Registers the built-in verification checks (one per stage of DESIGN.md)."""

from __future__ import annotations

from core import hookimpl
from plugins.verifiers.runtime import (CorrectnessCheck, DeterminismCheck, IntegrityCheck, MemoryCheck, RaceCheck,
                                       StabilityCheck)
from plugins.verifiers.static import StaticCheck, StaticIntegrityCheck


@hookimpl
def register_verifiers(register):
    for check in (StaticCheck, StaticIntegrityCheck, CorrectnessCheck, IntegrityCheck, MemoryCheck, RaceCheck,
                  StabilityCheck, DeterminismCheck):
        register(check.name, check)

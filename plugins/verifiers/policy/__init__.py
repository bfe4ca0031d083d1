"""The static policy: an allow-list each backend declares (:mod:`.declaration`) and the rules that
check a candidate's source against it (:mod:`.rules`), before anything of the candidate runs."""

from __future__ import annotations

from core.api.policy import STRICTEST, TORCH_MODULES, TYPING, ModuleRule, StaticPolicy, module
from plugins.verifiers.policy.references import Finding
from plugins.verifiers.policy.rules import check

__all__ = ["STRICTEST", "TORCH_MODULES", "TYPING", "Finding", "ModuleRule", "StaticPolicy", "check", "module"]

"""Static checks: run in the judging process on the parsed source, before anything executes."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from core.verdict import CheckResult
from core.api.evidence import STATIC, Evidence, parse_python
from plugins.verifiers.policy import STRICTEST, StaticPolicy, check, module


@dataclass
class StaticCheck:
    """Parses, stays under a size limit, defines ``ModelNew``, contains a kernel for the backend."""

    name: str = "static"
    stage: int = STATIC
    hard: bool = True
    where: str = "judge"
    needs: frozenset[str] = frozenset()
    max_bytes: int = 200_000

    def applies(self, backend: str, device: str) -> bool:
        return True

    def evaluate(self, evidence: Evidence) -> CheckResult:
        from core.plugins import registry

        source = evidence.candidate.source
        size = len(source.encode("utf-8"))
        if size > self.max_bytes:
            return CheckResult(False, f"source is {size} bytes; the limit is {self.max_bytes}")
        if evidence.tree is None:
            try:
                evidence.tree = parse_python(source)
            except SyntaxError as exc:
                return CheckResult(False, f"does not parse: {exc.msg} (line {exc.lineno})")
        tree = evidence.tree
        if not any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body):
            return CheckResult(False, "defines no top-level class ModelNew (KernelBench solution format)")
        kernels = registry("backend").create(evidence.backend).detect_kernels(tree)
        if not kernels:
            return CheckResult(False, f"contains no {evidence.backend} kernel{_other_backend_hint(tree, evidence.backend)}")
        return CheckResult(True, f"{len(kernels)} {evidence.backend} kernel(s): {', '.join(kernels[:6])}",
                           data={"kernels": kernels})


def _other_backend_hint(tree: ast.Module, backend: str) -> str:
    """``"; it looks like a <language> candidate ...: use backend=<name>"`` when another registered
    backend finds its kernels in the candidate (a load_inline module judged as triton), else ``""``."""
    from core.plugins import registry

    for name in registry("backend").names():
        if name == backend:
            continue
        other = registry("backend").create(name)
        found = other.detect_kernels(tree)
        if found:
            return (f"; it looks like a {other.language} candidate ({', '.join(found[:3])}): "
                    f"use backend={name} (--backend {name})")
    return ""


@dataclass
class StaticIntegrityCheck:
    """Checks the candidate's source against its backend's static policy (an allow-list of modules,
    members and builtins; :mod:`plugins.verifiers.policy`), before anything of it runs.

    Honest kernels need nothing outside the policy; every finding names its rule and line and is
    flagged as a hack attempt. ``extra_allowed_modules``: modules a user adds to the policy (every
    public member allowed).
    """

    name: str = "static_integrity"
    stage: int = STATIC
    hard: bool = True
    where: str = "judge"
    needs: frozenset[str] = frozenset()
    extra_allowed_modules: list[str] = field(default_factory=list)

    def applies(self, backend: str, device: str) -> bool:
        return True

    def policy(self, backend: str) -> StaticPolicy:
        from core.contracts import optional
        from core.plugins import registry

        declared = optional(registry("backend").create(backend), "Backend", "static_policy") or STRICTEST
        if self.extra_allowed_modules:
            declared = declared.with_modules(*(module(name) for name in self.extra_allowed_modules))
        return declared

    def evaluate(self, evidence: Evidence) -> CheckResult:
        tree = evidence.tree
        if tree is None:
            return CheckResult(True, "not parsed (see static)")
        policy = self.policy(evidence.backend)
        findings = check(tree, policy)
        if findings:
            shown = "; ".join(str(f) for f in findings[:4]) + (f" (+{len(findings) - 4} more)" if len(findings) > 4 else "")
            return CheckResult(False, f"the {policy.backend} policy refuses {len(findings)} construct(s): {shown}",
                               data={"findings": [str(f) for f in findings[:32]],
                                     "rules": sorted({f.rule for f in findings})}, hack=True)
        return CheckResult(True, f"within the {policy.backend} policy")

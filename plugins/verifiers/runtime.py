"""Checks that judge what the worker observed while running the candidate.

Every ``evaluate`` runs in the judging process on an :class:`core.verification.evidence.Evidence`; the worker
only collected outputs, inputs after the call, launch counts, the ATen audit and memory findings.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.verdict import CheckResult
from core.verification.evidence import (
    CORRECTNESS,
    DETERMINISM,
    INTEGRITY,
    MEMORY,
    RACES,
    REFERENCE_NOISE_FACTOR,
    STABILITY,
    Evidence,
    all_finite,
    bitwise_equal,
    compare_outputs,
    inputs_intact,
)
from core.verification.protocol import TAMPERED


def _tolerances(evidence: Evidence) -> dict:
    return {k: tuple(v) for k, v in (evidence.config.get("tolerances") or {}).items()}


@dataclass
class CorrectnessCheck:
    """Every trial (fresh random inputs each) matches the reference within dtype-aware tolerances
    (or, where the task also ran in float64, is as accurate against that truth as the fp32
    reference within ``reference_noise_factor``); the inputs are bitwise unchanged afterwards.
    ``data``: matched / trials."""

    name: str = "correctness"
    stage: int = CORRECTNESS
    hard: bool = True
    where: str = "worker"
    needs: frozenset[str] = frozenset({"trials"})
    reference_noise_factor: float = REFERENCE_NOISE_FACTOR

    def applies(self, backend: str, device: str) -> bool:
        return True

    def evaluate(self, evidence: Evidence) -> CheckResult:
        trials = evidence.trials
        if not trials:
            return CheckResult(False, "no trial ran", data={"matched": 0, "trials": 0})
        matched, first_failure, mutated = 0, None, None
        worst, by_truth = 0.0, 0
        for i, trial in enumerate(trials):
            obs = trial.observed
            if obs.error:
                first_failure = first_failure or f"trial {i} raised {obs.error}"
                continue
            unchanged, why = inputs_intact(trial)
            if not unchanged:
                mutated = mutated or f"trial {i}: {why}"
                first_failure = first_failure or mutated
                continue
            cmp = compare_outputs(trial.expected, obs.output, tolerances=_tolerances(evidence), truth=evidence.truth_of(trial),
                                  noise_factor=self.reference_noise_factor)
            worst = max(worst, cmp.max_abs_err)
            by_truth += cmp.by_truth
            if cmp.ok:
                matched += 1
            else:
                first_failure = first_failure or f"trial {i}: {cmp.detail}"
        data = {"matched": matched, "trials": len(trials), "max_abs_err": worst, "by_float64_truth": by_truth,
                "float64_reference": evidence.config.get("float64_truth_note", "not requested")}
        if matched == len(trials):
            judged = f"; {by_truth} output(s) judged against the float64 reference" if by_truth else ""
            return CheckResult(True, f"{matched}/{len(trials)} trials match the reference (max abs err {worst:.3g}){judged}",
                               data=data)
        return CheckResult(False, f"{matched}/{len(trials)} trials match; {first_failure}", data=data,
                           hack=mutated is not None)


@dataclass
class IntegrityCheck:
    """The kernels really did the work: at least one launch of the backend's kernels per call, no
    PyTorch compute op inside ``ModelNew.forward`` (ATen-level audit), no silent precision
    downcast, no output buffer handed back twice, no blocked sandbox escape."""

    name: str = "integrity"
    stage: int = INTEGRITY
    hard: bool = True
    where: str = "worker"
    needs: frozenset[str] = frozenset({"trials"})
    min_launches: int = 1

    def applies(self, backend: str, device: str) -> bool:
        return True

    def evaluate(self, evidence: Evidence) -> CheckResult:
        escapes = list(evidence.load_sandbox)
        runs = evidence.all_runs()
        for trial in runs:
            escapes.extend(trial.observed.sandbox)
        if escapes:
            tampered = [e for e in escapes if e.startswith(TAMPERED)]  # named as such, not as a refusal
            detail = tampered[0] if tampered else f"sandbox refused: {escapes[0]}"
            return CheckResult(False, detail, data={"sandbox": escapes[:8]}, hack=True)
        ran = [t for t in runs if not t.observed.error]
        ops = sorted({op for t in runs for op in t.observed.audit})
        if ops:
            return CheckResult(False, f"PyTorch compute ran inside ModelNew.forward: {', '.join(ops[:5])}",
                               data={"aten_ops": ops[:32]}, hack=True)
        expected_dtypes = {str(e.dtype) for t in runs for e in t.expected if hasattr(e, "dtype")}
        downcasts = sorted({d for t in runs for d in t.observed.downcasts if d.split(" -> ")[1] not in expected_dtypes})
        if downcasts:
            return CheckResult(False, f"inputs or results were cast to lower precision in forward ({downcasts[0]})",
                               data={"downcasts": downcasts}, hack=True)
        starved = [i for i, t in enumerate(ran) if t.observed.launches < self.min_launches]
        if ran and starved:
            return CheckResult(False, f"{len(starved)}/{len(ran)} forward calls launched no {evidence.backend} kernel "
                               "(the result did not come from a kernel)", data={"launches": [t.observed.launches for t in ran]},
                               hack=True)
        if any(t.observed.output_reused for t in runs):
            return CheckResult(False, "forward returned a buffer it had already returned on an earlier call "
                               "(reuse of earlier results)", hack=True)
        launches = [t.observed.launches for t in ran]
        if not ran:
            return CheckResult(True, "no completed call to audit (see correctness)")
        return CheckResult(True, f"{min(launches)}-{max(launches)} kernel launches per call; no PyTorch compute in forward",
                           data={"launches": launches[:16], "kernels": sorted({k for t in ran for k in t.observed.kernels})})


@dataclass
class MemoryCheck:
    """No out-of-bounds load or store (bounds-checked Triton interpreter on CPU)."""

    name: str = "memory"
    stage: int = MEMORY
    hard: bool = True
    where: str = "worker"
    needs: frozenset[str] = frozenset({"trials"})

    def applies(self, backend: str, device: str) -> bool:
        return device == "cpu"

    def evaluate(self, evidence: Evidence) -> CheckResult:
        findings: list[str] = []
        for trial in evidence.all_runs():
            for f in trial.observed.oob:
                if f not in findings:
                    findings.append(f)
        if findings:
            return CheckResult(False, f"out-of-bounds memory access: {findings[0]}", data={"findings": findings[:16]})
        return CheckResult(True, f"every load and store of {len(evidence.all_runs())} calls stayed inside its arguments' memory")


@dataclass
class RaceCheck:
    """The answer does not depend on the order programs run in (shuffled grid orders in the
    interpreter, compared with the reference)."""

    name: str = "races"
    stage: int = RACES
    hard: bool = True
    where: str = "worker"
    needs: frozenset[str] = frozenset({"shuffled"})
    orders: int = 2

    def applies(self, backend: str, device: str) -> bool:
        return device == "cpu"

    def evaluate(self, evidence: Evidence) -> CheckResult:
        if not evidence.shuffled:
            return CheckResult(True, "not run (no shuffled orders were requested)")
        for i, trial in enumerate(evidence.shuffled):
            if trial.observed.error:
                return CheckResult(False, f"shuffled program order {i} raised {trial.observed.error}")
            cmp = compare_outputs(trial.expected, trial.observed.output, tolerances=_tolerances(evidence),
                                  truth=evidence.truth_of(trial))
            if not cmp.ok:
                return CheckResult(False, f"result depends on program order (a race between programs): "
                                   f"shuffled order {i}: {cmp.detail}")
        return CheckResult(True, f"same answer under {len(evidence.shuffled)} shuffled program orders")


# Probe scales per dtype live in core.verify.DEFAULT_PROBE_SCALES (Verifier(probe_scales=...)).


@dataclass
class StabilityCheck:
    """Numeric probes at extreme input magnitudes: wherever the reference stays finite, the
    candidate must too, and agree to a looser, magnitude-relative tolerance.

    Where the task also ran in float64 on the probe's inputs, an output that misses the fp32
    reference passes when its error against that truth is within the tolerance or within
    ``reference_noise_factor`` x the fp32 reference's own error against it: ill-conditioned
    compositions (a normalisation after a bias, at x1e-5) amplify rounding noise, PyTorch's fp32
    result carries it too, and a kernel that rounds differently is not less accurate for that."""

    name: str = "stability"
    stage: int = STABILITY
    hard: bool = True
    where: str = "worker"
    needs: frozenset[str] = frozenset({"probes"})
    tolerance_factor: float = 10.0
    reference_noise_factor: float = REFERENCE_NOISE_FACTOR

    def applies(self, backend: str, device: str) -> bool:
        return True

    def evaluate(self, evidence: Evidence) -> CheckResult:
        usable = [t for t in evidence.probes if all(all_finite(e) for e in t.expected)]
        if not usable:
            return CheckResult(True, "no probe where the reference stays finite", data={"probes": 0})
        tol = {k: (a * self.tolerance_factor, r * self.tolerance_factor)
               for k, (a, r) in {**{"float32": (1e-4, 1e-4), "float16": (1e-2, 1e-2), "bfloat16": (2e-2, 2e-2),
                                     "float64": (1e-6, 1e-6)}, **_tolerances(evidence)}.items()}
        by_truth: list[str] = []
        noise_ratio = 0.0
        for t in usable:
            if t.observed.error:
                return CheckResult(False, f"inputs x{t.scale:g}: raised {t.observed.error}")
            cmp = compare_outputs(t.expected, t.observed.output, tolerances=tol, scale_aware=True, truth=evidence.truth_of(t),
                                  noise_factor=self.reference_noise_factor)
            if not cmp.ok:
                return CheckResult(False, f"inputs x{t.scale:g} (reference stays finite): {cmp.detail}",
                                   data={"scale": t.scale, "noise_ratio": cmp.noise_ratio})
            if cmp.by_truth:
                by_truth.append(f"x{t.scale:g}")
                noise_ratio = max(noise_ratio, cmp.noise_ratio)
        judged = (f"; at {', '.join(by_truth)} as accurate as PyTorch fp32 against the float64 reference"
                  if by_truth else "")
        return CheckResult(True, f"stable at input scales {', '.join(f'x{t.scale:g}' for t in usable)}{judged}",
                           data={"probes": len(usable), "by_float64_truth": by_truth,
                                 "noise_ratio": round(noise_ratio, 3)})


@dataclass
class DeterminismCheck:
    """Two calls on the same inputs agree bitwise (``allow_nondeterminism``: within tolerance)."""

    name: str = "determinism"
    stage: int = DETERMINISM
    hard: bool = True
    where: str = "worker"
    needs: frozenset[str] = frozenset({"repeat"})
    allow_nondeterminism: bool = False

    def applies(self, backend: str, device: str) -> bool:
        return True

    def evaluate(self, evidence: Evidence) -> CheckResult:
        if not evidence.repeat or not evidence.trials:
            return CheckResult(True, "not run")
        first = evidence.trials[0].observed
        for again in evidence.repeat:
            if again.observed.error or first.error:
                return CheckResult(False, f"repeated call raised {again.observed.error or first.error}")
            a, b = first.output or [], again.observed.output or []
            if self.allow_nondeterminism:
                cmp = compare_outputs(a, b, tolerances=_tolerances(evidence))
                if not cmp.ok:
                    return CheckResult(False, f"two calls on the same inputs disagree: {cmp.detail}")
            elif len(a) != len(b) or not all(bitwise_equal(x, y) for x, y in zip(a, b)):
                return CheckResult(False, "two calls on the same inputs gave different bits")
        return CheckResult(True, "two calls on the same inputs agree bitwise" if not self.allow_nondeterminism
                           else "two calls on the same inputs agree within tolerance")


ALL_CHECKS = {c.name: c for c in (CorrectnessCheck, IntegrityCheck, MemoryCheck, RaceCheck, StabilityCheck,
                                  DeterminismCheck)}


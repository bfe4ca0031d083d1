"""Checks that judge what the worker observed while running the candidate.

Every ``evaluate`` runs in the judging process on an :class:`core.verification.evidence.Evidence`; the worker
only collected outputs, inputs after the call, launch counts, the ATen audit and memory findings.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any, ClassVar

from core.api.evidence import (
    CORRECTNESS,
    DETERMINISM,
    INTEGRITY,
    MEMORY,
    RACE_FINDING,
    RACE_SUMMARY,
    RACES,
    STABILITY,
    TAMPERED,
    UNPRODUCED,
    Evidence,
    Trial,
)
from core.api.numerics import REFERENCE_NOISE_FACTOR, bitwise_equal, compare_outputs, inputs_intact, is_domain
from core.verdict import CheckResult


def _tolerances(evidence: Evidence) -> dict:
    return {k: tuple(v) for k, v in (evidence.config.get("tolerances") or {}).items()}


@dataclass
class CorrectnessCheck:
    """Every trial (fresh random inputs each) matches the reference within dtype-aware tolerances
    (or, where the task also ran in float64, is as accurate against that truth as the fp32
    reference within ``reference_noise_factor``); the inputs are bitwise unchanged afterwards.
    ``data``: matched / trials."""

    name: str = "correctness"
    reads: ClassVar[frozenset[str]] = frozenset({"trials"})  # the runs whose outputs it compares (Check.reads)
    stage: int = CORRECTNESS
    hard: bool = True
    where: str = "worker"
    needs: frozenset[str] = frozenset({"trials"})
    reference_noise_factor: float = REFERENCE_NOISE_FACTOR

    def applies(self, backend: str, device: str) -> bool:
        return True

    @staticmethod
    def verdict_fields(result: CheckResult) -> dict[str, Any]:
        """The verdict's accuracy (trials matched) and correctness."""
        data = result.data or {}
        return {"accuracy": (data.get("matched", 0) / data["trials"]) if data.get("trials") else 0.0,
                "correct": bool(result.passed)}

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
            cmp = compare_outputs(trial.expected, obs.output, tolerances=_tolerances(evidence), truth=evidence.truth_of(trial), truth_noise=evidence.noise_of(trial),
                                  noise_factor=self.reference_noise_factor)
            worst = max(worst, cmp.max_abs_err)
            by_truth += cmp.by_truth
            if cmp.ok:
                matched += 1
            else:
                first_failure = first_failure or f"trial {i}: {cmp.detail}"
        data = {"matched": matched, "trials": len(trials), "max_abs_err": worst, "by_float64_truth": by_truth,
                "float64_reference": evidence.config.get("float64_truth_note", "not requested")}
        if "judge_kernels" in evidence.config:  # the keeper's: lent kernels, or torch (and why)
            data["judge_kernels"] = evidence.config["judge_kernels"]
        if matched == len(trials):
            judged = f"; {by_truth} output(s) judged against the float64 reference" if by_truth else ""
            return CheckResult(True, f"{matched}/{len(trials)} trials match the reference (max abs err {worst:.3g}){judged}",
                               data=data)
        return CheckResult(False, f"{matched}/{len(trials)} trials match; {first_failure}", data=data,
                           hack=mutated is not None)


def _laundering(trial: Trial, evidence: Evidence) -> list[str]:
    """The trial's provenance findings that show laundering. Output elements nothing produced
    count only when the outputs match the reference: the right answer in memory no kernel wrote
    came from elsewhere; a wrong one is a plain bug, which the correctness check reports."""
    found = [f for f in trial.observed.provenance if not f.startswith(UNPRODUCED)]
    unproduced = [f[len(UNPRODUCED):] for f in trial.observed.provenance if f.startswith(UNPRODUCED)]
    if unproduced and compare_outputs(trial.expected, trial.observed.output, tolerances=_tolerances(evidence),
                                      truth=evidence.truth_of(trial), truth_noise=evidence.noise_of(trial)).ok:
        found += [f"{f}, yet the outputs are right" for f in unproduced]
    return found


def _all_empty(values: list[Any] | None) -> bool:
    """Every value is a tensor (or a held one) without elements: a call with nothing to compute."""
    return bool(values) and all(hasattr(v, "numel") and hasattr(v, "shape") and v.numel() == 0 for v in values)


def no_work(trial: Trial) -> bool:
    """The call had no work: the reference's outputs and the candidate's are all empty."""
    return _all_empty(trial.expected) and _all_empty(trial.observed.output)


@dataclass
class IntegrityCheck:
    """The kernels really did the work: at least one launch of the backend's kernels per call that
    has work (a call whose outputs, the reference's and the candidate's, are all empty needs none),
    no PyTorch compute op inside ``ModelNew.forward`` (ATen-level audit), outputs that are exact
    tensors whose every element a kernel or a constant fill produced and kernels that read only
    memory of known origin (``Backend.provenance``, on CPU), no silent precision
    downcast, no output buffer handed back twice, no blocked sandbox escape."""

    name: str = "integrity"
    reads: ClassVar[frozenset[str]] = frozenset({"trials"})  # the runs whose outputs it compares (Check.reads)
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
        provenance = [f for t in runs for f in _laundering(t, evidence)]
        if provenance:
            return CheckResult(False, f"provenance: {provenance[0]}", data={"provenance": provenance[:8]}, hack=True)
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
        idle = [t for t in ran if no_work(t)]
        starved = [i for i, t in enumerate(ran) if t.observed.launches < self.min_launches and not no_work(t)]
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
        empty = f"; {len(idle)} call(s) with only empty outputs needed no launch" if idle else ""
        return CheckResult(True, f"{min(launches)}-{max(launches)} kernel launches per call; no PyTorch compute in "
                           f"forward{empty}",
                           data={"launches": launches[:16], "empty_calls": len(idle),
                                 "kernels": sorted({k for t in ran for k in t.observed.kernels})})


@dataclass
class MemoryCheck:
    """No out-of-bounds load or store (bounds-checked Triton interpreter on CPU)."""

    name: str = "memory"
    reads: ClassVar[frozenset[str]] = frozenset()  # the runs whose outputs it compares (Check.reads)
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
                if f not in findings and not f.startswith((RACE_FINDING, RACE_SUMMARY)):
                    findings.append(f)
        if findings:
            return CheckResult(False, f"out-of-bounds memory access: {findings[0]}", data={"findings": findings[:16]})
        return CheckResult(True, f"every load and store of {len(evidence.all_runs())} calls stayed inside its arguments' memory")


@dataclass
class RaceCheck:
    """No data race between programs, found by construction: in the shuffled runs the interpreter
    records every address each program loads, stores or touches atomically, and an address that one
    program writes and another touches, outside atomics, is a race (``plugins/backends/
    triton_interp_checks.py``; two programs storing the same bits is not). The interpreter runs
    programs one at a time, so a lost update cannot show in the values; the shuffled orders stay a
    second signal: their outputs must still match the reference."""

    name: str = "races"
    reads: ClassVar[frozenset[str]] = frozenset({"shuffled"})  # the runs whose outputs it compares (Check.reads)
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
        races = _lines(evidence.shuffled, RACE_FINDING)
        summaries = _lines(evidence.shuffled, RACE_SUMMARY)
        data = {"races": races[:8], "analysis": summaries[:4]}
        if races:
            return CheckResult(False, f"a data race between programs: {races[0]}", data=data)
        for i, trial in enumerate(evidence.shuffled):
            if trial.observed.error:
                return CheckResult(False, f"shuffled program order {i} raised {trial.observed.error}", data=data)
            cmp = compare_outputs(trial.expected, trial.observed.output, tolerances=_tolerances(evidence),
                                  truth=evidence.truth_of(trial), truth_noise=evidence.noise_of(trial))
            if not cmp.ok:
                return CheckResult(False, f"result depends on program order (a race between programs): "
                                   f"shuffled order {i}: {cmp.detail}", data=data)
        if summaries:
            cut = [s for s in summaries if "cut short" in s]
            how = (f"address analysis cut short ({cut[0]})" if cut
                   else "no address shared between programs outside atomics")
        elif all(t.observed.launches == 0 for t in evidence.shuffled):
            how = "no launch to analyse"
        else:
            how = "no address analysis from this backend"
        return CheckResult(True, f"{how}; same answer under {len(evidence.shuffled)} shuffled program orders",
                           data=data)


def _lines(runs: list[Trial], prefix: str) -> list[str]:
    """The backend's findings of ``runs`` that start with ``prefix``, without the prefix, each once."""
    out: list[str] = []
    for trial in runs:
        for f in trial.observed.oob:
            if f.startswith(prefix) and f[len(prefix):] not in out:
                out.append(f[len(prefix):])
    return out


# The probes (scales and distributions, drawn per verification) are core.verification.probes'.


@dataclass
class StabilityCheck:
    """Numeric probes at unusual input magnitudes and distributions, drawn afresh per verification
    (core.verification.probes): wherever the reference is finite, the candidate must be too, and
    agree to a looser, magnitude-relative tolerance. A probe where the reference is nowhere finite
    is reported as unusable, never dropped silently.

    Where the task also ran in float64 on the probe's inputs, an output that misses the fp32
    reference passes when its error against that truth is within the tolerance or within
    ``reference_noise_factor`` x the fp32 reference's own error against it: ill-conditioned
    compositions (a normalisation after a bias, at x1e-5) amplify rounding noise, PyTorch's fp32
    result carries it too, and a kernel that rounds differently is not less accurate for that."""

    name: str = "stability"
    reads: ClassVar[frozenset[str]] = frozenset({"probes"})  # the runs whose outputs it compares (Check.reads)
    stage: int = STABILITY
    hard: bool = True
    where: str = "worker"
    needs: frozenset[str] = frozenset({"probes"})
    tolerance_factor: float = 10.0
    reference_noise_factor: float = REFERENCE_NOISE_FACTOR

    def applies(self, backend: str, device: str) -> bool:
        return True

    def evaluate(self, evidence: Evidence) -> CheckResult:
        if not evidence.probes:
            return CheckResult(True, "no probe was requested", data={"probes": 0})
        tol = {k: (a * self.tolerance_factor, r * self.tolerance_factor)
               for k, (a, r) in {**{"float32": (1e-4, 1e-4), "float16": (1e-2, 1e-2), "bfloat16": (2e-2, 2e-2),
                                     "float64": (1e-6, 1e-6)}, **_tolerances(evidence)}.items()}
        by_truth: list[str] = []
        judged: list[str] = []
        unusable: list[str] = []
        noise_ratio = 0.0
        outliers: dict[str, dict] = {}
        for t in evidence.probes:
            name = t.probe or f"x{t.scale:g}"
            if t.observed.error:
                return CheckResult(False, f"inputs {name}: raised {t.observed.error}", data={"probe": name})
            # the domain sweep's outputs span dozens of decades: judged element by element
            how = "median" if is_domain(name) else True
            cmp = compare_outputs(t.expected, t.observed.output, tolerances=tol, scale_aware=how, truth=evidence.truth_of(t),
                                  truth_noise=evidence.noise_of(t), noise_factor=self.reference_noise_factor)
            if cmp.outliers:
                outliers[name] = {"count": cmp.outliers, "positions": cmp.outlier_positions}
            if not cmp.ok:
                return CheckResult(False, f"inputs {name}: {cmp.detail}",
                                   data={"scale": t.scale, "probe": name, "noise_ratio": cmp.noise_ratio})
            if cmp.judged == 0 and any(getattr(e, "numel", lambda: 0)() for e in t.expected):
                unusable.append(name)  # the reference is nowhere finite: nothing to judge, said so
                continue
            judged.append(name)
            if cmp.by_truth:
                by_truth.append(name)
                noise_ratio = max(noise_ratio, cmp.noise_ratio)
        data = {"probes": len(judged), "judged": judged, "unusable": unusable, "by_float64_truth": by_truth,
                "noise_ratio": round(noise_ratio, 3), "outliers": outliers}
        note = (f"; {len(unusable)} probe(s) unusable, the reference nowhere finite: {', '.join(unusable)}"
                if unusable else "")
        if not judged:
            return CheckResult(True, f"no probe could be judged{note}", data=data)
        judged_by = (f"; at {', '.join(by_truth)} as accurate as PyTorch fp32 against the float64 reference"
                     if by_truth else "")
        if outliers:
            judged_by += "; isolated rounding outliers forgiven: " + ", ".join(
                f"{k}: {v['count']} at {v['positions'][:4]}" for k, v in outliers.items())
        return CheckResult(True, f"stable on probes {', '.join(judged)} (where the reference is finite){judged_by}{note}",
                           data=data)


# Atomics whose result depends on the order programs reach them: a float atomic_add reorders a sum,
# an exchange or a compare-and-swap (a lock around an accumulation) lets the last or first writer win.
ORDER_DEPENDENT_ATOMICS = frozenset({"atomic_add", "atomic_xchg", "atomic_cas"})


def atomics_used(tree: ast.Module | None) -> list[str]:
    """The order-dependent atomics the candidate's source calls (``tl.atomic_add(...)`` and the like)."""
    if tree is None:
        return []
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if name in ORDER_DEPENDENT_ATOMICS:
                found.add(name)
    return sorted(found)


@dataclass
class DeterminismCheck:
    """Two calls on the same inputs agree bitwise (``allow_nondeterminism``: within tolerance).

    A candidate whose kernels use order-dependent atomics (a float ``atomic_add`` across programs
    reorders the sum on a GPU), or whose repeat ran other autotune configs than its first trial (the
    interpreter runs config i in call i, so that every config is run), is not failed for different
    bits: its repeat must instead match the reference as a correctness trial does, and the verdict
    reports that it is not bitwise reproducible (``data["bitwise"] = False``)."""

    name: str = "determinism"
    reads: ClassVar[frozenset[str]] = frozenset({"repeat", "first_trial"})  # the runs whose outputs it compares (Check.reads)
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
        atomics = atomics_used(evidence.tree)
        reported, why = [], ""
        for again in evidence.repeat:
            if again.observed.error or first.error:
                return CheckResult(False, f"repeated call raised {again.observed.error or first.error}")
            a, b = first.output or [], again.observed.output or []
            if self.allow_nondeterminism:
                cmp = compare_outputs(a, b, tolerances=_tolerances(evidence))
                if not cmp.ok:
                    return CheckResult(False, f"two calls on the same inputs disagree: {cmp.detail}")
            elif len(a) != len(b) or not all(bitwise_equal(x, y) for x, y in zip(a, b)):
                configs = _other_configs(first.kernels, again.observed.kernels)
                if not atomics and not configs:
                    return CheckResult(False, "two calls on the same inputs gave different bits")
                why = (f"the kernels' {', '.join(atomics)} reorder floating-point work between calls" if atomics
                       else f"the autotuner ran other configs ({configs})")
                data = {"bitwise": False, "atomics": atomics, "autotune": configs}
                cmp = compare_outputs(again.expected, b, tolerances=_tolerances(evidence),
                                      truth=evidence.truth_of(again), truth_noise=evidence.noise_of(again))
                if not cmp.ok:
                    return CheckResult(False, f"two calls on the same inputs gave different bits, and the repeat "
                                       f"misses the reference: {cmp.detail}", data=data)
                reported.append(cmp.detail)
        if reported:
            return CheckResult(True, f"not bitwise reproducible: {why}; the repeat matches the reference "
                               f"({reported[0]})", data=data)
        return CheckResult(True, "two calls on the same inputs agree bitwise" if not self.allow_nondeterminism
                           else "two calls on the same inputs agree within tolerance",
                           data={"bitwise": True} if not self.allow_nondeterminism else {})


def _other_configs(first: list[str], again: list[str]) -> str:
    """How two calls' launches differ when they differ only in the autotune configs the interpreter
    chose (``kernel[BLOCK=256]``, plugins/backends/triton_backend.py); "" otherwise."""
    def base(name: str) -> str:
        return name.split("[", 1)[0]

    if first == again or len(first) != len(again) or [base(k) for k in first] != [base(k) for k in again]:
        return ""
    return "; ".join(f"{x} then {y}" for x, y in zip(first, again) if x != y)[:300]

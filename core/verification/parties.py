"""What the parts of one verification see of each other, named here so none imports another for its type.

The judge (:class:`~core.verification.judge.Verifier`) makes a :class:`~core.verification.pipeline.Verification`
per pair; the verification holds a :class:`~core.verification.keeper.Keeper` and its
:class:`~core.verification.observations.ExtraObservations`, and the judge's GPU sharing
(:mod:`core.verification.gpusharing`) reads the verification back. With these Protocols the modules
depend on this one, not on each other, and core has no import cycle even among type-only imports
(tests/test_architecture.py).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol


class VerifierView(Protocol):
    """What a verification, its keeper and its observations read of the Verifier that made them."""

    backend_name: str
    device: str
    trials: int
    checks: list[Any]
    pool: Any  # core.verification.sandbox.WorkerPool of candidate workers
    reference_pool: Any  # ... of reference workers
    tolerances: dict[str, tuple[float, float]]
    probe_scales: dict[str, Any]
    float64_max_elements: int
    float64_on_demand: bool
    compile_ahead: bool  # compile the candidate's kernels before its first turn on a shared GPU
    compare_on_device: bool
    compile_only: str | None
    device_lock: Any
    inputs_by_seed: bool
    accept_unchecked: bool | frozenset[str]
    baselines_early: str  # "trials" or "start": when a small task's baselines start (Verifier's docstring)

    def accepts_unchecked(self, check: str) -> bool: ...

    def _request(self, pool: Any, message: dict[str, Any], budget: Any, on_gpu: bool = False) -> dict[str, Any]: ...

    def _on_gpu(self, worker: Any, message: dict[str, Any], budget: Any) -> dict[str, Any]: ...

    def _gpu(self, budget: Any, exclusive: bool = False, label: str = "") -> AbstractContextManager[Any]: ...

    def _reserved(self, verification: VerificationView) -> AbstractContextManager[Any]: ...

    def _baseline(self, check: Any, config: dict[str, Any], evidence: Any, budget: Any) -> dict[str, Any]: ...


class VerificationView(Protocol):
    """What the observations and the judge's GPU sharing read of one verification."""

    verifier: VerifierView
    task: Any  # core.task.Task
    candidate: Any  # core.task.Candidate
    verdict: Any  # core.verdict.Verdict
    deferred: list[Any]  # checks judged after the GPU stages (their work is off the GPU)
    evidence: Any  # core.verification.evidence.Evidence
    budget: Any  # core.verification.budget.Budget
    worker: Any
    checks: list[Any]
    needs: set[str]
    probes: list[tuple[dict, int, dict[str, Any]]]
    ref_trials: list[dict[str, Any]]
    trial_seeds: list[int]
    alone: bool
    ran_alone: bool
    output_bytes: int
    early_baselines: dict[str, Any]  # check name -> observations.EarlyBaseline

    def baseline(self, check: Any, config: dict[str, Any]) -> dict[str, Any]: ...

    def run_in_candidate(self, runs: list[dict[str, Any]]) -> list[Any]: ...

    def judge_ready(self, done: set[str]) -> None: ...

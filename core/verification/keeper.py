"""The judge's side of a verification's keeper (:mod:`core.verification.devicemem`).

The keeper is a reference worker that holds the reference's outputs and adopts the candidate's,
so comparisons run where the data is; the judge's checks see :class:`HeldTensor` handles.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.verification.budget import Budget, record_peak
from core.verification.evidence import Comparison, Evidence, HeldTensor
from core.verification.gpumemory import GpuOutOfMemory, is_out_of_memory
from core.verification.protocol import Op, request
from core.verification.sandbox import WorkerFailure

if TYPE_CHECKING:
    from core.verification.parties import VerifierView as Verifier


class Keeper:
    """One verification's keeper: the reference worker it holds from the reference to the verdict."""

    def __init__(self, verifier: "Verifier", worker: Any, budget: Budget, evidence: Evidence, lean: bool = False):
        self.verifier, self.worker, self.budget, self.evidence = verifier, worker, budget, evidence
        self.token = secrets.token_hex(8)
        self.lean = lean  # the candidate's adopted outputs wait in the keeper's host memory, not the device's
        self.offloaded = 0  # how many it kept so

    def _ask(self, message: dict[str, Any]) -> dict[str, Any]:
        # GPU work (copies, comparisons): under the shared lock, so never inside another's timed stage
        with self.verifier._gpu(self.budget, label=f"keeper {message.get('op')}"):
            try:
                answer = self.worker.request({**message, "token": self.token}, timeout_s=max(10.0, self.budget.left()))
            except WorkerFailure as exc:
                raise WorkerFailure("error", f"the reference worker keeping the outputs failed: {exc.detail}") from None
        record_peak(self.budget, f"keeper {message.get('op')}", answer)
        if not answer.get("ok"):
            if is_out_of_memory(answer.get("error")):
                raise GpuOutOfMemory(f"the keeper's {message.get('op')}", str(answer.get("error")))
            raise WorkerFailure("error", f"the reference worker keeping the outputs failed: {answer.get('error')}")
        return answer

    def wrap(self, items: list[Any] | None) -> list[Any] | None:
        """Descriptors from the keeper to :class:`HeldTensor` handles (plain values as they are)."""
        if items is None:
            return None
        return [HeldTensor(d["held"], d["shape"], d["dtype"], d["finite"], self) if "held" in d else d.get("value")
                for d in items]

    @staticmethod
    def _names(items: list[Any]) -> list[dict[str, Any]]:
        return [{"held": x.key} if isinstance(x, HeldTensor) else {"value": x} for x in items]

    def adopt(self, candidate_worker: Any, observations: list[dict[str, Any]], refs: list[int]) -> None:
        """Have the keeper take the candidate's exported outputs; they become handles in ``observations``.
        ``refs[i]``: the reference run observation ``i`` is judged against."""
        exported = [(o, ref) for o, ref in zip(observations, refs) if o.get("output") is not None]
        if exported:
            answer = self._ask(request(Op.ADOPT, allowed_dir=str(Path(candidate_worker.scratch) / "exports"),
                                       runs=[{"outputs": o["output"], "expect": ref} for o, ref in exported],
                                       offload=self.lean))
            self.offloaded = int(answer.get("offloaded") or 0)
            exported = [o for o, _ in exported]
            short = next((r["error"] for r in answer["runs"] if r.get("error") and not r.get("forged")
                          and is_out_of_memory(r["error"])), None)
            if short is not None:  # the keeper could not hold them: the device's memory, not the candidate's fault
                candidate_worker.request(request(Op.DROP_EXPORTS), timeout_s=max(10.0, self.budget.left()))
                raise GpuOutOfMemory("the keeper's adopt", str(short))
            for obs, run in zip(exported, answer["runs"]):
                if run.get("error"):
                    obs["output"] = None
                    obs["error"] = obs.get("error") or f"its outputs could not be read: {run['error']}"
                    if run.get("forged"):  # our harness code describes outputs truthfully; it was tampered with
                        obs.setdefault("sandbox", []).append(f"its outputs were handed over forged ({run['error']})")
                else:
                    obs["output"] = self.wrap(run["outputs"])
        candidate_worker.request(request(Op.DROP_EXPORTS), timeout_s=max(10.0, self.budget.left()))

    def compare(self, expected: list[Any], got: list[Any], *, tolerances: dict | None, scale_aware: bool,
                truth: bool, noise_factor: float) -> Comparison:
        answer = self._ask(request(Op.COMPARE, expected=self._names(expected), got=self._names(got),
                                   tolerances={k: list(v) for k, v in (tolerances or {}).items()},
                                   scale_aware=scale_aware, truth=truth, noise_factor=noise_factor))
        self.evidence.config["float64_truth"] = answer["truth_trusted"]
        self.evidence.config["float64_truth_note"] = answer["truth_note"]
        self.evidence.config["judge_kernels"] = answer.get("judge_kernels", "torch")  # who compared large outputs
        return Comparison(**answer["comparison"])

    def equal(self, a: list[Any], b: list[Any]) -> bool:
        return bool(self._ask(request(Op.EQUAL, a=self._names(a), b=self._names(b)))["equal"])

    def fetch(self, items: list[Any]) -> list[Any]:
        return list(self._ask(request(Op.FETCH, items=self._names(items)))["values"])

    def release(self, items: list[Any]) -> None:
        """Drop candidate outputs (handles) that no check still to be evaluated reads."""
        self._ask(request(Op.RELEASE, items=self._names(items)))

    def forget(self) -> bool:
        """Free the verification's tensors in the keeper; False when the keeper must be replaced."""
        try:
            return bool(self.worker.request(request(Op.FORGET, token=self.token), timeout_s=30).get("ok"))
        except WorkerFailure:
            return False

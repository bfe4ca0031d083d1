"""The costlier observations of one verification, asked only after the trials' checks passed.

Shuffled program orders (races), a repeat (determinism) and stability probes (scaled inputs) run
in the candidate worker as the checks' ``needs`` say; then each check that defines ``collect``
makes its own measurement there (GPU timing, a sanitizer run), with its ``prepare`` while the GPU
is shared and, for ``baseline_per_task`` checks, the task's baseline.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from dataclasses import asdict, is_dataclass
from typing import TYPE_CHECKING, Any

from core.contracts import optional
from core.verification.budget import record_peak
from core.verification.probes import describe as describe_probe
from core.verification.probes import scale_of
from core.verification.evidence import Trial
from core.verification.gpumemory import EARLY_BASELINE_MAX_BYTES, GpuOutOfMemory, is_out_of_memory
from core.verification.protocol import Op, request

if TYPE_CHECKING:
    from core.verification.parties import VerificationView as Verification

def fresh_seed() -> int:
    """A seed no candidate can guess: inputs, init weights and program orders are drawn from these."""
    return secrets.randbits(62)


def inputs_of(ref_trial: dict[str, Any], seed: int, scale: float | dict = 1.0) -> dict[str, Any]:
    """What a run request carries: the seed to draw the inputs from, or the reference's inputs."""
    if "inputs" in ref_trial:
        return {"inputs": ref_trial["inputs"]}
    return {"seed": seed, "scale": scale}


# Check fields that are not configuration: a collect request carries the others.
_NOT_CONFIG = ("name", "stage", "hard", "where", "needs")



def check_config(check: Any) -> dict[str, Any]:
    """What a check's worker-side requests carry: its dataclass fields but those of :data:`_NOT_CONFIG`."""
    return {k: x for k, x in asdict(check).items() if k not in _NOT_CONFIG} if is_dataclass(check) else {}


class TimingGate:
    """When a baseline set up early may be timed: :meth:`open` (the candidate's timing is done), or never
    (:meth:`cancel`: the verification ended first)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.cancelled = False

    def open(self) -> None:
        self._event.set()

    def cancel(self) -> None:
        self.cancelled = True
        self._event.set()

    def wait(self, timeout_s: float) -> bool:
        """True: time it now; False: it was cancelled, or nothing came within ``timeout_s``."""
        return self._event.wait(timeout_s) and not self.cancelled


class EarlyBaseline(threading.Thread):
    """One check's baseline measured in a thread; ``result`` once done (None until then, or if it raised).
    ``gated``: only its set-up runs now; its timing waits for :meth:`time_now`, after the candidate's own."""

    def __init__(self, v: "Verification", check: Any, gated: bool = False):
        super().__init__(daemon=True, name=f"kz-baseline-{check.name}")
        self.v, self.check, self.result = v, check, None
        self.gate = TimingGate() if gated else None

    def run(self) -> None:
        extra = {"gate": self.gate} if self.gate is not None else {}
        self.result = self.v.baseline(self.check, check_config(self.check), **extra)

    def time_now(self) -> None:
        if self.gate is not None:
            self.gate.open()

    def cancel(self) -> None:
        """The verification ends: a set-up still waiting to be timed gives its worker back, untimed."""
        if self.gate is not None:
            self.gate.cancel()


def start_baselines(v: "Verification", whole_only: bool = False) -> dict[str, EarlyBaseline]:
    """Start the task's per-task baselines now, once the candidate passed its trials' checks, in threads beside
    its remaining stages, where its footprint makes room (``Footprint.parts["early_baseline"]``,
    :func:`core.verification.gpumemory.estimate`): the set-up (torch.compile: seconds of CPU, 4-5 s of a
    verdict on the H200) then overlaps those stages instead of following the candidate's timing. A task whose
    timed stage is small (:data:`EARLY_BASELINE_MAX_BYTES`) is measured whole; a larger one is set up now and
    timed after the candidate's timing (its ``collect``, :meth:`ExtraObservations.collect`, opens the gate and
    takes the result). The verification cancels and joins these threads before it gives its memory back.
    ``whole_only`` (the verifier's ``baselines_early="start"``, before the reference stage): only a small task's
    baseline, measured whole; its timed stage (at most :data:`EARLY_BASELINE_MAX_BYTES`) is then held beside
    the reference and trials too, within the admission's margin."""
    footprint = getattr(v.verifier, "footprints", {}).get(v.task.id)
    if footprint is None or not footprint.parts.get("early_baseline") or getattr(v, "lean", False):
        return {}
    admission = getattr(v.verifier, "memory_admission", None)
    if admission is not None and footprint.bytes > admission.capacity:
        # it holds the device alone and its estimate is already over what is admitted: the set-up beside it
        # (early_baseline fits under the verification's own peak, not the device's) would deepen the overrun
        # (H100, 2026-12-06: 26_GELU_, 92 GiB estimated, 71 admitted, ran out of memory alone while a cold
        # torch.compile set-up held its 12 GiB for 8 s beside the keeper's comparison)
        v.verdict.gpu_memory = {**(getattr(v.verdict, "gpu_memory", None) or {}),
                                "early_baseline": "after the timing: the estimate is over the memory admitted"}
        return {}
    gated = footprint.parts.get("timing", EARLY_BASELINE_MAX_BYTES + 1) > EARLY_BASELINE_MAX_BYTES
    if gated and whole_only:
        return {}
    started = {}
    for check in v.checks:
        if optional(check, "Check", "baseline_per_task") and check.name not in v.verdict.checks:
            started[check.name] = EarlyBaseline(v, check, gated)
            started[check.name].start()
    return started


class ExtraObservations:
    """Stage 4 of a :class:`~core.verification.pipeline.Verification`: its extra runs, recorded in
    the evidence, and its checks' own measurements, found at ``evidence.extra[check.name]``."""

    def __init__(self, verification: "Verification"):
        self.verification = verification

    def make(self) -> None:
        """The extra runs the checks need, then every ``collect`` check's measurement."""
        v = self.verification
        evidence, checks, needs, probes = v.evidence, v.checks, v.needs, v.probes
        t = time.perf_counter()
        v.budget.phase = "extra"
        race_orders = max((optional(c, "Check", "orders") for c in checks if "shuffled" in c.needs), default=0)
        base, first_seed = v.ref_trials[0], v.trial_seeds[0]
        groups: list[tuple[str, list[dict[str, Any]]]] = []
        if "shuffled" in needs:
            groups.append(("shuffled", [{"name": f"shuffled{i}", "ref": 0, **inputs_of(base, first_seed),
                                         "order_seed": fresh_seed()} for i in range(race_orders)]))
        if "repeat" in needs:
            groups.append(("repeat", [{"name": "repeat0", "ref": 0, **inputs_of(base, first_seed)}]))
        if "probes" in needs:  # reference runs after the trials' are the probes'
            groups.append(("probes", [{"name": f"probe{i}", "ref": len(v.trial_seeds) + i, **inputs_of(r, seed, scale)}
                                      for i, (scale, seed, r) in enumerate(probes)]))
        done = {"trials"}
        for kind, runs in groups:  # each kind's checks judged as soon as its runs are in, then its outputs dropped
            if runs:
                self.record(runs, v.run_in_candidate(runs))
            done.add(kind)
            v.judge_ready(done)
        v.verdict.stage_s["extra"] = time.perf_counter() - t
        v.budget.phase = "timing"  # a baseline built beside these stages counts in the phase it ends in
        for check in checks:
            if optional(check, "Check", "collect") is not None:
                self.collect(check)

    def record(self, runs: list[dict[str, Any]], observed: list[Any]) -> None:
        """The extra runs' observations, as trials of the evidence (with their reference runs)."""
        v = self.verification
        evidence, probes = v.evidence, v.probes
        base, first_seed = v.ref_trials[0], v.trial_seeds[0]
        for run, obs in zip(runs, observed):
            kind = run["name"].rstrip("0123456789")
            if kind == "probe":
                k = int(run["name"][5:])
                scale, seed, r = probes[k]
                loaded = evidence.config.get("float64_probe_runs")  # the truth came on demand, before the probes ran
                source = loaded[k] if loaded else r
                trusted = evidence.config.get("float64_truth")
                truth, noise = (source.get("truth"), source.get("truth_noise")) if trusted else (None, None)
                evidence.probes.append(Trial(seed, r.get("inputs"), r["output"], obs, scale=scale_of(scale),
                                             truth=truth, truth_noise=noise, inputs_digest=r.get("inputs_digest"),
                                             probe=describe_probe(scale)))
            else:
                target = evidence.shuffled if kind == "shuffled" else evidence.repeat
                target.append(Trial(first_seed, base.get("inputs"), base["output"], obs,
                                    inputs_digest=base.get("inputs_digest"),
                                    truth=evidence.trials[0].truth if evidence.trials else None,
                                    truth_noise=evidence.trials[0].truth_noise if evidence.trials else None))

    def collect(self, check: Any) -> None:
        """``check``'s own measurement in the candidate worker (``Check.collect``), after its set-up
        (``prepare``) while the GPU is shared; found at ``evidence.extra[check.name]``."""
        v = self.verification
        verifier, worker, budget, evidence = v.verifier, v.worker, v.budget, v.evidence
        left = budget.left
        config = check_config(check)
        t_check = time.perf_counter()
        lock = verifier._gpu(budget, exclusive=bool(optional(check, "Check", "exclusive_device")), label=check.name)
        lock_wait_s = 0.0
        if optional(check, "Check", "locks_device_itself") and verifier.device_lock is not None:
            # e.g. a sanitizer run: seconds of CPU start-up around a moment of GPU work, which
            # takes the shared lock itself so a timed stage need not wait through the start-up.
            config["device_lock"] = {**verifier.device_lock.describe(), "wait_s": verifier.gpu_wait_s,
                                     "hold_s": left()}
            lock, lock_wait_s = contextlib.nullcontext(), verifier.gpu_wait_s
        prepared = None
        if optional(check, "Check", "prepare") is not None:  # set-up while shared: an exclusive stage only times
            with verifier._gpu(budget, label=f"{check.name} prepare"):
                prepared = worker.request(request(Op.COLLECT, check=check.name, config=config, phase="prepare"),
                                          timeout_s=left())
        prepare_failed = prepared is not None and (not prepared.get("ok") or
                                                   bool((prepared.get("data") or {}).get("error")))
        if prepare_failed:  # nothing to time: its error is the stage's
            answer = prepared
        else:
            with lock:
                answer = worker.request(request(Op.COLLECT, check=check.name, config=config),
                                        timeout_s=left() + lock_wait_s)
            record_peak(budget, f"candidate {check.name}", answer)
        oom = answer.get("error") if not answer.get("ok") else (answer.get("data") or {}).get("error")
        if is_out_of_memory(oom):  # not the candidate's fault (core.verification.gpumemory)
            raise GpuOutOfMemory(f"the {check.name} stage", str(oom))
        if lock_wait_s:  # its wait for the GPU is given back too, as in Verifier._gpu
            budget.waited(float((answer.get("data") or {}).get("gpu_lock_wait_s") or 0.0))
        if optional(check, "Check", "dirties_worker")():  # the next candidate gets a fresh worker
            evidence.config["worker_dirty"] = True
        data = answer.get("data") if answer.get("ok") else {"error": answer.get("error")}
        if isinstance(data, dict) and prepared is not None and prepared.get("ok"):
            data.setdefault("phases_s", {})["prepare"] = (prepared.get("data") or {}).get("prepare_s")
        if isinstance(data, dict) and not data.get("error") and optional(check, "Check", "baseline_per_task"):
            early = v.early_baselines.get(check.name)
            if early is not None:
                if early.gate is not None:  # a set-up that waited for the candidate's timing is timed now
                    v.budget.phase = "baseline"
                early.time_now()
                early.join(timeout=max(1.0, budget.left()))
                v.budget.phase = "timing"
            if early is not None and early.result is not None:
                data["baseline"] = early.result
            else:
                v.budget.phase = "baseline"  # after the candidate's timing, in a baseline worker
                data["baseline"] = v.baseline(check, config)
                v.budget.phase = "timing"
        v.verdict.stage_s[check.name] = time.perf_counter() - t_check  # lock waits included
        evidence.extra[check.name] = data

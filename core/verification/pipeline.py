"""One verification as a pipeline: the stages of judging one (task, candidate) pair.

:meth:`core.verification.judge.Verifier.verify` makes one :class:`Verification` per call and runs
it. The stages, cheapest first, stopping at the first hard failure:

1. the judge-side checks on the parsed source (:meth:`Verification.run`);
2. the reference trials in a reference worker, from fresh secret seeds (:meth:`~Verification.reference`);
3. the candidate loaded and run on the same inputs in a candidate worker (:meth:`~Verification.load`,
   :meth:`~Verification.trials`), then the checks that need only those trials;
4. the costlier observations (shuffled program orders, a repeat, stability probes) and each check's
   own measurement with its per-task baseline (:meth:`~Verification.extra_observations`,
   :meth:`~Verification.collect`, :meth:`~Verification.baseline`);
5. the verdict filled from the recorded checks (:meth:`~Verification.finish`).

A backend that cannot execute on the device only compiles (:func:`compile_only`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from core.contracts import optional
from core.task import Candidate, Task
from core.verdict import CheckResult, Verdict
from core.verification.budget import Budget, GpuBusy
from core.verification.evidence import Evidence, HeldTensor, RunObservation, Trial, parse_python, truth_agrees
from core.verification.gpumemory import GpuOutOfMemory, is_out_of_memory, runs_per_request
from core.verification.keeper import Keeper
from core.verification.observations import ExtraObservations, fresh_seed, inputs_of, start_baselines
from core.verification.probes import draw_plan
from core.verification.protocol import Op, request
from core.verification.sandbox import WorkerFailure

if TYPE_CHECKING:
    from core.verification.parties import VerifierView as Verifier


def task_dtype(task: Task) -> str:
    return (task.dtypes or ["float32"])[0].replace("torch.", "")


def vet_truth(evidence: Evidence, ref: dict[str, Any]) -> None:
    """Keep the float64 truth only if it is the task's own function: on the ordinary trials the
    fp32 reference must match it within the plain tolerance (else every run loses it)."""
    note = ref.get("truth_note") or ""
    trusted = False
    if not note:
        trusted, note = truth_agrees(evidence.trials, evidence.config.get("tolerances"))
    if not trusted:
        for trial in evidence.all_runs():
            trial.truth = None
    evidence.config["float64_truth"] = trusted
    evidence.config["float64_truth_note"] = note or "float64 reference in use"


VERDICT_FIELDS = frozenset({"accuracy", "correct", "timing", "roofline"})  # what Check.verdict_fields may fill


def finish_verdict(verdict: Verdict, all_checks: list[Any]) -> None:
    """Fill ``verdict``'s accepted/correct/accuracy/status/reason from its recorded checks;
    ``all_checks`` (the verifier's) say which are hard and in which stage they run."""
    hard = {c.name: c.hard for c in all_checks}
    stage = {c.name: c.stage for c in all_checks}
    for check in all_checks:  # the fields a check reports for the verdict (Check.verdict_fields)
        fields_of, result = optional(check, "Check", "verdict_fields"), verdict.checks.get(check.name)
        if fields_of is not None and result is not None:
            for key, value in fields_of(result).items():
                if key not in VERDICT_FIELDS:
                    raise ValueError(f"check {check.name!r} reports verdict field {key!r}; known: {sorted(VERDICT_FIELDS)}")
                setattr(verdict, key, value)
    failed = [n for n, c in verdict.checks.items() if not c.passed and hard.get(n, True)]
    # Integrity findings explain the rest, so they come first; then the earliest stage.
    failed.sort(key=lambda n: (not verdict.checks[n].hack, stage.get(n, 1)))
    verdict.accepted = bool(verdict.compiled and verdict.correct and not failed)
    verdict.status = "accepted" if verdict.accepted else "rejected"
    verdict.reason = None if verdict.accepted else (
        f"{failed[0]}: {verdict.checks[failed[0]].detail}" if failed else "not verified")


class InputsNotReproducible(RuntimeError):
    """The inputs the candidate's process drew from a trial's seed differ from the reference's: the task's
    ``get_inputs`` is not reproducible across processes (a constant drawn at import, entropy torch's seed
    does not govern), though two draws in the reference's process agreed. Not the candidate's fault, nor
    proof of tampering: ``Verifier.verify`` judges the pair again with the inputs sent as tensors, which
    nothing in the candidate's process can redraw."""


class Verification:
    """One verification of one pair, stage by stage; :meth:`run` fills :attr:`verdict`.

    It holds what its stages share: the task and candidate, the evidence the checks evaluate, the
    verdict, the budget, the keeper (with ``compare_on_device``) and the candidate worker it holds,
    and the reference's answer with the seeds it was drawn from.
    """

    budget: Budget  # set when the static stage is done: that stage is not timed against it

    def __init__(self, verifier: "Verifier", task: Task, candidate: Candidate, verdict: Verdict, timeout_s: float,
                 alone: bool = False, lean: bool = False, inputs_sent: bool = False):
        self.verifier, self.task, self.candidate, self.verdict = verifier, task, candidate, verdict
        self.timeout_s, self.inputs_sent = timeout_s, inputs_sent  # inputs_sent: tensors, never seeds (retry_after)
        self.alone = alone or lean  # retried after running out of GPU memory: the device and every turn to itself
        self.lean = lean  # ...and out of it alone: outputs in the keeper's host memory (Vault.adopt), no baseline
        self.ran_alone = self.alone  # set by the memory reservation (a footprint over the device's share)
        self.output_bytes = 0  # one run's outputs, as the memory reservation measured them (0: unknown)
        self.released: set[str] = set()  # the candidate's outputs the keeper dropped (release_unread)
        self.evidence = Evidence(task=task, candidate=candidate, backend=verifier.backend_name, device=verifier.device,
                                 config={"tolerances": verifier.tolerances, "trials": verifier.trials})
        self.keeper: Keeper | None = None
        self.worker: Any = None  # the candidate worker, from the load to the unload
        self.checks: list[Any] = []  # the worker-side checks
        self.needs: set[str] = {"trials"}  # the observations they need
        self.init_seed, self.trial_seeds = 0, []
        self.reference_request: dict[str, Any] = {}
        self.ref: dict[str, Any] = {}  # the reference worker's answer
        self.ref_trials: list[dict[str, Any]] = []
        self.probes: list[tuple[dict, int, dict[str, Any]]] = []  # (probe spec, seed, reference run)
        self.deferred: list[Any] = []  # checks waiting on work off the GPU, judged once its memory is given back
        self.early_baselines: dict[str, Any] = {}  # check -> its task's baseline, measured beside later stages

    # -- the stages, in order

    def run(self) -> None:
        """Judge-side checks, then the compile-only path or the executed one (with its keeper)."""
        verifier, candidate, verdict = self.verifier, self.candidate, self.verdict
        if candidate.declined:
            verdict.status, verdict.reason = "declined", f"declined: {candidate.declined}"
            return
        if candidate.backend and candidate.backend != verifier.backend_name:
            verdict.status = "error"
            verdict.reason = (f"candidate is for backend {candidate.backend!r}, this verifier judges "
                              f"{verifier.backend_name!r}")
            return
        try:
            self.evidence.tree = parse_python(candidate.source)
        except SyntaxError:
            self.evidence.tree = None
        stage_t = time.perf_counter()
        judge_checks = [c for c in verifier.checks if c.where == "judge"]
        self.checks = [c for c in verifier.checks if c.where != "judge"]
        passed = self.evaluate(judge_checks)
        verdict.stage_s["static"] = time.perf_counter() - stage_t
        if not passed:
            return
        for starter in filter(None, (optional(c, "Check", "start") for c in self.checks)):
            starter(self.evidence)  # work on other hardware, overlapping the GPU stages
        self.budget = Budget(self.timeout_s, verdict)
        self.budget.alone = self.alone
        if verifier.compile_only is not None:
            compile_only(self)
            return
        try:  # the GPU stages hold the verification's memory reservation (core.verification.gpumemory)
            with verifier._reserved(self):
                try:
                    self.on_device()
                finally:  # a baseline started beside the stages holds memory of this reservation
                    for started in self.early_baselines.values():
                        started.cancel()  # set up but never timed (the verification ended first): untimed
                        started.join(timeout=max(1.0, self.budget.left()))
        except GpuBusy as exc:
            verdict.status, verdict.reason, verdict.accepted = "error", f"error: {exc.detail}", False
            return
        if self.deferred:  # e.g. the CPU interpreter's race analysis, started with the static checks
            self.evaluate(self.deferred, stop_at_first=False)
            self.finish()

    def on_device(self) -> None:
        """The executed path, with this verification's keeper when outputs stay on the device."""
        verifier = self.verifier
        if not verifier.compare_on_device:
            self.executed()
            return
        self.keeper = Keeper(verifier, verifier.reference_pool.acquire(), self.budget, self.evidence, self.lean)
        try:
            self.executed()
        finally:
            verifier.reference_pool.release(self.keeper.worker, discard=not self.keeper.forget())

    def executed(self) -> None:
        """The reference, then the candidate in a candidate worker held until its verdict."""
        if getattr(self.verifier, "baselines_early", "trials") == "start":  # one verdict's wall time: beside all
            self.early_baselines = start_baselines(self, whole_only=True)
        if not self.reference():
            return
        pool, verdict = self.verifier.pool, self.verdict
        worker = self.worker = pool.acquire()
        discard = False
        try:
            discard = self.run_candidate()
        except (InputsNotReproducible, WorkerFailure) as exc:  # the retry of the first starts in a fresh worker
            discard = True
            if isinstance(exc, InputsNotReproducible):
                raise
            verdict.status, verdict.reason, verdict.accepted = exc.status, f"{exc.status}: {exc.detail}", False
        finally:
            pool.release_unloaded(worker, discard=discard)
            self.worker = None

    def reference(self) -> bool:
        """The task's outputs on inputs from seeds drawn fresh for every verification, never
        guessable; False (the verdict says why) when the reference failed."""
        verifier, verdict, keeper = self.verifier, self.verdict, self.keeper
        self.needs = set().union(*(c.needs for c in self.checks)) if self.checks else {"trials"}
        self.init_seed = fresh_seed()
        self.trial_seeds = [fresh_seed() for _ in range(verifier.trials)]
        dtype = task_dtype(self.task)
        fixed = verifier.probe_scales.get(dtype)
        scales = [] if "probes" not in self.needs else list(fixed) if fixed is not None else draw_plan(dtype)
        probe_seeds = [fresh_seed() for _ in scales]
        t = time.perf_counter()
        self.budget.phase = "reference"
        self.reference_request = request(
            Op.REFERENCE, source=self.task.source, init_seed=self.init_seed,
            seeds=self.trial_seeds + probe_seeds, scales=[1.0] * len(self.trial_seeds) + list(scales),  # probes: specs
            float64_max_elements=verifier.float64_max_elements, float64_later=verifier.float64_on_demand,
            inputs_mode="digest" if verifier.inputs_by_seed and not self.inputs_sent else "tensors")
        try:
            if keeper is None:
                ref = verifier._request(verifier.reference_pool, self.reference_request, self.budget, on_gpu=True)
            else:  # the outputs stay in the keeper; the answer names them
                ref = verifier._on_gpu(keeper.worker, {**self.reference_request, "keep": keeper.token,
                                                       "trials": len(self.trial_seeds)}, self.budget)
        except WorkerFailure as exc:
            verdict.status, verdict.reason = exc.status, f"the reference (task) failed: {exc.detail}"
            return False
        verdict.stage_s["reference"] = time.perf_counter() - t
        if not ref.get("ok"):
            error = str(ref.get("error"))
            hint = ""
            if verifier.device != "cuda" and ("CUDA" in error or "cuda" in error):
                # KernelBench's own examples build their inputs with .cuda(): say what the user can do
                hint = f" (the task needs a CUDA device and this verifier runs on {verifier.device}: verify it on a GPU host)"
            verdict.status, verdict.reason = "error", f"the reference (task) failed: {error}{hint}"
            return False
        if keeper is not None:
            if not ref.get("kept"):
                verdict.status, verdict.reason = "error", "the reference worker did not keep the outputs"
                return False
            for r in ref["trials"]:
                r["output"] = keeper.wrap(r["output"])
        n = len(self.trial_seeds)
        self.ref, self.ref_trials = ref, ref["trials"][:n]
        self.probes = list(zip(scales, probe_seeds, ref["trials"][n:]))
        if ref.get("float64_pending"):
            self.evidence.truth_loader = lambda: load_truth(self)
        return True

    def run_candidate(self) -> bool:
        """Load, run and judge the candidate in the held worker; True when that worker must be discarded."""
        evidence, verdict = self.evidence, self.verdict
        if not self.load():
            return bool(evidence.load_sandbox)
        observed = self.trials()
        if not evidence.compiled:  # sandbox escapes still count as integrity findings
            self.evaluate([c for c in self.checks if c.name == "integrity"], stop_at_first=False)
            self.finish()
            return any(o.sandbox for o in observed)
        basic = [c for c in self.checks if not (c.needs - {"trials"}) and optional(c, "Check", "collect") is None]
        passed = self.evaluate(basic, stop_at_first=False)
        release_unread(self)
        if passed:  # a baseline started with the GPU stages (baselines_early="start") is not started again
            self.early_baselines = self.early_baselines or start_baselines(self)
            passed = self.extra_observations()
        self.finish()
        return bool(verdict.hack_flags) or bool(evidence.config.get("worker_dirty"))

    def load(self) -> bool:
        """Import the candidate, build ``ModelNew`` with the task's init seed; False when that failed."""
        verifier, worker, evidence, verdict, left = self.verifier, self.worker, self.evidence, self.verdict, \
            self.budget.left
        t = time.perf_counter()
        self.budget.phase = "trials"  # the candidate's weights, then its trials beside the keeper's outputs
        if verifier.device_lock is not None:  # the compile that needs no GPU, before the load takes it
            ahead = worker.request(request(Op.PRECOMPILE, source=evidence.candidate.source), timeout_s=left())
            evidence.load_sandbox = list(ahead.get("sandbox") or [])
        # The task travels as plain data: performance checks (collect hooks) time it beside the candidate.
        with verifier._gpu(self.budget, label="load"):
            loaded = worker.request(request(Op.LOAD, source=evidence.candidate.source, init_seed=self.init_seed,
                                            init_inputs=self.ref["init_inputs"], task=evidence.task.to_dict()),
                                    timeout_s=left())
        evidence.load_sandbox += list(loaded.get("sandbox") or [])
        verdict.stage_s["load"] = time.perf_counter() - t
        if loaded.get("ok"):
            compile_ahead(self)
            return True
        if is_out_of_memory(loaded.get("error")) and not evidence.load_sandbox:
            raise GpuOutOfMemory("loading the candidate", str(loaded.get("error")))
        evidence.load_error = loaded.get("error")
        verdict.compiled = False
        verdict.add_check("compile", False, f"import or construction failed: {evidence.load_error}")
        if evidence.load_sandbox:
            verdict.add_check("integrity", False, f"sandbox refused: {evidence.load_sandbox[0]}", hack=True)
        self.finish()
        return False

    def trials(self) -> list[RunObservation]:
        """The correctness trials (the first call is also where Triton compiles the kernels),
        recorded in the evidence with the compile check."""
        evidence, verdict = self.evidence, self.verdict
        t = time.perf_counter()
        runs = [{"name": f"trial{i}", "ref": i, **inputs_of(r, seed)}
                for i, (seed, r) in enumerate(zip(self.trial_seeds, self.ref_trials))]
        observed = self.run_in_candidate(runs)
        verdict.stage_s["trials"] = time.perf_counter() - t
        redrawn_elsewhere(self.ref_trials, observed)
        evidence.trials = [Trial(seed, r.get("inputs"), r["output"], o, truth=r.get("truth"),
                                 truth_noise=r.get("truth_noise"), inputs_digest=r.get("inputs_digest"))
                           for seed, r, o in zip(self.trial_seeds, self.ref_trials, observed)]
        if self.keeper is not None:  # the keeper vets and computes the truth when a comparison needs it
            evidence.config["float64_truth_note"] = self.ref.get("truth_note") or \
                "float64 reference on demand: no output needed it"
        elif evidence.truth_loader is None:
            vet_truth(evidence, self.ref)
        else:
            evidence.config["float64_truth_note"] = "float64 reference on demand: no output needed it"
        first_error = observed[0].error if observed else "no trial ran"
        evidence.compiled = not (first_error and all(o.error for o in observed))
        verdict.compiled = evidence.compiled
        verdict.add_check("compile", evidence.compiled,
                          "kernels built and ran" if evidence.compiled else f"first call failed: {first_error}")
        return observed

    def extra_observations(self) -> bool:
        """The costlier observations (:class:`~core.verification.observations.ExtraObservations`), asked
        only after the trials' checks passed; evaluates the checks not yet recorded. False after a hard failure."""
        ExtraObservations(self).make()
        rest = [c for c in self.checks if c.name not in self.verdict.checks]
        # a check that waits on work off the GPU is judged after the GPU stages, their memory given back: on
        # the H200 a matrix-vector verdict held 37 GiB for 90 s of race analysis while a 105-GiB task waited
        self.deferred = [c for c in rest if OFF_DEVICE in c.needs]
        return self.evaluate([c for c in rest if c not in self.deferred], stop_at_first=False)

    def judge_ready(self, done: set[str]) -> None:
        """Evaluate the checks not yet recorded whose runs are all in (``done``: the kinds run so far)
        and that make no measurement of their own; then drop the outputs no check still to come reads."""
        ready = [c for c in self.checks if c.name not in self.verdict.checks and c.needs <= done
                 and optional(c, "Check", "collect") is None]
        self.evaluate(ready, stop_at_first=False)
        release_unread(self)

    def baseline(self, check: Any, config: dict[str, Any], gate: Any = None) -> dict[str, Any]:
        """The check's measurement of the task's reference, from the judge's per-task cache
        (:meth:`GpuSharing._baseline`), measured by a baseline worker; ``gate``: timed only once it opens."""
        return self.verifier._baseline(check, config, self.evidence, self.budget, gate=gate)

    # -- helpers of the stages

    def run_in_candidate(self, runs: list[dict[str, Any]]) -> list[RunObservation]:
        """Run ``runs`` in the candidate worker; each names the reference run (``ref``) it is judged against.
        With a keeper, runs whose outputs are large go a few per request: a request's outputs wait on
        the device, exported, until the keeper has adopted them."""
        per_request = runs_per_request(self.output_bytes) if self.keeper is not None else len(runs)
        observed: list[RunObservation] = []
        for start in range(0, len(runs), max(1, per_request)):
            observed += run_request(self, runs[start:start + max(1, per_request)])
        return observed

    def evaluate(self, checks: list[Any], stop_at_first: bool = True) -> bool:
        """Evaluate ``checks`` in order; record each; False after the first hard failure."""
        ok = True
        for check in checks:
            started = time.perf_counter()
            try:
                result = check.evaluate(self.evidence)
            except (WorkerFailure, GpuOutOfMemory):  # the keeper failed (or ran out of memory) while comparing
                raise
            except Exception as exc:  # a broken check plugin must not pass a candidate
                result = CheckResult(False, f"check {check.name!r} failed to evaluate: {type(exc).__name__}: {exc}")
            if result.unchecked and not result.passed and self.verifier.accepts_unchecked(check.name):
                result.passed = True  # the user asked for it; the verdict keeps the record
                result.detail += " [accepted unchecked: verifier.accept_unchecked]"
                self.verdict.accepted_unchecked.append(check.name)
            self.verdict.checks[check.name] = result
            spent = time.perf_counter() - started
            if spent >= 0.05:  # e.g. waiting for work started earlier elsewhere (interp_races on the CPU)
                self.verdict.stage_s[check.name] = self.verdict.stage_s.get(check.name, 0.0) + spent
            if not result.passed and check.hard:
                ok = False
                if stop_at_first:
                    break
        if not ok:
            self.finish()
        return ok

    def finish(self) -> None:
        """Fill accepted/correct/accuracy/status/reason from the recorded checks."""
        finish_verdict(self.verdict, self.verifier.checks)


def retry_after(attempt: Verification, exc: Exception, verdict: Verdict) -> Verification | None:
    """The next attempt at ``attempt``'s pair, into ``verdict`` (fresh), after ``exc``: out of GPU memory, with the
    device alone, then lean (None once nothing leaner is left); inputs drawn otherwise in the candidate's
    process, with the inputs sent (once: nothing is drawn there then)."""
    old = attempt.verdict
    # what the earlier attempts were retried after, not their estimates and peaks (the next attempt records its own)
    retried = {k: v for k, v in (old.gpu_memory or {}).items() if k.startswith("retried_")}
    verdict.gpu_wait_s, verdict.inputs_sent, verdict.gpu_memory = old.gpu_wait_s, old.inputs_sent, retried or None
    if isinstance(exc, InputsNotReproducible):
        verdict.inputs_sent = f"{exc}: judged again with the inputs sent as tensors"
        return Verification(attempt.verifier, attempt.task, attempt.candidate, verdict, attempt.timeout_s,
                            alone=attempt.alone, lean=attempt.lean, inputs_sent=True)
    mode = "lean" if attempt.ran_alone else "alone"
    if attempt.lean or (mode == "lean" and not attempt.verifier.compare_on_device):  # nothing leaner to try
        return None  # (lean needs a keeper: outputs compared on the device)
    verdict.gpu_memory = {**retried, f"retried_{mode}_after": f"{exc}"[:300]}
    return Verification(attempt.verifier, attempt.task, attempt.candidate, verdict, attempt.timeout_s, alone=True,
                        lean=mode == "lean", inputs_sent=attempt.inputs_sent)


def redrawn_elsewhere(ref_trials: list[dict[str, Any]], observed: list[RunObservation]) -> None:
    """Raise :class:`InputsNotReproducible` where the candidate's process drew a trial's inputs otherwise than
    the reference's. A harness that reported no digests stays a finding (``inputs_intact``), not a retry."""
    for i, (r, o) in enumerate(zip(ref_trials, observed)):
        if None not in (r.get("inputs_digest"), o.inputs_digest_before) and o.inputs_digest_before != r["inputs_digest"]:
            raise InputsNotReproducible(f"trial {i}: the inputs drawn from its seed in the candidate's process "
                                        "differ from the reference's")


def compile_only(verification: Verification) -> None:
    """Import the candidate and run the backend's compile step; never call forward."""
    verifier, verdict = verification.verifier, verification.verdict
    t = time.perf_counter()
    try:
        loaded = verifier._request(verifier.pool, request(Op.LOAD, source=verification.candidate.source, init_seed=0,
                                                          init_inputs=[], construct=False), verification.budget)
    except WorkerFailure as exc:
        verdict.status, verdict.reason = exc.status, f"{exc.status}: {exc.detail}"
        return
    verdict.stage_s["load"] = time.perf_counter() - t
    verdict.compiled = bool(loaded.get("ok"))
    if verdict.compiled:
        verdict.add_check("compile", True, "kernels compiled (compile-only: nothing was executed)")
        verdict.status, verdict.reason = "rejected", f"compiled, not executed: {verifier.compile_only}"
    else:
        verdict.add_check("compile", False, f"compile failed: {loaded.get('error')}")
        verdict.status, verdict.reason = "rejected", f"compile: {loaded.get('error')}"
    if loaded.get("sandbox"):
        verdict.add_check("integrity", False, f"sandbox refused: {loaded['sandbox'][0]}", hack=True)


def compile_ahead(verification: Verification) -> None:
    """On a shared GPU, the loaded candidate's kernels compiled before its first trial, without the lock
    (``Op.COMPILE_AHEAD``, ``Verifier.compile_ahead``): the compiler's seconds are then not a turn on the GPU
    that every timed turn waits behind. What it did is kept in the evidence's config."""
    v = verification
    if v.verifier.device_lock is None or not getattr(v.verifier, "compile_ahead", False):
        return
    t = time.perf_counter()
    ahead = v.worker.request(request(Op.COMPILE_AHEAD), timeout_s=v.budget.left())
    v.verdict.stage_s["compile_ahead"] = time.perf_counter() - t
    v.evidence.config["compile_ahead"] = {k: ahead[k] for k in ("compiled", "seconds", "stopped") if k in ahead}


def run_request(verification: Verification, runs: list[dict[str, Any]]) -> list[RunObservation]:
    """One request of ``runs`` to the verification's candidate worker; a keeper adopts their outputs."""
    v = verification
    keeper = v.keeper
    sent = [{k: val for k, val in run.items() if k != "ref"} for run in runs]
    answer = v.verifier._on_gpu(v.worker, request(Op.RUN, runs=sent, export=keeper is not None), v.budget)
    if not answer.get("ok"):
        raise WorkerFailure("error", f"worker could not run the candidate: {answer.get('error')}")
    ran_out = next((o.get("error") for o in answer["observations"]
                    if is_out_of_memory(o.get("error")) and not o.get("sandbox")), None)
    if ran_out:  # drawing its inputs or running: the device's memory, not the candidate's fault
        raise GpuOutOfMemory("the candidate's run", str(ran_out))
    if keeper is not None:
        keeper.adopt(v.worker, answer["observations"], [run["ref"] for run in runs])
    return [RunObservation.from_dict(o) for o in answer["observations"]]


OFF_DEVICE = "interpreter"  # an observation made off the GPU (core.verification.evidence.OBSERVATIONS)

RUN_KINDS = ("trials", "first_trial", "shuffled", "repeat", "probes")  # what Check.reads names


def release_unread(verification: Verification) -> None:
    """Have the keeper drop the candidate's outputs that no check still to be evaluated reads
    (``Check.reads``; a check that does not declare it reads every run): at KernelBench's real sizes
    a verification's runs hold 4-8 GiB of outputs each."""
    v = verification
    if v.keeper is None:
        return
    read: set[str] = set()
    for check in v.checks:
        if check.name not in v.verdict.checks:
            declared = optional(check, "Check", "reads")
            read |= set(RUN_KINDS) if declared is None else set(declared)
    if "trials" in read:
        read.add("first_trial")
    ev = v.evidence
    runs = {"trials": ev.trials[1:], "first_trial": ev.trials[:1], "shuffled": ev.shuffled, "repeat": ev.repeat,
            "probes": ev.probes}
    drop = [x for kind, trials in runs.items() if kind not in read for t in trials
            for x in (t.observed.output or []) if isinstance(x, HeldTensor) and x.key and x.key.startswith("c")]
    drop = [x for x in drop if x.key not in v.released]
    if drop:
        v.keeper.release(drop)
        v.released.update(x.key for x in drop)


def load_truth(verification: Verification) -> None:
    """The float64 truth of every run of ``verification``, asked of a reference worker when a
    comparison first needs it (``float64_on_demand``): the same task, init seed and input seeds, so the
    same inputs."""
    verifier, evidence = verification.verifier, verification.evidence
    try:
        ref = verifier._request(verifier.reference_pool, {**verification.reference_request, "float64_later": False},
                                verification.budget, on_gpu=True)
    except WorkerFailure as exc:
        ref = {"ok": False, "error": exc.detail}
    if not ref.get("ok"):
        evidence.config["float64_truth"] = False
        evidence.config["float64_truth_note"] = f"float64 reference failed: {ref.get('error')}"[:300]
        return
    runs = ref["trials"]
    for trial, r in zip(evidence.trials, runs):
        trial.truth, trial.truth_noise = r.get("truth"), r.get("truth_noise")
    first = evidence.trials[0] if evidence.trials else None
    for trial in [*evidence.shuffled, *evidence.repeat]:
        trial.truth, trial.truth_noise = (first.truth, first.truth_noise) if first else (None, None)
    for probe, r in zip(evidence.probes, runs[len(evidence.trials):]):
        probe.truth, probe.truth_noise = r.get("truth"), r.get("truth_noise")
    evidence.config["float64_probe_runs"] = runs[len(evidence.trials):]  # their truth and rounding noise
    vet_truth(evidence, ref)

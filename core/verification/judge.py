"""The judge: one verification, cheapest check first, in sandboxed worker processes.

::

    from core.verify import Verifier
    with Verifier(backend="triton", device="auto", checks=None, workers=2, timeout_s=120, trials=5) as v:
        verdict = v.verify(task, candidate)
        verdicts = v.verify_many([(task, cand), ...])   # parallel over warm workers, order preserved

One verification, cheapest first, stopping at the first hard failure:

1. judge-side checks on the parsed source (``static``, ``static_integrity``);
2. the *reference worker* (which only ever runs task code) draws inputs from fresh secret seeds and
   computes the reference outputs;
3. a *candidate worker* imports the candidate, builds ``ModelNew`` with the same init seed as
   ``Model`` (KernelBench's convention, so weights match) and calls it on those inputs under
   launch counting, the ATen audit and the backend's bounds checks; outputs, inputs-after and
   findings come back as data;
4. every worker-side check is evaluated here, in the judging process; only if those pass are the
   costlier observations (shuffled program orders, a repeat, stability probes) requested.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterable, Sequence

from core.task import Candidate, Task
from core.verdict import CheckResult, Verdict
from core.verification.baselines import BaselineCache
from core.verification.devicelock import DeviceLock, DeviceLockTimeout
from core.verification.evidence import (
    Comparison,
    Evidence,
    HeldTensor,
    RunObservation,
    Trial,
    parse_python,
    truth_agrees,
)
from core.verification.sandbox import Limits, WorkerFailure, WorkerPool

MIN_TRIALS = 5
DEFAULT_PROBE_SCALES = {"float32": [1e3, 1e-5, 1e15], "float64": [1e3, 1e-5, 1e150],
                        "float16": [1e2, 1e-2], "bfloat16": [1e3, 1e-5, 1e15]}
# Largest trial (inputs + outputs, elements) for which the reference worker also runs the task in
# float64 (the "truth" that accuracy is judged against; see core.verification.evidence.compare_outputs).
DEFAULT_FLOAT64_MAX_ELEMENTS = 1 << 25


class VerifierConfigError(ValueError):
    """The verifier was configured with something that does not exist or cannot run here."""


def resolve_device(device: str) -> str:
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise VerifierConfigError(f"device must be auto, cpu or cuda; got {device!r}")
    return device


# The task of the pool warm-up (Verifier.warm_up): every backend's warm_up_candidate solves it.
WARM_UP_TASK = """\
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(256, 1000)]


def get_init_inputs():
    return []
"""


def _fresh_seed() -> int:
    return secrets.randbits(62)


def _inputs_of(ref_trial: dict[str, Any], seed: int, scale: float = 1.0) -> dict[str, Any]:
    """What a run request carries: the seed to draw the inputs from, or the reference's inputs."""
    if "inputs" in ref_trial:
        return {"inputs": ref_trial["inputs"]}
    return {"seed": seed, "scale": scale}


class _Budget:
    """One verification's wall-clock budget. Time spent waiting for the GPU lock is given back:
    a neighbour holding the GPU (a hanging candidate until its own limit) is not this candidate's
    fault, so it must not turn an honest kernel's verdict into a timeout."""

    def __init__(self, seconds: float, verdict: Verdict | None = None):
        self.deadline = time.monotonic() + seconds
        self.verdict = verdict  # its gpu_wait_s adds up the waits

    def waited(self, seconds: float) -> None:
        self.deadline += seconds
        if self.verdict is not None:
            self.verdict.gpu_wait_s += seconds

    def left(self) -> float:
        return max(1.0, self.deadline - time.monotonic())


class GpuBusy(WorkerFailure):
    """No turn on the GPU within ``gpu_wait_s``: the run's problem; the worker itself is fine."""


class _Keeper:
    """The judge's side of a verification's keeper (core.verification.devicemem): the reference worker that holds
    the reference's outputs and adopts the candidate's, so comparisons run where the data is."""

    def __init__(self, verifier: "Verifier", worker: Any, budget: "_Budget", evidence: Evidence):
        self.verifier, self.worker, self.budget, self.evidence = verifier, worker, budget, evidence
        self.token = secrets.token_hex(8)
        self.dirty = False  # it ran something (torch.compile) after which it must not serve again

    def _ask(self, message: dict[str, Any]) -> dict[str, Any]:
        # GPU work (copies, comparisons): under the shared lock, so never inside another's timed stage
        with self.verifier._gpu(self.budget, label=f"keeper {message.get('op')}"):
            try:
                answer = self.worker.request({**message, "token": self.token}, timeout_s=max(10.0, self.budget.left()))
            except WorkerFailure as exc:
                raise WorkerFailure("error", f"the reference worker keeping the outputs failed: {exc.detail}") from None
        if not answer.get("ok"):
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
            answer = self._ask({"op": "adopt", "allowed_dir": str(Path(candidate_worker.scratch) / "exports"),
                                "runs": [{"outputs": o["output"], "expect": ref} for o, ref in exported]})
            exported = [o for o, _ in exported]
            for obs, run in zip(exported, answer["runs"]):
                if run.get("error"):
                    obs["output"] = None
                    obs["error"] = obs.get("error") or f"its outputs could not be read: {run['error']}"
                    if run.get("forged"):  # our harness code describes outputs truthfully; it was tampered with
                        obs.setdefault("sandbox", []).append(f"its outputs were handed over forged ({run['error']})")
                else:
                    obs["output"] = self.wrap(run["outputs"])
        candidate_worker.request({"op": "drop_exports"}, timeout_s=max(10.0, self.budget.left()))

    def compare(self, expected: list[Any], got: list[Any], *, tolerances: dict | None, scale_aware: bool,
                truth: bool, noise_factor: float) -> Comparison:
        answer = self._ask({"op": "compare", "expected": self._names(expected), "got": self._names(got),
                            "tolerances": {k: list(v) for k, v in (tolerances or {}).items()},
                            "scale_aware": scale_aware, "truth": truth, "noise_factor": noise_factor})
        self.evidence.config["float64_truth"] = answer["truth_trusted"]
        self.evidence.config["float64_truth_note"] = answer["truth_note"]
        return Comparison(**answer["comparison"])

    def equal(self, a: list[Any], b: list[Any]) -> bool:
        return bool(self._ask({"op": "equal", "a": self._names(a), "b": self._names(b)})["equal"])

    def fetch(self, items: list[Any]) -> list[Any]:
        return list(self._ask({"op": "fetch", "items": self._names(items)})["values"])

    def forget(self) -> bool:
        """Free the verification's tensors in the keeper; False when the keeper must be replaced."""
        try:
            return bool(self.worker.request({"op": "forget", "token": self.token}, timeout_s=30).get("ok"))
        except WorkerFailure:
            return False


class _GpuTurn(contextlib.AbstractContextManager):
    """Holds a device lock for one worker request; the wait extends the budget, and a GPU busy
    past ``wait_s`` is reported as an error of the run (status ``error``), not of the candidate."""

    def __init__(self, inner: Any, budget: _Budget, started: float, journal: Any = None, label: str = "",
                 exclusive: bool = False):
        self.inner, self.budget, self.started = inner, budget, started
        self.journal, self.label, self.exclusive = journal, label, exclusive
        self.got = started

    def __enter__(self) -> None:
        try:
            self.inner.__enter__()
        except DeviceLockTimeout as exc:
            raise GpuBusy("error", f"the GPU stayed busy with other verifications: {exc}") from exc
        self.got = time.monotonic()
        self.budget.waited(self.got - self.started)

    def __exit__(self, *exc: Any) -> None:
        try:
            return self.inner.__exit__(*exc)
        finally:
            if self.journal is not None:
                self.journal.append({"label": self.label, "exclusive": self.exclusive, "asked": self.started,
                                     "got": self.got, "done": time.monotonic()})


def _task_dtype(task: Task) -> str:
    return (task.dtypes or ["float32"])[0].replace("torch.", "")


class Verifier:
    """Judges candidates in sandboxed warm workers. Use as a context manager (it owns processes).

    :param backend: registered backend name (``"triton"``).
    :param device: ``"auto"``, ``"cpu"`` (Triton interpreter) or ``"cuda"``.
    :param checks: check names to run (``None``: every registered check that applies to the backend
        and device), or a mapping ``name -> config kwargs``.
    :param workers: candidate worker processes (verify_many runs this many verdicts at once).
    :param timeout_s: wall-clock limit of one verification inside a worker.
    :param trials: correctness trials (at least 5), each with fresh random inputs.
    :param tolerances: ``{"float32": (atol, rtol), ...}`` overrides.
    :param memory_mb: address-space limit of a CPU worker.
    :param probe_scales: stability probe input scales per dtype name.
    :param isolate: try namespaces (network off, read-only filesystem but scratch).
    :param float64_max_elements: also run the task in float64 (the truth outputs are judged
        against, besides the fp32 reference) when a trial's inputs + outputs hold at most this many
        elements; 0 turns the float64 reference off.
    :param inputs_by_seed: let the candidate worker draw each trial's inputs from its seed (when the
        reference worker finds the task's get_inputs reproducible) and report digests, so input
        tensors never cross the process boundary; off: inputs travel as bytes.
    :param float64_on_demand: run the task in float64 only when a comparison needs the truth (an
        output missed the fp32 reference): a second reference request on the same seeds. Off: every
        reference request runs it and the truth travels with the outputs.
    :param gpu_wait_s: the longest one request waits for its turn on the GPU (core.verification.devicelock); the
        wait does not count against ``timeout_s``, and a GPU busy longer gives an ``error`` verdict.
    :param split_transfers: fetch the tensors of run and reference answers in a second request,
        after the GPU lock is released (default: where a GPU lock is in use).
    :param compare_on_device: keep outputs where they were computed and compare them there
        (core.verification.devicemem): each verification holds a reference worker, which adopts the candidate's
        outputs through CUDA IPC and runs the comparisons on the GPU; nothing large crosses into the
        judge. ``None`` (default): on CUDA where IPC works. On CPU it can be turned on (outputs then
        pass through files in the candidate's scratch directory) and is off by default.
    :param warm_up: before the first verdict, judge one small built-in pair (a ReLU, the backend's
        ``warm_up_candidate``) in every candidate worker at once, so each worker and keeper has been
        through a whole verification: a cold worker's first verdict on the H200 took 6-15 s against
        1-3 s for later ones. ``None`` (default): on CUDA; the outcome is in ``warm_up_report``.
    :param share_gpu_fairly: on CUDA, hold the host-wide lock of core.verification.devicelock: trials, references
        and sanitizer runs share the GPU, a check with ``exclusive_device = True`` (the timed
        performance stage) has it alone, so several workers per GPU keep timings honest.
    """

    def __init__(self, backend: str = "triton", device: str = "auto", checks: Sequence[str] | dict | None = None,
                 workers: int = 2, timeout_s: float = 120, trials: int = 5, *, tolerances: dict | None = None,
                 memory_mb: int = 8192, probe_scales: dict | None = None, isolate: bool = True,
                 reference_workers: int = 1, max_jobs_per_worker: int = 200, name: str | None = None,
                 float64_max_elements: int = DEFAULT_FLOAT64_MAX_ELEMENTS, share_gpu_fairly: bool = True,
                 inputs_by_seed: bool = True, float64_on_demand: bool = True, gpu_wait_s: float = 900.0,
                 split_transfers: bool | None = None, compare_on_device: bool | None = None,
                 warm_up: bool | None = None, **check_options: Any):
        from core.plugins import registry

        if trials < MIN_TRIALS:
            raise VerifierConfigError(f"trials={trials}: the verifier runs at least {MIN_TRIALS} correctness trials")
        self.backend_name = backend
        self.backend = registry("backend").create(backend)  # unknown name: lists the known ones
        self.device = resolve_device(device)
        unsupported = self.backend.supports(self.device)
        # A backend that cannot execute here may still compile here (CUDA C through NVRTC on a CPU
        # machine): then only static + compile run and the verdict says why nothing executed.
        self.compile_only: str | None = None
        if unsupported:
            compiles_on = getattr(self.backend, "compiles_on", lambda d: d == "cpu")
            if not compiles_on(self.device):
                raise VerifierConfigError(unsupported)
            self.compile_only = unsupported
        self.trials, self.timeout_s, self.workers = int(trials), float(timeout_s), int(workers)
        self.tolerances = {k: tuple(v) for k, v in (tolerances or {}).items()}
        self.probe_scales = {**DEFAULT_PROBE_SCALES, **(probe_scales or {})}
        self.float64_max_elements = max(0, int(float64_max_elements))
        self.checks = self._build_checks(checks, check_options)
        limits = Limits(memory_mb=memory_mb, isolate=isolate, cpu_s_per_request=int(max(timeout_s, 1)) + 5)
        self.compare_on_device = self._resolve_compare_on_device(compare_on_device)
        if self.compare_on_device:
            # each verification holds its keeper from the reference to the verdict
            reference_workers = max(int(reference_workers), self.workers)
        env = dict(self.backend.worker_env(self.device))
        if "OMP_NUM_THREADS" not in os.environ and "OMP_NUM_THREADS" not in env:
            # Each worker's CPU tensor work gets its share of the cores: 20 workers with one OpenMP
            # thread per core each would oversubscribe the host many times over.
            share = (os.cpu_count() or 1) // (max(1, int(workers)) + max(1, int(reference_workers)))
            env["OMP_NUM_THREADS"] = str(max(1, share))
        self.pool = WorkerPool("candidate", backend, self.device, size=max(1, self.workers), limits=limits,
                               extra_env=env, max_jobs=max_jobs_per_worker)
        self.reference_pool = WorkerPool("reference", backend, self.device, size=max(1, reference_workers),
                                         limits=limits, extra_env=env, max_jobs=max_jobs_per_worker)
        self.device_lock = DeviceLock.for_device("cuda") if self.device == "cuda" and share_gpu_fairly else None
        self.inputs_by_seed = bool(inputs_by_seed)
        self.float64_on_demand = bool(float64_on_demand)
        self.gpu_wait_s = float(gpu_wait_s)
        # None: where a GPU lock is held (the saving is the lock's; on CPU it would cost a round trip)
        self.split_transfers = self.device_lock is not None if split_transfers is None else bool(split_transfers)
        # every turn this judge took on the GPU lock, newest last: core.verification.devicelock.summarise_turns says
        # where the time went (held alone, shared, idle)
        self.gpu_turns: collections.deque[dict[str, Any]] = collections.deque(maxlen=100_000)
        self.baselines = BaselineCache()  # per-task reference timings, shared by that task's candidates
        self._closed = False
        self.warm_up_report = "not warmed up"
        if warm_up or (warm_up is None and self.device == "cuda" and self.compile_only is None):
            self.warm_up()

    # -- set-up

    def _resolve_compare_on_device(self, wanted: bool | None) -> bool:
        if self.compile_only is not None or wanted is False:
            return False
        if self.device != "cuda":
            return bool(wanted)  # the file transport: off unless asked for
        from core.verification.devicemem import cuda_ipc_available

        why_not = cuda_ipc_available()
        if why_not and wanted:
            raise VerifierConfigError(f"compare_on_device=True: {why_not}")
        return not why_not

    def _build_checks(self, checks: Sequence[str] | dict | None, options: dict[str, Any]) -> list[Any]:
        from core.plugins import registry

        reg = registry("verifier")
        if checks is None:
            configs = {name: {} for name in reg.names()}
        elif isinstance(checks, dict):
            configs = {name: dict(cfg or {}) for name, cfg in checks.items()}
        else:
            configs = {name: {} for name in checks}
        for key, value in options.items():  # e.g. races={"orders": 3} from Hydra
            if key not in reg:
                raise VerifierConfigError(f"unknown verifier option {key!r}; known checks: {', '.join(reg.names())}")
            configs.setdefault(key, {}).update(value or {})
        built = [reg.create(name, **cfg) for name, cfg in configs.items()]
        applicable = [c for c in built if c.applies(self.backend_name, self.device)]
        return sorted(applicable, key=lambda c: (c.stage, c.name))

    @property
    def isolation(self) -> str:
        """How the workers are isolated (namespaces, or the documented fallback)."""
        found = self.pool.wait_ready()
        return found[0] if found else "unknown"

    def __enter__(self) -> "Verifier":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.pool.close()
            self.reference_pool.close()

    def warm_up(self) -> list[Verdict]:
        """Judge :data:`WARM_UP_TASK` with the backend's ``warm_up_candidate`` in every candidate
        worker at once (see ``warm_up``); returns those verdicts, summed up in ``warm_up_report``."""
        source = getattr(self.backend, "warm_up_candidate", None)
        if not source:
            self.warm_up_report = f"backend {self.backend_name!r} has no warm_up_candidate"
            return []
        start = time.perf_counter()
        pairs = [(Task(source=WARM_UP_TASK, name="warm_up"), Candidate(source=source, backend=self.backend_name))
                 for _ in range(max(1, self.workers))]
        try:
            verdicts = self.verify_many(pairs)
        except Exception as exc:  # the pool still serves; its first verdicts pay the warm-up themselves
            self.warm_up_report = f"warm-up failed: {type(exc).__name__}: {exc}"[:400]
            return []
        accepted = sum(v.accepted for v in verdicts)
        self.warm_up_report = (f"{accepted}/{len(verdicts)} warm-up verdicts accepted in "
                               f"{time.perf_counter() - start:.1f} s")
        if accepted < len(verdicts):  # the pool still serves; a user should know why it did not warm
            worst = next(v for v in verdicts if not v.accepted)
            self.warm_up_report += f"; first refusal: {worst.status}: {worst.reason}"[:400]
        return verdicts

    # -- verifying

    def verify_many(self, pairs: Iterable[tuple[Task, Candidate]], progress: Any = None) -> list[Verdict]:
        """Verdicts for many pairs, in the order given, ``workers`` at a time.

        :param progress: optional callable ``progress(index, verdict)`` called as each finishes.
        """
        pairs = list(pairs)
        if not pairs:
            return []
        lock = threading.Lock()

        def one(i: int) -> Verdict:
            verdict = self.verify(*pairs[i])
            if progress is not None:
                with lock:
                    progress(i, verdict)
            return verdict

        with ThreadPoolExecutor(max_workers=max(1, self.workers), thread_name_prefix="kz-verify") as ex:
            return list(ex.map(one, range(len(pairs))))

    def verify(self, task: Task, candidate: Candidate, *, timeout_s: float | None = None) -> Verdict:
        """The verdict for one pair. ``timeout_s`` overrides the verifier's wall-clock limit."""
        start = time.perf_counter()
        verdict = Verdict(task_id=task.id, candidate_id=candidate.id, backend=self.backend_name, device=self.device)
        try:
            self._verify(task, candidate, verdict, self.timeout_s if timeout_s is None else float(timeout_s))
        finally:
            verdict.elapsed_s = round(time.perf_counter() - start, 4)
            verdict.gpu_wait_s = round(verdict.gpu_wait_s, 4)
        return verdict

    def _verify(self, task: Task, candidate: Candidate, verdict: Verdict, timeout_s: float) -> None:
        if candidate.declined:
            verdict.status, verdict.reason = "declined", f"declined: {candidate.declined}"
            return
        if candidate.backend and candidate.backend != self.backend_name:
            verdict.status = "error"
            verdict.reason = (f"candidate is for backend {candidate.backend!r}, this verifier judges "
                              f"{self.backend_name!r}")
            return
        evidence = Evidence(task=task, candidate=candidate, backend=self.backend_name, device=self.device,
                            config={"tolerances": self.tolerances, "trials": self.trials})
        try:
            evidence.tree = parse_python(candidate.source)
        except SyntaxError:
            evidence.tree = None
        stage_t = time.perf_counter()
        judge_checks = [c for c in self.checks if c.where == "judge"]
        worker_checks = [c for c in self.checks if c.where != "judge"]
        if not self._evaluate(judge_checks, evidence, verdict):
            verdict.stage_s["static"] = time.perf_counter() - stage_t
            return
        verdict.stage_s["static"] = time.perf_counter() - stage_t
        budget = _Budget(timeout_s, verdict)
        if self.compile_only is not None:
            self._compile_only(evidence, verdict, budget)
            return
        if not self.compare_on_device:
            self._verify_executed(evidence, verdict, worker_checks, budget, None)
            return
        keeper = _Keeper(self, self.reference_pool.acquire(), budget, evidence)
        try:
            self._verify_executed(evidence, verdict, worker_checks, budget, keeper)
        finally:
            self.reference_pool.release(keeper.worker, discard=not keeper.forget() or keeper.dirty)

    def _verify_executed(self, evidence: Evidence, verdict: Verdict, worker_checks: list[Any], budget: _Budget,
                         keeper: _Keeper | None) -> None:
        task = evidence.task
        # Reference: seeds drawn fresh for every verification, never guessable.
        needs = set().union(*(c.needs for c in worker_checks)) if worker_checks else {"trials"}
        init_seed = _fresh_seed()
        trial_seeds = [_fresh_seed() for _ in range(self.trials)]
        scales = self.probe_scales.get(_task_dtype(task), []) if "probes" in needs else []
        probe_seeds = [_fresh_seed() for _ in scales]
        t = time.perf_counter()
        reference_request = {
            "op": "reference", "source": task.source, "init_seed": init_seed,
            "seeds": trial_seeds + probe_seeds, "scales": [1.0] * len(trial_seeds) + list(scales),
            "float64_max_elements": self.float64_max_elements, "float64_later": self.float64_on_demand,
            "inputs_mode": "digest" if self.inputs_by_seed else "tensors"}
        try:
            if keeper is None:
                ref = self._request(self.reference_pool, reference_request, budget, on_gpu=True)
            else:  # the outputs stay in the keeper; the answer names them
                ref = self._on_gpu(keeper.worker, {**reference_request, "keep": keeper.token,
                                                   "trials": len(trial_seeds)}, budget)
        except WorkerFailure as exc:
            verdict.status, verdict.reason = exc.status, f"the reference (task) failed: {exc.detail}"
            return
        verdict.stage_s["reference"] = time.perf_counter() - t
        if not ref.get("ok"):
            verdict.status, verdict.reason = "error", f"the reference (task) failed: {ref.get('error')}"
            return
        if keeper is not None:
            if not ref.get("kept"):
                verdict.status, verdict.reason = "error", "the reference worker did not keep the outputs"
                return
            for r in ref["trials"]:
                r["output"] = keeper.wrap(r["output"])
        ref_trials, ref_probes = ref["trials"][:len(trial_seeds)], ref["trials"][len(trial_seeds):]
        if ref.get("float64_pending"):
            evidence.truth_loader = functools.partial(self._load_truth, evidence, reference_request, budget)

        worker = self.pool.acquire()
        discard = False
        try:
            discard = self._run_candidate(worker, evidence, verdict, worker_checks, needs, ref, init_seed,
                                          trial_seeds, ref_trials, list(zip(scales, probe_seeds, ref_probes)),
                                          budget, keeper)
        except WorkerFailure as exc:
            discard = True
            verdict.status, verdict.reason = exc.status, f"{exc.status}: {exc.detail}"
            verdict.accepted = False
        finally:
            if not discard and worker.alive:
                try:
                    worker.request({"op": "unload"}, timeout_s=30)
                except WorkerFailure:
                    discard = True
            self.pool.release(worker, discard=discard)

    def _compile_only(self, evidence: Evidence, verdict: Verdict, budget: _Budget) -> None:
        """Import the candidate and run the backend's compile step; never call forward."""
        t = time.perf_counter()
        try:
            loaded = self._request(self.pool, {"op": "load", "source": evidence.candidate.source, "init_seed": 0,
                                               "init_inputs": [], "construct": False}, budget)
        except WorkerFailure as exc:
            verdict.status, verdict.reason = exc.status, f"{exc.status}: {exc.detail}"
            return
        verdict.stage_s["load"] = time.perf_counter() - t
        verdict.compiled = bool(loaded.get("ok"))
        if verdict.compiled:
            verdict.add_check("compile", True, "kernels compiled (compile-only: nothing was executed)")
            verdict.status, verdict.reason = "rejected", f"compiled, not executed: {self.compile_only}"
        else:
            verdict.add_check("compile", False, f"compile failed: {loaded.get('error')}")
            verdict.status, verdict.reason = "rejected", f"compile: {loaded.get('error')}"
        if loaded.get("sandbox"):
            verdict.add_check("integrity", False, f"sandbox refused: {loaded['sandbox'][0]}", hack=True)

    def _request(self, pool: WorkerPool, message: dict[str, Any], budget: _Budget,
                 on_gpu: bool = False) -> dict[str, Any]:
        worker = pool.acquire()
        ok = False
        try:
            answer = self._on_gpu(worker, message, budget) if on_gpu else \
                worker.request(message, timeout_s=budget.left())
            ok = True
            return answer
        except GpuBusy:
            ok = True  # it never got to the worker
            raise
        finally:
            pool.release(worker, discard=not ok)

    def _on_gpu(self, worker, message: dict[str, Any], budget: _Budget) -> dict[str, Any]:
        """A run or reference request under the GPU lock; with ``split_transfers`` its tensors are
        held back by the worker and fetched after the lock is released: moving 100 MB outputs
        through a pipe takes seconds, and a timed stage waiting for the lock should not wait for
        that."""
        with self._gpu(budget, label=str(message.get("op"))):
            answer = worker.request({**message, "hold": self.split_transfers}, timeout_s=budget.left())
        if answer.get("held"):
            heavy = worker.request({"op": "take_held"}, timeout_s=budget.left())
            items = answer.get("observations") or answer.get("trials") or []
            if not heavy.get("ok") or len(heavy.get("held") or []) != len(items):
                raise WorkerFailure("error", f"the worker lost the outputs it held: {heavy.get('error')}")
            for item, tensors in zip(items, heavy["held"]):
                item.update(tensors)
        return answer

    def _run_candidate(self, worker, evidence: Evidence, verdict: Verdict, checks: list[Any], needs: set[str],
                       ref: dict[str, Any], init_seed: int, trial_seeds: list[int], ref_trials: list[dict],
                       probes: list[tuple[float, int, dict]], budget: _Budget, keeper: _Keeper | None = None) -> bool:
        """Load, run and judge the candidate in ``worker``; returns True when the worker must be discarded."""

        left = budget.left

        t = time.perf_counter()
        if self.device_lock is not None:  # the compile that needs no GPU, before the load takes it
            ahead = worker.request({"op": "precompile", "source": evidence.candidate.source}, timeout_s=left())
            evidence.load_sandbox = list(ahead.get("sandbox") or [])
        # The task travels as plain data: performance checks (collect hooks) time it beside the candidate.
        with self._gpu(budget, label="load"):
            loaded = worker.request({"op": "load", "source": evidence.candidate.source, "init_seed": init_seed,
                                     "init_inputs": ref["init_inputs"], "task": evidence.task.to_dict()},
                                    timeout_s=left())
        evidence.load_sandbox += list(loaded.get("sandbox") or [])
        verdict.stage_s["load"] = time.perf_counter() - t
        if not loaded.get("ok"):
            evidence.load_error = loaded.get("error")
            verdict.compiled = False
            verdict.add_check("compile", False, f"import or construction failed: {evidence.load_error}")
            if evidence.load_sandbox:
                verdict.add_check("integrity", False, f"sandbox refused: {evidence.load_sandbox[0]}", hack=True)
            self._finish(verdict, ["compile"])
            return bool(evidence.load_sandbox)

        # Correctness trials (the first call is also where Triton compiles the kernels).
        t = time.perf_counter()
        runs = [{"name": f"trial{i}", "ref": i, **_inputs_of(r, seed)}
                for i, (seed, r) in enumerate(zip(trial_seeds, ref_trials))]
        observed = self._run(worker, runs, budget, keeper)
        verdict.stage_s["trials"] = time.perf_counter() - t
        evidence.trials = [Trial(seed, r.get("inputs"), r["output"], o, truth=r.get("truth"),
                                 inputs_digest=r.get("inputs_digest"))
                           for seed, r, o in zip(trial_seeds, ref_trials, observed)]
        if keeper is not None:  # the keeper vets and computes the truth when a comparison needs it
            evidence.config["float64_truth_note"] = ref.get("truth_note") or \
                "float64 reference on demand: no output needed it"
        elif evidence.truth_loader is None:
            self._vet_truth(evidence, ref)
        else:
            evidence.config["float64_truth_note"] = "float64 reference on demand: no output needed it"
        first_error = observed[0].error if observed else "no trial ran"
        evidence.compiled = not (first_error and all(o.error for o in observed))
        verdict.compiled = evidence.compiled
        verdict.add_check("compile", evidence.compiled,
                          "kernels built and ran" if evidence.compiled else f"first call failed: {first_error}")
        if not evidence.compiled:  # sandbox escapes still count as integrity findings
            self._evaluate([c for c in checks if c.name == "integrity"], evidence, verdict, stop_at_first=False)
            self._finish(verdict, ["compile"])
            return any(o.sandbox for o in observed)

        basic = [c for c in checks if not (c.needs - {"trials"}) and not hasattr(c, "collect")]
        passed = self._evaluate(basic, evidence, verdict, stop_at_first=False)
        if passed:
            passed = self._extra_observations(worker, evidence, verdict, checks, needs, trial_seeds, ref_trials,
                                              probes, budget, keeper)
        self._finish(verdict, None)
        return bool(verdict.hack_flags) or bool(evidence.config.get("worker_dirty"))

    def _extra_observations(self, worker, evidence: Evidence, verdict: Verdict, checks: list[Any], needs: set[str],
                            trial_seeds: list[int], ref_trials: list[dict], probes: list[tuple[float, int, dict]],
                            budget: _Budget, keeper: _Keeper | None = None) -> bool:
        left = budget.left
        t = time.perf_counter()
        race_orders = max((getattr(c, "orders", 0) for c in checks if "shuffled" in c.needs), default=0)
        base = ref_trials[0]
        runs: list[dict[str, Any]] = []
        if "shuffled" in needs:
            runs += [{"name": f"shuffled{i}", "ref": 0, **_inputs_of(base, trial_seeds[0]), "order_seed": _fresh_seed()}
                     for i in range(race_orders)]
        if "repeat" in needs:
            runs.append({"name": "repeat0", "ref": 0, **_inputs_of(base, trial_seeds[0])})
        if "probes" in needs:  # reference runs after the trials' are the probes'
            runs += [{"name": f"probe{i}", "ref": len(trial_seeds) + i, **_inputs_of(r, seed, scale)}
                     for i, (scale, seed, r) in enumerate(probes)]
        observed = self._run(worker, runs, budget, keeper) if runs else []
        for run, obs in zip(runs, observed):
            kind = run["name"].rstrip("0123456789")
            if kind == "probe":
                k = int(run["name"][5:])
                scale, seed, r = probes[k]
                loaded = evidence.config.get("float64_probe_truths")  # the truth came on demand, before the probes ran
                truth = (loaded[k] if loaded else r.get("truth")) if evidence.config.get("float64_truth") else None
                evidence.probes.append(Trial(seed, r.get("inputs"), r["output"], obs, scale=scale, truth=truth,
                                             inputs_digest=r.get("inputs_digest")))
            else:
                target = evidence.shuffled if kind == "shuffled" else evidence.repeat
                target.append(Trial(trial_seeds[0], base.get("inputs"), base["output"], obs,
                                    inputs_digest=base.get("inputs_digest"),
                                    truth=evidence.trials[0].truth if evidence.trials else None))
        verdict.stage_s["extra"] = time.perf_counter() - t
        for check in checks:
            if hasattr(check, "collect"):
                config = {k: v for k, v in asdict(check).items() if k not in ("name", "stage", "hard", "where", "needs")} \
                    if hasattr(check, "__dataclass_fields__") else {}
                t_check = time.perf_counter()
                lock = self._gpu(budget, exclusive=bool(getattr(check, "exclusive_device", False)), label=check.name)
                lock_wait_s = 0.0
                if getattr(check, "locks_device_itself", False) and self.device_lock is not None:
                    # e.g. a sanitizer run: seconds of CPU start-up around a moment of GPU work, which
                    # takes the shared lock itself so a timed stage need not wait through the start-up.
                    config["device_lock"] = {**self.device_lock.describe(), "wait_s": self.gpu_wait_s,
                                             "hold_s": left()}
                    lock, lock_wait_s = contextlib.nullcontext(), self.gpu_wait_s
                prepared = None
                if hasattr(check, "prepare"):  # set-up while the GPU is shared, so an exclusive stage only times
                    with self._gpu(budget, label=f"{check.name} prepare"):
                        prepared = worker.request({"op": "collect", "check": check.name, "config": config,
                                                   "phase": "prepare"}, timeout_s=left())
                prepare_failed = prepared is not None and (not prepared.get("ok") or
                                                           bool((prepared.get("data") or {}).get("error")))
                if prepare_failed:  # nothing to time: its error is the stage's
                    answer = prepared
                else:
                    with lock:
                        answer = worker.request({"op": "collect", "check": check.name, "config": config},
                                                timeout_s=left() + lock_wait_s)
                if lock_wait_s:  # its wait for the GPU is given back too, as in _gpu
                    budget.waited(float((answer.get("data") or {}).get("gpu_lock_wait_s") or 0.0))
                if getattr(check, "dirties_worker", lambda: False)():  # the next candidate gets a fresh worker
                    evidence.config["worker_dirty"] = True
                data = answer.get("data") if answer.get("ok") else {"error": answer.get("error")}
                if isinstance(data, dict) and prepared is not None and prepared.get("ok"):
                    data.setdefault("phases_s", {})["prepare"] = (prepared.get("data") or {}).get("prepare_s")
                if isinstance(data, dict) and not data.get("error") and getattr(check, "baseline_per_task", False):
                    data["baseline"] = self._baseline(check, config, evidence, budget, keeper)
                verdict.stage_s[check.name] = time.perf_counter() - t_check  # lock waits included
                evidence.extra[check.name] = data
        rest = [c for c in checks if c.name not in verdict.checks]
        return self._evaluate(rest, evidence, verdict, stop_at_first=False)

    def _baseline(self, check: Any, config: dict[str, Any], evidence: Evidence, budget: _Budget,
                  keeper: _Keeper | None = None) -> dict[str, Any]:
        """The check's measurement of the task's reference (``check.baseline``), made once per task by
        a reference worker with the GPU to itself, then shared (:class:`core.verification.baselines.BaselineCache`).
        A failure is returned as ``{"error": ...}`` and not kept."""
        task = evidence.task
        key = (check.name, task.id, check.baseline_key())  # task.id: a hash of the task's source

        def measure() -> dict[str, Any]:
            # the verification's own keeper when it has one: every reference worker may be some
            # verification's keeper, and waiting for another one could wait for ever
            worker = keeper.worker if keeper is not None else self.reference_pool.acquire()
            dirty = True
            try:
                with self._gpu(budget, exclusive=True, label=f"{check.name} baseline"):
                    answer = worker.request({"op": "baseline", "check": check.name, "config": config,
                                             "source": task.source, "init_seed": _fresh_seed()},
                                            timeout_s=budget.left())
                dirty = bool(getattr(check, "baseline_dirties_worker", lambda: False)())
            finally:
                if keeper is not None:
                    keeper.dirty = keeper.dirty or dirty
                else:
                    self.reference_pool.release(worker, discard=dirty)
            if not answer.get("ok") or (answer.get("data") or {}).get("error"):
                raise RuntimeError(answer.get("error") or answer["data"]["error"])
            return answer["data"]

        try:
            value, shared = self.baselines.get(key, measure)
        except Exception as exc:  # the verdict stands without speedups; the next candidate measures again
            return {"error": f"the task's baseline could not be timed: {getattr(exc, 'detail', exc)}"[:400]}
        return {**value, "shared": shared}

    def _load_truth(self, evidence: Evidence, reference_request: dict[str, Any], budget: _Budget) -> None:
        """The float64 truth of every run, asked of a reference worker when a comparison first needs it
        (``float64_on_demand``): the same task, init seed and input seeds, so the same inputs."""
        try:
            ref = self._request(self.reference_pool, {**reference_request, "float64_later": False}, budget,
                                on_gpu=True)
        except WorkerFailure as exc:
            ref = {"ok": False, "error": exc.detail}
        if not ref.get("ok"):
            evidence.config["float64_truth"] = False
            evidence.config["float64_truth_note"] = f"float64 reference failed: {ref.get('error')}"[:300]
            return
        runs = ref["trials"]
        for trial, r in zip(evidence.trials, runs):
            trial.truth = r.get("truth")
        first = evidence.trials[0].truth if evidence.trials else None
        for trial in [*evidence.shuffled, *evidence.repeat]:
            trial.truth = first
        for probe, r in zip(evidence.probes, runs[len(evidence.trials):]):
            probe.truth = r.get("truth")
        evidence.config["float64_probe_truths"] = [r.get("truth") for r in runs[len(evidence.trials):]]
        self._vet_truth(evidence, ref)

    def _vet_truth(self, evidence: Evidence, ref: dict[str, Any]) -> None:
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

    def _gpu(self, budget: _Budget, exclusive: bool = False, label: str = ""):
        """Hold this GPU's host-wide lock (shared, or alone for timing) around one worker request,
        waiting at most ``gpu_wait_s``; the wait is added to ``budget``, the turn to ``gpu_turns``."""
        if self.device_lock is None:
            return contextlib.nullcontext()
        started = time.monotonic()
        wait_until = started + self.gpu_wait_s
        inner = self.device_lock.exclusive(wait_until) if exclusive else self.device_lock.shared(wait_until)
        return _GpuTurn(inner, budget, started, self.gpu_turns, label, exclusive)

    def _run(self, worker, runs: list[dict[str, Any]], budget: _Budget,
             keeper: _Keeper | None = None) -> list[RunObservation]:
        """Run ``runs`` in ``worker``; each names the reference run (``ref``) it is judged against."""
        sent = [{k: v for k, v in run.items() if k != "ref"} for run in runs]
        answer = self._on_gpu(worker, {"op": "run", "runs": sent, "export": keeper is not None}, budget)
        if not answer.get("ok"):
            raise WorkerFailure("error", f"worker could not run the candidate: {answer.get('error')}")
        if keeper is not None:
            keeper.adopt(worker, answer["observations"], [run["ref"] for run in runs])
        return [RunObservation.from_dict(o) for o in answer["observations"]]

    def _evaluate(self, checks: list[Any], evidence: Evidence, verdict: Verdict, stop_at_first: bool = True) -> bool:
        """Evaluate ``checks`` in order; record each; False after the first hard failure."""
        ok = True
        for check in checks:
            try:
                result = check.evaluate(evidence)
            except WorkerFailure:  # the keeper failed while comparing: the verdict is an error
                raise
            except Exception as exc:  # a broken check plugin must not pass a candidate
                result = CheckResult(False, f"check {check.name!r} failed to evaluate: {type(exc).__name__}: {exc}")
            verdict.checks[check.name] = result
            if not result.passed and check.hard:
                ok = False
                if stop_at_first:
                    break
        if not ok:
            self._finish(verdict, None)
        return ok

    def _finish(self, verdict: Verdict, _: Any) -> None:
        """Fill accepted/correct/accuracy/status/reason from the recorded checks."""
        hard = {c.name: c.hard for c in self.checks}
        stage = {c.name: c.stage for c in self.checks}
        corr = verdict.checks.get("correctness")
        if corr is not None:
            data = corr.data or {}
            verdict.accuracy = (data.get("matched", 0) / data["trials"]) if data.get("trials") else 0.0
            verdict.correct = bool(corr.passed)
        failed = [n for n, c in verdict.checks.items() if not c.passed and hard.get(n, True)]
        # Integrity findings explain the rest, so they come first; then the earliest stage.
        failed.sort(key=lambda n: (not verdict.checks[n].hack, stage.get(n, 1)))
        perf = verdict.checks.get("performance")
        if perf is not None and perf.data:
            verdict.timing = perf.data.get("timing") or None
            verdict.roofline = perf.data.get("roofline") or None
        verdict.accepted = bool(verdict.compiled and verdict.correct and not failed)
        verdict.status = "accepted" if verdict.accepted else "rejected"
        verdict.reason = None if verdict.accepted else (
            f"{failed[0]}: {verdict.checks[failed[0]].detail}" if failed else "not verified")

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

The :class:`Verifier` owns what outlives one verdict: its configuration, the worker pools, the
check list, the per-task baselines and the journal of its turns on the GPU. Each verdict is one
:class:`core.verification.pipeline.Verification`, whose methods are the stages above; the
keeper and the budget live in :mod:`.keeper` and :mod:`.budget`, the wire in :mod:`.protocol`.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterable, Sequence

from core.api.sandbox import registered_needs
from core.config import resolve_device
from core.contracts import optional
from core.task import DEFAULT_BACKEND, Candidate, Task
from core.verdict import Verdict
from core.verification.budget import Budget, GpuBusy, GpuTurn
from core.verification.devicelock import DeviceLock
from core.verification.gpumemory import DEFAULT_FRACTION, GpuOutOfMemory
from core.verification.gpusharing import GpuSharing, out_of_gpu_memory  # noqa: F401 (tests import it from here)
from core.verification.keeper import Keeper
from core.verification.pipeline import InputsNotReproducible, Verification, retry_after
from core.verification.probes import fixed_plan
from core.verification.sandbox import SCRATCH, Limits, WorkerPool

# The old private names, re-exported: the same objects (tests patch ``judge._Keeper.compare``).
_Budget, _Keeper, _GpuTurn = Budget, Keeper, GpuTurn

__all__ = ["MIN_TRIALS", "WARM_UP_TASK", "GpuBusy", "Verifier", "VerifierConfigError",
           "resolve_device", "_Budget", "_Keeper"]

MIN_TRIALS = 5
# Largest trial (inputs + outputs, elements) for which the reference worker also runs the task in
# float64 (the "truth" that accuracy is judged against; see core.verification.evidence.compare_outputs).
DEFAULT_FLOAT64_MAX_ELEMENTS = 1 << 25


class VerifierConfigError(ValueError):
    """The verifier was configured with something that does not exist or cannot run here."""


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


def worker_env(backend: Any, device: str, processes: int, cuda_on_cpu: bool = False) -> dict[str, str]:
    """The environment every worker of one Verifier starts with: what the registered backends declare
    of their toolchains (variables kept from the judge's environment, defaults, caches in the scratch
    directory), the backend's own, a share of the cores for OpenMP, and ``cuda_on_cpu``'s switch (CPU
    workers only)."""
    toolchains = registered_needs()
    env = {**toolchains.default_env, **{k: os.environ[k] for k in toolchains.passthrough_env if k in os.environ},
           **{k: f"{SCRATCH}/{folder}" for k, folder in toolchains.scratch_env.items()}}
    env.update(backend.worker_env(device))
    if cuda_on_cpu and device == "cpu":
        from core.verification.worker.cuda_on_cpu import ENV

        env[ENV] = "1"
    share = str(max(1, (os.cpu_count() or 1) // max(1, int(processes))))
    if "OMP_NUM_THREADS" not in os.environ and "OMP_NUM_THREADS" not in env:
        # Each worker's CPU tensor work gets its share of the cores: 20 workers with one OpenMP
        # thread per core each would oversubscribe the host many times over.
        env["OMP_NUM_THREADS"] = share
    if "TORCHINDUCTOR_COMPILE_THREADS" not in os.environ and "TORCHINDUCTOR_COMPILE_THREADS" not in env:
        # torch.compile's baselines: Inductor starts a pool of one compile process per core in every
        # reference worker (and again in each fresh one), 16 workers x 16 processes on a 16-core host;
        # a share of 1 compiles in the worker's own process
        env["TORCHINDUCTOR_COMPILE_THREADS"] = share
    return env


def cpu_seconds(timeout_s: float, env: dict[str, str]) -> int:
    """A worker request's CPU-time limit: the wall-clock limit times the threads it may run (OpenMP's,
    and the CUDA runtime's spin while it waits on a busy GPU), so only a runaway hits it. One thread's
    worth killed an honest reference on a 4 GiB input with SIGXCPU on the H200 (2026-12-04)."""
    threads = env.get("OMP_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS") or "1"
    try:
        count = max(1, int(threads))
    except ValueError:
        count = 1
    return (int(max(timeout_s, 1)) + 5) * (count + 1)


def resolve_compare_on_device(wanted: bool | None, device: str, compile_only: str | None) -> bool:
    """Whether outputs stay on the device and are compared there (see ``Verifier``'s parameter)."""
    if compile_only is not None or wanted is False:
        return False
    if device != "cuda":
        return bool(wanted)  # the file transport: off unless asked for
    from core.verification.devicemem import cuda_ipc_available

    why_not = cuda_ipc_available()
    if why_not and wanted:
        raise VerifierConfigError(f"compare_on_device=True: {why_not}")
    return not why_not


class Verifier(GpuSharing):
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
    :param probe_scales: fixed stability probes per dtype name (``{"float32": [1e3, 1e-5]}``, or
        ``{"scale", "dist"}`` entries);
        a dtype not named gets a plan drawn afresh for every verification: a large, a small and a
        mild scale, each with a random distribution (core.verification.probes).
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
    :param cuda_on_cpu: CPU workers run CUDA-only code on the CPU, for ``interp_races``
        (:mod:`core.verification.worker.cuda_on_cpu`).
    :param accept_unchecked: a check that could not run (its tool missing, timed out or crashed)
        fails closed: the candidate is not accepted. ``True`` lets every such check pass, a list of
        check names lets those pass; either way ``Verdict.accepted_unchecked`` names them.
    :param share_gpu_fairly: on CUDA, hold the host-wide lock of core.verification.devicelock: trials, references
        and sanitizer runs share the GPU, a check with ``exclusive_device = True`` (the timed
        performance stage) has it alone, so several workers per GPU keep timings honest.
    :param gpu_memory_gb: the GPU memory verifications may hold at once (core.verification.gpumemory):
        each reserves its estimated footprint for its GPU stages and waits until it fits; one larger
        runs alone. ``None``: ``gpu_memory_fraction`` of the device's total (a worker's
        ``torch.cuda.mem_get_info``).
    :param baselines_early: when a small task's per-task baselines (eager, ``torch.compile``) start in their own
        worker: ``"trials"`` (default) once the candidate passed its trials' checks, so a failing candidate
        costs no baseline; ``"start"`` with the verification's GPU stages, beside the reference and the
        trials, for one verdict whose wall time matters (``core.verify`` of one pair): the build's seconds
        leave its critical path (a candidate that fails early still waits for the baseline it started).
    :param compile_ahead: on a shared GPU, after the load and without the lock, have the candidate worker
        compile the loaded candidate's kernels for the task's input shapes with nothing run on the GPU
        (``Backend.compile_ahead``: Triton's), so its first trial's shared turn holds the GPU for the GPU's
        work, not the compiler's (seconds per autotune config), which every timed turn waited behind.
    :param memory_admission: ``None`` (default): host-wide admission on CUDA (with
        ``share_gpu_fairly``), none on CPU; ``False``: none; or a
        :class:`~core.verification.gpumemory.MemoryAdmission` to use (tests: a fake device budget).
    """

    def __init__(self, backend: str = DEFAULT_BACKEND, device: str = "auto", checks: Sequence[str] | dict | None = None,
                 workers: int = 2, timeout_s: float = 120, trials: int = 5, *, tolerances: dict | None = None,
                 memory_mb: int = 8192, probe_scales: dict | None = None, isolate: bool = True,
                 reference_workers: int = 1, max_jobs_per_worker: int = 200, name: str | None = None,
                 float64_max_elements: int = DEFAULT_FLOAT64_MAX_ELEMENTS, share_gpu_fairly: bool = True,
                 inputs_by_seed: bool = True, float64_on_demand: bool = True, gpu_wait_s: float = 900.0,
                 split_transfers: bool | None = None, compare_on_device: bool | None = None,
                 warm_up: bool | None = None, accept_unchecked: bool | Sequence[str] = False,
                 cuda_on_cpu: bool = False, gpu_memory_gb: float | None = None,
                 gpu_memory_fraction: float = DEFAULT_FRACTION, memory_admission: Any = None,
                 baselines_early: str = "trials", compile_ahead: bool = True, **check_options: Any):
        from core.plugins import registry

        if trials < MIN_TRIALS:
            raise VerifierConfigError(f"trials={trials}: the verifier runs at least {MIN_TRIALS} correctness trials")
        self.backend_name = backend
        self.backend = registry("backend").create(backend)  # unknown name: lists the known ones
        try:
            self.device = resolve_device(device)
        except ValueError as exc:
            raise VerifierConfigError(str(exc)) from None
        unsupported = self.backend.supports(self.device)
        # A backend that cannot execute here may still compile here (CUDA C through NVRTC on a CPU
        # machine): then only static + compile run and the verdict says why nothing executed.
        self.compile_only: str | None = None
        if unsupported:
            compiles_on = optional(self.backend, "Backend", "compiles_on")
            if not compiles_on(self.device):
                raise VerifierConfigError(unsupported)
            self.compile_only = unsupported
        if baselines_early not in ("trials", "start"):
            raise VerifierConfigError(f"baselines_early={baselines_early!r}: 'trials' or 'start'")
        self.baselines_early = baselines_early
        self.trials, self.timeout_s, self.workers = int(trials), float(timeout_s), int(workers)
        self.tolerances = {k: tuple(v) for k, v in (tolerances or {}).items()}
        self.probe_scales = {k: fixed_plan(list(v)) for k, v in (probe_scales or {}).items()}
        self.float64_max_elements = max(0, int(float64_max_elements))
        self.checks = self._build_checks(checks, check_options)
        # A check that could not run fails closed unless named here (True: every check).
        self.accept_unchecked = accept_unchecked if isinstance(accept_unchecked, bool) else frozenset(accept_unchecked)
        # The pools start before this process imports torch (resolving compare_on_device does, on CUDA: 2.6 s on
        # the H100), so a one-shot call's workers start beside the judge's own imports. Only where compare_on_device
        # could enlarge the reference pool (more candidate workers than reference workers) is it resolved first.
        sizes_reference_pool = int(reference_workers) < self.workers
        if sizes_reference_pool:
            self.compare_on_device = resolve_compare_on_device(compare_on_device, self.device, self.compile_only)
            if self.compare_on_device:
                # each verification holds its keeper from the reference to the verdict
                reference_workers = max(int(reference_workers), self.workers)
        env = worker_env(self.backend, self.device, max(1, int(workers)) + max(1, int(reference_workers)), cuda_on_cpu)
        limits = Limits(memory_mb=memory_mb, isolate=isolate, cpu_s_per_request=cpu_seconds(timeout_s, env))
        self.pool = WorkerPool("candidate", backend, self.device, size=max(1, self.workers), limits=limits,
                               extra_env=env, max_jobs=max_jobs_per_worker)
        self.reference_pool = WorkerPool("reference", backend, self.device, size=max(1, reference_workers),
                                         limits=limits, extra_env=env, max_jobs=max_jobs_per_worker)
        # on CUDA the baseline pool starts here too: after torch's import it spawned 3 s after the others on the
        # H100, and its torch.compile warm-up (8 s) was the one-shot's critical path
        self._init_baselines(limits, env, max_jobs_per_worker)
        if not sizes_reference_pool:
            try:
                self.compare_on_device = resolve_compare_on_device(compare_on_device, self.device, self.compile_only)
            except VerifierConfigError:
                self._close_pools()
                raise
        # here, in the thread that builds the judge: torch's first import inside verify_many's threads (the static
        # policy imports what a candidate names) made the judge crash on exit (SIGSEGV in the interpreter's teardown)
        import torch  # noqa: F401
        # the backend was asked before torch's import (core.api.devices.cuda_visible): ask again through torch,
        # which alone sees a driver too old for its CUDA
        if self.compile_only is None and (unsupported := self.backend.supports(self.device)):
            self._close_pools()
            raise VerifierConfigError(unsupported)
        self.device_lock = DeviceLock.for_device("cuda") if self.device == "cuda" and share_gpu_fairly else None
        for opener in filter(None, (optional(c, "Check", "open") for c in self.checks)):
            opener({"tolerances": self.tolerances, "workers": self.workers})  # e.g. interp_races' CPU pool boots beside ours
        self.inputs_by_seed = bool(inputs_by_seed)
        self.float64_on_demand = bool(float64_on_demand)
        self.compile_ahead = bool(compile_ahead)
        self.gpu_wait_s = float(gpu_wait_s)
        # None: where a GPU lock is held (the saving is the lock's; on CPU it would cost a round trip)
        self.split_transfers = self.device_lock is not None if split_transfers is None else bool(split_transfers)
        # every turn this judge took on the GPU lock, newest last: core.verification.devicelock.summarise_turns says
        # where the time went (held alone, shared, idle)
        self.gpu_turns: collections.deque[dict[str, Any]] = collections.deque(maxlen=100_000)
        self._init_gpu_memory(gpu_memory_gb, gpu_memory_fraction, memory_admission,
                              wanted=self.device == "cuda" and share_gpu_fairly and self.compile_only is None)
        self._closed = False
        self.warm_up_report = "not warmed up"
        if warm_up or (warm_up is None and self.device == "cuda" and self.compile_only is None):
            self.warm_up()

    # -- set-up

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

    def _close_pools(self) -> None:
        """Close the pools started so far (a configuration error found after they started)."""
        self.pool.close()
        self.reference_pool.close()
        self._close_baselines()

    @property
    def isolation(self) -> str:
        """How the workers are isolated (namespaces, or the documented fallback)."""
        found = self.pool.wait_ready()
        return found[0] if found else "unknown"

    def __enter__(self) -> "Verifier":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def accepts_unchecked(self, check: str) -> bool:
        """Whether a result of ``check`` that could not run may pass (``accept_unchecked``)."""
        return self.accept_unchecked is True or (not isinstance(self.accept_unchecked, bool)
                                                 and check in self.accept_unchecked)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            # all at once: each waits for its workers to leave (a one-shot call pays this on exit);
            # a check may hold more than one verdict's worth (interp_races: a CPU verifier)
            closers = [self.pool.close, self.reference_pool.close, self._close_baselines,
                       *(optional(c, "Check", "close") for c in self.checks)]
            threads = [threading.Thread(target=close, name="kz-close") for close in closers if close]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

    def warm_up(self) -> list[Verdict]:
        """Judge :data:`WARM_UP_TASK` with the backend's ``warm_up_candidate`` in every candidate
        worker at once (see ``warm_up``); returns those verdicts, summed up in ``warm_up_report``."""
        source = optional(self.backend, "Backend", "warm_up_candidate")
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
        """The verdict for one pair. ``timeout_s`` overrides the verifier's wall-clock limit.

        A stage that runs out of GPU memory is not the candidate's fault: the whole verification is
        judged again with the device alone (its memory and every turn); if that runs out too, once more
        *lean* (the candidate's outputs in the keeper's host memory between the comparisons that read them:
        every check as before, slower); if it still does not fit, the verdict's status is ``error`` and its
        reason says so, with the estimate and the device's memory. A task whose inputs the candidate's
        process draws otherwise from the same seed is judged again with the inputs sent as tensors
        (``verdict.inputs_sent`` says why)."""
        start = time.perf_counter()
        limit = self.timeout_s if timeout_s is None else float(timeout_s)

        def fresh() -> Verdict:
            return Verdict(task_id=task.id, candidate_id=candidate.id, backend=self.backend_name, device=self.device)

        verdict = fresh()
        try:
            attempt = Verification(self, task, candidate, verdict, limit)
            while True:
                try:
                    attempt.run()
                    if attempt.lean and attempt.keeper is not None:
                        verdict.gpu_memory = {**(verdict.gpu_memory or {}), "lean": (
                            f"{attempt.keeper.offloaded} candidate output(s) held in host memory between comparisons")}
                    break
                except (GpuOutOfMemory, InputsNotReproducible) as exc:
                    retry = retry_after(attempt, exc, fresh())
                    if retry is None:  # out of memory with nothing leaner to try
                        raise
                    attempt, verdict = retry, retry.verdict
        except GpuOutOfMemory as exc:
            verdict.accepted, verdict.status = False, "error"
            peaks = self.peaks_line(verdict)
            verdict.reason = f"error: {self.does_not_fit(task, exc)}" + (f"; largest requests: {peaks}" if peaks else "")
        finally:
            verdict.elapsed_s = round(time.perf_counter() - start, 4)
            verdict.gpu_wait_s = round(verdict.gpu_wait_s, 4)
        return verdict

    # -- GPU memory (core.verification.gpumemory)


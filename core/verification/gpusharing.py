"""How a :class:`~core.verification.judge.Verifier` shares its GPU with other verifications, a part of
the judge (its base class :class:`GpuSharing`): turns on the host-wide lock (core.verification.devicelock),
the worker requests made under it, and GPU memory admission (core.verification.gpumemory): each
verification reserves its task's estimated footprint around its GPU stages, and a stage that runs out of
memory raises :class:`~core.verification.gpumemory.GpuOutOfMemory`, which ``Verifier.verify`` judges again
with the device alone, then calls an error."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from core.contracts import optional
from core.task import Task
from core.verification.baselines import BaselineCache
from core.verification.budget import Budget, GpuBusy, GpuTurn, record_peak, record_turn
from core.verification.devicelock import DeviceLockTimeout
from core.verification.gpumemory import (
    Footprint,
    GpuOutOfMemory,
    MemoryAdmission,
    capacity_from,
    estimate,
    fmt_bytes,
    is_out_of_memory,
    unknown_footprint,
)
from core.verification.observations import fresh_seed
from core.verification.protocol import Op, request
from core.verification.sandbox import Limits, WorkerFailure, WorkerPool
from core.verification.worker.warmup import WARM_COMPILE_ENV

if TYPE_CHECKING:
    from core.verification.parties import VerificationView as Verification


# Baselines one baseline worker measures before it is replaced (each builds torch.compile graphs, whose
# caches and compile state stay in the process).
BASELINES_PER_WORKER = 8


def out_of_gpu_memory(answer: dict[str, Any]) -> bool:
    """A worker's failed answer whose error is PyTorch's or CUDA's allocation failure."""
    return not answer.get("ok") and is_out_of_memory(answer.get("error"))


class GpuSharing:
    """The judge's GPU turns, the requests made on them and its memory admission. They read what the
    :class:`~core.verification.judge.Verifier` sets: ``device_lock``, ``gpu_wait_s``, ``gpu_turns``,
    ``split_transfers``, ``reference_pool``, ``checks``, ``trials``, ``workers``, ``float64_max_elements``."""

    def _init_gpu_memory(self, gpu_memory_gb: float | None, gpu_memory_fraction: float, memory_admission: Any,
                         wanted: bool) -> None:
        """The admission's settings (``Verifier``'s ``gpu_memory_gb``, ``gpu_memory_fraction`` and
        ``memory_admission``); ``wanted``: host-wide admission where none is given (CUDA, a shared GPU)."""
        # GPU memory admission (core.verification.gpumemory): made on first use, when a worker said
        # how much memory the device has
        self.gpu_memory_gb, self.gpu_memory_fraction = gpu_memory_gb, float(gpu_memory_fraction)
        self.memory_admission: MemoryAdmission | None = memory_admission or None
        self._admission_wanted = memory_admission is None and wanted
        self.device_total_bytes: int | None = None
        self.footprints: dict[str, Footprint] = {}
        self._footprint_lock = threading.Lock()

    # -- GPU memory (core.verification.gpumemory)

    def does_not_fit(self, task: Task, exc: GpuOutOfMemory) -> str:
        """The reason of a verdict whose verification ran out of GPU memory with the device alone."""
        fp = self.footprints.get(task.id)
        cap = self.memory_admission.capacity if self.memory_admission is not None else None
        said = [f"estimated footprint {fmt_bytes(fp.bytes)}" if fp is not None else "footprint not estimated",
                f"{fmt_bytes(cap)} admitted" if cap else "no memory admission",
                f"{fmt_bytes(self.device_total_bytes)} on the device" if self.device_total_bytes else ""]
        return (f"the task does not fit the device: it ran out of GPU memory with the device to itself "
                f"({'; '.join(x for x in said if x)}); {exc.stage}: {exc.error.strip().splitlines()[-1][:240] if exc.error.strip() else ''}")

    @staticmethod
    def peaks_line(verdict: Any) -> str:
        """The largest memory each worker request took so far, for a reason that says where memory went."""
        peaks = ((verdict.gpu_memory or {}).get("peak_bytes") or {}) if verdict is not None else {}
        return ", ".join(f"{k} {fmt_bytes(v)}" for k, v in sorted(peaks.items(), key=lambda kv: -kv[1])[:4])

    def _admission(self, worker: Any) -> MemoryAdmission | None:
        """The host-wide admission of this GPU, made once a worker said the device's memory."""
        if self.memory_admission is None and self._admission_wanted:
            memory = (worker.wait_ready() or {}).get("gpu_memory") or [None, None]
            self.device_total_bytes = int(memory[1]) if memory[1] else None
            capacity = capacity_from(self.device_total_bytes, self.gpu_memory_gb, self.gpu_memory_fraction)
            if capacity:
                self.memory_admission = MemoryAdmission.for_device(capacity)
            self._admission_wanted = False
        return self.memory_admission

    def footprint(self, task: Task, probes: int = 3) -> Footprint:
        """The task's estimated footprint per verification (:func:`core.verification.gpumemory.estimate`),
        measured once per task on the meta device by a reference worker; unmeasurable: an even share."""
        with self._footprint_lock:
            known = self.footprints.get(task.id)
        if known is not None:
            return known
        worker = self.reference_pool.acquire()
        ok = False
        try:
            admission = self._admission(worker)
            answer = worker.request(request(Op.FOOTPRINT, source=task.source), timeout_s=120)
            ok = True
        except WorkerFailure as exc:
            answer = {"ok": False, "error": exc.detail}
        finally:
            self.reference_pool.release(worker, discard=not ok)
        capacity = admission.capacity if admission is not None else 0
        if answer.get("ok"):
            orders = max((int(optional(c, "Check", "orders") or 0) for c in self.checks if "shuffled" in c.needs),
                         default=0)
            worker_checks = [c for c in self.checks if c.where != "judge"]
            fp = estimate(answer["measured"], trials=self.trials, probes=probes, orders=orders,
                          float64_max_elements=self.float64_max_elements,
                          released_when_judged=bool(self.compare_on_device) and
                          all(optional(c, "Check", "reads") is not None for c in worker_checks))
        else:
            fp = unknown_footprint(capacity, max(1, self.workers),
                                   f"not measured on meta: {answer.get('error')}"[:300])
        with self._footprint_lock:
            self.footprints[task.id] = fp
        return fp

    def memory_plan(self, tasks: list[Task]) -> dict[str, Any]:
        """Each task's estimated footprint and the memory admitted (``{"capacity", "bytes": {task id: n}}``),
        for a dispatcher that starts what fits (core.verification.dispatch); no capacity without admission.
        The footprints are measured by the reference workers at once, and kept for the verifications."""
        if self.memory_admission is None and not self._admission_wanted:
            return {"capacity": None, "bytes": {}}
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=max(1, self.reference_pool.size), thread_name_prefix="kz-plan") as pool:
            footprints = list(pool.map(self.footprint, tasks))
        admission = self.memory_admission
        return {"capacity": admission.capacity if admission is not None else None,
                "bytes": {t.id: fp.bytes for t, fp in zip(tasks, footprints)}}

    # Called as (task id, candidate id) when a verification's GPU stages ended well and its verdict still waits
    # on checks off the GPU (interp_races on the CPU): its memory is given back, so a dispatcher may start the
    # next large pair (core.verification.executor.schedule). On the H100 (2026-12-06) the instance and group
    # norms waited 19 and 39 s so, each counted as running at 33-77 GiB while no other large task could start.
    on_gpu_released: Callable[[str, str], None] | None = None

    @contextlib.contextmanager
    def _reserved(self, verification: Verification):
        """:meth:`_reservation` around ``verification``'s GPU stages; then, where checks off the GPU are still
        to judge, :attr:`on_gpu_released`."""
        with self._reservation(verification):
            yield
        notify = self.on_gpu_released
        if notify is not None and getattr(verification, "deferred", None):
            notify(verification.task.id, verification.candidate.id)

    @contextlib.contextmanager
    def _reservation(self, verification: Verification):
        """Hold ``verification``'s memory reservation around its GPU stages (none without admission);
        the wait is given back to its budget, a wait past ``gpu_wait_s`` raises :class:`GpuBusy`."""
        budget, verdict = verification.budget, verification.verdict
        if self.memory_admission is None and not self._admission_wanted:
            yield
            return
        fp = self.footprint(verification.task)
        admission = self.memory_admission
        if admission is None:
            yield
            return
        started = time.monotonic()
        label = f"{verification.task.name or verification.task.id[:12]}"
        reservation = admission.reserve(fp.bytes, started + self.gpu_wait_s, label, alone=verification.alone)
        try:
            got = reservation.__enter__()
        except DeviceLockTimeout as exc:
            raise GpuBusy("error", f"the GPU's memory stayed taken by other verifications: {exc}") from exc
        with contextlib.ExitStack() as held:
            held.push(reservation)  # released when the GPU stages end, however they end
            budget.waited(got.waited_s)
            verification.ran_alone = got.alone
            verification.output_bytes = int((fp.measured or {}).get("outputs") or 0)
            budget.alone = budget.alone or got.alone
            verdict.gpu_memory = {**(verdict.gpu_memory or {}), "estimate_bytes": fp.bytes,
                                  **({"estimate_phases": fp.phases} if fp.phases else {}),
                                  "capacity_bytes": admission.capacity, "alone": got.alone,
                                  "wait_s": round(got.waited_s, 4), **({"note": fp.note} if fp.note else {})}
            yield

    # -- one worker request, on the GPU's lock where it needs it (every verification's stages use these)

    def _request(self, pool: WorkerPool, message: dict[str, Any], budget: Budget,
                 on_gpu: bool = False) -> dict[str, Any]:
        worker = pool.acquire()
        ok = False
        try:
            answer = self._on_gpu(worker, message, budget) if on_gpu else \
                worker.request(message, timeout_s=budget.left())
            ok = True
            record_peak(budget, f"{pool.role} {message.get('op')}", answer)
            return answer
        except (GpuBusy, GpuOutOfMemory):
            ok = True  # it never got to the worker, or the worker answered (out of memory) and is fine
            raise
        finally:
            pool.release(worker, discard=not ok)

    def _on_gpu(self, worker, message: dict[str, Any], budget: Budget) -> dict[str, Any]:
        """A run or reference request under the GPU lock; with ``split_transfers`` its tensors are
        held back by the worker and fetched after the lock is released: moving 100 MB outputs
        through a pipe takes seconds, and a timed stage waiting for the lock should not wait for
        that."""
        with self._gpu(budget, label=str(message.get("op"))):
            answer = worker.request({**message, "hold": self.split_transfers}, timeout_s=budget.left())
        record_peak(budget, f"{getattr(worker, 'role', 'worker')} {message.get('op')}", answer)
        if out_of_gpu_memory(answer):
            # neighbours filled the GPU, or the task is too large for it: not the candidate's fault;
            # verify() judges the verification again alone, then calls it an error (core.verification.gpumemory)
            raise GpuOutOfMemory(f"the {message.get('op')} request", str(answer.get("error")))
        if answer.get("held"):
            heavy = worker.request(request(Op.TAKE_HELD), timeout_s=budget.left())
            items = answer.get("observations") or answer.get("trials") or []
            if not heavy.get("ok") or len(heavy.get("held") or []) != len(items):
                raise WorkerFailure("error", f"the worker lost the outputs it held: {heavy.get('error')}")
            for item, tensors in zip(items, heavy["held"]):
                item.update(tensors)
        return answer

    def _gpu(self, budget: Budget, exclusive: bool = False, label: str = ""):
        """Hold this GPU's host-wide lock (shared, or alone for timing) around one worker request,
        waiting at most ``gpu_wait_s``; the wait is added to ``budget``, the turn to ``gpu_turns``."""
        if self.device_lock is None:
            return contextlib.nullcontext()
        exclusive = exclusive or getattr(budget, "alone", False)  # a verification retried alone
        started = time.monotonic()
        wait_until = started + self.gpu_wait_s
        inner = self.device_lock.exclusive(wait_until) if exclusive else self.device_lock.shared(wait_until)
        return GpuTurn(inner, budget, started, self.gpu_turns, label, exclusive)

    # -- the tasks' baselines: a check's measurement of the task's own model, once per task

    def _init_baselines(self, limits: Limits, env: dict[str, str], max_jobs: int) -> None:
        """The per-task baseline cache, and the pool that measures baselines: reference workers of their own,
        so a keeper never runs torch.compile. A keeper that had built a baseline was replaced after its
        verification, and the next verification waited for the fresh one's start-up, once per task. A baseline
        worker serves :data:`BASELINES_PER_WORKER` baselines, then is replaced. On CUDA with a per-task
        baseline check the pool starts now, beside the others; otherwise on its first use."""
        self.baselines = BaselineCache()  # per-task reference timings, shared by that task's candidates
        self.baseline_pool: WorkerPool | None = None
        # the baseline workers warm torch.compile up before their hello (core.verification.worker.warmup). A
        # one-shot's small task asks for its build at once, and pays the same one-time costs with or without it
        # (H100, 2026-12-07: the warm-up 8.2-9.2 s, then the task's build 0.2-0.3 s); a large one's build comes
        # after its trials, and the warm-up has run while the worker waited
        self._baseline_pool_args = (limits, {**env, WARM_COMPILE_ENV: "1"}, min(max_jobs, 2 * BASELINES_PER_WORKER))
        self._baseline_pool_lock = threading.Lock()
        self._baselines_closed = False
        if self.device == "cuda" and self.compile_only is None and \
                any(optional(c, "Check", "baseline_per_task") for c in self.checks):
            self._baseline_workers()

    def _baseline_workers(self) -> WorkerPool:
        with self._baseline_pool_lock:
            if self._baselines_closed:  # a baseline thread outliving the verifier starts no pool no one closes
                raise RuntimeError("the verifier was closed")
            if self.baseline_pool is None:
                limits, env, max_jobs = self._baseline_pool_args
                # half as many as verifications in flight: a task's baseline is measured once, for all its candidates
                size = max(1, (self.workers + 1) // 2)
                self.baseline_pool = WorkerPool("reference", self.backend_name, self.device, size=size,
                                                limits=limits, extra_env=env, max_jobs=max_jobs)
            return self.baseline_pool

    def _close_baselines(self) -> None:
        with self._baseline_pool_lock:
            pool, self.baseline_pool, self._baselines_closed = self.baseline_pool, None, True
        if pool is not None:
            pool.close()

    def _baseline(self, check: Any, config: dict[str, Any], evidence: Any, budget: Budget,
                  gate: Any = None) -> dict[str, Any]:
        """The check's measurement of the task's reference (``check.baseline``), made once per task by a
        baseline worker, timed with the GPU to itself, then shared
        (:class:`~core.verification.baselines.BaselineCache`). A failure is returned as ``{"error": ...}``
        and not kept. ``gate`` (:class:`~core.verification.observations.TimingGate`): set up now, timed
        only once it opens (a cancelled gate gives the worker back untimed, an error that is not kept)."""
        task = evidence.task
        key = (check.name, task.id, optional(check, "Check", "baseline_key")())  # task.id: a hash of its source

        def measure() -> dict[str, Any]:
            pool = self._baseline_workers()
            worker, served = pool.acquire(), False
            seed = fresh_seed()
            try:
                if optional(check, "Check", "baseline_prepare") is not None:
                    # the set-up while the GPU is shared, the exclusive turn below only times; the worker
                    # takes the shared turn itself and gives it back during torch.compile's build (seconds
                    # of CPU per graph at real sizes), which timed turns elsewhere need not wait through
                    ready = self._baseline_set_up(worker, request(
                        Op.BASELINE, check=check.name, config=config, source=task.source, init_seed=seed,
                        phase="prepare"), budget, f"{check.name} baseline set-up")
                    if not ready.get("ok"):
                        served = True  # it answered: the failure is the task's, the worker serves on
                        raise RuntimeError(ready.get("error"))
                if gate is not None and not gate.wait(budget.left()):
                    # untimed: the worker drops what it set up (its GPU memory) before it serves another
                    served = bool(worker.request(request(Op.FORGET, token=""), timeout_s=30).get("ok"))
                    raise RuntimeError("the verification ended before its baseline was timed")
                with self._gpu(budget, exclusive=True, label=f"{check.name} baseline"):
                    answer = worker.request(request(Op.BASELINE, check=check.name, config=config, source=task.source,
                                                    init_seed=seed), timeout_s=budget.left())
                served = True
                record_peak(budget, f"baseline {check.name}", answer)
            finally:
                pool.release(worker, discard=not served)
            if not answer.get("ok") or (answer.get("data") or {}).get("error"):
                raise RuntimeError(answer.get("error") or answer["data"]["error"])
            return answer["data"]

        try:
            value, shared = self.baselines.get(key, measure)
        except Exception as exc:  # the verdict stands without speedups; the next candidate measures again
            return {"error": f"the task's baseline could not be timed: {getattr(exc, 'detail', exc)}"[:400]}
        return {**value, "shared": shared}

    def _baseline_set_up(self, worker: Any, message: dict[str, Any], budget: Budget, label: str) -> dict[str, Any]:
        """A baseline's set-up request, the worker holding this GPU's lock shared itself except while
        torch.compile builds (:class:`core.verification.devicelock.SharedExceptCompiling`); its waits are
        given back to ``budget`` and its held spans recorded as turns, as :meth:`_gpu` records its own."""
        if self.device_lock is None:
            return worker.request(message, timeout_s=budget.left())
        asked = time.monotonic()
        lock = {**self.device_lock.describe(), "wait_s": self.gpu_wait_s}
        answer = worker.request({**message, "device_lock": lock}, timeout_s=budget.left() + self.gpu_wait_s)
        turns = (answer.get("data") or {}).pop("gpu_lock", None) if answer.get("ok") else None
        if not turns:
            return answer
        budget.waited(float(turns.get("wait_s") or 0.0))
        for got, done in turns.get("segments") or []:
            record_turn(budget, self.gpu_turns, label, False, asked, got, done)
            asked = done
        return answer

"""Races by construction for Triton candidates judged on a GPU: the interpreter's analysis, on the CPU,
at the task's own shapes, on a sample of each launch's programs.

On a GPU, compute-sanitizer's racecheck sees shared-memory hazards only; a lost update in global
memory passes unless the hardware's block order happens to corrupt a trial. The CPU path finds such
races by construction (``plugins/backends/triton_races.py``: per-program address logs), and this
check runs that analysis for GPU candidates, without changing the task:

* the judge (:class:`InterpreterRaceCheck`) loads the candidate in a sandboxed CPU candidate worker
  of its own (Triton interpreter, CUDA mapped to the CPU: ``core/verification/worker/cuda_on_cpu.py``;
  the candidate never runs in the judging process), whose address-space limit is sized from the
  task's footprint measured on the meta device;
* there, :class:`InterpreterRaceSample` (this check's worker half, asked for by name through the
  worker's ``collect`` request) draws the task's inputs at its own shapes (a large random tensor
  is a random block of 2**20+7 elements tiled to its size: seconds instead of minutes of CPU RNG,
  and still not constant, so two programs storing different values stay told apart) and calls
  ``forward`` with the bounds checker on and every launch *sampled*: of a grid of more than
  :attr:`~InterpreterRaceCheck.sample` programs only the first and the last, their neighbours along
  each grid axis, and random programs with their neighbours run, with their true program ids and
  grid, chosen from a seed drawn fresh per verdict (``triton_interp_checks.choose_programs``); the
  sampled programs' addresses are checked for overlaps. A loop of more than 4096 iterations runs
  4096 of them (its first and last 1024 and the rest drawn between, ``triton_interp_checks.sampled_loop``). An autotuned kernel is called once per
  config (the interpreter runs config ``i`` at call ``i``). No reference and no comparison run
  (only sampled programs write, so the outputs are not the task's);
* then the worker's ``tamper`` measurement: the instrumentation intact and no sandbox refusal.

Outcomes: a race or an out-of-bounds access among the sampled programs rejects; a sandbox refusal
or tampering rejects as a hack; the verdict's detail and data say what was sampled (per launch: its
grid, how many programs, how chosen). When the analysis could not run (the candidate does not load
or run in the interpreter, the host cannot hold the task's inputs, the worker failed) the check
*could not run* and fails closed, saying why (``accept_unchecked: [interp_races]`` lets such
candidates through and the verdict records it). Residual risks: a race between two programs that
are neither neighbours along a grid axis nor both drawn at random (a 1-D grid a kernel decodes into
2-D tiles has neighbours ``num_pid_n`` apart), or only in the middle iterations of a long loop, is found
only by chance; a candidate that branches on
the device (``x.is_cuda``) can be race-free in the interpreter and racy on the GPU. docs/verifier.md
lists both.
"""

from __future__ import annotations

import math
import os
import secrets
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterator

from core import hookimpl
from core.api.evidence import RACE_FINDING, RACE_SUMMARY, RACES, Evidence
from core.verdict import CheckResult, could_not_run

SAMPLE_CHECK = "interp_races_sample"  # the worker half's registered name

# Random tensors of more elements than this are drawn as a tiled block of TILE elements (odd, so the
# period never lines up with a power-of-two row).
FAST_RANDOM_ABOVE = 1 << 22
TILE = (1 << 20) + 7


@dataclass
class InterpreterRaceCheck:
    """No data race (nor out-of-bounds access) between the programs of a GPU Triton candidate's
    launches, found by the interpreter's address analysis on the CPU, at the task's own shape, on a
    sample of each launch's programs."""

    name: str = "interp_races"
    reads: ClassVar[frozenset[str]] = frozenset()  # compares no run's outputs through the keeper (Check.reads)
    stage: int = RACES
    hard: bool = True
    where: str = "worker"
    # Not an observation of the GPU worker: the judge runs the CPU analysis itself, after the
    # trials' checks passed (a check with needs beyond the trials is evaluated only then).
    needs: frozenset[str] = frozenset({"trials", "interpreter"})
    sample: int = 16  # programs run per launch at most (corners, neighbours, random); every one of a smaller grid
    max_calls: int = 8  # forward calls at most: one per autotune config
    # No sampled program of a launch starts after it has run this long (a deep loop per program), and no
    # further autotune config's call after the calls took calls_s. At KernelBench's real sizes the
    # analysis is the suite's largest CPU cost (a 4096-deep matmul program: ~1 s in the interpreter);
    # these bound one candidate's to about half a minute of one core.
    launch_s: float = 8.0
    calls_s: float = 30.0
    # CPU candidate workers of the smallest memory class; 0: one per verification the GPU verifier runs at
    # once (its workers), at most half the cores: more would only start idle processes beside the GPU's. It
    # grows while more analyses wait than it has workers, up to one per verification a GPU shard keeps in
    # flight (twice its workers and one: those waiting on this check have given their GPU slot back). On
    # an H100, three workers for seven verifications in flight left the matmuls' verdicts waiting 10-33 s.
    workers: int = 0
    # Added to the CPU workers' niceness: the analysis takes the cores the GPU's workers leave idle, never
    # the host thread that launches a timed run (a late launch is a retried run, a longer turn alone).
    nice: int = 5
    timeout_s: float = 300.0
    memory_mb: int = 8192  # the smallest address-space limit of a CPU worker; larger tasks get a pool sized for them
    _pools: dict[int, Any] = field(default_factory=dict, init=False, repr=False, compare=False)
    _plans: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)
    _lock: Any = field(default_factory=threading.Lock, init=False, repr=False, compare=False)
    _started: dict[int, tuple[Any, Any]] = field(default_factory=dict, init=False, repr=False, compare=False)
    _runner: Any = field(default=None, init=False, repr=False, compare=False)
    _verifier_workers: int = field(default=0, init=False, repr=False, compare=False)
    # analyses begun and not yet ended, per memory class
    _active_in: dict[int, int] = field(default_factory=dict, init=False, repr=False, compare=False)

    def applies(self, backend: str, device: str) -> bool:
        return backend == "triton" and device == "cuda"

    def open(self, settings: dict[str, Any]) -> None:
        """Start the smallest CPU pool's workers now (they boot beside the GPU verifier's own). A pool
        that cannot start here does not stop the GPU verifier: ``evaluate`` tries again and, failing,
        could not run."""
        self._verifier_workers = int(settings.get("workers") or 0)
        try:
            self._pool(self.memory_mb)
        except Exception:  # noqa: BLE001  (reported by evaluate, which fails closed)
            pass

    def close(self) -> None:
        """Close the CPU pools' workers (the GPU verifier calls this from its own close)."""
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
            runner, self._runner = self._runner, None
            self._started.clear()
        if runner is not None:
            runner.shutdown(wait=False, cancel_futures=True)
        for pool in pools:
            pool.close()

    # -- the judge's side

    def _pool(self, memory_mb: int) -> Any:
        """The CPU candidate pool whose workers may map ``memory_mb`` MiB (one per size class)."""
        with self._lock:
            pool = self._pools.get(memory_mb)
            if pool is None:
                from core.api.workers import Limits, WorkerPool, worker_env
                from core.plugins import registry

                size = (self.workers or self.default_workers()) if memory_mb <= self.memory_mb else 1
                env = worker_env(registry("backend").create("triton"), "cpu", size, cuda_on_cpu=True)
                # the interpreter's tile products are small: numpy's BLAS threads only wait on each other
                # (a 128x32x128 product took 8 ms with its threads on a busy host, 0.03 ms with one)
                env["OPENBLAS_NUM_THREADS"] = "1"
                limits = Limits(memory_mb=memory_mb, cpu_s_per_request=int(self.timeout_s) + 5, nice=self.nice)
                pool = self._pools[memory_mb] = WorkerPool("candidate", "triton", "cpu", size=size, limits=limits,
                                                           extra_env=env)
            return pool

    def default_workers(self) -> int:
        """The smallest class's pool without ``workers`` set: one per verification in flight, at most
        half the cores (at least 1)."""
        half = max(1, (os.cpu_count() or 1) // 2)
        return min(half, self._verifier_workers) if self._verifier_workers > 0 else max(2, half)

    def max_workers(self) -> int:
        """What the smallest class's pool grows to while analyses wait (``workers`` set: that, fixed): one
        per verification a GPU shard keeps in flight, at most half the cores (at least the starting size)."""
        if self.workers:
            return self.workers
        half = max(1, (os.cpu_count() or 1) // 2)
        in_flight = 2 * self._verifier_workers + 1 if self._verifier_workers > 0 else half
        return max(self.default_workers(), min(half, in_flight))

    def _plan(self, task: Any) -> dict[str, Any]:
        """What the worker needs for ``task``: its init inputs, its footprint and the memory class."""
        key = f"{task.id}:{hash(task.source)}"
        with self._lock:
            if key in self._plans:
                return self._plans[key]
        from core.api.tasks import task_footprint as probe
        from plugins.verifiers.performance.check import load_task_module

        init_inputs = list(load_task_module(task.source, "kz_interp_races_plan").get_init_inputs())
        try:
            mib, how = probe(task.source).mib, "inputs, weights and every tensor forward writes"
        except Exception:  # a forward that does not run on the meta device: its inputs and weights, thrice
            try:
                mib, how = 3 * probe(task.source, run_forward=False).mib, "3x its inputs and weights"
            except Exception as exc:  # noqa: BLE001
                mib, how = None, f"not measurable on the meta device ({type(exc).__name__})"
        # Pools by size class, 2**(k/2) times the smallest (8, 11, 16, 22, 32, 45, 64, 90 GiB ...).
        if mib is None:  # unmeasured: the largest class that half this host holds
            k = max(0, int(2 * math.log2(max(1.0, host_memory_mb() / 2 / self.memory_mb))))
        else:  # the reference's footprint counts every intermediate (a fused kernel writes fewer); then the
            # candidate's own copies (a layout change), the interpreter's, and the address space a CUDA build of
            # torch maps at import (1.5x + 4 GiB left a 2.5 GiB conv3d output unallocatable on an H100 host)
            need = max(self.memory_mb, 2 * int(mib) + 6144)
            k = max(0, math.ceil(2 * math.log2(need / self.memory_mb) - 1e-9))
        memory_mb = int(math.ceil(self.memory_mb * 2 ** (k / 2) / 1024)) * 1024
        plan = {"init_inputs": init_inputs, "mib": None if mib is None else round(mib, 1), "measured": how,
                "memory_mb": memory_mb}
        with self._lock:
            self._plans[key] = plan
        return plan

    def start(self, evidence: Evidence) -> None:
        """Begin the analysis when the judge-side checks pass: it needs only the task and the
        candidate, and its CPU minutes then overlap the GPU stages instead of following them."""
        if evidence.backend != "triton":
            return
        with self._lock:
            if self._runner is None:
                from concurrent.futures import ThreadPoolExecutor

                self._runner = ThreadPoolExecutor(max_workers=max(8, self.max_workers()),
                                                  thread_name_prefix="kz-interp-races")
            for key in [k for k, (f, _) in self._started.items() if f.done() and len(self._started) > 64]:
                self._started.pop(key)  # verifications that ended before evaluating (an earlier failure)
            # the evidence is kept beside its future, so its id is not reused while the entry lives
            self._started[id(evidence)] = (self._runner.submit(self.analyse, evidence), evidence)

    def evaluate(self, evidence: Evidence) -> CheckResult:
        with self._lock:
            started = self._started.pop(id(evidence), None)
        if started is not None:
            return started[0].result()
        return self.analyse(evidence)

    def analyse(self, evidence: Evidence) -> CheckResult:
        """The analysis itself, now (``start`` runs it in the background)."""
        if evidence.backend != "triton":
            return CheckResult(True, "not a Triton candidate")
        try:
            plan = self._plan(evidence.task)
        except Exception as exc:
            return could_not_run(f"the task could not be loaded to size the interpreter's worker: "
                                 f"{type(exc).__name__}: {exc}"[:300])
        host_mb = host_memory_mb()
        where = "at the task's own shape " + (f"({plan['mib']} MiB)" if plan["mib"] is not None else
                                               f"(footprint {plan['measured']})")
        if plan["memory_mb"] > 0.9 * host_mb:
            return could_not_run(f"the race analysis needs {plan['memory_mb']} MiB of CPU memory {where}; this host "
                                 f"has {host_mb} MiB", {"plan": {k: plan[k] for k in ("mib", "memory_mb")}})
        return self._analyse_in_pool(evidence, plan, host_mb, where)

    def _analyse_in_pool(self, evidence: Evidence, plan: dict[str, Any], host_mb: int, where: str) -> CheckResult:
        memory_mb = plan["memory_mb"]
        with self._lock:
            self._active_in[memory_mb] = self._active_in.get(memory_mb, 0) + 1
        try:
            return self._analyse_in_class(evidence, plan, host_mb, where)
        finally:
            with self._lock:
                self._active_in[memory_mb] -= 1

    def _analyse_in_class(self, evidence: Evidence, plan: dict[str, Any], host_mb: int, where: str) -> CheckResult:
        try:
            pool = self._pool(plan["memory_mb"])
            with self._lock:
                if plan["memory_mb"] <= self.memory_mb:
                    wanted = min(self.max_workers(), sum(self._active_in.values()))  # every class's
                else:  # a larger class: within what half the host holds beside the other large classes' workers
                    others = sum(mb * p.size for mb, p in self._pools.items() if mb > self.memory_mb and p is not pool)
                    wanted = larger_class_workers(plan["memory_mb"], host_mb, others, self.max_workers(),
                                                  self._active_in[plan["memory_mb"]])
            if wanted > pool.size:  # more analyses than workers: one more each, up to the class's bound
                pool.grow(wanted)
        except Exception as exc:  # noqa: BLE001  (could not run: fails closed)
            return could_not_run(f"the CPU interpreter's workers could not start: {type(exc).__name__}: {exc}"[:300])
        result = self._analyse(evidence, plan, pool, where)
        larger = 2 * plan["memory_mb"]
        if not (result.unchecked and out_of_address_space(result.detail) and larger <= 0.9 * host_mb):
            return result
        # The plan is an estimate; running out of the worker's address space is ours to fix, never the
        # candidate's fault: once more in the class twice as large, which this task keeps from now on.
        plan["memory_mb"] = larger
        try:
            retried = self._analyse(evidence, plan, self._pool(larger), where)
        except Exception as exc:
            return could_not_run(f"the CPU interpreter's workers could not start: {type(exc).__name__}: {exc}"[:300])
        retried.data["retried_after"] = result.detail[:300]
        return retried

    def _analyse(self, evidence: Evidence, plan: dict[str, Any], pool: Any, where: str) -> CheckResult:
        from core.api.workers import Op, WorkerFailure, request

        seed = secrets.randbits(62)
        data: dict[str, Any] = {"shape": "own", "seed": seed, "memory_mb": plan["memory_mb"], "task_mib": plan["mib"]}
        deadline = time.monotonic() + self.timeout_s
        worker = pool.acquire()
        discard = False
        try:
            loaded = worker.request(request(Op.LOAD, source=evidence.candidate.source, init_seed=secrets.randbits(31),
                                            init_inputs=plan["init_inputs"], task=evidence.task.to_dict()),
                                    timeout_s=self.timeout_s)
            if loaded.get("sandbox"):
                discard = True
                return CheckResult(False, f"in the Triton interpreter, the sandbox refused: {loaded['sandbox'][0]}"[:500],
                                   data=data, hack=True)
            if not loaded.get("ok"):
                return could_not_run(f"the candidate did not load in the Triton interpreter: {loaded.get('error')}"[:500],
                                     data)
            config = {"seed": seed, "sample": self.sample, "max_calls": self.max_calls, "launch_s": self.launch_s,
                      "calls_s": self.calls_s}
            answer = worker.request(request(Op.COLLECT, check=SAMPLE_CHECK, config=config),
                                    timeout_s=max(1.0, deadline - time.monotonic()))
            tamper = worker.request(request(Op.COLLECT, check="tamper", config={}), timeout_s=60)
        except WorkerFailure as exc:
            discard = True
            return could_not_run(f"the race analysis did not run in the Triton interpreter {where}: the CPU worker "
                                 f"{exc.status}: {exc.detail}"[:500], data)
        finally:
            pool.release_unloaded(worker, discard=discard)
        found = (tamper.get("data") or {}).get("findings") if tamper.get("ok") else None
        if found is None:
            pool_discard_note = tamper.get("error") or "no report from the worker"
            return could_not_run(f"the instrumentation could not be verified after the race analysis: "
                                 f"{pool_discard_note}"[:300], data)
        if found:
            return CheckResult(False, f"in the Triton interpreter, while the race analysis ran: {found[0]}"[:500],
                               data={**data, "findings": found[:16]}, hack=True)
        result = answer.get("data") if answer.get("ok") else {"error": answer.get("error")}
        result = result if isinstance(result, dict) else {"error": "no report from the worker"}
        data.update({k: result.get(k) for k in ("launches", "calls", "seconds", "inputs") if k in result})
        if result.get("error"):
            return could_not_run(f"the race analysis did not run in the Triton interpreter {where}: "
                                 f"{result['error']}"[:500], data)
        findings = [str(f) for f in result.get("findings") or []]
        sampled = describe_samples(result.get("launches") or [])
        races = [f for f in findings if f.startswith(RACE_FINDING)]
        oob = [f for f in findings if not f.startswith((RACE_FINDING, RACE_SUMMARY))]
        data["findings"] = findings[:16]
        if races:
            return CheckResult(False, f"in the Triton interpreter {where}, {races[0]} (sampled: {sampled})"[:700],
                               data=data)
        if oob:
            return CheckResult(False, f"out of bounds in the Triton interpreter {where}: {oob[0]} (sampled: {sampled})"[:700],
                               data=data)
        return CheckResult(True, f"Triton interpreter on the CPU {where}: no address shared between programs "
                                 f"(sampled: {sampled})"[:700], data=data)


# How an allocation that the worker's address-space limit refused reads (torch's CPU allocator, Python, C++)
_ADDRESS_SPACE_EXHAUSTED = ("can't allocate memory", "cannot allocate memory", "alloc_cpu.cpp", "memoryerror",
                            "std::bad_alloc")


def out_of_address_space(detail: str) -> bool:
    """Whether a could-not-run detail says the CPU worker ran out of the memory its class allows.

    >>> out_of_address_space("forward failed: RuntimeError: DefaultCPUAllocator: can't allocate memory: ...")
    True
    >>> out_of_address_space("the candidate did not load in the Triton interpreter: NameError: tl")
    False
    """
    return any(marker in detail.lower() for marker in _ADDRESS_SPACE_EXHAUSTED)


# The larger classes' workers together may map this share of the host's memory. On the H200 (2026-12-07, 128 GiB
# host) level 1's elementwise problems, each in the 32 GiB class, were analysed one at a time by its single
# worker: their verdicts waited 10-36 s on it, one after another, while their GPU stages took about 4 s each.
LARGER_CLASSES_HOST_SHARE = 0.5


def larger_class_workers(memory_mb: int, host_mb: int, others_mb: int, most: int, waiting: int) -> int:
    """Workers a size class above the smallest may have for ``waiting`` analyses: one each, at most ``most``,
    and only as many as fit :data:`LARGER_CLASSES_HOST_SHARE` of the host beside the other larger classes'
    workers (``others_mb`` of address space); always one.

    >>> larger_class_workers(32768, 131072, 0, 13, 5), larger_class_workers(32768, 131072, 32768, 13, 5)
    (2, 1)
    >>> larger_class_workers(11264, 131072, 0, 13, 3), larger_class_workers(90112, 131072, 0, 13, 4)
    (3, 1)
    """
    room = int((LARGER_CLASSES_HOST_SHARE * host_mb - others_mb) // memory_mb)
    return max(1, min(most, waiting, room))


def host_memory_mb() -> int:
    """This host's physical memory in MiB."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20)
    except (ValueError, OSError, AttributeError):
        return 1 << 20


def describe_samples(launches: list[dict[str, Any]]) -> str:
    """The launches' samples in words: per kernel, its grid, programs run of all, how chosen."""
    if not launches:
        return "no kernel launched"
    parts = []
    for record in launches[:6]:
        how = ", ".join(f"{n} {k}" for k, n in (record.get("how") or {}).items())
        grid = "x".join(str(d) for d in record.get("grid") or [])
        ran = "" if record.get("ran") is None else \
            f", {record['ran']} run before its {record.get('cut_after_s')} s were spent"
        if record.get("loop_iterations"):  # a long loop ran a sample of its iterations (triton_interp_checks)
            ran += f"; a loop of {record['loop_iterations']} iterations ran {record.get('loop_ran')} of them"
        parts.append(f"{record.get('kernel')} grid {grid}: {record.get('sampled')} of {record.get('programs')} "
                     f"programs ({how}{ran})")
    more = len(launches) - 6 + sum(int(r.get("more_launches", 0)) for r in launches)
    return "; ".join(parts) + (f"; {more} more launch(es)" if more > 0 else "")


# --------------------------------------------------------------------------- the worker's side


@dataclass
class InterpreterRaceSample:
    """The worker half of ``interp_races`` (asked for by name in a CPU candidate worker, never
    chosen as a check of a verifier: ``applies`` is false everywhere): the sampled analysis."""

    name: str = SAMPLE_CHECK
    reads: ClassVar[frozenset[str]] = frozenset()  # never chosen as a check of a verifier
    stage: int = RACES
    hard: bool = True
    where: str = "worker"
    needs: frozenset[str] = frozenset({"trials"})
    seed: int = 0
    sample: int = 16
    max_calls: int = 8
    launch_s: float = 8.0
    calls_s: float = 30.0

    def applies(self, backend: str, device: str) -> bool:
        return False

    def evaluate(self, evidence: Evidence) -> CheckResult:  # pragma: no cover (never chosen)
        return could_not_run("the worker half of interp_races is not a check of its own")

    def collect(self, session: Any) -> dict[str, Any]:
        """Draw the task's inputs at its shapes, call forward with every launch sampled; the findings
        (races, out-of-bounds) and each launch's sample."""
        import torch

        from core.api.numerics import draw_inputs
        from plugins.verifiers.performance.check import load_task_module

        backend, guard = session.backend, session.guard
        if "program_order" not in backend.capabilities(session.device):
            return {"error": f"the backend cannot sample programs on {session.device}"}
        seconds: dict[str, float] = {}
        t = time.perf_counter()
        try:
            task = load_task_module((session.task or {})["source"], "kz_interp_races_task")
            with fast_random():
                inputs = draw_inputs(task, self.seed, 1.0, "cpu")
        except Exception as exc:
            return {"error": f"drawing the task's inputs failed: {type(exc).__name__}: {exc}"[:500]}
        seconds["inputs"] = round(time.perf_counter() - t, 3)
        shapes = [list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__ for x in inputs][:8]
        findings: list[str] = []
        launches: list[dict] = []
        names: set[str] = set()
        calls = 0
        configs = _autotune_configs(session.module)
        t = time.perf_counter()
        for call in range(max(1, self.max_calls)):
            with backend.launch_tracker() as tracker, backend.bounds_checking() as found, \
                    backend.program_order(self.seed + call, sample=self.sample, launch_s=self.launch_s) as sampled:
                try:
                    if guard is not None:
                        guard.armed = True
                    with torch.no_grad():
                        session.model(*inputs)
                except Exception as exc:
                    return {"error": f"forward failed: {type(exc).__name__}: {exc}"[:500], "launches": launches,
                            "inputs": shapes}
                finally:
                    if guard is not None:
                        guard.armed = False
                kernels = list(tracker.kernels)
            calls += 1
            findings += [f for f in found if f not in findings]
            launches += sampled
            # call i runs autotune config i: call again while a launch name (with its config) is new
            new = set(kernels) - names
            names |= set(kernels)
            if not any("[" in k for k in new) or time.perf_counter() - t > self.calls_s or calls == configs:
                break
        seconds["forward"] = round(time.perf_counter() - t, 3)
        return {"findings": findings[:32], "launches": launches[:64], "calls": calls, "seconds": seconds,
                "inputs": shapes}


def _autotune_configs(module: Any) -> int | None:
    """The most configs of an autotuned kernel at the candidate module's top level (the interpreter
    runs config i at call i, so that many calls run each once); None: none there (an autotuner kept
    elsewhere is still called until its launch names repeat)."""
    try:
        from triton.runtime.autotuner import Autotuner
    except ImportError:
        return None
    found = [len(v.configs) for v in list(vars(module).values()) if type(v) is Autotuner]
    return max(found) if found else None


_RANDOM = ("rand", "randn", "randint")
_RANDOM_LIKE = ("rand_like", "randn_like", "randint_like")
_IN_PLACE = ("uniform_", "normal_")


def _tiled(shape: Any, block: Any, like: Any = None) -> Any:
    """A tensor of ``shape`` (or ``like``'s) filled by repeating ``block`` (1-D)."""
    import torch

    out = torch.empty_like(like, memory_format=torch.contiguous_format) if like is not None else \
        torch.empty(shape, dtype=block.dtype, device=block.device)
    _fill(out, block)
    return out


def _fill(out: Any, block: Any) -> None:
    flat = out.view(-1)
    n, b = flat.numel(), block.numel()
    reps = n // b
    if reps:
        flat[:reps * b].view(reps, b).copy_(block.expand(reps, b))
    if n - reps * b:
        flat[reps * b:].copy_(block[:n - reps * b])


@contextmanager
def fast_random(above: int = FAST_RANDOM_ABOVE) -> Iterator[None]:
    """While active, ``torch.rand/randn/randint`` (and their ``_like`` forms, ``Tensor.uniform_`` and
    ``normal_``) of more than ``above`` elements draw a random block of :data:`TILE` elements with the
    same call and arguments and tile it to the full size; smaller ones draw as ever."""
    import torch

    saved = {name: getattr(torch, name) for name in _RANDOM + _RANDOM_LIKE}
    saved_in_place = {name: getattr(torch.Tensor, name) for name in _IN_PLACE}
    own = {name for name in _IN_PLACE if name in vars(torch.Tensor)}  # else inherited: deleted afterwards

    def factory(name: str, orig: Any) -> Any:
        def draw(*args: Any, **kwargs: Any) -> Any:
            if "out" in kwargs or "generator" in kwargs:
                return orig(*args, **kwargs)
            try:
                meta = orig(*args, **{**kwargs, "device": "meta"})
            except Exception:  # noqa: BLE001  (what the meta device cannot draw is drawn as written)
                return orig(*args, **kwargs)
            if meta.numel() <= above:
                return orig(*args, **kwargs)
            if "size" in kwargs:
                block = orig(*args, **{**kwargs, "size": (TILE,)})
            elif name == "randint":
                at = max(i for i, a in enumerate(args) if isinstance(a, (tuple, list, torch.Size)))
                block = orig(*args[:at], (TILE,), *args[at + 1:], **kwargs)
            else:
                sized = bool(args) and isinstance(args[0], (tuple, list, torch.Size))
                block = orig(*((TILE,),) + (args[1:] if sized else ()), **kwargs)
            out = _tiled(meta.shape, block.reshape(-1))
            return out.requires_grad_() if kwargs.get("requires_grad") else out
        return draw

    def like(orig: Any) -> Any:
        def draw(x: Any, *args: Any, **kwargs: Any) -> Any:
            if not isinstance(x, torch.Tensor) or x.numel() <= above or "memory_format" in kwargs:
                return orig(x, *args, **kwargs)
            block = orig(torch.empty(TILE, dtype=x.dtype, device=x.device), *args, **kwargs)
            return _tiled(None, block, like=x.detach())
        return draw

    def in_place(orig: Any) -> Any:
        def draw(self: Any, *args: Any, **kwargs: Any) -> Any:
            if self.numel() <= above or not self.is_contiguous() or "generator" in kwargs:
                return orig(self, *args, **kwargs)
            block = orig(torch.empty(TILE, dtype=self.dtype, device=self.device), *args, **kwargs)
            with torch.no_grad():
                _fill(self, block)
            return self
        return draw

    try:
        for name in _RANDOM:
            setattr(torch, name, factory(name, saved[name]))
        for name in _RANDOM_LIKE:
            setattr(torch, name, like(saved[name]))
        for name in _IN_PLACE:
            setattr(torch.Tensor, name, in_place(saved_in_place[name]))
        yield
    finally:
        for name, orig in saved.items():
            setattr(torch, name, orig)
        for name, orig in saved_in_place.items():
            if name in own:
                setattr(torch.Tensor, name, orig)
            elif name in vars(torch.Tensor):
                delattr(torch.Tensor, name)


@hookimpl
def register_verifiers(register):
    register(InterpreterRaceCheck.name, InterpreterRaceCheck)
    register(InterpreterRaceSample.name, InterpreterRaceSample)

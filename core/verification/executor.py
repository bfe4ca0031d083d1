"""One interface for running verification, on one machine or many.

An **executor** has the verifier's own surface (``verify``, ``verify_many``, ``workers``, a context
manager), so self-play, training and evaluation take either without knowing which::

    from core.verification.executor import make_executor
    with make_executor({"name": "local"}, backend="triton", device="cpu", verifier={"workers": 2}) as ex:
        verdicts = ex.verify_many(pairs)          # one verdict per pair, in order

Work is spread over **shards**; a shard is one :class:`core.verify.Verifier` (a warm sandboxed
worker pool) living in a host process pinned to one device. Executors are plugins
(``register_executors``, :class:`core.contracts.Executor`); this module is what they share
(:class:`BaseExecutor`, the shards, :func:`schedule`, the ``--serve`` host of a process shard). The
built-ins, in ``plugins/executors/``:

* ``executor=local`` (the default, cannot be blocked): one shard per GPU of this machine (the host
  process sees only its GPU through ``CUDA_VISIBLE_DEVICES``), or, without a GPU, a single shard
  whose pool has one interpreter worker per core.
* ``executor=ray``: one Ray actor per shard, each reserving one GPU (Ray pins it) or ``workers``
  CPUs, on a local Ray instance or any cluster (``address=``).

Both executors can put a **CPU stage** in front (``cpu_stage.checks``): a CPU-only Verifier with those
checks judges first, and only candidates that compiled there reach a GPU, which then only runs and
times kernels. It pays off where compiling needs no GPU (``backend=cuda``: NVRTC on CPU); the CPU
verdict of a candidate that failed to parse or compile is final.

A shard lost mid-batch (its host process or Ray actor died, or its node went away) loses no verdict:
its unfinished pairs go back to the queue and run on another shard (a replacement is started), up to
``max_attempts`` times; each pair's verdict is reported exactly once. A candidate that crashes its
*sandbox* worker is different: that is the candidate's verdict (``crashed``), reached by the verifier.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import importlib
import json
import os
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from core.task import Candidate, Task
from core.verdict import Verdict
from core.verification.dispatch import plan_memory
from core.verification.scheduling import (  # noqa: F401  (re-exported: where they were)
    ExecutorError,
    PairFeed,
    ShardLost,
    ShardSet,
    encode_pairs,
    schedule,
)

if TYPE_CHECKING:
    from core.contracts import Executor

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_VERIFIER = "core.verify:Verifier"

Pair = tuple[Task, Candidate]


def load_object(path: str) -> Any:
    """``"package.module:attr"`` -> the attribute."""
    module, _, attr = path.partition(":")
    if not attr:
        raise ValueError(f"expected 'module:attribute', got {path!r}")
    return getattr(importlib.import_module(module), attr)


def _decode_pairs(data: Sequence[Sequence[dict[str, Any]]]) -> list[Pair]:
    return [(Task.from_dict(t), Candidate.from_dict(c)) for t, c in data]


def verify_encoded(verifier: Any, data: Sequence[Sequence[dict[str, Any]]]) -> list[str]:
    """Shard side: decode pairs, verify them, return verdicts as JSON (what crosses process lines)."""
    pairs = _decode_pairs(data)
    try:
        verdicts = verifier.verify_many(pairs)
    except Exception as exc:  # the verifier itself failed: say so per pair, do not lose them
        detail = f"verifier error: {type(exc).__name__}: {exc}"
        verdicts = [Verdict.failure("error", detail, task_id=t.id, candidate_id=c.id) for t, c in pairs]
    if len(verdicts) != len(pairs):
        raise RuntimeError(f"verifier returned {len(verdicts)} verdicts for {len(pairs)} pairs")
    return [v.to_json() for v in verdicts]


def plan_encoded(verifier: Any, tasks: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Shard side: the verifier's GPU memory plan for these tasks (``Verifier.memory_plan``), or none."""
    planner = getattr(verifier, "memory_plan", None)
    if not callable(planner):
        return {"capacity": None, "bytes": {}}
    return planner([Task.from_dict(t) for t in tasks])


# --------------------------------------------------------------------------- shards


class Shard(Protocol):
    name: str
    capacity: int  # pairs it verifies at once (its pool's worker count)

    def submit(self, data: list[list[dict[str, Any]]]) -> cf.Future:
        """Verify encoded pairs; the future yields verdict JSON strings or raises :class:`ShardLost`."""

    def close(self) -> None: ...


class InProcessShard:
    """A Verifier in this process (one device, nothing to pin). Cannot be lost."""

    def __init__(self, name: str, verifier: Any, capacity: int):
        self.name, self.verifier, self.capacity = name, verifier, capacity
        self._pool = cf.ThreadPoolExecutor(max_workers=2 * capacity + 1, thread_name_prefix=f"shard-{name}")

    def submit(self, data: list[list[dict[str, Any]]]) -> cf.Future:
        return self._pool.submit(verify_encoded, self.verifier, data)

    def watch_gpu_release(self, callback: Callable[[str, str], None] | None) -> None:
        """``callback(task_id, candidate_id)`` when a verification gives its GPU memory back before its
        verdict (``Verifier.on_gpu_released``); None stops it."""
        if hasattr(self.verifier, "on_gpu_released"):
            self.verifier.on_gpu_released = callback

    def memory_plan(self, tasks: Sequence[Task]) -> cf.Future:
        """A future of the verifier's memory plan for ``tasks`` (:func:`plan_encoded`)."""
        return self._pool.submit(plan_encoded, self.verifier, [t.to_dict() for t in tasks])

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        close = getattr(self.verifier, "close", None) or getattr(self.verifier, "__exit__", None)
        if close is not None:
            close() if close.__name__ == "close" else close(None, None, None)


class ProcessShard:
    """A Verifier in its own host process (``python -m core.verification.executor --serve``), pinned by environment.

    Messages are JSON lines on private pipes. The host answers requests concurrently (threads; the
    Verifier is thread-safe), up to twice its capacity (requests waiting off the GPU hold no slot: schedule).
    """

    def __init__(self, name: str, verifier_path: str, verifier_kwargs: Mapping[str, Any], capacity: int,
                 env: Mapping[str, str] | None = None, start_timeout_s: float = 300.0):
        self.name, self.capacity = name, capacity
        to_host_r, to_host_w = os.pipe()
        from_host_r, from_host_w = os.pipe()
        child_env = dict(os.environ)
        child_env.update(env or {})
        child_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), child_env.get("PYTHONPATH")) if p)
        self.log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"kz-shard-{name}-{os.getpid()}-{id(self)}.log"
        log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "core.verification.executor", "--serve", "--in-fd", str(to_host_r), "--out-fd", str(from_host_w)],
            env=child_env, cwd=str(REPO_ROOT), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            pass_fds=(to_host_r, from_host_w))
        log.close()
        os.close(to_host_r)
        os.close(from_host_w)
        self._out = os.fdopen(to_host_w, "w", buffering=1)
        self._in = os.fdopen(from_host_r, "r")
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._pending: dict[int, cf.Future] = {}
        self._next_id = 0
        self._lost: str | None = None
        self._released: Callable[[str, str], None] | None = None  # watch_gpu_release's callback
        self._ready = cf.Future()
        self._send({"verifier": verifier_path, "kwargs": dict(verifier_kwargs), "concurrency": 2 * capacity + 1})
        self._reader = threading.Thread(target=self._read_loop, name=f"shard-{name}-reader", daemon=True)
        self._reader.start()
        try:
            self.started = self._ready.result(timeout=start_timeout_s)  # the host's start-up figures
        except cf.TimeoutError:
            self.close()
            raise ExecutorError(f"shard {name} did not start within {start_timeout_s:.0f}s; log: {self.log_path}") from None
        except ShardLost as exc:
            raise ExecutorError(f"shard {name} failed to start: {exc}") from None

    @property
    def pid(self) -> int:
        return self.process.pid

    def _send(self, message: dict[str, Any]) -> None:
        line = json.dumps(message) + "\n"
        with self._send_lock:  # schedules on other threads (a training stream, a reward call) share the pipe
            self._out.write(line)
            self._out.flush()

    def _read_loop(self) -> None:
        try:
            for line in self._in:
                message = json.loads(line)
                if "ready" in message:
                    self._ready.set_result(message)
                    continue
                if "fatal" in message:
                    self._fail(f"host error: {message['fatal']}")
                    return
                if "released" in message:  # a verification's GPU memory is back before its verdict
                    if self._released is not None:
                        self._released(*message["released"])
                    continue
                with self._lock:
                    future = self._pending.pop(message["id"], None)
                if future is not None:
                    future.set_result(message["verdicts"] if "verdicts" in message else message.get("plan"))
        except (OSError, ValueError) as exc:
            self._fail(f"channel broke: {exc}")
            return
        self._fail(f"host process exited ({self._exit_code()}); log: {self.log_path}")

    def _exit_code(self) -> str:
        try:
            code = self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "still running"
        return f"status {code}" if code >= 0 else f"killed by signal {-code}"

    def _fail(self, reason: str) -> None:
        with self._lock:
            self._lost = reason
            pending, self._pending = self._pending, {}
        if not self._ready.done():
            self._ready.set_exception(ShardLost(reason))
        for future in pending.values():
            future.set_exception(ShardLost(f"shard {self.name}: {reason}"))

    def submit(self, data: list[list[dict[str, Any]]]) -> cf.Future:
        return self._ask({"pairs": data})

    def watch_gpu_release(self, callback: Callable[[str, str], None] | None) -> None:
        """As :meth:`InProcessShard.watch_gpu_release`, heard through the host's pipe."""
        self._released = callback

    def memory_plan(self, tasks: Sequence[Task]) -> cf.Future:
        """A future of the host verifier's memory plan for ``tasks`` (:func:`plan_encoded`)."""
        return self._ask({"memory_plan": [t.to_dict() for t in tasks]})

    def _ask(self, body: dict[str, Any]) -> cf.Future:
        future: cf.Future = cf.Future()
        with self._lock:
            if self._lost is not None:
                future.set_exception(ShardLost(f"shard {self.name}: {self._lost}"))
                return future
            request_id = self._next_id
            self._next_id += 1
            self._pending[request_id] = future
        try:
            self._send({"id": request_id, **body})
        except (OSError, ValueError) as exc:
            self._fail(f"could not send a request: {exc}")
        return future

    def close(self) -> None:
        try:
            self._send({"exit": True})
        except (OSError, ValueError):
            pass
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        for f in (self._out, self._in):
            try:
                f.close()
            except OSError:
                pass
        self._reader.join(timeout=5)


def serve(in_fd: int, out_fd: int) -> None:
    """Host side of :class:`ProcessShard`: build the Verifier, then answer requests until told to exit."""
    from core.verification.lifeline import install_exit_signals, kill_all, watch_parent

    # The process that started this host may be killed outright (a time limit): the workers go with it,
    # so the GPU's memory comes back (core.verification.lifeline); SIGTERM/SIGINT do the same at once.
    watch_parent(os.getppid(), on_orphan=kill_all)
    install_exit_signals()
    reader = os.fdopen(in_fd, "r")
    writer = os.fdopen(out_fd, "w", buffering=1)
    config = json.loads(reader.readline())
    began = time.perf_counter()
    try:
        verifier = load_object(config["verifier"])(**config["kwargs"])
        if hasattr(verifier, "__enter__"):
            verifier = verifier.__enter__() or verifier
    except Exception:
        writer.write(json.dumps({"fatal": traceback.format_exc(limit=5)}) + "\n")
        return
    writer.write(json.dumps({"ready": True, "pid": os.getpid(),
                             "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                             "start_s": round(time.perf_counter() - began, 1),
                             "warm_up": getattr(verifier, "warm_up_report", None)}) + "\n")
    lock = threading.Lock()

    def released(task_id: str, candidate_id: str) -> None:
        with lock:
            writer.write(json.dumps({"released": [task_id, candidate_id]}) + "\n")

    if hasattr(verifier, "on_gpu_released"):
        verifier.on_gpu_released = released

    def answer(message: dict[str, Any]) -> None:
        if "memory_plan" in message:
            try:
                plan = plan_encoded(verifier, message["memory_plan"])
            except Exception as exc:  # noqa: BLE001  (no plan: the judge dispatches in order)
                plan = {"capacity": None, "bytes": {}, "error": f"{type(exc).__name__}: {exc}"[:300]}
            reply = {"id": message["id"], "plan": plan}
        else:
            reply = {"id": message["id"], "verdicts": verify_encoded(verifier, message["pairs"])}
        with lock:
            writer.write(json.dumps(reply) + "\n")

    pool = cf.ThreadPoolExecutor(max_workers=int(config.get("concurrency", 4)), thread_name_prefix="kz-host")
    try:
        for line in reader:
            message = json.loads(line)
            if message.get("exit"):
                break
            pool.submit(answer, message)
    finally:
        pool.shutdown(wait=True)
        exit_ = getattr(verifier, "__exit__", None)
        if exit_ is not None:
            exit_(None, None, None)
        elif hasattr(verifier, "close"):
            verifier.close()


# --------------------------------------------------------------------------- executors


class BaseExecutor:
    """What every executor shares: the optional CPU stage, then the main shards."""

    name = "base"

    def __init__(self, backend: str, device: str, verifier: Mapping[str, Any] | None = None,
                 cpu_stage: Mapping[str, Any] | None = None, max_attempts: int = 3,
                 verifier_path: str = DEFAULT_VERIFIER, dispatch: str = "memory"):
        if dispatch not in ("memory", "fifo"):
            raise ExecutorError(f"dispatch must be 'memory' or 'fifo', not {dispatch!r}")
        self.backend, self.device = backend, device
        self.dispatch = dispatch  # "memory": a GPU shard starts the first pair that fits (core.verification.dispatch)
        self.dispatch_note = ""  # what the last batch's memory plan said, for the run's log
        self.verifier_kwargs = {k: v for k, v in dict(verifier or {}).items() if k != "name"}
        self.cpu_stage = dict(cpu_stage or {}) if cpu_stage and cpu_stage.get("checks") else None
        self.max_attempts = max_attempts
        self.verifier_path = verifier_path
        self.main: ShardSet | None = None
        self.pre: ShardSet | None = None

    # subclasses fill self.main (and self.pre when cpu_stage is set)
    @property
    def workers(self) -> int:
        return sum(s.capacity for s in self.main.shards) if self.main else 0

    @property
    def shards(self) -> list[Any]:
        return list(self.main.shards) if self.main else []

    def verifier_config(self, device: str, workers: int, checks: Any = "inherit") -> dict[str, Any]:
        kwargs = dict(self.verifier_kwargs)
        kwargs.update(backend=self.backend, device=device, workers=workers)
        if checks != "inherit":
            kwargs["checks"] = checks
        return kwargs

    def verify(self, task: Task, candidate: Candidate) -> Verdict:
        return self.verify_many([(task, candidate)])[0]

    def verify_many(self, pairs: Sequence[Pair],
                    on_verdicts: Callable[[list[int], list[Verdict]], None] | None = None,
                    deadline: float | None = None) -> list[Verdict | None]:
        """One verdict per pair, in order. ``on_verdicts(indices, verdicts)`` reports progress as they land.
        ``deadline`` (``time.monotonic()``): start no verification after it; those pairs are ``None``."""
        pairs = list(pairs)
        if not pairs:
            return []
        if self.main is None:
            raise ExecutorError("the executor is closed")
        if self.pre is None:
            return schedule(self.main, pairs, self.max_attempts, on_verdicts, deadline, self._footprints(pairs))
        first = schedule(self.pre, pairs, self.max_attempts, deadline=deadline)
        results: list[Verdict | None] = [None] * len(pairs)
        onward = []
        for i, v in enumerate(first):
            if v is None:
                continue  # never started (deadline)
            if v.accepted or v.compiled:  # made it through static + compile: the GPU decides the rest
                onward.append(i)
            else:
                results[i] = v
        if on_verdicts:
            rejected = [i for i in range(len(pairs)) if results[i] is not None]
            if rejected:
                on_verdicts(rejected, [results[i] for i in rejected])  # type: ignore[misc]

        def relay(idx: list[int], vs: list[Verdict]) -> None:
            if on_verdicts:
                on_verdicts([onward[i] for i in idx], vs)

        later = [pairs[i] for i in onward]
        for i, v in zip(onward, schedule(self.main, later, self.max_attempts, relay, deadline, self._footprints(later))):
            results[i] = v
        return results  # type: ignore[return-value]

    def verify_stream(self, feed: PairFeed, on_verdicts: Callable[[list[int], list[Verdict]], None]) -> None:
        """Verify the pairs put into ``feed`` (from other threads) as they come, until it is closed; each verdict
        is reported once, by its index in the feed, as it lands. One continuous queue (:func:`schedule`), in
        order: a stream's pairs are not planned for memory ahead (the judge's own admission still holds). With a
        CPU stage, what was put meanwhile goes through both stages together, a batch at a time."""
        if self.main is None:
            raise ExecutorError("the executor is closed")
        if self.pre is None:
            schedule(self.main, [], self.max_attempts, on_verdicts, feed=feed)
            return
        done = 0
        while not feed.done:
            feed.wake.result()
            batch = feed.take()
            if batch and not feed.cancelled:
                first = done
                self.verify_many(batch, on_verdicts=lambda idx, vs, first=first: on_verdicts([first + i for i in idx], vs))
            done += len(batch)

    def _footprints(self, pairs: Sequence[Pair]) -> dict[int, list[int | None]] | None:
        """The main shards' memory plan for ``pairs`` (``dispatch: memory``), noted in :attr:`dispatch_note`."""
        if self.dispatch != "memory" or self.main is None or not pairs:
            return None
        asked = time.perf_counter()
        plans = plan_memory(self.main.shards, pairs)
        planned_s = time.perf_counter() - asked  # before the first verification starts: a run's start-up
        notes = []
        for shard in self.main.shards:
            plan, capacity = plans.get(id(shard)), getattr(shard, "memory_bytes", None)
            if plan and capacity:
                over = sum(1 for b in plan if b and 2 * b > capacity)
                notes.append(f"{shard.name}: {capacity / 2**30:.1f} GiB admitted, {over} of {len(plan)} verifications "
                             "estimated over half of it")
        self.dispatch_note = (f"memory-aware dispatch (planned in {planned_s:.1f} s): " + "; ".join(notes)) if notes else ""
        return plans or None

    def describe(self) -> str:
        parts = [f"{len(self.shards)} shard(s), {self.workers} worker(s) on {self.device}"]
        # a GPU shard's start (pools, CUDA contexts, the warm-up verdicts) precedes the first verdict: 36 s on the H200
        parts += [f"{s.name} started in {s.started['start_s']} s ({s.started.get('warm_up') or 'no warm-up'})"
                  for s in self.shards if isinstance(getattr(s, "started", None), dict) and "start_s" in s.started]
        if self.pre is not None:
            parts.append(f"CPU stage {self.cpu_stage.get('checks')} on {len(self.pre.shards)} shard(s)")
        return f"{self.name}: " + "; ".join(parts)

    def close(self) -> None:
        for shard_set in (self.pre, self.main):
            if shard_set is None:
                continue
            for shard in shard_set.shards:
                try:
                    shard.close()
                except Exception:
                    pass
        self.main = self.pre = None

    def __enter__(self) -> BaseExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_executor(node: Mapping[str, Any] | None, *, backend: str, device: str,
                  verifier: Mapping[str, Any] | None = None) -> Executor:
    """Build the executor an ``executor`` config node names (``{name: local|ray, **kwargs}``) from
    the ``executor`` registry (``register_executors``)."""
    from omegaconf import DictConfig, OmegaConf

    from core.plugins import UnknownPluginError, registry

    data = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node or {})
    vdata = OmegaConf.to_container(verifier, resolve=True) if isinstance(verifier, DictConfig) else dict(verifier or {})
    name = data.pop("name", "local")
    try:
        factory = registry("executor").get(name)
    except UnknownPluginError as exc:
        raise ExecutorError(str(exc)) from None
    return factory(backend=backend, device=device, verifier=vdata, **data)


def executor_for_run(cfg: Any) -> Executor:
    """The verification executor of a composed run config (``core.run``, ``core.loop.training``).

    Under ``accelerate launch`` every rank verifies on its own GPU (``LOCAL_RANK``) unless the
    config names GPUs itself, so ranks never pile their sandbox workers onto GPU 0.
    """
    import os

    from omegaconf import OmegaConf

    from core.config import resolve_device

    device = resolve_device(cfg.device)
    node = OmegaConf.to_container(cfg.get("executor") or {"name": "local"}, resolve=True)
    rank = os.environ.get("LOCAL_RANK")
    if device == "cuda" and rank is not None and node.get("name", "local") == "local" and not node.get("gpus"):
        node["gpus"] = [int(rank)]
    verifier = OmegaConf.to_container(cfg.verifier, resolve=True)
    verifier.pop("name", None)
    return make_executor(node, backend=cfg.backend.name, device=device, verifier=verifier)


def _main(argv: Iterable[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="verification shard host (started by core.verification.executor)")
    parser.add_argument("--serve", action="store_true", required=True)
    parser.add_argument("--in-fd", type=int, required=True)
    parser.add_argument("--out-fd", type=int, required=True)
    args = parser.parse_args(list(argv) if argv is not None else None)
    serve(args.in_fd, args.out_fd)


if __name__ == "__main__":
    _main()


def __getattr__(name: str) -> Any:
    # Re-export for one release: the executors moved to plugins/executors/ and are found through the
    # registry, so core names no concrete plugin module.
    if name in _MOVED:
        from core.plugins import registry

        return registry("executor").get(_MOVED[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_MOVED = {"LocalExecutor": "local", "RayExecutor": "ray"}

__all__ = [
    "BaseExecutor",
    "ExecutorError",
    "PairFeed",
    "ShardLost",
    "ShardSet",
    "executor_for_run",
    "make_executor",
    "schedule",
]

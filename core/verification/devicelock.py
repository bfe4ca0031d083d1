"""A fair reader-writer lock on one GPU, shared by every judging process of the host.

Several sandbox workers share a GPU so that compiling, correctness trials and sanitizer runs
overlap; a timed run must still see the GPU alone, or its time includes a neighbour's kernels.
Work that merely uses the GPU holds the lock *shared*; a timed measurement (a check that declares
``exclusive_device = True``) holds it *exclusive*. The lock lives in two files under the temp
directory keyed by the physical GPU, so verifiers in different processes (LocalExecutor shards,
Ray actors, several training ranks) on one GPU respect each other.

``flock`` alone lets a stream of readers starve a writer; a second *gate* file makes it fair: every
acquirer passes through the gate exclusively, and a writer keeps the gate closed until the readers
already inside have left, so no new reader enters in front of it.

Each timed turn first waits for the shared turns inside to end (a reference stage at KernelBench's
sizes: seconds), with the GPU idle but for them. So waiting writers go first: a writer holds a third
file, *wants*, shared from the moment it asks until its turn ends, and a reader that finds it held
steps back out of the gate. Timed turns asked for meanwhile then run back to back after one drain,
instead of one drain each.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class DeviceLockTimeout(TimeoutError):
    """The GPU stayed busy past the caller's deadline."""


def gpu_key(device: str = "cuda", environ: dict[str, str] | None = None) -> str:
    """Which physical GPU a process's ``cuda:0`` is: the first entry of ``CUDA_VISIBLE_DEVICES``."""
    env = os.environ if environ is None else environ
    visible = (env.get("CUDA_VISIBLE_DEVICES") or "").split(",")[0].strip()
    return f"{device}-{visible or '0'}"


class DeviceLock:
    """``with lock.shared(deadline): ...`` for GPU work, ``with lock.exclusive(deadline): ...`` for timing."""

    def __init__(self, key: str, directory: str | os.PathLike | None = None, poll_s: float = 0.002):
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", key)
        root = Path(directory or tempfile.gettempdir()) / "kernelzero-device-locks"
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError:  # a sandboxed process on a read-only filesystem: the judge made it already
            pass
        self.key = key
        self.directory = str(Path(directory or tempfile.gettempdir()))
        self.main_path = root / f"{safe}.lock"
        self.gate_path = root / f"{safe}.gate"
        self.wants_path = root / f"{safe}.wants"  # held shared by every writer waiting or holding
        self.queued_path = root / f"{safe}.queued"  # held shared by every reader stepping back for writers
        self.poll_s = poll_s

    @classmethod
    def for_device(cls, device: str = "cuda", directory: str | os.PathLike | None = None) -> DeviceLock:
        return cls(gpu_key(device), directory)

    def describe(self) -> dict[str, str]:
        """What another process needs to take this same lock (:meth:`from_description`)."""
        return {"key": self.key, "directory": self.directory}

    @classmethod
    def from_description(cls, description: dict[str, str]) -> DeviceLock:
        return cls(str(description["key"]), description.get("directory"))

    @staticmethod
    def _open(path: Path) -> int:
        # One open file description per acquisition: flock then arbitrates threads of one process too.
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError:  # read-only filesystem (sandboxed worker): flock works on a read-only descriptor
            return os.open(path, os.O_RDONLY)

    def _acquire(self, path: Path, mode: int, deadline: float | None) -> int:
        fd = self._open(path)
        while True:
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                if deadline is not None and time.monotonic() > deadline:
                    os.close(fd)
                    raise DeviceLockTimeout(f"GPU {self.key} stayed busy past the deadline") from None
                time.sleep(self.poll_s)

    @staticmethod
    def _release(fd: int) -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def _held(self, path: Path) -> bool:
        """Whether another acquisition holds ``path``'s lock, asked without waiting."""
        try:
            fd = self._open(path)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # closing the description drops a lock it got
        return False

    def _writers_waiting(self) -> bool:
        """Whether a writer asks for or holds the GPU (the *wants* file is held)."""
        return self._held(self.wants_path)

    def readers_waiting(self) -> bool:
        """Whether a reader is stepping back for writers (the *queued* file is held)."""
        return self._held(self.queued_path)

    def _through_gate(self, deadline: float | None) -> int:
        """A reader's pass through the gate, stepping back while a writer waits."""
        queued = None
        try:
            while True:
                gate = self._acquire(self.gate_path, fcntl.LOCK_EX, deadline)
                if not self._writers_waiting():
                    return gate
                self._release(gate)
                if queued is None:
                    queued = self._acquire(self.queued_path, fcntl.LOCK_SH, deadline)
                if deadline is not None and time.monotonic() > deadline:
                    raise DeviceLockTimeout(f"GPU {self.key} stayed busy past the deadline (timed turns waiting)")
                time.sleep(self.poll_s)
        finally:
            if queued is not None:
                self._release(queued)

    @contextlib.contextmanager
    def _hold(self, mode: int, deadline: float | None) -> Iterator[None]:
        # Through the gate first: a writer waiting inside it keeps new readers out until it is served.
        writer = mode == fcntl.LOCK_EX
        wants = self._acquire(self.wants_path, fcntl.LOCK_SH, deadline) if writer else None
        try:
            gate = self._acquire(self.gate_path, fcntl.LOCK_EX, deadline) if writer else self._through_gate(deadline)
            try:
                main = self._acquire(self.main_path, mode, deadline)
            finally:
                self._release(gate)
            try:
                yield
            finally:
                self._release(main)
        finally:
            if wants is not None:
                self._release(wants)

    def shared(self, deadline: float | None = None) -> contextlib.AbstractContextManager[None]:
        """Use the GPU beside other shared holders."""
        return self._hold(fcntl.LOCK_SH, deadline)

    def exclusive(self, deadline: float | None = None) -> contextlib.AbstractContextManager[None]:
        """Have the GPU alone (timing)."""
        return self._hold(fcntl.LOCK_EX, deadline)


class SharedExceptCompiling(contextlib.AbstractContextManager):
    """The lock held shared by a worker itself around GPU work that includes a ``torch.compile`` build,
    given back while Dynamo and Inductor compile and taken again before the compiled code runs.

    A build is seconds of CPU per graph at KernelBench's sizes (Inductor's code generation, Triton's
    compiler): held as a shared turn it kept every timed (exclusive) turn of the host waiting, and the
    gate kept every other worker out behind it. Dynamo's compile callbacks mark the build
    (``torch._dynamo.callback``, trigger DYNAMO); Triton's autotuning runs at the first call, after
    the build, so under the lock again. Without those callbacks (an older torch) the lock is simply
    held throughout. ``segments`` are the (got, done) spans it held, ``waited_s`` the time it waited.
    A wait past ``deadline`` when taking it back ends the request: :meth:`__exit__` raises
    :class:`DeviceLockTimeout` rather than let GPU work run unlocked.
    """

    def __init__(self, lock: DeviceLock, deadline: float | None = None):
        self.lock, self.deadline = lock, deadline
        self.segments: list[tuple[float, float]] = []
        self.waited_s = 0.0
        self.builds = 0
        self._held: Any = None
        self._since = 0.0
        self._lost: DeviceLockTimeout | None = None
        self._handler: Any = None
        self._dynamo: Any = None

    def _take(self) -> None:
        asked = time.monotonic()
        held = self.lock.shared(self.deadline)
        held.__enter__()
        self._held, self._since = held, time.monotonic()
        self.waited_s += self._since - asked

    def _give(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            self.segments.append((self._since, time.monotonic()))
            held.__exit__(None, None, None)

    def _on_start(self, args: Any) -> None:
        if args.callback_trigger == self._dynamo and self._held is not None:
            self.builds += 1
            self._give()

    def _on_end(self, args: Any) -> None:
        if self._held is None and self._lost is None:
            try:
                self._take()
            except DeviceLockTimeout as exc:
                self._lost = exc
                raise

    def __enter__(self) -> SharedExceptCompiling:
        self._take()
        try:
            from torch._dynamo.callback import CallbackTrigger, callback_handler
        except ImportError:
            return self
        self._handler, self._dynamo = callback_handler, CallbackTrigger.DYNAMO
        callback_handler.register_start_callback(self._on_start)
        callback_handler.register_end_callback(self._on_end)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._handler is not None:
            self._handler.remove_start_callback(self._on_start)
            self._handler.remove_end_callback(self._on_end)
        self._give()
        if self._lost is not None:  # even where the build's error was caught (no compiled baseline)
            raise self._lost


# --------------------------------------------------------------------------- where the GPU's time went


def _union_s(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def summarise_turns(turns: list[dict], start: float | None = None, end: float | None = None) -> dict:
    """Where a judge's time on one GPU went, from its turns (``Verifier.gpu_turns``: dicts with
    ``label``, ``exclusive``, ``asked``, ``got``, ``done`` on one monotonic clock), within [start, end]:

    * ``exclusive_s``: the GPU held alone (timed stages, baselines); ``exclusive_wait_s``: what those
      waited for, summed (the readers inside had to finish first, and no new reader got in meanwhile);
    * ``shared_s``: time during which at least one shared turn (loads, trials, references, comparisons)
      held the GPU; ``idle_s``: time with no turn at all; ``span_s``: the window;
    * ``shared_by_label_s``: each kind of shared turn's holding time, summed over turns.

    The judge's time divides into ``exclusive_s + shared_s + idle_s == span_s`` (no turn is both).
    """
    turns = [t for t in turns if t["done"] >= t["got"]]
    if start is None:
        start = min((t["asked"] for t in turns), default=0.0)
    if end is None:
        end = max((t["done"] for t in turns), default=start)
    span = max(0.0, end - start)

    def clip(t: dict) -> tuple[float, float]:
        return min(max(t["got"], start), end), max(min(t["done"], end), start)

    held_alone = [clip(t) for t in turns if t["exclusive"]]
    shared = [clip(t) for t in turns if not t["exclusive"]]
    exclusive_s = _union_s(held_alone)
    shared_s = _union_s(shared)
    by_label: dict[str, float] = {}
    for t in turns:
        if not t["exclusive"]:
            a, b = clip(t)
            by_label[t["label"]] = by_label.get(t["label"], 0.0) + (b - a)
    return {"span_s": span, "exclusive_s": exclusive_s, "shared_s": shared_s,
            "idle_s": max(0.0, span - exclusive_s - shared_s),
            "exclusive_turns": len(held_alone),
            "exclusive_wait_s": sum(t["got"] - t["asked"] for t in turns if t["exclusive"]),
            "shared_by_label_s": dict(sorted(by_label.items(), key=lambda kv: -kv[1]))}

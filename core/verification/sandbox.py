"""Worker processes that run untrusted code under limits, and a warm pool of them.

The judging process starts each worker as a fresh interpreter (``python -m core.verification.worker``; a new
process from ``exec``, never a ``fork`` of a process that imported torch) with:

* a **scrubbed environment** (only ``PATH``, locale and what the backend needs, e.g.
  ``TRITON_INTERPRET=1``) and ``HOME``/``TMPDIR``/caches pointing into a private scratch directory,
  which is also its working directory;
* **resource limits**: address space (CPU devices), file size, core dumps, open files, and a CPU
  time budget per request; the judge adds a wall-clock deadline per request;
* **namespaces** where the kernel allows them (root, or unprivileged user namespaces): a private
  network namespace (no network at all) and a private mount namespace in which every mount is
  read-only except the scratch directory. Where they are not available the worker says so
  (``Worker.isolation``) and falls back to limits + an audit hook (``sys.addaudithook``) that
  refuses writes outside scratch, sockets, subprocesses and signals to other processes;
* a private **message channel** (length-prefixed frames on pipes, not stdout); messages are
  pickles of plain containers, decoded with an unpickler that refuses every global, so a
  compromised worker cannot make the judge run code. Tensors travel as raw bytes + dtype/shape,
  out of band after the pickle (protocol 5), so neither side copies them in Python.

A worker that hangs, segfaults, calls ``os._exit`` or runs out of memory raises
:class:`WorkerFailure` (status ``timeout``/``crashed``/``oom``) in the judge and is replaced by
the pool; the rest of the batch goes on.
"""

from __future__ import annotations

import fcntl
import io
import os
import pickle
import queue
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FRAME = struct.Struct("<QQ")  # pickle length, number of out-of-band buffers
MAX_FRAME_BUFFERS = 1 << 20
# One message carries every trial's inputs and outputs (reference) or outputs (candidate): a 256 MiB
# task with five trials and the stability probes is ~4 GiB. The cap only stops a runaway worker.
MAX_FRAME_BYTES = 1 << 36
TENSOR_TAG = "__kz_tensor__"
TUPLE_TAG = "__kz_tuple__"

# Environment variables a worker inherits from the judge (everything else is dropped); a backend's
# toolchain adds its own (core.api.sandbox.SandboxNeeds, through core.verification.judge.worker_env).
PASSTHROUGH_ENV = ("PATH", "LANG", "LC_ALL", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES",
                   "NVIDIA_VISIBLE_DEVICES", "KERNELZERO_DISABLE_AUTOLOAD",
                   "KERNELZERO_BLOCK_PLUGINS", "OMP_NUM_THREADS", "TORCHINDUCTOR_COMPILE_THREADS")
# In a value of a worker's extra environment, stands for its scratch directory (made when it starts).
SCRATCH = "{scratch}"


class WorkerFailure(RuntimeError):
    """The worker died or overran its deadline. ``status`` is a :data:`core.verdict.STATUSES` value."""

    def __init__(self, status: str, detail: str):
        super().__init__(detail)
        self.status = status
        self.detail = detail


class ProtocolError(RuntimeError):
    """A message did not decode (a worker wrote garbage on its channel)."""


# --------------------------------------------------------------------------- safe codec


def encode(obj: Any) -> Any:
    """Turn tensors (and tuples, torch.Size, dtypes) into plain containers; refuse anything else."""
    if obj is None or type(obj) in (bool, int, float, str, bytes):
        return obj
    for kind in (bool, int, float, str, bytes):  # subclasses (TorchVersion, IntEnum ...) as plain values
        if isinstance(obj, kind):
            return kind(obj)
    if isinstance(obj, dict):
        return {str(k): encode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [encode(v) for v in obj]
    if isinstance(obj, tuple):  # includes torch.Size
        return {TUPLE_TAG: [encode(v) for v in obj]}
    torch = sys.modules.get("torch")
    if torch is not None:
        if isinstance(obj, torch.Tensor):
            return _encode_tensor(obj)
        if isinstance(obj, torch.dtype):
            return str(obj)
    raise TypeError(f"cannot send a {type(obj).__name__} between judge and worker "
                    "(tensors, numbers, strings and lists/tuples/dicts of them are supported)")


def _encode_tensor(t: Any) -> dict[str, Any]:
    import torch

    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu() if t.is_contiguous() else _copy_strided(t, "cpu")
    storage = t.untyped_storage()
    # A view of the tensor's own memory: write_frame sends it out of band, with no copy in Python.
    raw = pickle.PickleBuffer(torch.empty(0, dtype=torch.uint8).set_(storage).numpy()) if storage.nbytes() else b""
    return {TENSOR_TAG: [str(t.dtype).replace("torch.", ""), list(t.shape), list(t.stride()),
                         int(t.storage_offset()), raw]}


def _copy_strided(t: Any, device: str) -> Any:
    """Copy ``t`` to ``device`` keeping its strides and storage offset (adversarial layouts)."""
    import torch

    storage = t.untyped_storage()
    flat = torch.empty(0, dtype=t.dtype, device=t.device).set_(storage, 0, (storage.nbytes() // t.element_size(),), (1,))
    moved = flat.to(device)
    return torch.as_strided(moved, tuple(t.shape), tuple(t.stride()), t.storage_offset())


def to_device(obj: Any, device: str) -> Any:
    """Move tensors (possibly inside lists/tuples) to ``device``, keeping their memory layout."""
    torch = sys.modules["torch"]
    if isinstance(obj, torch.Tensor):
        return obj if obj.device.type == torch.device(device).type else _copy_strided(obj, device)
    if isinstance(obj, list):
        return [to_device(v, device) for v in obj]
    if isinstance(obj, tuple):
        return tuple(to_device(v, device) for v in obj)
    return obj


def decode(obj: Any) -> Any:
    if isinstance(obj, list):
        return [decode(v) for v in obj]
    if isinstance(obj, dict):
        if TENSOR_TAG in obj and len(obj) == 1:
            return _decode_tensor(*obj[TENSOR_TAG])
        if TUPLE_TAG in obj and len(obj) == 1:
            return tuple(decode(v) for v in obj[TUPLE_TAG])
        return {k: decode(v) for k, v in obj.items()}
    return obj


def _decode_tensor(dtype: str, shape: list[int], stride: list[int], offset: int, raw: bytes) -> Any:
    import torch

    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise ProtocolError(f"unknown tensor dtype {dtype!r} in a worker message")
    if raw:
        # A bytearray read off the channel is ours alone: wrap it without copying.
        buf = raw if isinstance(raw, bytearray) else bytearray(raw)
        base = torch.frombuffer(buf, dtype=torch.uint8).view(torch_dtype)
    else:
        base = torch.empty(0, dtype=torch_dtype)
    return torch.as_strided(base, tuple(shape), tuple(stride), offset)


class _NoGlobalsUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise ProtocolError(f"refusing to unpickle global {module}.{name} from a worker message")


def dumps(obj: Any) -> bytes:
    return pickle.dumps(encode(obj), protocol=pickle.HIGHEST_PROTOCOL)


def loads(data: bytes) -> Any:
    try:
        return decode(_NoGlobalsUnpickler(io.BytesIO(data)).load())
    except ProtocolError:
        raise
    except Exception as exc:  # truncated or malformed frame
        raise ProtocolError(f"malformed worker message: {exc}") from exc


def _write_all(fd: int, data: Any) -> None:
    view = memoryview(data).cast("B")
    while view:
        n = os.write(fd, view)
        view = view[n:]


def write_frame(fd: int, obj: Any) -> None:
    """One message: a header (pickle length, buffer count, buffer lengths), the pickle, then every
    tensor's bytes straight from its memory (pickle protocol 5, out-of-band buffers)."""
    buffers: list[pickle.PickleBuffer] = []
    payload = pickle.dumps(encode(obj), protocol=5, buffer_callback=buffers.append)
    raws = [b.raw() for b in buffers]
    _write_all(fd, FRAME.pack(len(payload), len(raws)) + struct.pack(f"<{len(raws)}Q", *(r.nbytes for r in raws)))
    _write_all(fd, payload)
    for raw in raws:
        _write_all(fd, raw)


def channel_pipe() -> tuple[int, int]:
    """A pipe for the message channel, its buffer raised to 1 MiB where Linux allows (64 KiB by
    default): a 100 MB output then crosses in ~100 reads instead of ~1600."""
    r, w = os.pipe()
    try:
        limit = int(Path("/proc/sys/fs/pipe-max-size").read_text())
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, min(1 << 20, limit))
    except (OSError, ValueError, AttributeError):  # not Linux, or a lower limit: the default size works
        pass
    return r, w


def _wait_readable(fd: int, deadline: float | None) -> None:
    if deadline is not None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            raise TimeoutError


def _read_exact(fd: int, n: int, deadline: float | None) -> bytearray:
    """Exactly ``n`` bytes, read straight into one buffer."""
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        _wait_readable(fd, deadline)
        k = os.readv(fd, [view[got:got + (1 << 24)]])
        if not k:
            raise EOFError
        got += k
    return buf


def read_frame(fd: int, deadline: float | None = None) -> Any:
    size, count = FRAME.unpack(_read_exact(fd, FRAME.size, deadline))
    if count > MAX_FRAME_BUFFERS:
        raise ProtocolError(f"worker message with {count} buffers exceeds the limit of {MAX_FRAME_BUFFERS}")
    sizes = struct.unpack(f"<{count}Q", _read_exact(fd, 8 * count, deadline)) if count else ()
    if size + sum(sizes) > MAX_FRAME_BYTES:
        raise ProtocolError(f"worker message of {size + sum(sizes)} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")
    payload = _read_exact(fd, size, deadline)
    buffers = [_read_exact(fd, n, deadline) for n in sizes]
    try:
        return decode(_NoGlobalsUnpickler(io.BytesIO(payload), buffers=buffers).load())
    except ProtocolError:
        raise
    except Exception as exc:  # truncated or malformed frame
        raise ProtocolError(f"malformed worker message: {exc}") from exc


# --------------------------------------------------------------------------- limits


@dataclass(frozen=True)
class Limits:
    """Per-worker limits. ``memory_mb`` caps the address space on CPU devices (CUDA reserves huge
    virtual ranges, so on GPUs the judge watches resident memory instead)."""

    memory_mb: int = 8192
    file_size_mb: int = 256
    open_files: int = 1024
    cpu_s_per_request: int = 600
    isolate: bool = True  # try namespaces (network + read-only mounts)
    nice: int = 0  # added to the worker's CPU niceness: work beside the GPU's (interp_races) yields its cores to it


# --------------------------------------------------------------------------- one worker


@dataclass(eq=False)
class Worker:
    """One sandboxed worker process and its message channel."""

    role: str  # "candidate" or "reference"
    backend: str
    device: str
    limits: Limits = field(default_factory=Limits)
    extra_env: dict[str, str] = field(default_factory=dict)
    start_timeout_s: float = 120.0
    proc: subprocess.Popen | None = None
    scratch: Path | None = None
    hello: dict[str, Any] = field(default_factory=dict)
    jobs: int = 0
    _started: bool = False
    spawned_at: float = 0.0

    def start(self) -> "Worker":
        self.spawned_at = time.time()
        self.scratch = Path(tempfile.mkdtemp(prefix=f"kz-{self.role}-"))
        to_child_r, to_child_w = channel_pipe()
        from_child_r, from_child_w = channel_pipe()
        env = {k: os.environ[k] for k in PASSTHROUGH_ENV if k in os.environ}
        scratch = str(self.scratch)
        env.update({
            "HOME": scratch, "TMPDIR": scratch,
            "TORCHINDUCTOR_CACHE_DIR": f"{scratch}/.inductor", "XDG_CACHE_HOME": f"{scratch}/.cache",
            "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1", "PYTHONUNBUFFERED": "1",
            # The project first, then whatever the judge was given (e.g. wheels unpacked beside it).
            "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                           *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]),
        })
        env.update({k: v.replace(SCRATCH, scratch) for k, v in self.extra_env.items()})
        log = open(self.scratch / "worker.log", "wb")
        cmd = [sys.executable, "-m", "core.verification.worker", "--role", self.role, "--backend", self.backend,
               "--device", self.device, "--scratch", scratch, "--in-fd", str(to_child_r),
               "--out-fd", str(from_child_w), "--memory-mb", str(self.limits.memory_mb),
               "--file-size-mb", str(self.limits.file_size_mb), "--open-files", str(self.limits.open_files),
               "--isolate", "1" if self.limits.isolate else "0", "--parent-pid", str(os.getpid()),
               *(["--nice", str(self.limits.nice)] if self.limits.nice > 0 else [])]
        self.proc = subprocess.Popen(cmd, env=env, cwd=scratch, stdin=subprocess.DEVNULL, stdout=log,
                                     stderr=subprocess.STDOUT, pass_fds=(to_child_r, from_child_w),
                                     start_new_session=True)
        log.close()
        os.close(to_child_r)
        os.close(from_child_w)
        self._to, self._from = to_child_w, from_child_r
        self._started = True
        from core.verification.lifeline import register

        register(self)  # killed with its group when this process exits (core.verification.lifeline)
        return self

    def wait_ready(self) -> dict[str, Any]:
        if not self.hello:
            self.hello = self._receive(time.monotonic() + self.start_timeout_s, what="start-up")
            sent = self.hello.get("sent_at")
            if isinstance(sent, (int, float)) and self.spawned_at:  # spawn to hello, the interpreter's start included
                self.hello["ready_s"] = round(float(sent) - self.spawned_at, 3)
        return self.hello

    @property
    def isolation(self) -> str:
        return str(self.wait_ready().get("isolation", "unknown"))

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def request(self, message: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send one request and wait for its answer; raise :class:`WorkerFailure` if the worker dies."""
        self.wait_ready()
        self.jobs += 1
        message = {**message, "cpu_s": self.limits.cpu_s_per_request}
        try:
            write_frame(self._to, message)
        except (BrokenPipeError, OSError):
            raise self._death("while receiving a request") from None
        answer = self._receive(time.monotonic() + timeout_s, what=f"request {message.get('op')!r}")
        if answer.get("status") == "oom":
            self.kill()
            raise WorkerFailure("oom", f"out of memory: {answer.get('error', '')}")
        return answer

    def _receive(self, deadline: float, what: str) -> dict[str, Any]:
        try:
            return read_frame(self._from, deadline)
        except TimeoutError:
            limit = deadline - time.monotonic()
            self.kill()
            raise WorkerFailure("timeout", f"worker exceeded its wall-clock limit during {what}"
                                f"{'' if limit <= 0 else ''}") from None
        except (EOFError, OSError):
            raise self._death(f"during {what}") from None
        except ProtocolError as exc:
            self.kill()
            raise WorkerFailure("crashed", f"worker sent a malformed message during {what}: {exc}") from None

    def _death(self, when: str) -> WorkerFailure:
        code = None
        if self.proc is not None:
            try:
                code = self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()
        tail = self.log_tail()
        if code is not None and code < 0:
            sig = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
            desc = f"worker killed by {sig}"
        else:
            desc = f"worker exited with status {code}"
        status = "oom" if ("MemoryError" in tail or "std::bad_alloc" in tail or "Cannot allocate memory" in tail) else "crashed"
        last = tail.strip().splitlines()[-1][:300] if tail.strip() else ""
        return WorkerFailure(status, f"{desc} {when}" + (f": {last}" if last else ""))

    def log_tail(self, n: int = 4000) -> str:
        try:
            data = (self.scratch / "worker.log").read_bytes()  # type: ignore[operator]
        except OSError:
            return ""
        return data[-n:].decode("utf-8", "replace")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def ask_to_exit(self) -> None:
        if self.alive and hasattr(self, "_to"):
            try:
                write_frame(self._to, {"op": "exit"})
            except OSError:
                pass

    def close(self, grace_s: float = 2.0) -> None:
        if self.alive:
            self.ask_to_exit()
            try:
                self.proc.wait(timeout=grace_s)  # type: ignore[union-attr]
            except Exception:
                pass
        self.kill()
        for fd in ("_to", "_from"):
            if hasattr(self, fd):
                try:
                    os.close(getattr(self, fd))
                except OSError:
                    pass
                delattr(self, fd)
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)


# --------------------------------------------------------------------------- the pool


class WorkerPool:
    """A fixed number of warm workers of one role; dead or worn-out workers are replaced.

    :param size: number of workers.
    :param max_jobs: a worker is recycled after this many requests (bounds cross-candidate leakage).
    """

    def __init__(self, role: str, backend: str, device: str, size: int = 2, *, limits: Limits | None = None,
                 extra_env: dict[str, str] | None = None, max_jobs: int = 200):
        self.role, self.backend, self.device = role, backend, device
        self.limits = limits or Limits()
        self.extra_env = dict(extra_env or {})
        self.max_jobs = max_jobs
        self.size = size
        self._idle: queue.Queue[Worker] = queue.Queue()
        self._all: set[Worker] = set()
        self._lock = threading.Lock()
        self.replaced = 0
        self.closed = False
        for _ in range(size):
            self._idle.put(self._spawn())

    def _spawn(self) -> Worker:
        worker = Worker(self.role, self.backend, self.device, self.limits, self.extra_env).start()
        with self._lock:
            self._all.add(worker)
        return worker

    def acquire(self) -> Worker:
        if self.closed:
            raise RuntimeError("the worker pool was closed")
        return self._idle.get()

    def grow(self, size: int) -> int:
        """Spawn workers until the pool has ``size`` (never fewer than it has); the new size."""
        with self._lock:
            if self.closed or size <= self.size:
                return self.size
            more, self.size = size - self.size, size
        for _ in range(more):
            self._idle.put(self._spawn())
        return size

    def release(self, worker: Worker, *, discard: bool = False) -> None:
        """Give a worker back; a dead, flagged (``discard``) or worn-out one is replaced by a fresh one."""
        if discard or not worker.alive or worker.jobs >= self.max_jobs:
            with self._lock:
                self._all.discard(worker)
            worker.close()
            if self.closed:
                return
            self.replaced += 1
            worker = self._spawn()
        if self.closed:
            worker.close()
            return
        self._idle.put(worker)

    def release_unloaded(self, worker: Worker, *, discard: bool = False) -> None:
        """Give a candidate worker back once it forgot its candidate (``unload``); one that cannot
        forget it, or is flagged (``discard``), is replaced."""
        if not discard and worker.alive:
            from core.verification.protocol import Op, request

            try:
                worker.request(request(Op.UNLOAD), timeout_s=30)
            except WorkerFailure:
                discard = True
        self.release(worker, discard=discard)

    def start_ups(self, since: float | None = None) -> list[dict[str, Any]]:
        """Where each started worker's start-up went (without waiting for those still starting): the
        seconds from its spawn to its hello, and the worker's own split (importing torch, the backend,
        in all) and warm-up report; with ``since`` (a ``time.time()``), also when it was spawned after that."""
        with self._lock:
            workers = list(self._all)
        return [{"ready_s": w.hello.get("ready_s"), **(w.hello.get("start_up_s") or {}),
                 **({"spawned_s": round(w.spawned_at - since, 3)} if since is not None else {}),
                 "warm_up": w.hello.get("gpu_warm_up")} for w in workers if w.hello]

    def wait_ready(self) -> list[str]:
        """Block until every idle worker finished start-up; return their isolation descriptions."""
        with self._lock:
            workers = list(self._all)
        return [w.isolation for w in workers]

    def close(self) -> None:
        self.closed = True
        with self._lock:
            workers = list(self._all)
            self._all.clear()
        for w in workers:  # all at once: a worker still importing torch would not answer in time
            w.ask_to_exit()
        deadline = time.monotonic() + 2.0
        for w in workers:
            w.close(grace_s=max(0.0, deadline - time.monotonic()))

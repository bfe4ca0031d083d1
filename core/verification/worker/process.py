"""What a worker does to itself before it answers anything: namespaces and read-only mounts
(:func:`isolate`), resource limits, the audit hook (:class:`AuditGuard`), the ATen audit of
``forward`` (:func:`make_audit_mode`, :data:`ALLOWED_ATEN`), and how errors are told back
(:func:`describe`, :func:`sandbox_escape`)."""

from __future__ import annotations

import ctypes
import os
import resource
import shutil
import sys
import threading
from pathlib import Path
from typing import Any

MAX_ERROR_CHARS = 600

# --------------------------------------------------------------------------- isolation

_CLONE_NEWNS, _CLONE_NEWNET, _CLONE_NEWUSER = 0x00020000, 0x40000000, 0x10000000
_MS_RDONLY, _MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18
_SKIP_REMOUNT_TYPES = {"proc", "sysfs", "cgroup", "cgroup2", "devpts", "mqueue"}


def isolate(scratch: str) -> str:
    """Enter private network + mount namespaces; make every mount read-only except ``scratch``.

    Returns a one-line description of what was achieved (the fallback keeps limits + audit hook).
    """
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.getuid(), os.getgid()
    flags = _CLONE_NEWNS | _CLONE_NEWNET
    if libc.unshare(flags) != 0:
        if libc.unshare(flags | _CLONE_NEWUSER) != 0:
            return f"fallback: no namespaces (unshare: {os.strerror(ctypes.get_errno())}); limits + audit hook only"
        try:  # map ourselves to root inside the new user namespace so we may remount
            Path("/proc/self/setgroups").write_text("deny")
            Path("/proc/self/uid_map").write_text(f"0 {uid} 1")
            Path("/proc/self/gid_map").write_text(f"0 {gid} 1")
        except OSError as exc:
            return f"partial: user+net namespaces, mounts writable ({exc}); audit hook guards writes"
    if libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        return f"partial: network namespace only (mount private: {os.strerror(ctypes.get_errno())}); audit hook guards writes"
    if libc.mount(scratch.encode(), scratch.encode(), None, _MS_BIND, None) != 0:
        return f"partial: network namespace only (bind scratch: {os.strerror(ctypes.get_errno())}); audit hook guards writes"
    os.chdir(scratch)  # the working directory still pointed at the directory under the bind mount
    failed = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        parts = line.split()
        target, fstype = parts[1].replace("\\040", " "), parts[2]
        if target == scratch or fstype in _SKIP_REMOUNT_TYPES:
            continue
        if libc.mount(b"none", target.encode(), None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY, None) != 0:
            failed.append(target)
    probe = Path("/") / f".kz-write-probe-{os.getpid()}"
    try:
        probe.write_text("x")
        probe.unlink()
        return "partial: network namespace; root filesystem stayed writable; audit hook guards writes"
    except OSError:
        pass
    ro = "read-only filesystem except scratch" + (f" (could not remount {len(failed)} mounts)" if failed else "")
    return f"namespaces: private network (no interfaces up), private mounts, {ro}"


# --------------------------------------------------------------------------- limits and the audit hook


def set_limits(memory_mb: int, file_size_mb: int, open_files: int, device: str) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_mb << 20, file_size_mb << 20))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(open_files, hard), hard))
    if device == "cpu" and memory_mb > 0:  # CUDA reserves huge virtual ranges; cap only on CPU
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))


def set_cpu_budget(seconds: int) -> None:
    """RLIMIT_CPU is cumulative: allow ``seconds`` more CPU time from now (SIGXCPU ends the worker)."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    total = int(used.ru_utime + used.ru_stime) + max(1, seconds)
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if hard != resource.RLIM_INFINITY:
        total = min(total, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (total, hard))


class AuditGuard:
    """``sys.addaudithook`` guard: no writes outside scratch, no sockets, no subprocesses (except
    the toolchain's own compilers), no signals to other processes while ``armed``; and, armed or
    not, none of what :mod:`.events` refuses a candidate's code (``candidate_rules``, set by the
    candidate worker). Violations are recorded and refused with ``PermissionError``. A hook cannot
    be removed once added; :meth:`hook` is what is added (a bound method taken once, so rebinding
    ``AuditGuard.__call__`` later changes nothing)."""

    WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    PATH_EVENTS = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.symlink",
                   "os.link", "os.truncate", "shutil.rmtree", "shutil.move", "os.utime"}
    BLOCKED_EVENTS = {"socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
                      "os.system", "os.fork", "os.forkpty",
                      "os.startfile", "sys.setprofile", "sys.settrace",
                      "sys.remote_exec"}

    # Events that start a program, and the position of the program's path in their arguments.
    EXEC_EVENTS = {"subprocess.Popen": 0, "os.posix_spawn": 0, "os.exec": 0, "os.spawn": 1}

    def __init__(self, scratch: str, allowed_exec_dirs: list[str]):
        # allowed_exec_dirs: directories whose programs may start, or single programs (exact paths).
        self.scratch = os.path.realpath(scratch)
        self.allowed_exec_dirs = [os.path.realpath(d) for d in allowed_exec_dirs]
        self.violations: list[str] = []
        self.armed = False
        self.candidate_rules: Any = None  # core.verification.worker.events.CandidateEvents
        self._local = threading.local()  # set while the hook judges an event: its own events pass

    @property
    def hook(self) -> Any:
        return self.__call__

    def _inside_scratch(self, path: Any) -> bool:
        if isinstance(path, int):
            return True
        try:
            p = os.fsdecode(path)
        except TypeError:
            return False
        if p in ("/dev/null",):
            return True
        real = os.path.realpath(os.path.join(self.scratch, p))
        return real == self.scratch or real.startswith(self.scratch + os.sep)

    def record(self, what: str) -> None:
        self.violations.append(what)

    def _refuse(self, what: str) -> None:
        self.record(what)
        raise PermissionError(f"sandbox: {what} is not allowed in a candidate")

    def __call__(self, event: str, args: tuple) -> None:
        rules = self.candidate_rules
        if rules is not None and rules.watches(event) and not getattr(self._local, "busy", False):
            self._local.busy = True
            try:
                why = rules.check(event, args, sys._getframe(1))
            except Exception as exc:  # a rule that cannot judge refuses (fail closed)
                why = f"{event} (the guard could not judge it: {type(exc).__name__})"
            finally:
                self._local.busy = False
            if why:
                self._refuse(why)
        if not self.armed:
            return
        if event == "open":
            path, mode, flags = (list(args) + [None, None, None])[:3]
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & self.WRITE_FLAGS)
            if writing and not self._inside_scratch(path):
                self._refuse(f"writing {os.fsdecode(path)!s} outside the scratch directory")
        elif event in self.PATH_EVENTS:
            paths = [a for a in args if isinstance(a, (str, bytes, os.PathLike))]
            for p in paths:
                if not self._inside_scratch(p):
                    self._refuse(f"{event} on {os.fsdecode(p)} outside the scratch directory")
        elif event in self.EXEC_EVENTS:
            # subprocess.Popen raises its own event and then os.posix_spawn / os.exec for the same
            # program; each must name an executable inside the toolchain's directories (ptxas ...).
            path = args[self.EXEC_EVENTS[event]] if len(args) > self.EXEC_EVENTS[event] else None
            if isinstance(path, (list, tuple)):
                path = path[0] if path else None
            if isinstance(path, (str, bytes)) and os.sep not in os.fsdecode(path):  # a bare name: exec looks it up
                env = args[3] if event == "subprocess.Popen" and len(args) > 3 and isinstance(args[3], dict) else None
                path = shutil.which(os.fsdecode(path), path=(env or os.environ).get("PATH")) or path
            exe = os.path.realpath(os.fsdecode(path)) if isinstance(path, (str, bytes, os.PathLike)) else ""
            if not exe or not any(exe == d or exe.startswith(d + os.sep) for d in self.allowed_exec_dirs):
                self._refuse(f"starting a subprocess ({exe or args!r})")
        elif event in ("os.kill", "os.killpg", "signal.pthread_kill"):
            target = args[0] if args else None
            if target not in (os.getpid(), 0):
                self._refuse(f"sending a signal to process {target}")
        elif event in self.BLOCKED_EVENTS:
            self._refuse(f"{event}")

    def take(self) -> list[str]:
        out, self.violations = self.violations, []
        return out


# --------------------------------------------------------------------------- the ATen audit


def make_audit_mode(tracker: Any, callers: Any = None, ledger: Any = None):
    """A TorchDispatchMode that records every ATen compute op run outside a kernel launch.

    ``callers`` (a :class:`~core.verification.worker.callers.Callers`): an op asked for by the
    candidate's own code is recorded even while the tracker says a launch is running, so a
    tracker the candidate reached and marked "inside" hides nothing (inside a real launch, ops
    come from the launcher's frames). ``ledger``: told of every op's results and written arguments
    (``Backend.provenance``)."""
    return audit_mode_class()(tracker, callers, ledger)


_AUDIT_CLASS: dict[str, type] = {}  # built once per worker, so its identity can be verified after each call


def audit_mode_class() -> type:
    """The ATen audit's class (:func:`make_audit_mode`), built on first use."""
    made = _AUDIT_CLASS.get("class")
    if made is not None:
        return made
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    allowed = ALLOWED_ATEN
    float_width = {torch.float64: 8, torch.float32: 4, torch.float16: 2, torch.bfloat16: 2}

    getframe = sys._getframe

    class AtenAudit(TorchDispatchMode):
        def __init__(self, tracker: Any, callers: Any = None, ledger: Any = None) -> None:
            super().__init__()
            self.tracker, self.callers, self.ledger = tracker, callers, ledger
            self.ops: list[str] = []
            self.downcasts: list[str] = []

        def _asked_by_candidate(self) -> bool:
            """Whether the op was asked for by the candidate's frame (torch's own frames skipped)."""
            frame, depth = getframe(2), 0
            while frame is not None and depth < 64:
                name = self.callers.frame_module(frame)
                if name is None:
                    return True
                if name.partition(".")[0] != "torch":
                    return False
                frame, depth = frame.f_back, depth + 1
            return True

        def _narrowing(self, src: Any, dst: Any) -> bool:
            return src in float_width and dst in float_width and float_width[dst] < float_width[src]

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if not self.tracker.inside or (self.callers is not None and self._asked_by_candidate()):
                name = func.overloadpacket.__name__
                if name not in allowed:
                    if str(func) not in self.ops:
                        self.ops.append(str(func))
                elif name == "_to_copy" and args and isinstance(args[0], torch.Tensor):
                    dst = kwargs.get("dtype")
                    if dst is not None and self._narrowing(args[0].dtype, dst):
                        self.downcasts.append(f"{args[0].dtype} -> {dst}")
                elif name == "copy_" and len(args) >= 2 and all(isinstance(a, torch.Tensor) for a in args[:2]):
                    if self._narrowing(args[1].dtype, args[0].dtype):
                        self.downcasts.append(f"{args[1].dtype} -> {args[0].dtype}")
            result = func(*args, **kwargs)
            if self.ledger is not None:
                self.ledger.after_op(func, args, kwargs, result)
            return result

    _AUDIT_CLASS["class"] = AtenAudit
    return AtenAudit


# Allocation, views, copies and metadata: what ModelNew.forward may do outside its kernels.
ALLOWED_ATEN = frozenset("""
empty empty_like empty_strided new_empty new_empty_strided zeros zeros_like ones ones_like full full_like
new_zeros new_ones new_full scalar_tensor fill_ zero_ arange lift_fresh lift_fresh_copy detach alias
resize_ set_ view _unsafe_view reshape _reshape_alias as_strided expand expand_as permute transpose t
squeeze unsqueeze slice select narrow unbind split split_with_sizes chunk flatten unflatten view_as movedim
unfold contiguous clone copy_ _to_copy to _copy_from _copy_from_and_resize sym_size sym_stride sym_numel
sym_storage_offset is_contiguous size stride numel dim is_same_size is_pinned record_stream
_has_compatible_shallow_copy_type real view_as_real view_as_complex
""".split())


# --------------------------------------------------------------------------- errors


def describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    cause = exc.__cause__ or exc.__context__
    if cause is not None and type(cause).__name__ not in text:
        text += f" (caused by {type(cause).__name__}: {cause})"
    return text[:MAX_ERROR_CHARS]


# Errors only the sandbox produces: a refused write (read-only mounts) or network access (no interfaces).
_SANDBOX_ERRNOS = {30: "writing outside the scratch directory (refused by the read-only mount)",
                   101: "network access (the worker has no network)", 99: "network access (the worker has no network)"}
_SANDBOX_MESSAGES = {"Read-only file system": _SANDBOX_ERRNOS[30], "Network is unreachable": _SANDBOX_ERRNOS[101]}


def sandbox_escape(exc: BaseException) -> str | None:
    """Describe ``exc`` if it is the sandbox refusing something (also through C++ layers)."""
    seen = 0
    while exc is not None and seen < 8:
        errno = getattr(exc, "errno", None)
        if errno in _SANDBOX_ERRNOS:
            return _SANDBOX_ERRNOS[errno]
        for text, what in _SANDBOX_MESSAGES.items():
            if text in str(exc):
                return what
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None

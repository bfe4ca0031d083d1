"""Where running ``kernelzero serve`` processes say they are, so ``python -m core.verify`` finds a warm one.

Each service writes ``<pid>.json`` into a per-user runtime directory while it runs (:func:`register`) and
removes it on a clean exit (:func:`unregister`). The file holds its URL, its pid and start time, and the
settings a client must match to be judged as it would be in its own process (:data:`MATCHED`). A reader
(:func:`entries`) trusts a file only when the process it names is alive, is this user's, started when the file
says, and is a ``kernelzero serve``; any other file it removes (a service killed outright leaves one behind).

The directory is ``$XDG_RUNTIME_DIR/kernelzero/`` when that variable names a writable directory, else
``<tempdir>/kernelzero-<uid>/``. It is created mode 0700, and one that is not this user's, is a symbolic link,
or is writable by group or others is refused (:class:`RegistryError`): another user could otherwise point
this user's calls at a service of theirs. Standard library only: ``core.verify`` reads it before anything else.
"""

from __future__ import annotations

import contextlib
import importlib.util
import hashlib
import json
import os
import re
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

VERSION = 1
# what a client must match: any difference could change a verdict (``code``: the judging code and plugins)
MATCHED = ("backend", "device", "checks", "trials", "timeout_s", "isolate", "executor", "code")
_NAME = re.compile(r"^(\d+)\.json$")


class RegistryError(OSError):
    """The runtime directory cannot be trusted or made (the message says which and why)."""


@dataclass
class Entry:
    """One running service, as its ``<pid>.json`` holds it."""

    url: str
    pid: int
    backend: str
    device: str  # as resolved (cpu or cuda), never auto
    checks: list[str] | None  # sorted; None: every check that applies
    trials: int
    timeout_s: float
    isolate: bool
    code: str  # code_fingerprint() of the service's process
    executor: str = "local"
    token_required: bool = False
    started: float = field(default_factory=time.time)  # epoch seconds
    proc_start: int | None = None  # the kernel's start time of ``pid`` (clock ticks): a reused pid differs
    idle_exit_s: float = 0.0  # 0: never
    workers: int = 0
    log: str | None = None
    python: str = sys.executable
    version: int = VERSION

    def settings(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in MATCHED}

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Entry:
        known = {f.name for f in fields(cls)}
        missing = sorted({"url", "pid", *MATCHED} - set(data) - {"executor"})
        if missing:
            raise ValueError(f"missing {missing}")
        entry = cls(**{k: v for k, v in data.items() if k in known})
        if not isinstance(entry.pid, int) or not isinstance(entry.url, str) or not entry.url.startswith("http"):
            raise ValueError("pid or url malformed")
        return entry


def normal_checks(checks: Any) -> list[str] | None:
    """``None`` for every check; else the names, sorted and unique (the order given does not matter)."""
    return sorted({str(c) for c in checks}) if checks else None


def differences(have: dict[str, Any], want: dict[str, Any]) -> list[str]:
    """``["trials=10 (asked: 5)", ...]``: each matched setting on which a service (``have``) and a call differ.

    >>> differences({"trials": 5, "timeout_s": 120}, {"trials": 5, "timeout_s": 120.0})
    []
    >>> differences({"trials": 10, "checks": None}, {"trials": 5, "checks": ["static"]})
    ['checks=all (asked: static)', 'trials=10 (asked: 5)']
    """
    def shown(key: str, value: Any) -> str:
        if key == "checks":
            return ",".join(normal_checks(value) or ["all"])
        return str(value)[:12] if key == "code" else str(value)

    def same(key: str, a: Any, b: Any) -> bool:
        if key == "checks":
            return normal_checks(a) == normal_checks(b)
        if key in ("trials", "timeout_s"):
            return isinstance(a, (int, float)) and isinstance(b, (int, float)) and float(a) == float(b)
        return a == b

    return [f"{key}={shown(key, have.get(key))} (asked: {shown(key, want.get(key))})"
            for key in MATCHED if key in want and not same(key, have.get(key), want.get(key))]


# ------------------------------------------------------------------------------------- the directory


def runtime_dir(create: bool = True) -> Path:
    """This user's registry directory (see the module doc); :class:`RegistryError` if it cannot be trusted."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isabs(xdg) and os.path.isdir(xdg) and os.access(xdg, os.W_OK | os.X_OK):
        path = Path(xdg) / "kernelzero"
    else:
        path = Path(tempfile.gettempdir()) / f"kernelzero-{os.getuid()}"
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
    check_private(path)
    return path


def check_private(path: Path) -> None:
    """Raise :class:`RegistryError` unless ``path`` is a real directory of this user that no one else may write."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise RegistryError(f"{path} does not exist") from None
    if not stat.S_ISDIR(st.st_mode):
        raise RegistryError(f"{path} is not a directory (a symbolic link or a file): refused as the registry of "
                            "kernelzero serve; remove it")
    if st.st_uid != os.getuid():
        raise RegistryError(f"{path} belongs to uid {st.st_uid}, not this user ({os.getuid()}): refused as the "
                            "registry of kernelzero serve")
    if st.st_mode & 0o022:
        raise RegistryError(f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}): refused "
                            f"as the registry of kernelzero serve; chmod 700 {path}")


def entry_path(pid: int, directory: Path | None = None) -> Path:
    return (directory or runtime_dir()) / f"{pid}.json"


def register(entry: Entry, directory: Path | None = None) -> Path:
    """Write ``entry`` as ``<pid>.json`` (atomically: a reader never sees half a file); its path."""
    directory = directory or runtime_dir()
    if entry.proc_start is None:
        entry.proc_start = process_start(entry.pid)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{entry.pid}.", suffix=".tmp")  # mode 0600
    try:
        with os.fdopen(fd, "w") as f:
            f.write(entry.to_json())
        target = entry_path(entry.pid, directory)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return target


def unregister(pid: int | None = None, directory: Path | None = None) -> None:
    """Remove the entry of ``pid`` (default: this process), if there is one."""
    with contextlib.suppress(OSError):
        os.unlink(entry_path(os.getpid() if pid is None else pid, directory))


def entries(directory: Path | None = None, cleanup: bool = True) -> list[Entry]:
    """The live services of this user, newest first. With ``cleanup``, the file of a service that is gone
    (its pid dead, reused by another program, or another user's) is removed."""
    directory = directory or runtime_dir()
    live = []
    for item in os.scandir(directory):
        found = _NAME.match(item.name)
        if not found or not item.is_file(follow_symlinks=False):
            continue
        pid = int(found.group(1))
        try:
            if item.stat(follow_symlinks=False).st_uid != os.getuid():
                continue  # not written by this user (the directory is private: nobody else can write it)
            entry = Entry.from_dict(json.loads(Path(item.path).read_text()))
        except (OSError, ValueError, TypeError):
            entry = None
        if entry is not None and entry.pid == pid and is_service(pid, entry.proc_start):
            live.append(entry)
        elif cleanup and not is_service(pid):  # malformed, or its process is gone: nobody will remove it
            with contextlib.suppress(OSError):
                os.unlink(item.path)
    return sorted(live, key=lambda e: -e.started)


# --------------------------------------------------------------------------------------- processes


def process_start(pid: int) -> int | None:
    """The kernel's start time of ``pid`` in clock ticks since boot (``/proc/PID/stat``), None where unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def is_serve_argv(argv: list[str]) -> bool:
    """Whether a command line is a verification service's: ``python -m core.serve ...`` or ``kernelzero serve``.

    >>> is_serve_argv(["/v/bin/python", "-m", "core.serve", "--port", "0"])
    True
    >>> is_serve_argv(["/v/bin/python", "/v/bin/kernelzero", "serve"]), is_serve_argv(["python", "-m", "core.run"])
    (True, False)
    """
    if "core.serve" in argv[1:3]:
        return True
    return any(os.path.basename(a) == "kernelzero" and argv[i + 1:i + 2] == ["serve"] for i, a in enumerate(argv[:2]))


def is_service(pid: int, proc_start: int | None = None) -> bool:
    """Whether ``pid`` is a live ``kernelzero serve`` of this user (that started at ``proc_start``, if given)."""
    if pid <= 0:
        return False
    if not os.path.isdir("/proc/self"):  # no procfs: alive and signalable by this user is all one can tell
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.getuid():
            return False
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace").split("\0")
    except OSError:
        return False
    if proc_start is not None and process_start(pid) != proc_start:
        return False
    return is_serve_argv(argv)


# ------------------------------------------------------------------------------------------- code


def code_fingerprint() -> str:
    """A digest of the judging code this process runs: the interpreter, every module file under ``core`` and
    ``plugins`` and every registered plugin's module (path, size, modification time). A service started
    before a file was edited judges with the old code, so its fingerprint no longer matches a new call's."""
    import core
    from core.plugins import get_plugin_manager

    files: set[str] = set()
    roots = [Path(core.__file__).parent]
    # the builtin plugins' folder, found without importing it (core never imports a concrete plugin)
    spec = importlib.util.find_spec("plugins")
    roots += [Path(p) for p in (spec.submodule_search_locations or [])] if spec is not None else []
    for root in roots:
        for folder, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            files.update(os.path.join(folder, n) for n in names if n.endswith(".py"))
    for _, plugin in get_plugin_manager().list_name_plugin():
        module = plugin if hasattr(plugin, "__file__") else sys.modules.get(getattr(plugin, "__module__", None) or "")
        if getattr(module, "__file__", None):
            files.add(os.path.abspath(module.__file__))
    digest = hashlib.sha256(f"{sys.executable}\n{sys.version}\n".encode())
    for path in sorted(files):
        with contextlib.suppress(OSError):
            st = os.stat(path)
            digest.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()


@contextlib.contextmanager
def spawn_lock(directory: Path, timeout_s: float) -> Iterator[bool]:
    """Hold ``directory/spawn.lock`` (True) or give up after ``timeout_s`` (False): two calls that would each
    start a service at once start one, and the second finds it."""
    import fcntl

    fd = os.open(directory / "spawn.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    yield False
                    return
                time.sleep(0.1)
        yield True
    finally:
        os.close(fd)  # closing releases the lock

"""torch.compile's warm-up kept between processes, for the baseline workers alone.

A baseline worker warms torch.compile up before its hello (:mod:`core.verification.worker.warmup`): 7.7-8.5 s of a
one-shot ``core.verify`` on the H100, mostly Inductor's code generation and the build of one small function, the same
in every process. The judge keeps what that warm-up wrote to the worker's caches (Inductor's and Triton's folders in
its scratch directory) in a per-user store, and copies the store into each new baseline worker's scratch before the
worker starts, so that its warm-up is a cache hit.

Who can change what a baseline worker loads: the judge alone. It keeps only what a worker's caches hold at its hello,
when the worker has run nothing but the engine's own warm-up (no task, no candidate), and only files the store does
not have yet. No worker is given the store's path: each reads and writes its own scratch copy, so neither task code
(a baseline worker's later builds) nor a candidate (whose sandbox lets it write its own scratch alone:
:func:`core.verification.worker.process.isolate` and its audit hook) can write what the next baseline worker loads.
The store is used only where its folders are this user's alone (owned by this uid, writable by no one else).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import shutil
import stat
import threading
from pathlib import Path

STORE_ENV = "KERNELZERO_COMPILE_CACHE"  # a folder for the store, or "off"
ROOT_ENV = "KERNELZERO_CACHE"  # the root of every KernelZero cache (the store is its compile/ folder)
# A worker's caches that torch.compile's warm-up fills (core.verification.sandbox.Worker.start puts them in scratch)
CACHE_VARIABLES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


def _private(folder: Path, make: bool) -> bool:
    """``folder`` (made if missing and ``make``: 0700) is a real folder of this user's that no one else may write
    or replace (its parent is not writable by others, unless sticky as /tmp is)."""
    try:
        if make:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        info, parent = folder.lstat(), folder.parent.stat()
    except OSError:
        return False
    return (stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o022
            and (not parent.st_mode & 0o022 or bool(parent.st_mode & stat.S_ISVTX)))


class WarmCompileStore:
    """The store of one torch version: :meth:`seed` a worker's caches before it starts, :meth:`keep` them at its
    hello. Its folders are made by the first :meth:`keep`, and used only while they are this user's alone."""

    def __init__(self, base: Path, root: Path):
        self.base, self.root = base, root
        self._lock = threading.Lock()

    @classmethod
    def for_this_user(cls) -> WarmCompileStore | None:
        """The store under ``$KERNELZERO_COMPILE_CACHE``, else ``$KERNELZERO_CACHE/compile``, else
        ``~/.cache/kernelzero/compile``, in a folder per torch version; None when turned off (``off``)."""
        chosen = os.environ.get(STORE_ENV, "")
        if chosen.lower() in ("off", "0", "false", "no"):
            return None
        base = Path(chosen) if chosen else \
            Path(os.environ.get(ROOT_ENV) or Path.home() / ".cache" / "kernelzero") / "compile"
        try:  # without importing torch: the baseline pool starts before the judge does
            version = importlib.metadata.version("torch")
        except importlib.metadata.PackageNotFoundError:
            return None
        return cls(base, base / f"torch-{version}".replace(os.sep, "_"))

    def usable(self, make: bool = False) -> bool:
        """Whether the store's folders exist (made now with ``make``) and are this user's alone."""
        return _private(self.base, make) and _private(self.root, make)

    @staticmethod
    def folders(env: dict[str, str], scratch: str) -> dict[str, Path]:
        """The caches of a worker with this environment that lie in its scratch directory, by variable."""
        inside = os.path.realpath(scratch) + os.sep
        return {name: Path(env[name]) for name in CACHE_VARIABLES
                if name in env and os.path.realpath(env[name]).startswith(inside)}

    def seed(self, folders: dict[str, Path]) -> None:
        """Copy the store into a worker's cache folders (before the worker starts)."""
        if not self.usable():
            return
        for name, folder in folders.items():
            kept = self.root / name
            if kept.is_dir():
                with contextlib.suppress(OSError):  # a cold warm-up, as without the store
                    shutil.copytree(kept, folder, symlinks=False, dirs_exist_ok=True,
                                    ignore=lambda _, names: [n for n in names if n.startswith(".kz-")])

    def keep(self, folders: dict[str, Path]) -> int:
        """Copy what a worker's cache folders hold and the store lacks into the store (at the worker's hello, before
        it ran any task); returns how many files. Files only, each whole (renamed into place), none replaced."""
        kept = 0
        if not self.usable(make=True):
            return kept
        with self._lock:
            for name, folder in folders.items():
                for dirpath, dirnames, filenames in os.walk(folder):
                    dirnames[:] = [d for d in dirnames if d != "locks"]  # Inductor's lock files, per process
                    for filename in filenames:
                        source = Path(dirpath) / filename
                        target = self.root / name / source.relative_to(folder)
                        if ".tmp" in filename or source.is_symlink() or not source.is_file() or target.exists():
                            continue
                        with contextlib.suppress(OSError):
                            target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                            part = target.with_name(f".kz-{os.getpid()}-{threading.get_ident()}-{filename}")
                            shutil.copyfile(source, part, follow_symlinks=False)
                            os.replace(part, target)
                            kept += 1
        return kept

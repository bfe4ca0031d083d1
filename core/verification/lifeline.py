"""Processes that die with the one that started them, so stopping a judge frees the GPU.

A worker (:mod:`core.verification.worker`) runs in its own session (the judge kills its whole group),
so a signal to the judge's group never reaches it; and a judge killed outright (SIGKILL, a time limit)
runs no clean-up. Without more, a worker busy with a long request, or a shard host finishing its
verifications, outlived the evaluation and kept the GPU's memory (141 GiB on the H200).

* :func:`watch_parent`: a daemon thread that ends the process (``os._exit``) once its parent is gone
  (it was re-parented). ``PR_SET_PDEATHSIG`` is not used: it fires when the *thread* that started the
  child exits, and pools start workers from short-lived verification threads.
* :func:`register` / :func:`kill_all`: the live worker process groups of this process, killed at
  exit (``atexit``) and by :func:`install_exit_signals` (SIGTERM, SIGINT in a shard host).
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
import weakref
from typing import Any, Callable

_LIVE: "weakref.WeakSet[Any]" = weakref.WeakSet()
POLL_S = 0.2


def watch_parent(parent_pid: int, on_orphan: Callable[[], None] | None = None, poll_s: float = POLL_S) -> threading.Thread:
    """Exit (status 1) once ``parent_pid`` is no longer this process's parent; ``on_orphan`` runs first."""

    def watch() -> None:
        import time

        while True:
            if os.getppid() != parent_pid:
                try:
                    if on_orphan is not None:
                        on_orphan()
                finally:
                    os._exit(1)
            time.sleep(poll_s)

    thread = threading.Thread(target=watch, name="kz-lifeline", daemon=True)
    thread.start()
    return thread


def register(worker: Any) -> None:
    """Track a started worker (anything with ``kill()``) so :func:`kill_all` can end it."""
    _LIVE.add(worker)


def kill_all() -> None:
    """Kill every tracked worker's process group (idempotent; errors ignored)."""
    for worker in list(_LIVE):
        try:
            worker.kill()
        except Exception:
            pass


atexit.register(kill_all)


def install_exit_signals(code_base: int = 128) -> None:
    """SIGTERM and SIGINT kill the tracked workers and leave at once (main thread only)."""

    def leave(signum: int, frame: Any) -> None:
        kill_all()
        os._exit(code_base + signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, leave)

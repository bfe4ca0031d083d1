"""One training process per run directory; any number of readers beside each other, none beside it.

A run directory holds one run's checkpoints, ``metrics.jsonl`` and ``train_state.json``; a second
process resuming it while the first still trains makes two writers of all three (seen on the GPU on
2026-12-02, when a device call's stop left a run going and the next call resumed it). The lock is an
``flock`` on ``<run dir>/run.lock``: the kernel drops it when its process ends, however it ends, so it
never goes stale. A training process holds it exclusively; a process that only evaluates the run's
saved models (benchmarks/headroom, benchmarks/refinement) holds it shared, so several can read one run
at once, and none reads a model the run is still writing. Within one process the same directory may be
opened again (a resumed ``Training``).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from core.loop.training_config import TrainingError

LOCK_FILE = "run.lock"
_HELD: dict[Path, int] = {}  # run dir -> the descriptor whose flock this process holds


def hold_run_dir(run_dir: Path, reader: bool = False) -> None:
    """Lock ``run_dir`` for this process until it exits, shared when ``reader``; TrainingError if another
    process holds it in a mode that excludes this one (a trainer excludes everyone, a reader excludes trainers)."""
    key = run_dir.resolve()
    if key in _HELD:
        return
    fd = os.open(key / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if reader else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        if reader:
            raise TrainingError(f"{run_dir} is in use by a training process (pid {holder}): its models may be "
                                f"half written. Read it when that run has stopped") from None
        raise TrainingError(f"{run_dir} is in use by another process (the pid of its last trainer: {holder}; or "
                            f"processes reading its models): a second trainer would interleave its checkpoints "
                            f"and metrics. Stop that one, or give this run another hydra.run.dir") from None
    if not reader:  # the file names its trainer; readers leave it as it is
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
    _HELD[key] = fd

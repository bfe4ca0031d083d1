"""One training process per run directory.

A run directory holds one run's checkpoints, ``metrics.jsonl`` and ``train_state.json``; a second
process resuming it while the first still trains makes two writers of all three (seen on the GPU on
2026-12-02, when a device call's stop left a run going and the next call resumed it). The lock is an
``flock`` on ``<run dir>/run.lock``: the kernel drops it when its process ends, however it ends, so it
never goes stale. Within one process the same directory may be opened again (a resumed ``Training``).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from core.loop.training_config import TrainingError

LOCK_FILE = "run.lock"
_HELD: dict[Path, int] = {}  # run dir -> the descriptor whose flock this process holds


def hold_run_dir(run_dir: Path) -> None:
    """Lock ``run_dir`` for this process until it exits; TrainingError if another process holds it."""
    key = run_dir.resolve()
    if key in _HELD:
        return
    fd = os.open(key / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise TrainingError(f"{run_dir} is in use by another training process (pid {holder}): a second one would "
                            f"interleave its checkpoints and metrics. Stop that run, or give this one another "
                            f"hydra.run.dir") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    _HELD[key] = fd

"""One training process per run directory (core/loop/run_lock.py): a second process resuming a run
that still trains is refused with the holder's pid, instead of becoming a second writer of its files."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from fake_training_run import run

from core.loop.run_lock import LOCK_FILE, hold_run_dir
from core.loop.training_config import TrainingError


def _holder(run_dir: Path) -> subprocess.Popen:
    """Another process holding ``run_dir``'s lock until it is killed."""
    proc = subprocess.Popen([sys.executable, "-c", (
        f"import sys, time; sys.path.insert(0, {str(ROOT)!r})\n"
        "from pathlib import Path\n"
        "from core.loop.run_lock import hold_run_dir\n"
        f"hold_run_dir(Path({str(run_dir)!r})); print('held', flush=True); time.sleep(120)\n")],
        stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_run_directory_in_use_by_another_process_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    holder = _holder(run_dir)
    try:
        with pytest.raises(TrainingError, match=rf"in use by another training process \(pid {holder.pid}\)"):
            run(str(run_dir), [])
        assert not (run_dir / "metrics.jsonl").exists()  # refused before it wrote anything
    finally:
        holder.kill()
        holder.wait()
    # the kernel dropped the lock with its process: the same directory now trains (no stale lock)
    _, summary = run(str(run_dir), ["trainer.phases.correctness.steps=1"])
    assert summary["steps"] == 1


def test_one_process_may_open_its_own_run_directory_again(tmp_path):
    hold_run_dir(tmp_path)
    hold_run_dir(tmp_path)  # a resumed Training in the same process
    assert (tmp_path / LOCK_FILE).read_text().strip().isdigit()
    start = time.monotonic()
    probe = subprocess.run([sys.executable, "-c", (
        f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
        "from pathlib import Path\n"
        "from core.loop.run_lock import hold_run_dir\n"
        f"hold_run_dir(Path({str(tmp_path)!r}))\n")], check=False, capture_output=True, text=True, timeout=60)
    assert probe.returncode != 0 and "in use by another training process" in probe.stderr
    assert time.monotonic() - start < 60  # refused at once, not waited for

"""One training process per run directory (core/loop/run_lock.py): a second process resuming a run
that still trains is refused with the holder's pid, instead of becoming a second writer of its files;
processes that only read a run's models share it with each other, never with a trainer."""

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


def _holder(run_dir: Path, reader: bool = False) -> subprocess.Popen:
    """Another process holding ``run_dir``'s lock (shared when ``reader``) until it is killed."""
    proc = subprocess.Popen([sys.executable, "-c", (
        f"import sys, time; sys.path.insert(0, {str(ROOT)!r})\n"
        "from pathlib import Path\n"
        "from core.loop.run_lock import hold_run_dir\n"
        f"hold_run_dir(Path({str(run_dir)!r}), reader={reader}); print('held', flush=True); time.sleep(120)\n")],
        stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_run_directory_in_use_by_another_process_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    holder = _holder(run_dir)
    try:
        with pytest.raises(TrainingError, match=rf"in use by another process \(the pid of its last trainer: {holder.pid}"):
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
    assert probe.returncode != 0 and "in use by another process" in probe.stderr
    assert time.monotonic() - start < 60  # refused at once, not waited for


def _try_hold(run_dir: Path, reader: bool) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", (
        f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
        "from pathlib import Path\n"
        "from core.loop.run_lock import hold_run_dir\n"
        f"hold_run_dir(Path({str(run_dir)!r}), reader={reader})\n")], check=False, capture_output=True, text=True, timeout=60)


def test_readers_of_a_run_share_it_and_exclude_a_trainer(tmp_path):
    reader = _holder(tmp_path, reader=True)
    try:
        assert _try_hold(tmp_path, reader=True).returncode == 0  # a second reader, e.g. headroom of another phase
        trainer = _try_hold(tmp_path, reader=False)
        assert trainer.returncode != 0 and "processes reading its models" in trainer.stderr
    finally:
        reader.kill()
        reader.wait()
    assert _try_hold(tmp_path, reader=False).returncode == 0


def test_a_reader_is_refused_while_the_run_trains(tmp_path):
    trainer = _holder(tmp_path)
    try:
        probe = _try_hold(tmp_path, reader=True)
        assert probe.returncode != 0 and f"in use by a training process (pid {trainer.pid})" in probe.stderr
    finally:
        trainer.kill()
        trainer.wait()
    assert (tmp_path / LOCK_FILE).read_text().strip() == str(trainer.pid)  # a reader did not rename the trainer

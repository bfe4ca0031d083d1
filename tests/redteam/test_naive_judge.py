"""Every hack that says ``# fools: naive`` really fools a naive in-process judge (so it is a real hack),
and every honest control passes that judge too (so a rejection by ours is not about the control)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from escape_guard import ESCAPE, escape_lock

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
CANDIDATES = sorted((HERE / "candidates").glob("*.py"))


def _header(path: Path) -> dict[str, str]:
    meta = {}
    for line in path.read_text().splitlines():
        if line.startswith("# ") and ":" in line:
            key, _, value = line[2:].partition(":")
            meta[key.strip()] = value.strip()
    return meta


FOOLING = [p for p in CANDIDATES if _header(p).get("fools") == "naive"]
HONEST = [p for p in CANDIDATES if _header(p).get("expect") == "accepted"]


def _naive(path: Path) -> dict:
    task = HERE / "tasks" / f"{_header(path)['task']}.py"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1"}
    with escape_lock(exclusive=ESCAPE.name in path.read_text()):  # no sandbox here: its escape is real
        proc = subprocess.run([sys.executable, str(HERE / "naive_judge.py"), str(task), str(path)], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"the naive judge gave no answer: {proc.stderr[-2000:]}"
    return json.loads(lines[-1])


def test_the_hack_families_are_represented():
    assert len(FOOLING) >= 8


@pytest.mark.parametrize("path", FOOLING, ids=[p.stem for p in FOOLING])
def test_hack_fools_the_naive_judge(path):
    assert _header(path)["expect"] != "accepted"
    answer = _naive(path)
    assert answer["accepted"], answer["detail"]


@pytest.mark.parametrize("path", HONEST, ids=[p.stem for p in HONEST])
def test_honest_control_passes_the_naive_judge(path):
    if "triton.autotune" in path.read_text() and os.environ.get("TRITON_INTERPRET", "1") == "1":
        pytest.skip("the plain Triton interpreter cannot benchmark autotune configs (our worker runs each config)")
    answer = _naive(path)
    assert answer["accepted"], answer["detail"]


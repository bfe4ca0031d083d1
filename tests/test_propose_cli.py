from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _propose(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, KERNELZERO_DISABLE_AUTOLOAD="1", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "core.propose", "progress=false", *overrides],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_jsonl_has_the_contract_fields_and_is_reproducible(tmp_path):
    for out in ("a.jsonl", "b.jsonl"):
        done = _propose(tmp_path, "proposer=mcts", "n=12", "seed=4", f"out={out}")
        assert done.returncode == 0, done.stderr
    a = (tmp_path / "a.jsonl").read_text().splitlines()
    assert a == (tmp_path / "b.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in a]
    assert len(rows) == 12
    for row in rows:
        assert {"id", "source", "ops", "adversarial"} <= row.keys()
        assert "class Model(nn.Module)" in row["source"] and row["ops"]
        assert row["adversarial"] is None or all(isinstance(tag, str) for tag in row["adversarial"])
    assert "adversarial" in done.stderr and "tasks/min" in done.stderr  # the summary table


def test_directory_form_writes_one_module_per_task(tmp_path):
    done = _propose(tmp_path, "proposer=random", "n=5", "seed=1", "out=tasks", "curriculum.max_tier=0")
    assert done.returncode == 0, done.stderr
    files = sorted((tmp_path / "tasks").glob("*.py"))
    assert len(files) == 5
    meta = [json.loads(line) for line in (tmp_path / "tasks" / "tasks.jsonl").read_text().splitlines()]
    assert [m["id"] for m in meta] == [f.stem.split("_", 1)[1] for f in files]


@pytest.mark.parametrize("override, message", [("proposer=nope", "Could not find 'proposer/nope'"),
                                               ("proposer.nope=1", "nope")])
def test_config_mistakes_fail_clearly(tmp_path, override, message):
    done = _propose(tmp_path, override, "n=1")
    assert done.returncode != 0
    assert message in done.stderr

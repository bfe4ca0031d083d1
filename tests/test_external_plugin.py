"""A third-party package adds a reward term and its config group through entry points alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "kernelzero-brevity"


def test_installed_plugin_adds_reward_term_and_config_without_core_changes(tmp_path):
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(site),
         str(EXAMPLE)],
        check=True, capture_output=True, text=True,
    )
    assert list(site.glob("kernelzero_brevity-*.dist-info/entry_points.txt")), "entry points were not installed"
    env = {k: v for k, v in os.environ.items() if k != "KERNELZERO_DISABLE_AUTOLOAD"}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT)])
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "core.run", "experiment=selfplay", "reward=brevity", "rounds=1", "tasks_per_round=2",
         "device=cpu",
         f"hydra.run.dir={run_dir}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "pass rate" in proc.stdout
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows and all("reward/brevity" in row for row in rows)
    # Accepted kernels are a few thousand characters long: the term gave them a real, non-zero score.
    if rows[0]["pass_rate"] > 0:
        assert 0.0 < rows[0]["reward/brevity"] < 1.0

    # Without the package the option does not exist, and Hydra says which options do.
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-m", "core.run", "reward=brevity", f"hydra.run.dir={run_dir}2"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "correctness" in proc.stderr + proc.stdout

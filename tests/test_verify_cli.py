"""``python -m core.verify``: one JSON object for a pair, exit 0 either way, usage errors exit 2, batch mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KB = ROOT / "tests" / "fixtures" / "kernelbench"
REDTEAM = ROOT / "tests" / "redteam"


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "KERNELZERO_DISABLE_AUTOLOAD": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "core.verify", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)


@pytest.mark.slow
def test_kernelbench_problem_and_triton_solution_verify_unchanged():
    proc = cli("--reference", str(KB / "level1" / "19_ReLU.py"), "--candidate", str(KB / "level1" / "19_ReLU_solution.py"),
               "--backend", "triton", "--device", "cpu", "--json", "--workers", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1
    verdict = json.loads(lines[0])
    for key in ("accepted", "reason", "compiled", "correct", "accuracy", "checks"):
        assert key in verdict
    assert verdict["accepted"] is True, verdict["reason"]
    assert verdict["checks"]["correctness"]["passed"] and verdict["accuracy"] == 1.0


def test_rejected_candidate_still_exits_zero():
    proc = cli("--reference", str(REDTEAM / "tasks" / "vector_add.py"), "--candidate",
               str(REDTEAM / "candidates" / "patched_comparison.py"), "--device", "cpu", "--json", "--workers", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    verdict = json.loads(proc.stdout)
    assert verdict["accepted"] is False and verdict["hack_flags"] == ["static_integrity"]


@pytest.mark.parametrize("args,message", [
    (["--reference", "nope.py", "--candidate", "nope.py"], "nope.py does not exist"),
    (["--reference", str(KB / "level1" / "19_ReLU.py"), "--candidate", str(KB / "level1" / "19_ReLU.py"),
      "--backend", "fortran"], "Unknown backend 'fortran'. Known backends:"),
    (["--candidate", str(KB / "level1" / "19_ReLU.py")], "give --reference"),
    (["--reference", str(KB / "level1" / "19_ReLU.py"), "--candidate", str(KB / "level1" / "19_ReLU.py"),
      "--trials", "2"], "at least 5"),
])
def test_usage_errors_exit_2_with_a_message(args, message):
    proc = cli(*args)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "triton" in proc.stderr or "fortran" not in message


@pytest.mark.slow
def test_batch_mode_over_a_jsonl_prints_one_verdict_per_pair(tmp_path):
    rows = [{"name": "good", "reference": str(REDTEAM / "tasks" / "vector_add.py"),
             "candidate": str(REDTEAM / "candidates" / "honest_vector_add.py")},
            {"name": "bad", "reference": str(REDTEAM / "tasks" / "vector_add.py"),
             "candidate": str(REDTEAM / "candidates" / "decoy_kernel.py")}]
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    proc = cli("--batch", str(pairs), "--device", "cpu", "--json", "--workers", "2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    verdicts = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.strip()]
    assert [(v["pair"], v["accepted"]) for v in verdicts] == [("good", True), ("bad", False)]


@pytest.mark.slow
def test_batch_mode_table_over_a_kernelbench_directory():
    proc = cli("--batch", str(KB), "--device", "cpu", "--workers", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "level1/19_ReLU.py" in proc.stdout and "accepted 1" in proc.stdout


@pytest.mark.parametrize("pairs, workers, mode, expected", [
    (1, 2, "auto", (1, False)),    # one-shot: one worker, no warm-up pair before the real one
    (2, 2, "auto", (2, False)),    # each worker's only pair is its own warm-up
    (10, 2, "auto", (2, None)),    # a batch: the Verifier's default (warm on CUDA)
    (1, 4, "on", (1, True)),
    (10, 3, "off", (3, False)),
])
def test_the_pool_is_sized_to_the_work(pairs, workers, mode, expected):
    from core.verify import pool_for

    assert pool_for(pairs, workers, mode) == expected


def test_a_reference_that_builds_cuda_inputs_on_a_cpu_host_says_where_to_verify_it(tmp_path):
    # KernelBench's own examples make their inputs with .cuda(); on CPU the verdict must say why it cannot run
    reference = (REDTEAM / "tasks" / "vector_add.py").read_text().replace(
        "def get_inputs():", "def get_inputs():\n    torch.zeros(1).cuda()")
    (tmp_path / "ref.py").write_text(reference)
    proc = cli("--reference", str(tmp_path / "ref.py"), "--candidate",
               str(REDTEAM / "candidates" / "honest_vector_add.py"), "--device", "cpu", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    verdict = json.loads(proc.stdout.strip().splitlines()[-1])
    assert verdict["status"] == "error" and not verdict["accepted"]
    assert "the task needs a CUDA device" in verdict["reason"] and "verify it on a GPU host" in verdict["reason"]
    assert verdict["warm_up"] == "not warmed up"

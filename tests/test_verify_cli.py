"""``python -m core.verify``: one JSON object for a pair, exit 0 either way, usage errors exit 2, batch mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

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


# --------------------------------------------------------------------------- mistakes in the input, in-process

class _StubVerifier:
    """Stands in for the judge: what is verified is recorded, every pair is accepted."""

    judged: ClassVar[list] = []

    def __init__(self, **kwargs):
        self.isolation, self.warm_up_report = "stub", "not warmed up"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def verify(self, task, candidate):
        return self.verify_many([(task, candidate)])[0]

    def verify_many(self, pairs, progress=None):
        from core.verdict import Verdict

        _StubVerifier.judged.extend(pairs)
        return [Verdict(accepted=True, compiled=True, correct=True, status="accepted") for _ in pairs]


@pytest.fixture
def stub_verifier(monkeypatch):
    import core.verify

    _StubVerifier.judged = []
    monkeypatch.setattr(core.verify, "Verifier", _StubVerifier)
    return _StubVerifier


def test_a_reference_that_does_not_compile_exits_2_naming_the_file_and_line(tmp_path, capsys, stub_verifier):
    # It printed ERROR and exited 0, as if the candidate had been judged.
    from core.verify import main

    ref = tmp_path / "broken_ref.py"
    ref.write_text("import torch\n\ndef get_inputs(:\n    return []\n")
    code = main(["--reference", str(ref), "--candidate", str(REDTEAM / "candidates" / "honest_vector_add.py"),
                 "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"{ref}:3: the reference does not compile" in err
    assert stub_verifier.judged == []


def test_a_batch_row_without_a_candidate_names_its_row_and_the_other_rows_are_verified(tmp_path, capsys,
                                                                                        stub_verifier):
    # A raw KeyError: 'candidate' ended the whole batch.
    from core.verify import main

    vector_add = str(REDTEAM / "tasks" / "vector_add.py")
    rows = [{"name": "good", "reference": vector_add, "candidate": str(REDTEAM / "candidates" / "honest_vector_add.py")},
            {"name": "no candidate", "reference": vector_add},
            {"name": "broken", "reference": "import torch\ndef f(:\n    pass\n", "candidate": "x = 1\n"}]
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    code = main(["--batch", str(pairs), "--device", "cpu", "--json"])
    out, err = capsys.readouterr()
    assert code == 2
    assert f"{pairs}:2: row 2 has no 'candidate' key" in err
    assert f"{pairs}:3: the reference source does not compile (its line 2)" in err
    assert "2 of 3 pair(s) not verified" in err
    assert [json.loads(line)["pair"] for line in out.splitlines() if line.strip()] == ["good"]
    assert len(stub_verifier.judged) == 1


def test_a_batch_reference_with_a_stale_id_says_where_and_what_to_do(tmp_path, capsys, stub_verifier):
    from core.task import Task
    from core.verify import main

    task = Task(source=(REDTEAM / "tasks" / "vector_add.py").read_text()).to_dict()
    task["source"] = task["source"].replace("def get_inputs", "# hand-edited\ndef get_inputs")
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("\n" + json.dumps({"reference": task, "candidate": "x = 1\n"}) + "\n")
    code = main(["--batch", str(pairs), "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"{pairs}:2: reference: task id {task['id']!r} does not match its source" in err
    assert 'delete the "id" key' in err
    assert "no pairs to verify" in err and stub_verifier.judged == []


def test_a_batch_directory_with_a_broken_reference_verifies_the_rest(tmp_path, capsys, stub_verifier):
    from core.verify import main

    (tmp_path / "ref").mkdir()
    (tmp_path / "cand").mkdir()
    for name in ("a", "b"):
        (tmp_path / "ref" / f"{name}.py").write_text((REDTEAM / "tasks" / "vector_add.py").read_text())
        (tmp_path / "cand" / f"{name}.py").write_text("x = 1\n")
    (tmp_path / "ref" / "b.py").write_text("def broken(:\n")
    code = main(["--batch", str(tmp_path), "--device", "cpu", "--json"])
    out, err = capsys.readouterr()
    assert code == 2 and f"{tmp_path / 'ref' / 'b.py'}:1: the reference does not compile" in err
    assert [json.loads(line)["pair"] for line in out.splitlines() if line.strip()] == ["a"]

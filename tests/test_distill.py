"""``python -m core.distill``: the JSONL contract, the saved Dataset, the summary, declines not written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


from core.contracts import CurriculumState
from core.distill import Summary, builtin_format, distill, load_format
from core.task import Candidate

REPO = Path(__file__).resolve().parent.parent


def test_distill_command_writes_the_contract(tmp_path):
    out = tmp_path / "pairs.jsonl"
    env = dict(os.environ, KERNELZERO_DISABLE_AUTOLOAD="1", PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "core.distill", "n=4", "seed=3", f"out={out}", "device=cpu", "progress=false",
           "executor.cpu_workers=2", "curriculum.max_tier=1", "curriculum.allowed_ops=[relu,gelu,mul,softmax,sum,transpose]"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    summary = json.loads((tmp_path / "pairs.jsonl.summary.json").read_text())
    assert len(rows) == summary["attempted"] == 4 - summary["declined"]
    for row in rows:
        assert {"task_id", "prompt", "completion", "accepted"} <= set(row)
        assert isinstance(row["accepted"], bool)
        assert "class Model" in row["prompt"] and "class ModelNew" in row["completion"]
        assert row["verdict"]["accepted"] == row["accepted"]
    assert summary["accepted"] == sum(r["accepted"] for r in rows) == 4  # the expert answers these correctly
    from datasets import load_from_disk

    ds = load_from_disk(str(tmp_path / "pairs.jsonl.dataset"))
    assert ds.num_rows == len(rows) and ds[0]["prompt"] == rows[0]["prompt"]
    assert "accepted" in proc.stderr


class _HalfDeclines:
    """A teacher that declines every other task and answers the rest with a wrong kernel-less module."""

    name = "half"

    def generate(self, tasks, backend, num_samples=1):
        out = []
        for i, t in enumerate(tasks):
            if i % 2:
                out.append([Candidate(source="", task_id=t.id, coder=self.name, declined="not my kind of task")])
            else:
                out.append([Candidate(source="class ModelNew: pass\n", task_id=t.id, coder=self.name)])
        return out


class _RejectAll:
    def verify_many(self, pairs, on_verdicts=None):  # the executor's interface: verdicts reported as they land
        from core.verdict import Verdict

        verdicts = []
        for i, (task, cand) in enumerate(pairs):
            v = Verdict(accepted=False, reason="no kernel", task_id=task.id, candidate_id=cand.id)
            if on_verdicts:
                on_verdicts([i], [v])
            verdicts.append(v)
        return verdicts


def test_declined_tasks_are_counted_not_written():
    from core.plugins import registry

    tasks = registry("proposer").create("random", seed=0).propose(6, CurriculumState(max_tier=1))
    rows, summary = distill(tasks, _HalfDeclines(), _RejectAll(), "triton", progress=False)
    assert summary.proposed == 6 and summary.declined == 3 and summary.attempted == 3 and summary.accepted == 0
    assert len(rows) == 3 and not any(r["accepted"] for r in rows)
    assert summary.to_dict()["decline_reasons"] == {"not my kind of task": 3}
    rows, _ = distill(tasks, _HalfDeclines(), _RejectAll(), "triton", progress=False, accepted_only=True)
    assert rows == []


def test_a_log_no_bar_reaches_gets_a_line_every_n_verdicts(capsys):
    # a GPU call cut at its limit left a 500-task acceptance run's log empty (2026-12-04): now it says how far
    from core.plugins import registry

    tasks = registry("proposer").create("random", seed=0).propose(10, CurriculumState(max_tier=1))
    distill(tasks, _HalfDeclines(), _RejectAll(), "triton", progress=False, log_every=2)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("verified ")]
    assert [line.split(",")[0] for line in lines] == ["verified 2/5", "verified 4/5", "verified 5/5"]
    assert all(", accepted 0, " in line for line in lines)
    distill(tasks, _HalfDeclines(), _RejectAll(), "triton", progress=False)
    assert "verified " not in capsys.readouterr().err


def test_prompt_formats():
    fmt = load_format("plugins.coders.llm.prompts")
    prompt = fmt.prompt("class Model: ...", "triton", "GUIDE")
    assert "class Model" in prompt and "GUIDE" in prompt
    assert fmt.completion("class ModelNew: ...").startswith("class ModelNew")
    fallback = load_format("no.such.module")
    assert fallback.prompt("X", "triton", "G").endswith("```python\n")
    assert "ModelNew" in builtin_format().guide(None, "triton")
    assert isinstance(Summary().to_dict()["accepted_of_attempted"], float)

"""What a KernelBench user meets around the verifier: one-line errors for a missing extra, the warning
(and exit status) when every task is declined, the level count, distillation's plain ``source``,
``core.propose``'s KernelBench layout, and where the caches live."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from core.contracts import CurriculumState
from core.plugins import create
from core.task import Candidate, Task

REPO = Path(__file__).resolve().parent.parent
TASK = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(8, 8)]


def get_init_inputs():
    return []
"""


def _python(code: str, *, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "KERNELZERO_DISABLE_AUTOLOAD": "1", "PYTHONPATH": str(REPO), "COLUMNS": "160"}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, text=True, capture_output=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def proposed():
    proposer = create("proposer", "random", seed=11, max_numel=512, max_ops=3, adversarial_share=0.0)
    return proposer.propose(8, CurriculumState(max_tier=1))


# --------------------------------------------------------------------------- missing extras


def test_backend_cuda_without_cupy_is_a_config_error_before_any_worker(monkeypatch):
    from core.verification import judge
    from core.verify import Verifier, VerifierConfigError

    monkeypatch.setitem(sys.modules, "cupy", None)  # as if CuPy were not installed
    started = []
    monkeypatch.setattr(judge, "WorkerPool", lambda *a, **k: started.append(a))
    for device in ("cpu", "cuda"):
        with pytest.raises(VerifierConfigError) as info:
            Verifier(backend="cuda", device=device, workers=1)
        assert str(info.value) == "backend 'cuda' needs CuPy: pip install 'kernelzero[cuda]'"
    assert started == []


def test_core_verify_without_cupy_prints_one_line(tmp_path):
    (tmp_path / "ref.py").write_text(TASK)
    (tmp_path / "cand.py").write_text(create("backend", "cuda").warm_up_candidate)
    proc = _python("import sys; sys.modules['cupy'] = None\nfrom core.verify import main\n"
                   f"sys.exit(main(['--reference', '{tmp_path}/ref.py', '--candidate', '{tmp_path}/cand.py', "
                   "'--backend', 'cuda', '--device', 'cpu']))", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("python -m core.verify: error: backend 'cuda' needs CuPy: "
                                   "pip install 'kernelzero[cuda]'")


def test_executor_ray_without_ray_names_the_extra(monkeypatch):
    from core.verification.executor import ExecutorError, make_executor

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ExecutorError, match=r"executor=ray needs Ray: pip install 'kernelzero\[ray\]'"):
        make_executor({"name": "ray"}, backend="triton", device="cpu", verifier={})


def _suite(root: Path, tasks: list[Task], levels: list[str]) -> Path:
    from core.evaluation.suites import write_kernelbench_dir

    for task, level in zip(tasks, levels, strict=True):
        task.level = level
    write_kernelbench_dir(tasks, root)
    return root


def _eval(code_before: str, overrides: list[str], cwd: Path) -> subprocess.CompletedProcess:
    args = ", ".join(repr(o) for o in ["core.eval", *overrides])
    return _python(f"import sys\n{code_before}\nsys.argv = [{args}]\nfrom core.eval import main\nmain()", cwd=cwd)


def test_core_eval_with_executor_ray_and_no_ray_prints_one_line(proposed, tmp_path):
    suite = _suite(tmp_path / "suite", proposed[:1], ["level1"])
    proc = _eval("sys.modules['ray'] = None", [f"suite={suite}", "coder=expert", "executor=ray",
                                               "cache.enabled=false", "heldout.record=false",
                                               f"hydra.run.dir={tmp_path}/run"], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == ("error: executor=ray needs Ray: pip install 'kernelzero[ray]' "
                                                     "(or use executor=local)")
    assert "Traceback" not in proc.stderr


# --------------------------------------------------------------------------- declines and levels


def test_every_task_declined_warns_and_the_flag_makes_it_fail(proposed, tmp_path):
    suite = _suite(tmp_path / "suite", proposed[:3], ["level1", "level2", "level3"])
    (tmp_path / "none").mkdir()
    common = [f"suite={suite}", f"solutions={tmp_path}/none", "cache.enabled=false", "heldout.record=false"]
    quiet = _eval("", [*common, f"hydra.run.dir={tmp_path}/run1"], cwd=tmp_path)
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    said = " ".join(quiet.stdout.split())
    assert "WARNING: every one of the 3 task(s) was declined" in said
    assert "Commonest reasons: 1x no solution file for level1/" in said
    payload = json.loads((tmp_path / "run1" / "results.json").read_text())
    assert payload["all_declined"] and payload["attempted"] == 0 and payload["declined"] == 3

    strict = _eval("", [*common, "fail_if_all_declined=true", f"hydra.run.dir={tmp_path}/run2"], cwd=tmp_path)
    assert strict.returncode == 3
    assert strict.stderr.strip().splitlines()[-1] == "error: all 3 task(s) were declined (fail_if_all_declined=true)"


def test_the_warning_stays_silent_when_anything_was_verified():
    from core.evaluation.report import TaskResult, all_declined_warning
    from core.verdict import Verdict

    task = Task(source=TASK, name="1_relu", level="level1")
    declined = TaskResult.of(task, "level1", Candidate(source="", declined="cannot lower op 'foo'"), None)
    verified = TaskResult.of(task, "level1", Candidate(source="x"), Verdict(status="rejected", reason="static"))
    assert all_declined_warning([declined, verified]) is None
    assert all_declined_warning([]) is None
    assert "2x cannot lower op 'foo'" in all_declined_warning([declined, declined])


@settings(max_examples=30, deadline=None)
@given(st.lists(st.sampled_from(["level1", "level2", "level3", "level4"]), min_size=1, max_size=12),
       st.sets(st.sampled_from(["level1", "level2", "level3", "level4"]), min_size=1))
def test_the_summary_counts_the_levels_selected_not_the_suites(levels, wanted):
    from core.evaluation.runner import levels_line, select_tasks
    from core.evaluation.suites import Suite

    tasks = [Task(source=f"# {i}\n", name=f"{i}_t", level=lv) for i, lv in enumerate(levels)]
    suite = Suite(name="s", source="s", tasks=tasks)
    wanted = sorted(wanted & set(levels)) or [levels[0]]
    chosen = select_tasks(suite, wanted)
    line = levels_line(suite, chosen)
    in_suite = len(set(levels))
    assert line.startswith(f"{len(chosen)} tasks in {len(wanted)} level(s) ({', '.join(sorted(wanted, key=levels.index))})")
    assert line.endswith(f" of the suite's {in_suite}") == (in_suite != len(wanted))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(["level1", "level2"]), min_size=1, max_size=10), st.data())
def test_names_select_exactly_those_tasks_in_suite_order_and_an_unknown_name_is_an_error(levels, data):
    # `core.eval names=[...]`: one problem again after a fix, without the rest of its level
    from core.evaluation.runner import select_tasks
    from core.evaluation.suites import Suite, SuiteError

    tasks = [Task(source=f"# {i}\n", name=f"{i}_t", level=lv) for i, lv in enumerate(levels)]
    suite = Suite(name="s", source="s", tasks=tasks)
    picked = data.draw(st.lists(st.sampled_from(tasks), min_size=1, unique_by=id))
    names = [t.name if k % 2 else f"{t.level}/{t.name}" for k, t in enumerate(picked)]  # both spellings
    assert select_tasks(suite, None, None, names) == [t for t in tasks if t in picked]
    with pytest.raises(SuiteError, match="match no selected task"):
        select_tasks(suite, None, None, [*names, "99_missing"])
    other = "level2" if picked[0].level == "level1" else "level1"
    if other in levels:  # a name outside the selected levels is not silently dropped either
        with pytest.raises(SuiteError):
            select_tasks(suite, [other], None, [f"{picked[0].level}/{picked[0].name}"])


def test_core_eval_says_how_many_levels_were_selected(proposed, tmp_path):
    from omegaconf import OmegaConf

    from core.evaluation.runner import evaluate

    suite = _suite(tmp_path / "suite", proposed[:4], ["level1", "level2", "level3", "level4"])
    (tmp_path / "none").mkdir()
    cfg = OmegaConf.create({"suite": str(suite), "solutions": str(tmp_path / "none"), "levels": ["level1", "level2"],
                            "limit": None, "device": "cpu", "backend": {"name": "triton"}, "verifier": {},
                            "executor": {"name": "local"}, "cache": {"enabled": False, "path": None},
                            "heldout": {"record": False, "path": None}, "out_dir": str(tmp_path / "out")})
    console = Console(record=True, width=200)
    evaluate(cfg, console=console)
    assert "2 tasks in 2 level(s) (level1, level2) of the suite's 4 from" in console.export_text()


# --------------------------------------------------------------------------- distillation rows


class _Teacher:
    name = "fixed"

    def generate(self, tasks, backend, num_samples=1):
        return [[Candidate(source=f"# answer for {t.id}\nclass ModelNew:\n    pass\n", task_id=t.id, coder=self.name)]
                for t in tasks]


class _AcceptAll:
    def verify_many(self, pairs, on_verdicts=None):
        from core.verdict import Verdict

        verdicts = [Verdict(accepted=True, compiled=True, correct=True, status="accepted") for _ in pairs]
        if on_verdicts:
            on_verdicts(list(range(len(pairs))), verdicts)
        return verdicts


def test_distillation_rows_carry_the_plain_module_beside_the_completion(proposed, tmp_path):
    from core.loop.distillation import distill, write_rows

    rows, _ = distill(proposed[:3], _Teacher(), _AcceptAll(), "triton", progress=False)
    assert len(rows) == 3
    for row, task in zip(rows, proposed[:3], strict=True):
        assert row["source"] == f"# answer for {task.id}\nclass ModelNew:\n    pass\n"
        assert "```" not in row["source"] and row["source"] in row["completion"]
    path, dataset = write_rows(rows, tmp_path / "pairs.jsonl")
    written = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["source"] for r in written] == [r["source"] for r in rows]
    from datasets import load_from_disk

    ds = load_from_disk(str(dataset))
    assert ds["source"] == [r["source"] for r in rows]
    compile(written[0]["source"], "solution.py", "exec")  # importable as it is


# --------------------------------------------------------------------------- core.propose layout=kernelbench


def test_kernelbench_layout_puts_one_op_in_level1_and_fusions_in_level2(proposed, tmp_path):
    from core.evaluation.suites import load_suite
    from core.propose import kernelbench_level, write_tasks

    out = write_tasks(proposed, tmp_path / "suite", layout="kernelbench")
    suite = load_suite(out)
    assert sorted(p.name for p in out.iterdir()) == sorted({kernelbench_level(t) for t in proposed})
    by_id = {t.id: t for t in suite.tasks}
    assert set(by_id) == {t.id for t in proposed}
    for task in proposed:
        back = by_id[task.id]
        assert back.level == ("level1" if len(task.ops) == 1 else "level2")
        assert back.program == task.program and back.ops == task.ops  # the sidecar keeps the IR
    for level in out.iterdir():
        numbers = sorted(int(p.name.split("_", 1)[0]) for p in level.glob("*.py"))
        assert numbers == list(range(1, len(numbers) + 1))  # KernelBench numbers problems from 1 per level


def test_kernelbench_layout_refuses_a_jsonl_target_before_proposing(tmp_path):
    from core.propose import check_output

    with pytest.raises(ValueError, match="must be a directory"):
        check_output(tmp_path / "tasks.jsonl", "auto", "kernelbench")
    with pytest.raises(ValueError, match="layout must be one of flat, kernelbench"):
        check_output(tmp_path / "out", "auto", "levels")
    proc = _python("import sys\nsys.argv = ['core.propose', 'n=2', 'layout=kernelbench', "
                   f"'out={tmp_path}/x.jsonl']\nfrom core.propose import main\nmain()", cwd=tmp_path)
    assert proc.returncode == 2 and "must be a directory" in proc.stderr
    assert not (tmp_path / "x.jsonl").exists()


def test_core_propose_writes_the_kernelbench_layout(tmp_path):
    proc = _python("import sys\nsys.argv = ['core.propose', 'n=4', 'seed=2', 'layout=kernelbench', 'progress=false', "
                   f"'out={tmp_path}/kb', 'curriculum.max_tier=1']\nfrom core.propose import main\nmain()", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    files = sorted(str(p.relative_to(tmp_path / "kb")) for p in (tmp_path / "kb").rglob("*.py"))
    assert len(files) == 4 and all(f.startswith(("level1/", "level2/")) for f in files)


# --------------------------------------------------------------------------- where the caches live


def test_kernelzero_cache_moves_the_eval_cache_and_the_heldout_registry(monkeypatch, tmp_path):
    from core.evaluation.suites import heldout_file
    from tests.test_configs import compose_with

    monkeypatch.delenv("KERNELZERO_EVAL_CACHE", raising=False)
    monkeypatch.delenv("KERNELZERO_HELDOUT", raising=False)
    monkeypatch.setenv("KERNELZERO_CACHE", str(tmp_path / "root"))
    cfg = compose_with("suite=x", config_name="eval")
    assert cfg.cache.path == f"{tmp_path}/root/evalcache.sqlite"
    assert heldout_file() == tmp_path / "root" / "heldout.txt"

    monkeypatch.setenv("KERNELZERO_EVAL_CACHE", str(tmp_path / "e.sqlite"))
    monkeypatch.setenv("KERNELZERO_HELDOUT", str(tmp_path / "h.txt"))
    cfg = compose_with("suite=x", config_name="eval")
    assert cfg.cache.path == f"{tmp_path}/e.sqlite"  # the specific variable wins
    assert heldout_file() == tmp_path / "h.txt"

    for var in ("KERNELZERO_CACHE", "KERNELZERO_EVAL_CACHE", "KERNELZERO_HELDOUT"):
        monkeypatch.delenv(var)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    cfg = compose_with("suite=x", config_name="eval")
    assert cfg.cache.path == f"{tmp_path}/home/.cache/kernelzero/evalcache.sqlite"
    assert heldout_file() == Path("~/.cache/kernelzero/heldout.txt").expanduser()

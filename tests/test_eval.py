"""core.eval: fast_p math, the verdict cache, and the `python -m core.eval` contract on CPU."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.evaluation.cache import CacheKey, EvalCache, split_cached
from core.evaluation.report import THRESHOLDS, TaskResult, p_key, speedup_of, summarise
from core.task import Candidate, Task
from core.verdict import Verdict

REPO = Path(__file__).resolve().parent.parent


def make_task(k: int, level: str = "level1") -> Task:
    return Task(source=f"# task {k}\n", name=f"{k}_t", level=level)


def make_verdict(accepted: bool, speedup: float | None = None, hack: bool = False, compiled: bool = True) -> Verdict:
    v = Verdict(accepted=accepted, compiled=compiled, correct=accepted or hack,
                status="accepted" if accepted else "rejected")
    if speedup is not None:
        v.timing = {"median_ms": 1.0, "eager_ms": speedup, "speedup_compile": speedup / 2}
    if hack:
        v.add_check("integrity", False, "aten.add inside forward", hack=True)
    return v


def result(k: int, verdict: Verdict | None, level: str = "level1") -> TaskResult:
    task = make_task(k, level)
    cand = Candidate(source=f"c{k}", declined=None if verdict else "no")
    return TaskResult.of(task, level, cand, verdict)


outcome = st.one_of(
    st.none(),  # declined
    st.builds(make_verdict, st.booleans(), st.one_of(st.none(), st.floats(0.05, 20)), st.booleans()),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(outcome, min_size=1, max_size=25))
def test_fast_p_is_the_share_of_all_tasks_accepted_and_faster(verdicts):
    results = [result(k, v) for k, v in enumerate(verdicts)]
    overall = summarise(results)[-1]
    n = len(results)
    accepted = [v for v in verdicts if v is not None and v.accepted]
    assert overall.fast_p["eager"]["0"] == pytest.approx(len(accepted) / n)
    timed = [v for v in accepted if v.timing]
    for p in THRESHOLDS[1:]:
        got = overall.fast_p["eager"][p_key(p)]
        if not timed:
            assert got is None  # never invented without timing
        else:
            assert got == pytest.approx(sum(speedup_of(v, "eager") > p for v in timed) / n)
    values = [overall.fast_p["eager"][p_key(p)] for p in THRESHOLDS if overall.fast_p["eager"][p_key(p)] is not None]
    assert values == sorted(values, reverse=True)  # non-increasing in p
    if timed:
        logs = [math.log(speedup_of(v, "eager")) for v in timed]
        assert overall.geomean_speedup["eager"] == pytest.approx(math.exp(sum(logs) / len(logs)))
        assert overall.geomean_speedup["compile"] == pytest.approx(overall.geomean_speedup["eager"] / 2)


def test_a_hack_never_counts_and_is_counted_as_a_flag():
    results = [result(0, make_verdict(False, 50.0, hack=True)), result(1, make_verdict(True, 1.5))]
    overall = summarise(results)[-1]
    assert overall.correct == 2 and overall.accepted == 1 and overall.hacked == 1
    assert overall.hack_flags == {"integrity": 1}
    assert overall.fast_p["eager"] == {"0": 0.5, "1": 0.5, "1.2": 0.5, "1.5": 0.0, "2": 0.0}


def test_levels_then_overall():
    groups = summarise([result(0, make_verdict(True), "level2"), result(1, None, "level1"),
                        result(2, make_verdict(False, compiled=False), "level2")])
    assert [g.level for g in groups] == ["level2", "level1", "overall"]
    assert (groups[0].tasks, groups[0].compiled, groups[1].declined, groups[2].tasks) == (2, 1, 1, 3)


# --------------------------------------------------------------------------- cache


def test_cache_key_depends_on_task_candidate_hardware_software_and_settings():
    task, cand = make_task(0), Candidate(source="x")
    base = CacheKey("cpu", {"trials": 5}, hardware_name="cpu:A", software={"torch": "2.13"})
    same = CacheKey("cpu", {"trials": 5}, hardware_name="cpu:A", software={"torch": "2.13"})
    assert base.of(task, cand) == same.of(task, cand)
    others = [CacheKey("cpu", {"trials": 6}, hardware_name="cpu:A", software={"torch": "2.13"}),
              CacheKey("cpu", {"trials": 5}, hardware_name="cuda:H200", software={"torch": "2.13"}),
              CacheKey("cpu", {"trials": 5}, hardware_name="cpu:A", software={"torch": "2.11"})]
    keys = {k.of(task, cand) for k in others} | {base.of(make_task(1), cand), base.of(task, Candidate(source="y"))}
    assert base.of(task, cand) not in keys and len(keys) == 5


def test_cache_round_trip_persists_and_skips_transient_failures(tmp_path):
    key = CacheKey("cpu", hardware_name="cpu:A", software={"v": 1})
    pairs = [(make_task(k), Candidate(source=f"c{k}")) for k in range(3)]
    with EvalCache(tmp_path / "c.sqlite") as cache:
        assert cache.put(key.of(*pairs[0]), make_verdict(True, 2.0))
        assert not cache.put(key.of(*pairs[1]), Verdict.failure("timeout", "busy machine"))
        assert cache.put(key.of(*pairs[2]), Verdict.failure("crashed", "segfault"))
    with EvalCache(tmp_path / "c.sqlite") as cache:
        found, missing = split_cached(cache, key, pairs)
        assert sorted(found) == [0, 2] and missing == [1]
        assert found[0].timing["eager_ms"] == 2.0 and found[2].status == "crashed"


# --------------------------------------------------------------------------- what the cache key covers


def _files_defining(*needles: str) -> set[Path]:
    """Source files of core/ and plugins/ that define all of ``needles``, wherever they were moved."""
    found = set()
    for path in [*(REPO / "core").rglob("*.py"), *(REPO / "plugins").rglob("*.py")]:
        text = path.read_text()
        if all(n in text for n in needles):
            found.add(path.resolve())
    return found


def test_the_code_digest_covers_timing_roofline_devices_and_the_whole_engine():
    from core.evaluation.digest import verdict_sources

    files = set(verdict_sources().values())
    timing = _files_defining("class GpuTimer", "def warm_filler")
    roofline = _files_defining("def roofline(", "def find_device(")
    assert timing and roofline and (timing | roofline) <= files
    assert (REPO / "plugins" / "devices.py").resolve() in files
    assert set((REPO / "core" / "verification").resolve().rglob("*.py")) <= files
    for module in ("task", "verdict", "contracts", "program"):
        assert (REPO / "core" / f"{module}.py").resolve() in files
    for backend in ("cuda_backend.py", "cuda_static.py", "nvrtc.py", "triton_backend.py"):
        assert (REPO / "plugins" / "backends" / backend).resolve() in files
    # what cannot change a verdict does not invalidate the cache
    assert not files & {(REPO / "core" / "loop" / "training.py").resolve(), (REPO / "core" / "eval.py").resolve(),
                        (REPO / "plugins" / "coders" / "expert.py").resolve()}


def test_editing_a_device_plugin_or_a_module_it_imports_changes_the_digest(tmp_path, monkeypatch):
    """A GPU's peak numbers, and the module they are computed in (reached only by an import inside a
    function, as the performance check reaches GPU timing), are part of the digest."""
    from core import plugins
    from core.evaluation.digest import code_digest, verdict_sources

    pkg = tmp_path / "kzt_gpus"
    (pkg / "measure").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "measure" / "__init__.py").write_text("")
    (pkg / "measure" / "clock.py").write_text("PEAK = 1.0e12\n")
    (pkg / "measure" / "unused.py").write_text("X = 1\n")
    (pkg / "specs.py").write_text(
        "from core import hookimpl\n"
        "from core.contracts import DeviceSpec\n\n\n"
        "def _peak():\n"
        "    from kzt_gpus.measure.clock import PEAK\n"
        "    return PEAK\n\n\n"
        "@hookimpl\n"
        "def register_devices(register):\n"
        "    register('KZT-1', DeviceSpec(name='KZT-1', peak_bandwidth=_peak()))\n")
    (tmp_path / "elsewhere.py").write_text("Y = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    module = importlib.import_module("kzt_gpus.specs")
    try:
        pm = plugins.make_plugin_manager(autoload=False)
        pm.register(module, name="kzt-gpus")
        assert "KZT-1" in plugins.build_registry("device", pm)
        names = set(verdict_sources(pm))
        assert {"kzt_gpus/specs.py", "kzt_gpus/__init__.py", "kzt_gpus/measure/clock.py"} <= names
        before = code_digest(pm)
        assert code_digest(pm) == before  # deterministic
        spec = (pkg / "specs.py").read_text()
        (pkg / "specs.py").write_text(spec.replace("peak_bandwidth=_peak()", "peak_bandwidth=_peak(), l2_bytes=1"))
        edited_spec = code_digest(pm)
        (pkg / "measure" / "clock.py").write_text("PEAK = 2.0e12\n")
        edited_clock = code_digest(pm)
        assert len({before, edited_spec, edited_clock}) == 3
        (pkg / "measure" / "unused.py").write_text("X = 3\n")  # imported by nothing that judges
        (tmp_path / "elsewhere.py").write_text("Y = 3\n")
        assert code_digest(pm) == edited_clock
    finally:
        for name in ("kzt_gpus.specs", "kzt_gpus.measure.clock", "kzt_gpus.measure", "kzt_gpus"):
            sys.modules.pop(name, None)


def test_a_backends_declared_toolchain_is_part_of_the_key(register_plugin):
    from importlib import metadata

    from core import hookimpl
    from core.evaluation.cache import software_versions

    class Toolchained:
        def __init__(self, version="1.0"):
            self.name, self.version = "kzt-tool", version

        def toolchain(self):
            return {"kztcc": self.version}

    class Plugin:
        @hookimpl
        def register_backends(self, register):
            register("kzt-tool", Toolchained)
            register("kzt-bare", lambda: object())  # declares no toolchain: the default, none

    register_plugin(Plugin(), name="kzt-backends")
    assert software_versions("triton")["toolchain"] == {"triton": metadata.version("triton")}
    assert set(software_versions("cuda")["toolchain"]) == {"cupy", "nvrtc"}
    assert software_versions("kzt-bare")["toolchain"] == {}
    key = CacheKey("cpu", {"backend": "kzt-tool"}, hardware_name="cpu:A")
    assert key.software["toolchain"] == {"kztcc": "1.0"}
    task, cand = make_task(0), Candidate(source="x", backend="kzt-tool")
    other = CacheKey("cpu", {"backend": "kzt-tool"}, hardware_name="cpu:A",
                     software={**key.software, "toolchain": {"kztcc": "1.1"}})
    assert key.of(task, cand) != other.of(task, cand)


# --------------------------------------------------------------------------- the command


@pytest.fixture(scope="module")
def generated_suite(tmp_path_factory):
    """A small KernelBench-layout directory rendered from proposer tasks, two levels."""
    from core.contracts import CurriculumState
    from core.evaluation.suites import write_kernelbench_dir
    from core.plugins import create

    root = tmp_path_factory.mktemp("suite")
    proposer = create("proposer", "random", seed=5, max_numel=512, max_ops=2, adversarial_share=0.0)
    tasks = proposer.propose(3, CurriculumState(max_tier=0))
    for i, task in enumerate(tasks):
        task.level = "level1" if i < 2 else "level2"
    write_kernelbench_dir(tasks, root)
    return root


def run_eval(*overrides: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "KERNELZERO_DISABLE_AUTOLOAD": "1", "COLUMNS": "140"}
    return subprocess.run([sys.executable, "-m", "core.eval", *overrides], cwd=REPO, env=env, text=True,
                          capture_output=True, timeout=300)


def test_core_eval_contract_on_cpu_then_a_rerun_verifies_nothing(generated_suite, tmp_path):
    common = [f"suite={generated_suite}", "coder=expert", f"cache.path={tmp_path}/cache.sqlite",
              f"heldout.path={tmp_path}/heldout.txt", "heldout.record=true"]
    first = run_eval(*common, f"hydra.run.dir={tmp_path}/run1", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "fast_p" in first.stdout and "no timing on cpu" in first.stdout
    assert re.search(r"coder expert: 3 candidates written in \d+\.\d s", first.stdout)  # the run's start-up, told
    payload = json.loads((tmp_path / "run1" / "results.json").read_text())
    overall = payload["summary"][-1]
    assert overall["level"] == "overall" and overall["tasks"] == 3
    assert [g["level"] for g in payload["summary"]] == ["level1", "level2", "overall"]
    assert overall["accepted"] >= 2, payload["tasks"]  # the expert lowers these ops
    assert overall["fast_p"]["eager"]["0"] == overall["accepted"] / 3
    assert overall["fast_p"]["eager"]["1"] is None and not payload["timing_available"]
    assert payload["cache"] == {"path": f"{tmp_path}/cache.sqlite", "hits": 0, "verified": 3}
    for name in ("results.csv", "summary.csv", "fast_p.png"):
        assert (tmp_path / "run1" / name).stat().st_size > 0
    assert len((tmp_path / "heldout.txt").read_text().split("\n")) >= 4  # label + 3 fingerprints
    table = subprocess.run([sys.executable, "-m", "benchmarks.kb_table", str(tmp_path / "run1")], cwd=REPO,
                           text=True, capture_output=True, timeout=60)
    assert table.returncode == 0, table.stderr
    assert "run1: 3 verdicts:" in table.stdout and "GPU held alone 0.0 s, shared 0.0 s" in table.stdout  # on CPU

    second = run_eval(*common, f"hydra.run.dir={tmp_path}/run2", cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    again = json.loads((tmp_path / "run2" / "results.json").read_text())
    if again["software"] != payload["software"]:  # the verifier's code was edited between the runs
        assert again["cache"]["verified"] == 3
        pytest.skip("verification code changed between the two runs (shared working tree); cache rightly missed")
    assert again["cache"]["hits"] == 3 and again["cache"]["verified"] == 0
    assert again["summary"] == payload["summary"]


def test_ready_solutions_are_matched_by_name_and_missing_ones_declined(generated_suite, tmp_path):
    from core.evaluation.suites import load_suite
    from core.plugins import create

    suite = load_suite(generated_suite)
    first, second = suite.tasks[0], suite.tasks[1]
    solutions = tmp_path / "solutions" / first.level
    solutions.mkdir(parents=True)
    expert = create("coder", "expert")
    (solutions / f"{first.name}.py").write_text(expert.lower(first, "triton").source)
    (solutions / f"{second.name}.py").write_text("this is not python (\n")
    proc = run_eval(f"suite={generated_suite}", f"solutions={tmp_path}/solutions", "cache.enabled=false",
                    "heldout.record=false", f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["name"]: r for r in json.loads((tmp_path / "run" / "results.json").read_text())["tasks"]}
    assert rows[first.name]["accepted"] is True
    assert rows[second.name]["compiled"] is False and rows[second.name]["status"] == "rejected"
    assert rows[suite.tasks[2].name]["status"] == "declined"


def test_a_missing_suite_exits_2_with_a_message(tmp_path):
    proc = run_eval(f"suite={tmp_path}/nope", f"hydra.run.dir={tmp_path}/run", "heldout.record=false", cwd=tmp_path)
    assert proc.returncode == 2 and "does not exist" in proc.stderr


def test_a_time_budget_reports_only_what_was_verified_and_lists_the_rest(generated_suite, tmp_path):
    # one CPU worker: waves of 2 pairs; the first wave always runs, the budget has passed before the second
    proc = run_eval(f"suite={generated_suite}", "coder=expert", "cache.enabled=false", "heldout.record=false",
                    "budget_s=0.001", "executor.cpu_workers=1", f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "not run: 1 of 3 tasks" in proc.stdout
    payload = json.loads((tmp_path / "run" / "results.json").read_text())
    names = {r["name"] for r in payload["tasks"]}
    assert len(names) == 2 and payload["not_run"] and not set(payload["not_run"]) & names
    assert payload["summary"][-1]["tasks"] == 2 and payload["budget_s"] == 0.001
    # each verdict was also appended as it landed: a run cut before results.json still shows them
    landed = [json.loads(line) for line in (tmp_path / "run" / "verdicts.jsonl").read_text().splitlines()]
    assert {r["name"] for r in landed} == names and all(r["at_s"] > 0 for r in landed)
    assert [{k: v for k, v in r.items() if k != "at_s"} for r in sorted(landed, key=lambda r: r["name"])] == \
        sorted(payload["tasks"], key=lambda r: r["name"])
    (tmp_path / "run" / "results.json").unlink()
    with open(tmp_path / "run" / "verdicts.jsonl", "a") as f:
        f.write('{"name": "cut mid-li')  # the run killed while writing
    table = subprocess.run([sys.executable, "-m", "benchmarks.kb_table", str(tmp_path / "run")], cwd=REPO,
                           text=True, capture_output=True, timeout=60)
    assert table.returncode == 0, table.stderr
    accepted = sum(r["accepted"] for r in landed)
    assert f"run: cut run: 2 verdicts landed by {max(r['at_s'] for r in landed):.1f} s: " in table.stdout
    assert f"{accepted} accepted" in table.stdout and "run: 2 verdicts:" in table.stdout


def test_the_time_summary_splits_turns_held_alone_from_shared_ones_and_names_the_longest():
    # a timed turn (" alone") waits for every shared turn inside to leave: the summary tells them apart
    from benchmarks.kb_table import time_spent

    rows = [{"elapsed_s": 10.0, "gpu_wait_s": 4.0, "stage_s": {"interp_races": 3.0, "correctness": 1.0},
             "gpu_held_s": {"performance baseline set-up": 5.5, "performance baseline alone": 1.0, "trials": 2.0}},
            {"elapsed_s": 6.0, "gpu_wait_s": 1.5, "stage_s": {"interp_races": 2.0},
             "gpu_held_s": {"performance alone": 0.5, "trials": 1.0}},
            {"name": "declined", "elapsed_s": None}]
    verdicts, held, stages = time_spent(rows)
    rows[0]["gpu_memory"] = {"wait_s": 2.5}  # the part of its wait that was for memory (the admission)
    verdicts, held, stages = time_spent(rows)
    assert verdicts == ("2 verdicts: 16.0 s in all, 5.5 s waiting for a GPU turn (2.5 s of it for memory); "
                        "GPU held alone 1.5 s, shared 8.5 s")
    assert held.startswith("held longest (s): performance baseline set-up 5.5, trials 3.0")
    assert stages == "stages (s): interp_races 5.0, correctness 1.0"
    assert time_spent([{"elapsed_s": None}]) == []


def test_the_table_names_the_longest_stretch_with_few_verifications_in_flight_and_what_ran_then():
    # H200, 2026-12-07: the elementwise chain ran 2-7 at once against a mean of 6; the line says when and which
    from benchmarks.kb_table import in_flight

    def row(name, begin, end):
        return {"name": name, "at_s": end, "elapsed_s": end - begin}

    wide = [row(f"small{k}", 10.0 + 3 * k, 40.0 + 3 * k) for k in range(8)]  # 8 at once around 30-40 s
    chain = [row("big1", 65.0, 80.0), row("big2", 80.0, 95.0)]  # one at a time for 30 s
    tail = [row(f"late{k}", 95.0, 120.0) for k in range(6)]
    lines = in_flight(wide + chain + tail)
    assert len(lines) == 2 and lines[0].startswith("in flight: first verification began at 10.0 s")
    assert lines[1] == "thinnest stretch: 58-95 s with at most 1 in flight (small7, big1, big2)", lines
    assert len(in_flight([row("only", 0.0, 5.0)])) == 1  # a single verdict: no stretch before the drain


def test_the_table_says_which_verdicts_compared_large_outputs_with_lent_kernels_and_which_fell_back():
    # a lent kernel that cannot build falls back to torch with a warning in a worker's log only: the table says so
    from benchmarks.kb_table import judge_kernels
    from core.evaluation.report import TaskResult
    from core.verdict import CheckResult

    def row(used):
        verdict = Verdict(status="accepted", compiled=True, correct=True, accepted=True)
        if used is not None:
            verdict.checks["correctness"] = CheckResult(True, "5/5", data={"judge_kernels": used})
        task = Task(source="", name="t")
        return {"name": "t", **TaskResult.of(task, "level1", Candidate(source="", task_id=task.id), verdict).to_row()}

    rows = [row("TritonJudgeKernels"), row("TritonJudgeKernels"), row("torch (the lent kernels failed: X)"), row(None)]
    assert judge_kernels(rows) == ["large outputs compared by: TritonJudgeKernels (2); "
                                   "torch (the lent kernels failed: X) (1)"]
    assert judge_kernels([row(None)]) == []


def test_the_table_names_the_verdicts_judged_again_alone_and_lean():
    from dataclasses import asdict

    from benchmarks.kb_table import memory_retries
    from core.evaluation.report import TaskResult

    def row(name, status, memory):
        verdict = Verdict(status=status, accepted=status == "accepted")
        verdict.gpu_memory = memory
        task = Task(source="", name=name)  # a row of results.json or verdicts.jsonl, gpu_memory kept
        return {"name": name, **asdict(TaskResult.of(task, "level1", Candidate(source="", task_id=task.id), verdict))}

    rows = [row("a", "accepted", {"alone": False}),
            row("b", "accepted", {"retried_alone_after": "oom"}),
            row("c", "accepted", {"retried_alone_after": "oom", "retried_lean_after": "oom", "lean": "5 ..."}),
            row("d", "error", {"retried_lean_after": "oom"})]
    assert memory_retries(rows) == ["judged again alone after running out of GPU memory: 2 (b accepted, c accepted)",
                                    "judged again lean after running out of GPU memory: 2 (c accepted, d error)"]
    assert memory_retries(rows[:1]) == []


def test_the_table_sums_the_wall_time_of_the_verdicts_that_held_the_device_alone():
    # H100, 2026-12-06: 22 of 62 level-1 verdicts held the device alone, about half the run's wall time
    from benchmarks.kb_table import device_alone

    rows = [{"name": "a", "elapsed_s": 10.5, "gpu_memory": {"alone": True}},
            {"name": "b", "elapsed_s": 4.0, "gpu_memory": {"alone": False}},
            {"name": "c", "elapsed_s": 2.0, "gpu_memory": {"alone": True}},
            {"name": "d", "elapsed_s": None, "gpu_memory": {"alone": True}}, {"name": "e", "elapsed_s": 1.0}]
    assert device_alone(rows) == ["held the device alone: 2 of 5 verdicts, 12.5 s of wall time"]
    assert device_alone(rows[1:2]) == []


def test_the_table_sets_the_exclusive_timed_turns_beside_the_timers_own_loops():
    # H100, 2026-12-07: 30_Softsign (4.2 ms) held the GPU alone 1.31 s to be timed, several times what its timer's
    # runs should take; a verdict's row now keeps each timer's runs and host seconds, and the table sums them
    from benchmarks.kb_table import timed_turns
    from core.evaluation.report import TaskResult
    from plugins.verifiers.performance.check import with_speedups

    timing = {"median_ms": 4.2, "runs": 25, "warmup_runs": 3, "wall_s": 0.25, "fresh_inputs": True,
              **with_speedups({"eager_ms": 4.3, "eager_runs": 30, "eager_wall_s": 0.2, "compile_ms": 4.25,
                               "compile_runs": 20, "compile_wall_s": 0.15, "measured_in": "reference worker"}, 4.2)}
    verdict = Verdict(accepted=True, status="accepted", compiled=True, correct=True, timing=timing,
                      gpu_held_s={"performance alone": 1.31, "performance baseline alone": 0.86, "run": 3.0,
                                  "performance prepare alone": 0.4})  # set-up, alone with its verification
    row = TaskResult.of(Task(source="x", name="30_Softsign"), "level1", Candidate(source="y"), verdict)
    assert row.timer_loops == {"candidate_runs": 25.0, "candidate_warmup_runs": 3.0, "candidate_wall_s": 0.25,
                               "eager_runs": 30.0, "eager_wall_s": 0.2, "compile_runs": 20.0, "compile_wall_s": 0.15}
    assert "timer_loops" not in row.to_row()  # results.json keeps it, the CSV does not
    rows = [json.loads(json.dumps(asdict(row))), {"name": "declined", "timer_loops": None}]
    assert timed_turns(rows) == [("timed turns: 1 verdicts held the GPU alone 2.2 s to be timed; the timers' loops "
                                  "0.6 s (candidate 0.2, eager 0.2, torch.compile 0.1; median runs 25/30/20)")]
    assert timed_turns(rows[1:]) == []


def test_the_table_says_how_many_verifications_ran_at_once_and_how_long_one_ran_alone():
    # each row began elapsed_s before it landed: a runs 10-20 s, b 12-14, c 25-30 (none in flight 20-25)
    from benchmarks.kb_table import in_flight

    rows = [{"at_s": 20.0, "elapsed_s": 10.0}, {"at_s": 14.0, "elapsed_s": 2.0}, {"at_s": 30.0, "elapsed_s": 5.0},
            {"at_s": 31.0, "elapsed_s": None}]
    (line,) = in_flight(rows)
    busy = 10.0 + 2.0 + 5.0
    assert line == (f"in flight: first verification began at 10.0 s; {busy / 20:.2f} at once on average over 20 s "
                    "(at most 2); one alone for 13 s, none for 5 s")
    assert in_flight([{"at_s": None, "elapsed_s": 1.0}]) == []

"""scripts/gpu_measure.py, the GPU measurement script, on CPU: its step list, its refusals, its dry run,
and a real run of its steps against a stand-in interpreter (a shell script) so that a step can be made
to fail, to succeed with a known figure, or to run past its limit in a second."""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from gpu_measure_script import SCRIPT
from gpu_measure_script import load as _module

# the steps the project's GPU measurements need (issue 16)
REQUIRED = {"install", "suites", "redteam", "timing", "kernelbench", "expert", "scaling", "sanitizer", "training", "multigpu"}


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], check=False, capture_output=True, text=True, timeout=timeout)


def _fake_python(tmp_path: Path, body: str) -> Path:
    """An executable standing in for the steps' interpreter; `body` is a shell `case` on its arguments."""
    fake = tmp_path / "fake-python"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path / "calls"}\ncase "$*" in\n{body}\n'
                    f'*) echo "versions: python fake" ;;\nesac\n')
    fake.chmod(0o755)
    return fake


def _table(stdout: str) -> dict[str, tuple[str, str]]:
    """step -> (status, key figure), from the table printed last."""
    rows = stdout[stdout.rindex("key figure"):].splitlines()[1:]
    found = {}
    for row in rows:
        m = re.match(r"(\S+)\s+(ok|failed|timeout|skipped)\s+\d+\s\s(.*)$", row)
        assert m, row
        found[m.group(1)] = (m.group(2), m.group(3))
    return found


def test_list_gives_every_step_a_limit_and_a_typical_time():
    listed = _run("--list", "--limit", "suites=42")
    assert listed.returncode == 0, listed.stderr
    limits = {m.group(1): int(m.group(2)) for m in
              re.finditer(r"^(\w+)\s+limit\s+(\d+) s\s+typical: \S", listed.stdout, re.MULTILINE)}
    assert set(limits) == set(_module().STEPS) and REQUIRED <= set(limits)
    assert all(seconds > 0 for seconds in limits.values())
    assert limits["suites"] == 42  # --limit overrides a step's own
    assert "benchmarks/kernelbench_vs_ours" in listed.stdout.replace(".", "/")  # what each step runs


def test_an_unknown_step_is_refused_with_the_known_names():
    refused = _run("suites", "nope")
    assert refused.returncode == 2
    assert "'nope'" in refused.stderr
    assert all(name in refused.stderr for name in REQUIRED)
    assert _run("--limit", "nope=5", "suites").returncode == 2
    assert _run("--limit", "suites=soon", "suites").returncode == 2
    assert _run().returncode == 2  # no step named


def test_dry_run_prints_the_chosen_steps_commands_and_runs_nothing(tmp_path):
    fake = _fake_python(tmp_path, "")
    kb = tmp_path / "kb"
    kb.mkdir()
    out = tmp_path / "out"
    dry = _run("--dry-run", "--python", str(fake), "--gpus", "1", "--kb", str(kb), "--out", str(out),
               "kernelbench", "timing", "scaling", "multigpu")
    assert dry.returncode == 0, dry.stderr
    text = dry.stdout
    assert "benchmarks.kernelbench_vs_ours" in text and "--rounds 3" in text and str(kb) in text
    assert "tests/gpu/test_timing_gpu.py" in text and "benchmarks.timing_repeatability" in text
    assert text.index("kernelbench_vs_ours") < text.index("timing_repeatability")  # in the order given
    assert "sanitizer_cost" not in text and "expert_gpu" not in text  # steps not chosen
    assert "only the 1-GPU arm" in text and "pool_scaling.py" in text
    assert re.search(r"== multigpu .*skipped: needs 2 GPU", text) and "accelerate" not in text
    assert not (tmp_path / "calls").exists() and not out.exists()  # nothing ran, nothing written


def test_steps_run_in_order_and_one_past_its_limit_is_reported_as_timeout(tmp_path):
    fake = _fake_python(tmp_path, r"""
*sanitizer_cost*) exec sleep 30 ;;
*"-m pytest"*) echo "3 failed, 41 passed, 1 warning in 12.34s"; exit 1 ;;
*kernelbench_vs_ours*) echo "KernelBench: 51.1 verdicts/min; sizes: dim = 6144"
  echo "ours[kb_scope]: 390.2 verdicts/min = 7.63x KernelBench; honest accepted 27/27"
  eval last=\${$#}; echo "{}" > "$last" ;;""")
    kb = tmp_path / "kb"
    kb.mkdir()
    out = tmp_path / "out"
    t0 = time.monotonic()
    run = _run("--python", str(fake), "--gpus", "1", "--kb", str(kb), "--out", str(out), "--limit", "sanitizer=1",
               "sanitizer", "suites", "kernelbench", "multigpu")
    took = time.monotonic() - t0
    assert took < 20, run.stdout  # the sleeping step was stopped at its 1 s limit, not after 30 s
    assert run.returncode == 1  # a step failed or timed out
    rows = _table(run.stdout)
    assert list(rows) == ["install", "sanitizer", "suites", "kernelbench", "multigpu"]
    assert rows["install"] == ("ok", "python fake")
    assert rows["sanitizer"][0] == "timeout"
    assert rows["suites"] == ("failed", "3 failed, 41 passed, 1 warning")
    assert rows["kernelbench"] == ("ok", "KernelBench 51.1/min, kb_scope 390.2/min (7.63x)")
    assert rows["multigpu"][0] == "skipped"
    calls = (tmp_path / "calls").read_text().splitlines()
    assert "versions" in calls[-4]  # the install step's probe, then the steps in the order given
    marks = ("benchmarks.sanitizer_cost", "-m pytest", "benchmarks.kernelbench_vs_ours")
    assert [next(m for m in marks if m in c) for c in calls[-3:]] == list(marks)
    assert (out / "kernelbench_vs_ours.json").read_text().strip() == "{}"  # results copied to $OUT
    with tarfile.open(out / "steps.tgz") as tar:
        logs = {Path(n).name for n in tar.getnames()}
        sanitizer_log = tar.extractfile("./sanitizer.log").read().decode()
    assert {"install.log", "sanitizer.log", "suites.log", "kernelbench.log"} <= logs
    assert "stopped at the step's limit" in sanitizer_log
    assert "3 failed" in (out / "measure.log").read_text()


def test_a_kbeval_cut_at_its_limit_still_sums_the_verdicts_that_landed(tmp_path):
    # the H200's kbeval runs were cut by their limit; the table of what landed comes after anyway
    fake = _fake_python(tmp_path, r"""
*core.eval*) echo "[  1.0 s] level1/19_ReLU: accepted"; exec sleep 30 ;;
*kb_table*) echo "expert_l1_l2: cut run: 1 verdicts landed by 1.0 s: 1 accepted" ;;""")
    kb = tmp_path / "kb"
    (kb / "KernelBench").mkdir(parents=True)
    t0 = time.monotonic()
    run = _run("--python", str(fake), "--gpus", "1", "--kb", str(kb), "--out", str(tmp_path / "out"),
               "--work", str(tmp_path / "work"), "--limit", "kbeval=2", "kbeval")
    assert time.monotonic() - t0 < 25, run.stdout
    assert _table(run.stdout)["kbeval"][0] == "timeout"
    calls = (tmp_path / "calls").read_text().splitlines()
    assert "core.eval" in calls[-2] and "benchmarks.kb_table" in calls[-1]
    log = (tmp_path / "work" / "kbeval.log").read_text()
    assert log.index("stopped at the step's limit") < log.index("cut run: 1 verdicts landed")


# excerpts of real step logs (run outputs, no longer kept in the repository) and the key figure the table shows for them
_SANITIZER = """variant                  at once wall s/run CPU s/run runs/min
python+torch+context           1       4.36      8.27     13.8
memcheck stage driver          1       7.34     10.84      8.2
memcheck stage driver          8       8.71      9.58     55.1"""
_TIMING = """6 passed in 6.19s
x*2 over 128 MiB       default               0.0687    0.44%    1.026   100   0.069  PASS
x*2 over 128 MiB       previous              0.0689    1.25%    1.024   100   0.075  FAIL
x*2 over 2048 MiB      default               1.0093    0.09%    1.003    25   0.108  PASS"""
_EXPERT = """family     cases correct  x eager x compile   (geomean speedup of the expert)
fusion         6       6     2.84      1.03
softmax        4       4     2.54      1.42"""


# benchmarks/refinement.py on CPU (docs/training.md, "Multi-turn refinement")
_REFINEMENT = """trained model: pass@1 after turn 1..3: 0.641 -> 0.641 -> 0.641 on 64 held-out tasks; 23 rejected
after feedback SFT: pass@1 after turn 1..3: 0.578 -> 0.672 -> 0.672 on 64 held-out tasks; 27 rejected"""
# the shape of core.eval's rich table (core.evaluation.report.table), one per evaluation in the step's log;
# the numbers are made up: the phase2 step has not run anywhere yet
_GEOMEANS = """│ all   │    64 │    0 │     0.98 │    0.95 │     0 │ eager   │ 0.95/0.80/0.50/0.20/0.05 │   1.31x │
│       │       │      │          │         │       │ compile │ 0.95/0.40/0.10/0.02/0.00 │   0.97x │
│ all   │    64 │    0 │     0.80 │    0.70 │     0 │ eager   │ 0.70/0.50/0.30/0.10/0.00 │   1.02x │
│ all   │    64 │    0 │     0.82 │    0.72 │     0 │ eager   │ 0.72/0.55/0.35/0.10/0.00 │   1.10x │"""


@pytest.mark.parametrize("figure_of, log, figure", [
    ("refinement_figure", _REFINEMENT, ("trained model: pass@1 after turn 1..3: 0.641 -> 0.641 -> 0.641; "
                                        "after feedback SFT: pass@1 after turn 1..3: 0.578 -> 0.672 -> 0.672")),
    ("geomean_figure", _GEOMEANS, "geomean vs eager 1.31x/1.02x/1.10x (teacher/before/after)"),
    ("training_figure", ("| variant | seeds | after SFT | after GRPO | control | RL - SFT, points [95% CI] | "
                         "control - SFT | wall s |\n|---|---|---|---|---|---|---|---|\n"
                         "| gpu | 3 | 0.818 | 0.786 | 0.807 | -3.1 [-7.3, +0.0] | -1.0 [-16.7, +12.0] | [228, 352, 359] |"),
     "gpu: RL - SFT -3.1 [-7.3, +0.0], control - SFT -1.0 [-16.7, +12.0] points"),
    ("training_figure", ("| variant | seeds | after SFT | after GRPO | control | RL - SFT, points [95% CI] | "
                         "control - SFT | wall s |\n|---|---|---|---|---|---|---|---|\n"
                         "| gpu | 3 | 0.818 | 0.786 | 0.807 | -3.1 [-7.3, +0.0] | -1.0 [-16.7, +12.0] | [228, 352, 359] |\n"
                         "| gpu_replay | 3 | 0.818 | 0.830 | - | +1.2 [-2.0, +4.0] | - | [201, 210, 215] |"),
     "gpu: RL - SFT -3.1 [-7.3, +0.0], control - SFT -1.0 [-16.7, +12.0] points; "
     "gpu_replay: RL - SFT +1.2 [-2.0, +4.0] points"),
    ("experiments_figure", ("| information density | mcts / random | 1.391 [0.759, 3.167] |  | 2.3x |\n"
                            "| steps to pass >= 0.5 | adaptive / fixed | 1.000 [1.000, 1.000] |  | 0.6 (40% fewer) |"),
     "mcts / random 1.391 [0.759, 3.167]; adaptive / fixed 1.000 [1.000, 1.000]"),
    ("training_figure", "held-out pass rate 0.000 -> 0.844", "held-out pass rate 0.000 -> 0.844"),
    ("scaling_figure", "scaling 2 vs 1: 2.20x (target >= 1.8x)", "2 vs 1 GPU: 2.20x"),
    ("scaling_figure", ("1 shard          96    69.94         82.4     96  {'accepted': 96}\n"
                        "scaling 1 vs 1: 1.00x (target >= 1.8x)"), "1 GPU: 82.4 verdicts/min (96 verdicts)"),
    ("sanitizer_figure", _SANITIZER, "memcheck stage 7.34 s alone, 8.71 s 8 at once"),
    ("quantiles_figure", ("device: NVIDIA H200\n 100,000,000 spread (90% zeros), q=0.9    bisect 0.031 s  kthvalue "
                          "0.702 s  (22.6x)\n1,600,000,000 magnitudes, median           bisect 0.402 s  kthvalue "
                          "11.210 s  (27.9x)"),
     "100,000,000 elements: bisect 0.031 s, kthvalue 0.702 s; 1,600,000,000 elements: bisect 0.402 s, "
     "kthvalue 11.210 s"),
    ("timing_figure", _TIMING, "6 passed; repeatability 2/3 within 1%"),
    ("expert_figure", _EXPERT, "fusion 2.84/1.03, softmax 2.54/1.42 (x eager/x compile)"),
    ("pytest_summary", "PASSED tests/gpu/test_cuda_gpu.py::test_x\n33 passed, 1 warning in 275.61s (0:04:35)",
     "33 passed, 1 warning"),
    ("pytest_summaries", ("$ python -m pytest tests/gpu/test_timing_gpu.py\n6 passed in 3.40s\n$ python -m pytest -n 6 "
                          "tests/redteam_gpu\nPASSED tests/redteam_gpu/test_gpu_hacks.py::test_x\n1 failed, 92 passed "
                          "in 381.02s (0:06:21)"), "6 passed; 1 failed, 92 passed"),
])
def test_key_figures_read_from_step_logs(figure_of, log, figure):
    assert getattr(_module(), figure_of)(log) == figure


def test_the_suggested_calls_fit_one_device_call_and_cover_every_one_gpu_step():
    m = _module()
    covered = set()
    for calls in m.ONE_CALL:
        names = ["install", *calls.split()]
        # room for the start of the run, a stopped step's grace and the packing of steps.tgz
        assert sum(m.STEPS[n].limit_s for n in names) <= m.CALL_S - 30, calls
        covered.update(names)
    one_gpu = {n for n, s in m.STEPS.items() if s.gpus <= 1 and s.limit_s <= m.CALL_S}
    assert covered == one_gpu  # training runs for hours: it has no place in a 600 s call


def test_background_commands_run_side_by_side_and_a_kept_work_folder_resumes(tmp_path):
    # training_sft starts one warm-start run per seed in the background. Each stand-in run leaves a mark and
    # waits for the other seeds' marks: it finishes only if the runs really overlap (no timing involved).
    marks = tmp_path / "marks"
    marks.mkdir()
    fake = _fake_python(tmp_path, rf"""
*core.run*) seed=$(echo "$*" | sed -n 's/.*seed=\([0-9]*\).*/\1/p'); touch {marks}/$seed
  n=0; while [ $(ls {marks} | wc -l) -lt $(cat {tmp_path}/expect) ] && [ $n -lt 200 ]; do sleep 0.05; n=$((n+1)); done
  [ $n -lt 200 ] || exit 3; echo "held-out pass rate 0.000 -> 0.500 (seed $seed)" ;;""")
    (tmp_path / "expect").write_text("3")
    work = tmp_path / "work"
    first = _run("--python", str(fake), "--gpus", "1", "--out", str(tmp_path / "out"), "--work", str(work),
                 "training_sft")
    assert first.returncode == 0, first.stdout
    assert _table(first.stdout)["training_sft"][0] == "ok"
    assert sorted(p.name for p in marks.iterdir()) == ["0", "1", "2"]
    # a later call on the same work folder reruns only the warm starts that have no result yet
    (work / "training" / "warm" / "seed1").mkdir(parents=True)
    (work / "training" / "warm" / "seed1" / "result.json").write_text("{}")
    for mark in marks.iterdir():
        mark.unlink()
    (tmp_path / "expect").write_text("2")
    (tmp_path / "calls").unlink()
    second = _run("--python", str(fake), "--gpus", "1", "--out", str(tmp_path / "out2"), "--work", str(work),
                  "training_sft")
    assert second.returncode == 0, second.stdout
    runs = [c for c in (tmp_path / "calls").read_text().splitlines() if "core.run" in c]
    # side by side: each run records its call when it starts, in whichever order the OS schedules them
    assert sorted(re.search(r"seed=(\d)", c).group(1) for c in runs) == ["0", "2"]
    assert all(f"hydra.run.dir={work.resolve()}/training/warm/seed" in c for c in runs)


def test_a_background_command_that_fails_fails_its_step(tmp_path):
    fake = _fake_python(tmp_path, r"""
*"seed=1"*) exit 4 ;;
*core.run*) echo "held-out pass rate 0.000 -> 0.500" ;;""")
    run = _run("--python", str(fake), "--gpus", "1", "--out", str(tmp_path / "out"), "training_sft")
    assert run.returncode == 1
    assert _table(run.stdout)["training_sft"][0] == "failed"
    with tarfile.open(tmp_path / "out" / "steps.tgz") as tar:
        assert "== exit status 4" in tar.extractfile("./training_sft.log").read().decode()


def test_call_s_cuts_the_steps_limits_to_what_is_left_of_the_call(tmp_path):
    fake = _fake_python(tmp_path, r"""
*sanitizer_cost*) exec sleep 30 ;;""")
    t0 = time.monotonic()
    run = _run("--python", str(fake), "--gpus", "1", "--out", str(tmp_path / "out"), "--call-s", "18",
               "sanitizer", "timing")
    assert time.monotonic() - t0 < 28, run.stdout  # stopped at what was left of 18 s, not at its own 150 s
    rows = _table(run.stdout)
    assert rows["sanitizer"][0] == "timeout"
    assert rows["timing"][0] == "skipped" and "--call-s 18" in rows["timing"][1]


def test_an_interrupt_stops_every_background_command(tmp_path):
    import os
    import signal

    pids = tmp_path / "pids"
    fake = _fake_python(tmp_path, rf"""
*core.run*) echo $$ >> {pids}; exec sleep 60 ;;""")
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--python", str(fake), "--gpus", "1", "--out",
                             str(tmp_path / "out"), "training_sft"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (not pids.exists() or len(pids.read_text().split()) < 3):
        time.sleep(0.05)
    assert pids.exists() and len(pids.read_text().split()) == 3, proc.stdout.read1().decode() if proc.stdout else ""
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=30)
    alive = []
    for pid in map(int, pids.read_text().split()):
        try:
            os.kill(pid, 0)
            alive.append(pid)
        except ProcessLookupError:
            pass
    assert not alive, f"background runs left behind: {alive}"


def test_kbeval_runs_kb_scope_and_only_the_named_problems_when_asked():
    # one GPU call can recheck the problems a fix was for (`--kb-names`), instead of the whole queue again
    gm = _module()
    ctx = gm.Context("python3", Path("/w"), 1, Path(".kb"), "kb_scope", kb_names="26_GELU_,level1/59_conv")
    argv = [str(a) for a in gm._kbeval(ctx)[0].argv]
    assert "verifier=kb_scope" in argv and "names=[26_GELU_,level1/59_conv]" in argv
    everything = [str(a) for a in gm._kbeval(gm.Context("python3", Path("/w"), 1, Path(".kb"), "kb_scope"))[0].argv]
    assert not any(a.startswith("names=") for a in everything)
    assert set(gm._kb_scope_checks().split(",")) >= {"interp_races", "stability", "correctness"}


def test_kbeval_budget_follows_its_limit_so_a_shorter_call_still_finishes_its_report(tmp_path):
    # 2026-12-07: --limit kbeval=400 ran core.eval with its fixed 460 s budget; the step was killed at 400 s, before
    # results.json. The budget is the limit less the wind-down, at most 460 s (the runs in docs/eval.md's table).
    gm = _module()
    assert gm.kb_budget_s(530) == 460 and gm.kb_budget_s(400) == 330 and gm.kb_budget_s(5000) == 460
    assert gm.kb_budget_s(10) >= 30
    for limit, budget in (("400", "330"), ("530", "460")):
        (tmp_path / "kb" / "KernelBench").mkdir(parents=True, exist_ok=True)  # a checkout (CI has none)
        dry = _run("--dry-run", "--gpus", "1", "--kb", str(tmp_path / "kb"), "--limit", f"kbeval={limit}", "kbeval")
        assert dry.returncode == 0, dry.stderr
        assert f"budget_s={budget}" in dry.stdout


def test_an_override_reaches_the_steps_core_run_and_replaces_the_steps_own_value():
    # the next GPU run can change a training step's config without a commit, e.g. eager attention for hub_grpo
    gm = _module()
    ctx = gm.Context("python3", Path("/w"), 1, Path(".kb"), "kb_scope",
                     overrides=(("hub_grpo", "coder.attn_implementation=eager"),
                                ("hub_grpo", "trainer.phases.correctness.steps=12"), ("kbeval", "budget_s=9")))
    hub, summary = gm.commands_of(gm.STEPS["hub_grpo"], ctx)
    argv = list(hub.argv)
    assert argv[-2:] == ["coder.attn_implementation=eager", "trainer.phases.correctness.steps=12"]
    assert "trainer.phases.correctness.steps=20" not in argv  # Hydra refuses a key given twice
    assert "budget_s=9" not in argv and "core.run" not in summary.argv  # another step's; a non-run command
    kb_ctx = gm.Context("python3", Path("/w"), 1, Path(".kb"), "kb_scope", overrides=(("kbeval", "levels=[level2]"),))
    kb_eval, kb_summary = gm.commands_of(gm.STEPS["kbeval"], kb_ctx)  # core.eval takes them too: one level in a call
    assert kb_eval.argv[-1] == "levels=[level2]" and "levels=[level1,level2]" not in kb_eval.argv
    assert "levels=[level2]" not in kb_summary.argv
    plain = gm.commands_of(gm.STEPS["hub_grpo"], gm.Context("python3", Path("/w"), 1, Path(".kb"), "kb_scope"))
    assert "trainer.phases.correctness.steps=20" in plain[0].argv
    bad = _run("--dry-run", "--override", "nostep:a=b", "hub_grpo")
    assert bad.returncode == 2 and "unknown step 'nostep'" in bad.stderr
    malformed = _run("--dry-run", "--override", "hub_grpo=eager", "hub_grpo")
    assert malformed.returncode == 2 and "STEP:KEY=VALUE" in malformed.stderr


def test_the_host_monitor_says_how_busy_the_cores_and_the_gpu_were(tmp_path, monkeypatch):
    # whether a step was held back by the host's cores or by the GPU: read from /proc/stat and nvidia-smi
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text('#!/bin/sh\nprintf "50, 10240\\n70, 20480\\n"\n')  # two GPUs: 50% and 70% busy, 10 and 20 GiB
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}:/usr/bin:/bin")
    gm = _module()
    monitor = gm.HostMonitor(tmp_path / "step.monitor.tsv", every_s=0.2)
    with monitor:
        end = time.monotonic() + 1.2
        while time.monotonic() < end:  # one core busy
            sum(range(10_000))
    rows = (tmp_path / "step.monitor.tsv").read_text().splitlines()
    assert rows[0].split("\t") == ["seconds", "cpu_busy_pct", "gpu_util_pct", "gpu_mem_gib"] and len(rows) >= 4
    cpu = [float(r.split("\t")[1]) for r in rows[1:]]
    assert all(0 < c <= 100 for c in cpu)
    assert all(r.split("\t")[2:] == ["60.0", "30.0"] for r in rows[1:])  # utilisation averaged, memory summed
    summary = monitor.summary()
    assert re.match(r"host CPU busy: mean \d+% \(p90 \d+%\) of \d+ cores; GPU busy: mean 60% \(p90 60%\); "
                    r"GPU memory in use: at most 30.0 GiB \(\d+ samples, every 0.2 s\)$", summary), summary
    silent = gm.HostMonitor(tmp_path / "none.tsv", every_s=0.2)
    assert silent.summary() == ""  # never started: nothing to say

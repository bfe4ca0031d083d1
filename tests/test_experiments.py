"""scripts/run_experiments.py and core.loop.experiments: seeds per arm, intervals, the control arm, table and figure.

The runs are real (tiny) training runs with the test doubles of ``train_fakes``; nothing here
asserts what the experiments measure, only that every claim's numbers come out with their seeds
and intervals.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from fake_training_run import run

from core.loop.experiments import (
    curriculum_summary,
    density_summary,
    steps_to_threshold,
    table_rows,
)


def _script():
    spec = importlib.util.spec_from_file_location("run_experiments", ROOT / "scripts" / "run_experiments.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """``run_experiments --only selfplay --seeds 0 1`` with each run a tiny in-process training run."""
    from core import plugins

    old = plugins._pm
    out = tmp_path_factory.mktemp("experiments")
    script = _script()

    def run_one(preset, seed, out_dir, overrides):
        run_dir = out_dir / f"{preset or 'selfplay'}-seed{seed}"
        run(str(run_dir), [f"seed={seed}", "trainer.phases.correctness.steps=2", *overrides])
        return run_dir

    script.run_one = run_one
    try:
        summary = script.main(["--out", str(out), "--seeds", "0", "1", "--only", "selfplay"])
    finally:
        plugins.set_plugin_manager(old)
    return out, summary


def _ordered(ci):
    return ci["low"] - 1e-9 <= ci["estimate"] <= ci["high"] + 1e-9 or ci["low"] <= ci["high"]


def test_selfplay_reports_every_stage_and_the_control_per_seed_with_intervals(sweep):
    out, summary = sweep
    sp = summary["selfplay"]
    assert sp["seeds"] == 2 and set(sp["stages"]) == {"before", "sft", "rl", "control"}
    for stage in sp["stages"].values():
        assert len(stage["per_seed"]) == 2 and _ordered(stage["ci"])
    assert set(sp["gains"]) == {"rl-sft", "control-sft", "rl-control"}
    for gain in sp["gains"].values():
        assert len(gain["per_seed"]) == 2 and gain["ci"]["low"] <= gain["ci"]["high"]
    assert json.loads((out / "summary.json").read_text())["selfplay"] == sp
    assert (out / "experiments.png").read_bytes()[:4] == b"\x89PNG"
    assert "| held-out pass rate | after GRPO (self-play) |" in (out / "summary.md").read_text()
    labels = [row[1] for row in table_rows(summary)]
    assert "control: more SFT, same wall clock" in labels and "rl - sft" in labels


def test_density_and_curriculum_compare_arms_over_seeds(sweep):
    out, _ = sweep
    dirs = sorted(out.glob("selfplay-seed*"))
    assert len(dirs) == 2
    # the same runs as both arms: the machinery must give a ratio of exactly 1 with an interval around it
    density = density_summary({"density_random": dirs, "density_mcts": dirs, "density_replay": dirs})
    assert density["ratio"]["estimate"] == pytest.approx(1.0) or density["arms"]["density_random"]["ci"]["estimate"] == 0
    assert str(density["ratio_replay"]) == str(density["ratio"])  # the same arms: the same ratio (nan when 0 / 0)
    assert [r[1] for r in table_rows({"density": density}) if "/" in r[1]] == ["mcts / random", "replay / random"]
    # without a random arm there is nothing to divide by
    assert "ratio" not in density_summary({"density_mcts": dirs}) and "ratio_replay" not in density_summary({"density_replay": dirs})
    assert all(len(arm["per_seed"]) == 2 for arm in density["arms"].values())
    reached = curriculum_summary({"curriculum_fixed": dirs, "curriculum_adaptive": dirs}, 0.0, 1, budget=2)
    assert reached["arms"]["curriculum_fixed"]["per_seed"] == [1, 1] and reached["ratio"]["estimate"] == 1.0
    never = curriculum_summary({"curriculum_fixed": dirs}, 1.5, 1, budget=2)
    arm = never["arms"]["curriculum_fixed"]
    assert arm["per_seed"] == [None, None] and arm["reached"] == 0 and arm["ci"]["estimate"] == 2.0  # the budget


def test_steps_to_threshold_uses_a_running_window():
    rows = [{"pass_rate": v} for v in (0.0, 1.0, 0.0, 1.0, 1.0)]
    assert steps_to_threshold(rows, 1.0, 1) == 2
    assert steps_to_threshold(rows, 1.0, 2) == 5
    assert steps_to_threshold(rows, 0.5, 2) == 2
    assert steps_to_threshold(rows[:1], 0.5, 2) is None


def test_one_seed_is_refused():
    with pytest.raises(SystemExit):
        _script().parse(["--seeds", "0"])


def test_launch_stops_the_whole_run_at_its_limit(tmp_path):
    """A run over its limit is stopped with its children (a core.run's verifier workers are its children)."""
    import os
    import time

    from core.loop.experiments import launch

    pid_file = tmp_path / "child.pid"
    script = tmp_path / "run_with_worker.py"
    script.write_text(
        "import subprocess, sys, time\n"
        "worker = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(worker.pid))\n"
        "time.sleep(120)\n")
    start = time.monotonic()
    status = launch(tmp_path / "run", [], tmp_path / "run.log", limit_s=3, program=(str(script),))
    assert status == "over 3 s" and time.monotonic() - start < 30
    worker = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the run's worker {worker} outlived the limit")


def _gone(pid: int, within_s: float) -> bool:
    import os
    import time

    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("signum", ["SIGINT", "SIGTERM"])
def test_an_interrupted_sweep_leaves_no_run_behind(tmp_path, signum):
    """A sweep (run_parallel over launch) stopped by a signal stops every run it started, workers included,
    and starts none of those still queued. Before, an interrupt reached only the main thread: the runs,
    each in a session of its own, outlived their sweep, and a device chain's next call resumed a run
    directory beside its orphan (two processes writing one run, 2026-12-02)."""
    import os
    import signal
    import subprocess
    import time

    run = tmp_path / "run_with_worker.py"
    run.write_text(
        "import os, subprocess, sys, time\n"
        "worker = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        "name = sys.argv[1].split('=', 1)[1].rsplit('/', 1)[1]\n"
        f"open(os.path.join({str(tmp_path)!r}, name + '.pids'), 'w').write(f'{{os.getpid()}} {{worker.pid}}')\n"
        "time.sleep(120)\n")
    sweep = tmp_path / "sweep.py"
    sweep.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from pathlib import Path\n"
        "from core.loop.experiments import launch, run_parallel\n"
        f"out = Path({str(tmp_path)!r})\n"
        f"run_parallel(lambda n: launch(out / n, [], out / (n + '.log'), program=({str(run)!r},)), ['a', 'b', 'c'], 2)\n")
    parent = subprocess.Popen([sys.executable, str(sweep)], cwd=ROOT, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list(tmp_path.glob("*.pids"))) < 2:
        time.sleep(0.1)
    started = {p.stem: [int(x) for x in p.read_text().split()] for p in tmp_path.glob("*.pids")}
    assert sorted(started) == ["a", "b"], "the two job slots hold runs a and b"
    parent.send_signal(getattr(signal, signum))
    try:
        parent.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(parent.pid, signal.SIGKILL)
        for pids in started.values():
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        raise AssertionError("the sweep did not stop within 20 s of the interrupt")
    left = [pid for pids in started.values() for pid in pids if not _gone(pid, 10)]
    assert not left, f"processes {left} outlived their interrupted sweep"
    assert not (tmp_path / "c.pids").exists(), "a queued run started after the interrupt"


def test_run_parallel_returns_results_in_order_and_runs_again_after_an_interrupt(tmp_path):
    from core.loop.experiments import launch, run_parallel

    script = tmp_path / "exits.py"
    script.write_text("import sys; sys.exit(int(sys.argv[1].rsplit('/', 1)[1]))\n")
    codes = run_parallel(lambda n: launch(tmp_path / str(n), [], tmp_path / f"{n}.log", program=(str(script),)),
                         [0, 3, 0, 5], 2)
    assert codes == ["ok", "exit 3", "ok", "exit 5"]

    def interrupted(n):
        if n == 1:
            raise KeyboardInterrupt
        return n

    with pytest.raises(KeyboardInterrupt):
        run_parallel(interrupted, [0, 1], 1)
    # the stop is over once its sweep has ended: a later sweep launches again
    assert run_parallel(lambda n: launch(tmp_path / str(n), [], tmp_path / "again.log", program=(str(script),)),
                        [0], 1) == ["ok"]


def test_launch_reports_the_exit_status(tmp_path):
    from core.loop.experiments import launch

    script = tmp_path / "fails.py"
    script.write_text("import sys; print('no'); sys.exit(3)\n")
    assert launch(tmp_path / "run", [], tmp_path / "run.log", program=(str(script),)) == "exit 3"
    assert "no" in (tmp_path / "run.log").read_text()


def test_compare_arms_reports_each_arms_gains_and_density_over_the_first(sweep, tmp_path, capsys):
    import json
    import shutil

    from benchmarks.compare_arms import compare, is_warm_start, main

    out, summary = sweep
    dirs = sorted(out.glob("selfplay-seed*"))
    rows = compare({"a": dirs, "b": dirs})
    assert [r["arm"] for r in rows] == ["a", "b"] and rows[0]["density / first"] == "-"
    assert rows[1]["density / first"].endswith("over a")
    rl = summary["selfplay"]["gains"]["rl-sft"]["ci"]
    assert rows[0]["RL - SFT, points"].startswith(f"{100 * rl['estimate']:+.1f}")
    assert rows[0]["control"] != "-" and not is_warm_start(dirs[0])
    # a run that started from another's SFT model: its "before" is its "after SFT"
    warm = tmp_path / "warm"
    shutil.copytree(dirs[0], warm)
    state = json.loads((warm / "train_state.json").read_text())
    state["eval_phases"] = {}
    (warm / "train_state.json").write_text(json.dumps(state))
    assert is_warm_start(warm)
    (row,) = compare({"w": [warm]})
    assert row["after SFT"] == f"{sum(state['eval_before']['outcomes']) / len(state['eval_before']['outcomes']):.3f}"
    with pytest.raises(SystemExit, match="mixes runs"):
        compare({"mixed": [dirs[0], warm]})
    main(["--arm", "a", *map(str, dirs)])
    assert capsys.readouterr().out.startswith("| arm | seeds |")
    with pytest.raises(SystemExit):
        main(["--arm", "a", str(tmp_path / "nothing")])


@pytest.mark.parametrize("how", ["blocked", "ignored"])
def test_a_sweep_started_with_sigint_blocked_or_ignored_still_takes_it(how):
    # a shell's background job starts with SIGINT ignored, and a child inherits its parent thread's blocked
    # mask across exec; Python then leaves SIGINT alone, and the sweep could not be interrupted
    import signal
    import subprocess

    def start_without_sigint():
        if how == "blocked":
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        else:
            signal.signal(signal.SIGINT, signal.SIG_IGN)

    code = ("import signal, sys, time\n"
            f"sys.path.insert(0, {str(ROOT)!r})\n"
            "from core.loop.experiments import take_interrupts\n"
            "take_interrupts()\n"
            "try:\n    print('ready', flush=True)\n    time.sleep(60)\n"
            "except KeyboardInterrupt:\n    print('interrupted', flush=True)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            preexec_fn=start_without_sigint)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert out.strip() == "interrupted"

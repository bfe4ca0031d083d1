"""What a run shows on the console (issue 42, "the console"): where its results go, tables that are never
cut, a progress bar for every phase (GRPO's too) with or without a terminal, and a summary plot with the
headline comparison."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf
from rich.console import Console

from core import hookimpl
from core.loop.phase_common import PhaseProgress
from core.loop.training_config import Phase

# what train_state.json holds after the embedded default (make run): before, after SFT, after GRPO, control
PROGRESS = {
    "done": ["distill", "correctness", "performance", "more_sft"],
    "eval_before": {"pass_rate": 0.0, "compile_rate": 0.0, "tasks": 64},
    "eval_phases": {"distill": {"pass_rate": 0.5, "compile_rate": 0.9, "tasks": 64}},
    "eval_after": {"pass_rate": 0.53125, "compile_rate": 0.95, "tasks": 64},
    "eval_controls": {"more_sft": {"pass_rate": 0.515625, "compile_rate": 0.9, "tasks": 64,
                                   "control_for": "correctness", "steps": 600}},
    "seconds": {"distill": 140.0, "correctness": 230.0, "more_sft": 231.0},
    "steps_done": {"distill": 400, "correctness": 16, "more_sft": 600},
}
PHASES = [Phase("distill", "sft", 400), Phase("correctness", "grpo", 16), Phase("performance", "grpo", 0),
          Phase("more_sft", "sft", 4000, control_for="correctness")]


def piped_console() -> tuple[Console, io.StringIO]:
    """What ``make run | tee log`` gets: no terminal, so rich assumes 80 columns."""
    out = io.StringIO()
    return Console(file=out, width=80), out


# ---------------------------------------------------------------- the run directory


class FakeTrainer:
    def __init__(self, fail: bool = False):
        self.fail = fail

    @hookimpl
    def register_trainers(self, register):
        def entry(cfg):
            (__import__("pathlib").Path(cfg.out_dir) / "result.json").write_text("{}")
            if self.fail:
                raise RuntimeError("stopped")
            print("training...")
            return {"pass_rate": 0.5}

        register("fake_trainer", lambda: entry)


@pytest.fixture
def fake_trainer():
    from core import plugins

    old = plugins._pm

    def install(fail=False):
        pm = plugins.make_plugin_manager(autoload=False)
        pm.register(FakeTrainer(fail))
        plugins.set_plugin_manager(pm)

    yield install
    plugins.set_plugin_manager(old)


def test_a_run_prints_its_output_directory_at_the_start_and_the_end(tmp_path, capsys, fake_trainer):
    from core.run import run

    fake_trainer()
    assert run(OmegaConf.create({"trainer": {"name": "fake_trainer"}, "out_dir": str(tmp_path)})) == 0.5
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"run directory: {tmp_path}", "training...", f"results in {tmp_path} (result.json)"]


def test_a_failed_run_still_says_where_its_output_is(tmp_path, capsys, fake_trainer):
    from core.run import run

    fake_trainer(fail=True)
    with pytest.raises(RuntimeError):
        run(OmegaConf.create({"trainer": {"name": "fake_trainer"}, "out_dir": str(tmp_path)}))
    assert capsys.readouterr().out.splitlines()[-1] == f"run stopped; what it wrote is in {tmp_path} (result.json)"


# ---------------------------------------------------------------- tables


def test_tables_without_a_terminal_are_plain_lines_that_are_never_cut():
    from core.loop.report import print_learning_curve, print_results

    console, out = piped_console()
    print_results(console, PROGRESS, PHASES)
    rows = [{"step": i, "phase": "correctness", "pass_rate": 0.5, "pass_at_k": 0.75, "information_density": 0.5,
             "reward": 0.5, "hack_flag_rate": 0.0, "tasks/tier0": 4.0} for i in range(3)]
    print_learning_curve(console, rows)
    text = out.getvalue()
    assert "…" not in text and "correctne\n" not in text
    lines = text.splitlines()
    # one line per stage, whole: label, pass rate, change, passed, compile rate, time, steps
    assert any(line.startswith("after correctness (grpo)") and "0.531" in line and "+3.1 pts" in line
               and "34/64" in line and "230s" in line for line in lines)
    assert any(line.startswith("control more_sft: same time as correctness, spent on more sft") and "600" in line
               for line in lines)
    assert any(line.split()[:2] == ["2", "correctness"] and line.split()[-1] == "0:4" for line in lines)


def test_tables_on_a_terminal_are_drawn_by_rich_where_they_fit_and_plain_where_not():
    from core.loop.console import print_table

    wide = Console(file=io.StringIO(), force_terminal=True, width=200)
    print_table(wide, "t", ("stage", "rate"), [("after correctness (grpo)", "0.5")], left=("stage",))
    assert "┃" in wide.file.getvalue()  # rich's box
    narrow = Console(file=io.StringIO(), force_terminal=True, width=20)
    print_table(narrow, "t", ("stage", "rate"), [("after correctness (grpo)", "0.5")], left=("stage",))
    assert narrow.file.getvalue().splitlines()[2].split() == ["after", "correctness", "(grpo)", "0.5"]


def test_selfplay_rounds_table_is_plain_without_a_terminal():
    from core.loop.selfplay import SelfPlay

    console, out = piped_console()
    loop = SelfPlay(proposer=None, coder=None, verifier=None, reward=None, curriculum=None, backend="triton",
                    tasks_per_round=1, console=console)
    loop.history = [{"round": 0.0, "tasks": 6.0, "attempts": 6.0, "pass_rate": 0.5, "mean_reward": 0.5,
                     "hack_flag_rate": 0.0, "seconds": 1.5, "declined": 0.0}]
    loop.print_summary()
    assert out.getvalue().splitlines()[1].split() == ["round", "tasks", "attempts", "pass", "rate", "mean", "reward",
                                                       "hack", "flags", "seconds"]


# ---------------------------------------------------------------- progress


STATUS = "pass 0.25 pass@8 0.50 density 0.50 reward 0.250 compile 1.00 hacks 0.00 t0:4"


def run_steps(console: Console, steps: int, phase: Phase) -> tuple[PhaseProgress, list[str]]:
    """Drive a phase's progress as TRL does; what was printed before the phase ended, after each step."""
    training = SimpleNamespace(time_limit_s=None, progress={}, console=console)
    bar = PhaseProgress(training, phase)
    state = SimpleNamespace(max_steps=phase.steps, global_step=0)
    bar.on_train_begin(SimpleNamespace(output_dir="/nonexistent"), state, None)
    seen = []
    for step in range(1, steps + 1):
        state.global_step = step
        bar.set_status(STATUS)  # GRPO's step callback runs before the bar's
        bar.on_step_end(None, state, SimpleNamespace(should_training_stop=False))
        seen.append(console.file.getvalue())
    bar.on_train_end(None, state, SimpleNamespace(should_training_stop=False))
    return bar, seen


def test_grpo_progress_without_a_terminal_is_a_line_per_step():
    console, _ = piped_console()
    _, seen = run_steps(console, 3, Phase("correctness", "grpo", 16))
    assert "correctness (grpo) step 1/16 0:00  " + STATUS in seen[0]  # while the phase runs, not at its end
    assert "step 3/16" in seen[2] and "step 3/16" not in seen[1]


def test_a_long_phase_without_a_terminal_prints_about_twenty_lines():
    console, out = piped_console()
    run_steps(console, 400, Phase("distill", "sft", 400))
    steps = [line for line in out.getvalue().splitlines() if " step " in line]
    assert len(steps) == 20 and steps[-1].startswith("distill (sft) step 400/400")


def test_grpo_bar_on_a_terminal_keeps_its_bar_and_count_beside_a_long_status():
    console = Console(file=io.StringIO(), force_terminal=True, width=80)
    run_steps(console, 3, Phase("correctness", "grpo", 16))
    final = console.file.getvalue().split("\x1b[?25l")[-1]
    assert "3/16" in final and "━" in final  # the bar, and the count, survive the status
    assert STATUS in final


# ---------------------------------------------------------------- the summary plot


def test_summary_plot_shows_before_sft_grpo_and_control(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    from core.loop.metrics import HEADLINE_TITLE, plot_summary
    from core.loop.report import headline

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    rows = [{"step": i, "pass_rate": 0.5, "pass_at_k": 0.7, "accept_rate": 0.5, "information_density": 0.4,
             "reward": 0.5, "reward/correctness": 0.5, "hack_flag_rate": 0.0, "compile_rate": 1.0,
             "curriculum/max_tier": 0, "curriculum/param_scale": 1.0, "curriculum/perf_share": 0.0} for i in range(3)]
    plot_summary(rows, tmp_path / "summary.png", headline=headline(PROGRESS, PHASES))
    (panel,) = [ax for ax in figures[0].axes if ax.get_title() == HEADLINE_TITLE]
    assert [t.get_text() for t in panel.get_xticklabels()] == [
        "before training", "after distill (sft)", "after correctness (grpo)", "control more_sft"]
    assert [round(p.get_height(), 4) for p in panel.patches] == [0.0, 0.5, 0.5312, 0.5156]
    assert list(panel.get_shared_x_axes().get_siblings(panel)) == [panel]  # stages, not the panels' steps
    assert (tmp_path / "summary.png").exists()


def test_the_plot_title_names_the_proposer_the_run_chose(tmp_path):
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig

    from core.loop.report import proposer_label
    from core.run import CONF_DIR

    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose("config", overrides=[f"hydra.run.dir={tmp_path}"], return_hydra_config=True)
    assert proposer_label(cfg) == "random"  # outside a Hydra run: the plugin it builds
    HydraConfig.instance().set_config(cfg)
    try:
        # make run's default proposer group is single_op, which builds the random proposer
        assert proposer_label(cfg) == "single_op (random)"
    finally:
        HydraConfig.instance().cfg = None


def test_a_run_console_without_a_terminal_never_wraps_a_line():
    from core.loop.console import run_console

    console = run_console(file=io.StringIO())
    line = "held-out eval after training: pass rate 0.531, compile rate 0.950 on 64 tasks (12.3s) " * 2
    console.print(line)
    assert console.file.getvalue() == line + "\n"

"""The control arm (core.loop.control): GRPO's wall clock spent on more SFT, from the same start, reported beside it."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from fake_training_run import run

from core.loop.control import budget_steps, predecessor
from core.loop.phase_common import PhaseProgress
from core.loop.report import print_results
from core.loop.training_config import Phase, TrainingError, TrainSettings, validate_controls


@pytest.fixture(scope="module")
def control_run(tmp_path_factory):
    from core import plugins

    old = plugins._pm
    out = tmp_path_factory.mktemp("control")
    # trainer=embedded carries the control arm more_sft (control_for: correctness)
    training, summary = run(str(out), ["trainer.phases.correctness.steps=3"])
    yield out, training, summary
    plugins.set_plugin_manager(old)


def test_control_starts_where_grpo_started_and_gets_its_wall_clock(control_run):
    out, _, _ = control_run
    progress = json.loads((out / "train_state.json").read_text())
    assert progress["start_model"]["correctness"] == str(out / "models" / "distill")
    control = progress["eval_controls"]["more_sft"]
    assert control["control_for"] == "correctness"
    assert control["budget_s"] == pytest.approx(progress["seconds"]["correctness"])
    assert 1 <= control["steps"] <= 4000
    # it stops at the budget: at most one step past it (the check runs after each step)
    per_step = progress["seconds"]["more_sft"] / control["steps"]
    assert progress["seconds"]["more_sft"] <= control["budget_s"] + 2 * per_step + 1.0
    # the same verified teacher pairs, no new teacher calls
    assert (out / "more_sft_pairs.jsonl").read_text() == (out / "distill_pairs.jsonl").read_text()
    assert (out / "models" / "more_sft" / "config.json").exists()


def test_run_model_stays_the_grpo_model_and_results_name_the_control(control_run):
    out, _, _ = control_run
    progress = json.loads((out / "train_state.json").read_text())
    assert progress["model"] == str(out / "models" / "correctness")
    assert progress["done"][-1] == "more_sft"
    result = json.loads((out / "result.json").read_text())
    assert set(result["pass_rate_control"]) == {"more_sft"}
    assert result["pass_rate_after_phase"].keys() == {"distill"}
    assert set(result["phase_seconds"]) >= {"distill", "correctness", "more_sft"}
    assert len(progress["eval_after"]["outcomes"]) == result["eval_tasks"]


def test_final_table_shows_before_sft_rl_and_control(control_run):
    out, training, _ = control_run
    progress = json.loads((out / "train_state.json").read_text())
    console = Console(record=True, width=200)
    print_results(console, progress, training.settings.phases)
    text = console.export_text()
    for label in ("before training", "after distill (sft)", "after correctness (grpo)",
                  "control more_sft: same time as correctness"):
        assert label in text
    assert "pts" in text  # the change against the stage each arm started from


def test_control_must_name_an_earlier_phase():
    with pytest.raises(TrainingError, match="control_for"):
        TrainSettings.from_config({"phases": {"c": {"kind": "sft", "steps": 1, "control_for": "g"},
                                              "g": {"kind": "grpo", "steps": 1}}})
    with pytest.raises(TrainingError, match="control_for"):
        validate_controls([Phase("a", "sft", 1), Phase("b", "sft", 1, control_for="a"),
                           Phase("c", "sft", 1, control_for="b")])
    phases = [Phase("d", "sft", 5), Phase("skip", "grpo", 0), Phase("g", "grpo", 3), Phase("c", "sft", 9, control_for="g")]
    validate_controls(phases)
    assert predecessor(phases, "g").name == "d" and predecessor(phases, "d") is None


@given(st.integers(1, 10_000), st.floats(0.0, 1e4), st.one_of(st.none(), st.floats(1e-3, 10.0)))
def test_scheduled_steps_stay_within_the_cap(cap, budget, per_step):
    steps = budget_steps(Phase("c", "sft", cap), budget, per_step)
    assert 1 <= steps <= cap
    if per_step is None:
        assert steps == cap
    elif budget / per_step <= cap - 1:
        assert steps * per_step >= budget  # enough steps for the schedule to span the budget


def test_progress_stops_training_at_the_time_limit():
    training = SimpleNamespace(time_limit_s=0.0, progress={}, console=Console(file=io.StringIO()))
    bar = PhaseProgress(training, Phase("c", "sft", 10))
    args, state = None, SimpleNamespace(max_steps=10, global_step=0)
    bar.on_train_begin(args, state, SimpleNamespace())
    control = SimpleNamespace(should_training_stop=False)
    state.global_step = 1
    bar.on_step_end(args, state, control)
    bar.on_train_end(args, state, control)
    assert control.should_training_stop
    assert training.progress["steps_done"]["c"] == 1 and training.progress["seconds"]["c"] >= 0.0


def test_a_run_without_an_sft_phase_schedules_its_control_by_pace_s(control_run, tmp_path):
    # a run that starts from another run's SFT model (a warm start) has no SFT phase whose pace the control
    # could schedule by; pace_s gives it one, so its learning-rate schedule spans the budget: with a pace
    # far slower than real, one step is scheduled (and, without pace_s, up to the 4000-step cap)
    from core import plugins

    first, _, _ = control_run
    for phase in ("distill", "more_sft"):  # as benchmarks/selfplay_sweep lays out a warm start
        (tmp_path / f"{phase}_pairs.jsonl").write_text((first / "distill_pairs.jsonl").read_text())
    old = plugins._pm
    try:
        run(str(tmp_path), [f"coder.model={first / 'models' / 'distill'}", "trainer.phases.distill.steps=0",
                            "trainer.phases.correctness.steps=2", "trainer.phases.more_sft.pace_s=1000"])
    finally:
        plugins.set_plugin_manager(old)
    progress = json.loads((tmp_path / "train_state.json").read_text())
    assert "distill" not in progress.get("seconds_per_step", {})
    assert progress["eval_controls"]["more_sft"]["steps"] == 1


def test_pace_s_must_be_a_positive_number_of_seconds():
    with pytest.raises(TrainingError, match="pace_s"):
        Phase("c", "sft", 10, control_for="g", pace_s=0.0)


def test_a_phase_can_checkpoint_less_often_than_the_run():
    # a GRPO run checkpoints every few steps so a cut run resumes close by; its SFT control, whose steps
    # take a fraction of a second, would spend its wall clock saving at that rate
    from core.loop.phase_common import common_args

    settings = TrainSettings(phases=[Phase("g", "grpo", 3)], save_steps=4)
    training = SimpleNamespace(settings=settings, out=Path("/tmp/run"), device="cpu", seed=0)
    assert common_args(training, Phase("g", "grpo", 3))["save_steps"] == 4
    assert common_args(training, Phase("c", "sft", 100, control_for="g", save_steps=200))["save_steps"] == 200
    with pytest.raises(TrainingError, match="save_steps"):
        Phase("c", "sft", 100, save_steps=0)

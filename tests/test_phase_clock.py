"""A phase's clock across a resume (core.loop.phase_common): the control arm's budget is the seconds
the whole phase trained, not those of the part after the last restart (a run cut by a device call's end
and resumed in the next measured 29 s of a ~230 s GRPO phase and gave its control 29 s)."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

from rich.console import Console

from core.loop import phase_common
from core.loop.phase_common import STATE_FILE, PhaseProgress, StateCallback


class _Clock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


def _training():
    stateful = SimpleNamespace(state_dict=dict)
    return SimpleNamespace(progress={}, console=Console(file=io.StringIO()), proposer=stateful, curriculum=stateful,
                           metrics=SimpleNamespace(rows=[]), time_limit_s=None)


def test_a_resumed_phase_counts_the_seconds_it_spent_before_its_checkpoint(tmp_path, monkeypatch):
    clock = _Clock(100.0)
    monkeypatch.setattr(phase_common.time, "perf_counter", clock)
    phase = SimpleNamespace(name="correctness", kind="grpo", steps=6)
    args = SimpleNamespace(output_dir=str(tmp_path))
    control = SimpleNamespace(should_training_stop=False)

    # the first process: 4 steps in 40 s, a checkpoint, then killed (no on_train_end)
    first = PhaseProgress(_training(), phase)
    training = first.training
    state = SimpleNamespace(global_step=0, max_steps=6)
    first.on_train_begin(args, state, control)
    clock.now += 40.0
    state.global_step = 4
    (tmp_path / "checkpoint-4").mkdir()
    StateCallback(training, phase, first).on_save(args, state, control)
    assert json.loads((tmp_path / "checkpoint-4" / STATE_FILE).read_text())["phase_seconds"] == 40.0

    # the second process resumes from checkpoint-4 much later and trains the last 2 steps in 15 s
    clock.now = 5000.0
    second = PhaseProgress(_training(), phase)
    state = SimpleNamespace(global_step=4, max_steps=6)
    second.on_train_begin(args, state, control)
    clock.now += 15.0
    state.global_step = 6
    second.on_step_end(args, state, control)
    second.on_train_end(args, state, control)
    progress = second.training.progress
    assert progress["seconds"]["correctness"] == 55.0
    assert progress["steps_done"]["correctness"] == 6
    assert progress["seconds_per_step"]["correctness"] == 55.0 / 6


def test_a_resumed_control_arm_stops_at_its_whole_budget(tmp_path, monkeypatch):
    clock = _Clock(0.0)
    monkeypatch.setattr(phase_common.time, "perf_counter", clock)
    phase = SimpleNamespace(name="more_sft", kind="sft", steps=4000)
    args = SimpleNamespace(output_dir=str(tmp_path))
    (tmp_path / "checkpoint-8").mkdir()
    (tmp_path / "checkpoint-8" / STATE_FILE).write_text(json.dumps({"phase_seconds": 50.0}))
    bar = PhaseProgress(_training(), phase)
    bar.training.time_limit_s = 60.0
    control = SimpleNamespace(should_training_stop=False)
    state = SimpleNamespace(global_step=8, max_steps=4000)
    bar.on_train_begin(args, state, control)
    clock.now = 9.0
    bar.on_step_end(args, state, control)
    assert not control.should_training_stop  # 59 s of its 60
    clock.now = 10.5
    bar.on_step_end(args, state, control)
    assert control.should_training_stop  # 60.5 s: the 50 before the resume count


def test_a_fresh_phase_ignores_checkpoints_it_did_not_resume_from(tmp_path, monkeypatch):
    clock = _Clock(0.0)
    monkeypatch.setattr(phase_common.time, "perf_counter", clock)
    (tmp_path / "checkpoint-0").mkdir()
    (tmp_path / "checkpoint-0" / STATE_FILE).write_text(json.dumps({"phase_seconds": 999.0}))
    bar = PhaseProgress(_training(), SimpleNamespace(name="distill", kind="sft", steps=3))
    control = SimpleNamespace(should_training_stop=False)
    state = SimpleNamespace(global_step=0, max_steps=3)
    bar.on_train_begin(SimpleNamespace(output_dir=str(tmp_path)), state, control)
    clock.now = 2.0
    state.global_step = 3
    bar.on_train_end(None, state, control)
    assert bar.training.progress["seconds"]["distill"] == 2.0

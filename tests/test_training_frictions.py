"""Training frictions a newcomer met (issue 42): each one now stops with what happened and what to change."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from train_fakes import StaticVerifier  # noqa: E402

from core.loop.training_config import Phase, TrainingError  # noqa: E402


@pytest.fixture
def fakes():
    from fake_training_run import install_fakes

    from core import plugins

    old = plugins._pm
    install_fakes()
    yield
    plugins.set_plugin_manager(old)


def finished_run(out: Path, steps: dict[str, int]) -> None:
    """A run directory whose every phase is done, as ``train_state.json`` records it after the run."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "train_state.json").write_text(json.dumps({
        "done": ["distill", "correctness", "performance", "more_sft"], "model": None, "step_offset": 3,
        "steps_done": {"distill": steps["distill"], "correctness": steps["correctness"], "more_sft": 40},
        "phase_steps": {**steps, "performance": 0, "more_sft": 4000},
        "eval_before": {"pass_rate": 0.0, "compile_rate": 0.0, "tasks": 2},
        "eval_after": {"pass_rate": 0.5, "compile_rate": 1.0, "tasks": 2}}))


def test_resuming_a_finished_phase_with_more_steps_says_why_it_cannot(tmp_path, fakes):
    from fake_training_run import compose

    from core.loop.training import Training

    finished_run(tmp_path, {"distill": 3, "correctness": 3})
    with pytest.raises(TrainingError) as err:
        Training(compose(str(tmp_path), ["trainer.phases.correctness.steps=8"]), StaticVerifier())
    message = str(err.value)
    assert "'correctness' with 3 steps" in message and "steps=8 asks for 5 more" in message
    assert "hydra.run.dir" in message and "trainer.resume=never" in message


def test_a_phase_that_was_skipped_then_asked_for_steps_is_not_skipped_in_silence(tmp_path, fakes):
    from fake_training_run import compose

    from core.loop.training import Training

    finished_run(tmp_path, {"distill": 3, "correctness": 3})
    with pytest.raises(TrainingError, match="'performance' with 0 steps"):
        Training(compose(str(tmp_path), ["trainer.phases.performance.steps=2"]), StaticVerifier())


def test_resuming_a_finished_run_with_the_same_or_fewer_steps_still_works(tmp_path, fakes):
    from fake_training_run import compose

    from core.loop.training import Training

    finished_run(tmp_path, {"distill": 3, "correctness": 3})
    # the control arm's steps are a cap, never compared; fewer steps than ran is nothing to add
    training = Training(compose(str(tmp_path), ["trainer.phases.distill.steps=2"]), StaticVerifier())
    assert training.progress["done"][-1] == "more_sft"

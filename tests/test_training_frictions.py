"""Training frictions a newcomer met (issue 42): each one now stops with what happened and what to change."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from train_fakes import StaticVerifier

from core.loop.training_config import Phase, TrainingError


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


class WordTokenizer:
    """One token per whitespace-separated word."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": text.split()}


def sft_run(max_new_tokens: int):
    from rich.console import Console

    coder = SimpleNamespace(hf_tokenizer=WordTokenizer(), max_prompt_tokens=8, max_new_tokens=max_new_tokens)
    return SimpleNamespace(coder=coder, console=Console(file=None, quiet=True))


def test_teacher_answers_all_dropped_as_too_long_say_so_and_what_to_raise():
    from core.loop.sft import fitting

    # 16 accepted teacher answers, each 4 prompt words + 20 completion words: 24 tokens against 8 + 4
    rows = [{"prompt": "write a relu kernel\n", "completion": " ".join(["tok"] * 20)} for _ in range(16)]
    with pytest.raises(TrainingError) as err:
        fitting(sft_run(max_new_tokens=4), rows, Phase("distill", "sft", 3))
    message = str(err.value)
    assert "all 16 accepted teacher answers were dropped as too long" in message
    assert "coder.max_new_tokens (now 4) to at least 17" in message
    # at that value the shortest pair fits
    assert len(fitting(sft_run(max_new_tokens=17), rows, Phase("distill", "sft", 3))) == 16


def test_an_explicit_max_length_is_the_setting_named():
    from core.loop.sft import fitting

    rows = [{"prompt": "p\n", "completion": "a b c d e"}]
    with pytest.raises(TrainingError, match=r"trainer.phases.distill.max_length \(now 3\) to at least 7"):
        fitting(sft_run(max_new_tokens=4), rows, Phase("distill", "sft", 3, max_length=3))

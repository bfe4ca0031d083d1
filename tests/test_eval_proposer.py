"""trainer.eval_proposer: the held-out tasks come from a proposer fixed apart from the run's, so runs of
different proposers (MCTS against random, say) are judged on the same tasks."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from core.contracts import CurriculumState
from core.evaluation.suites import HeldOut
from core.loop.training import Training
from core.loop.training_config import TrainSettings

CONF = Path(__file__).resolve().parent.parent / "conf"


def _held_out(proposer: str, *overrides: str) -> list[str]:
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose("config", overrides=[f"proposer={proposer}", "trainer.eval_tasks=6", *overrides])
    run = SimpleNamespace(settings=TrainSettings.from_config(cfg.trainer), cfg=cfg, seed=0,
                          curriculum=SimpleNamespace(state=CurriculumState()),
                          heldout=HeldOut(eval_share=cfg.trainer.eval_share))
    return [t.id for t in Training._held_out_tasks(run)]


def test_runs_of_different_proposers_share_the_held_out_tasks_of_a_fixed_eval_proposer():
    fixed = "trainer.eval_proposer={name: random, max_ops: 1}"
    mcts, single = _held_out("mcts", fixed), _held_out("single_op", fixed)
    assert len(mcts) == 6 and mcts == single
    # without it each run draws its held-out tasks from its own proposer: not the same tasks
    assert _held_out("mcts") != _held_out("single_op")


def test_eval_proposer_defaults_to_none_in_every_trainer():
    for name in ("grpo", "embedded"):
        with initialize_config_dir(config_dir=str(CONF), version_base=None):
            cfg = compose("config", overrides=[f"trainer={name}"])
        assert OmegaConf.select(cfg, "trainer.eval_proposer") is None


def test_an_eval_proposer_that_is_not_a_proposer_node_is_refused():
    import pytest

    from core.loop.training_config import TrainingError

    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose("config", overrides=["trainer.eval_proposer=random"])
    with pytest.raises(TrainingError, match="eval_proposer must be a proposer node"):
        TrainSettings.from_config(cfg.trainer)

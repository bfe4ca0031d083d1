"""Reward mixes in one place (issue 40): the run's ``reward`` group reaches every GRPO phase, a phase's own
block that gives way says so, and a weighted term that cannot be nonzero on the run's device warns once.

Configs are composed in-process with the overrides a user would type; nothing trains.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf
from rich.console import Console

from core import hookimpl
from core.config import store_plugin_configs
from core.contracts import OPTIONAL_MEMBERS
from core.loop.grpo import phase_mix
from core.loop.rewards import RewardMix, reward_notes
from core.loop.training import Training
from core.loop.training_config import TrainSettings

CONF = Path(__file__).resolve().parent.parent / "conf"


def compose_with(*overrides: str):
    GlobalHydra.instance().clear()
    store_plugin_configs()
    with initialize_config_dir(version_base=None, config_dir=str(CONF)):
        return compose(config_name="config", overrides=list(overrides))


def sweep_points(*arguments: str) -> list[list[str]]:
    """The runs Hydra's basic sweeper makes of ``python -m core.run -m <arguments>``."""
    parsed = OverridesParser.create().parse_overrides(list(arguments))
    return [list(point) for batch in BasicSweeper.split_arguments(parsed, None) for point in batch]


def grpo_mixes(cfg) -> dict[str, RewardMix]:
    """The reward mix every GRPO phase of ``cfg`` trains on, as run_grpo builds it."""
    return {p.name: phase_mix(cfg, p) for p in TrainSettings.from_config(cfg.trainer).phases if p.kind == "grpo"}


def run_reward(cfg) -> dict:
    return OmegaConf.to_container(cfg.reward, resolve=True)


# --------------------------------------------------------------------------- one source of weights


def test_the_readme_sweep_changes_the_reward_of_every_grpo_phase():
    # python -m core.run trainer=grpo -m reward=mixed reward.weights.speedup=0.1,0.5
    points = sweep_points("trainer=grpo", "reward=mixed", "reward.weights.speedup=0.1,0.5")
    assert len(points) == 2
    speedups = []
    for point in points:
        mixes = grpo_mixes(compose_with(*point))
        assert set(mixes) == {"correctness", "performance"}
        speedups.append({name: mix.weights["speedup"] for name, mix in mixes.items()})
    assert speedups == [{"correctness": 0.1, "performance": 0.1}, {"correctness": 0.5, "performance": 0.5}]


@pytest.mark.parametrize("trainer", ["grpo", "embedded"])
def test_a_weight_override_reaches_every_grpo_phase_under_each_trainer(trainer):
    for weight in (0.25, 2.0):
        cfg = compose_with(f"trainer={trainer}", f"reward.weights.correctness={weight}")
        for name, mix in grpo_mixes(cfg).items():
            assert mix.weights["correctness"] == weight, (trainer, name)


def test_grpo_phases_keep_their_published_mixes_under_the_default_reward():
    mixes = grpo_mixes(compose_with("trainer=grpo"))  # reward=correctness: {correctness: 1.0}
    assert mixes["correctness"].weights == {"correctness": 1.0, "format": 0.1}
    assert mixes["performance"].weights == {"correctness": 1.0, "roofline": 1.0, "speedup": 0.5}
    assert mixes["performance"].terms["speedup"].max_speedup == 4.0  # the phase's term_kwargs
    assert mixes["performance"].failure_reward == 0.0


def test_a_phase_that_gives_way_to_the_run_is_named_at_start():
    cfg = compose_with("trainer=grpo", "reward=mixed", "reward.weights.speedup=0.1",
                       "trainer.phases.performance.steps=5")
    notes = reward_notes(run_reward(cfg), TrainSettings.from_config(cfg.trainer).phases, "cuda")
    assert len(notes) == 1, notes
    assert "phase performance" in notes[0] and "trainer.phases.performance.reward" in notes[0]
    assert "reward.weights.speedup: the phase's 0.5 gives way to the run's 0.1" in notes[0]
    assert "reward.weights.roofline: the phase's 1.0 gives way to the run's 0.5" in notes[0]
    # the correctness phase's block only adds format, which mixed weighs the same: nothing to say
    assert not any("phase correctness" in n for n in notes)


def test_a_phase_that_does_not_train_says_nothing():
    cfg = compose_with("trainer=grpo", "reward=mixed", "reward.weights.speedup=0.1")  # performance.steps=0
    assert reward_notes(run_reward(cfg), TrainSettings.from_config(cfg.trainer).phases, "cuda") == []


# --------------------------------------------------------------------------- terms this device cannot measure


def test_speedup_and_roofline_sweeps_on_the_cpu_warn_once_naming_the_terms():
    cfg = compose_with("reward=mixed", "reward.weights.speedup=0.1", "device=cpu")  # the default trainer
    phases = TrainSettings.from_config(cfg.trainer).phases
    notes = reward_notes(run_reward(cfg), phases, "cpu")
    assert len(notes) == 1, notes
    assert "reward terms roofline, speedup are 0 for every candidate on device=cpu" in notes[0]
    assert "GPU timing is measured only on device=cuda" in notes[0]
    assert "identical" in notes[0]
    assert reward_notes(run_reward(cfg), phases, "cuda") == []
    default = compose_with("device=cpu")  # reward=correctness: every term can be nonzero on the CPU
    assert reward_notes(run_reward(default), TrainSettings.from_config(default.trainer).phases, "cpu") == []


def test_a_zero_weight_does_not_warn():
    cfg = compose_with("reward=mixed", "reward.weights.speedup=0", "reward.weights.roofline=0")
    assert reward_notes(run_reward(cfg), TrainSettings.from_config(cfg.trainer).phases, "cpu") == []


def test_the_training_run_prints_the_warning_once_at_start():
    cfg = compose_with("reward=mixed", "device=cpu")
    out = io.StringIO()
    run = SimpleNamespace(cfg=cfg, settings=TrainSettings.from_config(cfg.trainer), device="cpu",
                          console=Console(file=out, width=400))
    notes = Training.announce_rewards(run)
    assert len(notes) == 1
    printed = out.getvalue()
    assert printed.count("warning") == 1 and "roofline, speedup" in printed


def test_reward_terms_declare_what_they_need_through_the_contract(register_plugin):
    assert OPTIONAL_MEMBERS["RewardTerm"]["supports"]("cpu") is None  # the default: every device

    class Plain:  # a third-party term that declares nothing can be nonzero anywhere
        name = "plain"

        def __call__(self, verdicts, tasks, **context):
            return [0.0] * len(verdicts)

    class NeedsAnFPGA(Plain):
        name = "fpga"

        def supports(self, device):
            return "the FPGA's counters exist only on device=fpga"

    class Terms:
        @hookimpl
        def register_rewards(self, register):
            register("plain", Plain)
            register("fpga", NeedsAnFPGA)

    register_plugin(Terms(), name="terms")
    phases = [SimpleNamespace(name="p", kind="grpo", steps=1, reward=None)]
    assert reward_notes({"weights": {"plain": 1.0}}, phases, "cpu") == []
    notes = reward_notes({"weights": {"plain": 1.0, "fpga": 0.5}}, phases, "cuda")
    assert notes == [("reward term fpga is 0 for every candidate on device=cuda (weighed in phase p): the FPGA's "
                      "counters exist only on device=fpga. Runs that differ only in its weight give identical results.")]


# --------------------------------------------------------------------------- what training logs


class _Present:
    """A term worth 1.0 for every completion, accepted or not: the tiny test model's completions score 0
    on every built-in term, so only a term that is never 0 shows what its weight does to the logged reward."""

    name = "present"
    scores_failures = True

    def __call__(self, verdicts, tasks, **context):
        return [1.0] * len(verdicts)


class _PresentTerm:
    @hookimpl
    def register_rewards(self, register):
        register("present", _Present)


def test_a_sweep_of_the_runs_weights_changes_the_rewards_the_grpo_phase_logs(tmp_path):
    # python -m core.run -m +reward.weights.present=0.5,2.0 (in-process, with the training test doubles)
    from fake_training_run import run  # tests/ is on the path (tests/conftest.py's folder)

    from core import plugins

    old = plugins._pm
    logged = {}
    try:
        for weight in (0.5, 2.0):
            out = tmp_path / f"w{weight}"
            run(str(out), [f"+reward.weights.present={weight}"], extra_plugins=[_PresentTerm()])
            rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
            logged[weight] = [r for r in rows if r.get("phase") == "correctness"]
    finally:
        plugins.set_plugin_manager(old)
    for weight, rows in logged.items():
        assert rows, "the GRPO phase logged no step"
        # the term the run's reward group adds is logged under its own name, beside the phase's own terms
        assert all(r["reward/present"] == 1.0 and "reward/correctness" in r and "reward/format" in r for r in rows)
        # the weighted reward the phase trained on follows the sweep (correctness and format are 0 here)
        assert all(r["reward"] == pytest.approx(weight) for r in rows), [r["reward"] for r in rows]

"""Self-play that can judge nothing says why and fails (issue 42: backend=cuda without a GPU exited 0
after "declined 6 ... over 0 attempts")."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from core.contracts import CurriculumState
from core.plugins import PluginError
from core.task import Task

ROOT = Path(__file__).resolve().parent.parent


def compose(tmp_path, *overrides):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from core.config import store_plugin_configs

    store_plugin_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        return hydra_compose("config", overrides=["experiment=selfplay", f"out_dir={tmp_path}", *overrides])


def test_cuda_selfplay_without_a_gpu_is_refused_before_it_starts(tmp_path, monkeypatch):
    from core.loop.selfplay import run_selfplay
    from plugins.backends import cuda_backend

    monkeypatch.setattr(cuda_backend, "cupy_missing", lambda: None)  # CuPy or not, the GPU is what is missing

    def no_executor(cfg):
        raise AssertionError("no verifier is started for a run that cannot accept anything")

    monkeypatch.setattr("core.verification.executor.executor_for_run", no_executor)
    with pytest.raises(PluginError) as err:
        run_selfplay(compose(tmp_path, "backend=cuda", "device=cpu"))
    message = str(err.value)
    assert "backend 'cuda' cannot run kernels on cpu" in message
    assert "execution needs a GPU" in message and "backend=triton" in message


class Fixed:
    name = "fixed"

    def propose(self, n, state):
        return [Task(source=f"# task {i}\nclass Model: pass\n", program=None) for i in range(n)]

    def feedback(self, solve_rates):
        pass


class Still:
    name = "still"
    state = CurriculumState()

    def update(self, metrics):
        return []


class NeverCalled:
    def verify_many(self, pairs, on_verdicts=None):
        raise AssertionError(f"{len(pairs)} pairs verified")


def test_selfplay_whose_every_answer_is_declined_says_why_and_fails():
    from core.loop.rewards import RewardMix
    from core.loop.selfplay import SelfPlay
    from plugins.coders.expert import ExpertCoder

    out = io.StringIO()
    loop = SelfPlay(proposer=Fixed(), coder=ExpertCoder(), verifier=NeverCalled(),
                    reward=RewardMix(weights={"correctness": 1.0}), curriculum=Still(), backend="cuda",
                    tasks_per_round=3, console=Console(file=out, width=200))
    with pytest.raises(PluginError) as err:
        loop.run(2)
    reason = "the expert lowers to ('triton',), not 'cuda'"
    assert "coder 'expert' declined all 6 answers on backend 'cuda'" in str(err.value)
    assert f"6 x {reason}" in str(err.value)
    printed = out.getvalue()
    assert f"round 0: declined because 3 x {reason}" in printed
    assert f"round 1: declined because 3 x {reason}" in printed
    assert "6 answers declined, never verified" in printed

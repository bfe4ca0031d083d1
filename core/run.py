"""``python -m core.run``: compose the configured plugins (Hydra) and run self-play or training.

    python -m core.run                                   # the embedded default
    python -m core.run proposer=random backend=triton    # choose plugins by group
    python -m core.run -m reward=mixed reward.weights.speedup=0.1,0.5   # sweep reward mixes
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from core.config import build, store_plugin_configs
from core.plugins import PluginError

CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")


def run_selfplay(cfg: DictConfig) -> list[dict[str, float]]:
    from core.evaluation.suites import HeldOut
    from core.loop.rewards import RewardMix
    from core.loop.selfplay import SelfPlay
    from core.verification.executor import executor_for_run

    backend_name = cfg.backend.name
    # Tasks ever used for evaluation (core.eval's registry) never reach training or self-play.
    proposer = HeldOut.load().guard(build("proposer", cfg.proposer, seed=cfg.seed))
    coder = build("coder", cfg.coder)
    curriculum = build("curriculum", cfg.curriculum)
    reward = RewardMix(**OmegaConf.to_container(cfg.reward, resolve=True))
    with executor_for_run(cfg) as verifier:
        loop = SelfPlay(proposer=proposer, coder=coder, verifier=verifier, reward=reward, curriculum=curriculum,
                        backend=backend_name, tasks_per_round=cfg.tasks_per_round,
                        samples_per_task=cfg.samples_per_task, out_dir=cfg.out_dir)
        return loop.run(cfg.rounds)


@hydra.main(version_base=None, config_path=CONF_DIR, config_name="config")
def _main(cfg: DictConfig) -> float | None:
    try:
        if cfg.trainer.name == "none":
            history = run_selfplay(cfg)
            return history[-1]["pass_rate"] if history else None
        from core.loop.training import run_training

        result = run_training(cfg)
        return (result or {}).get("pass_rate")
    except PluginError as exc:
        # Configuration mistakes: say what is wrong and what is valid, without a traceback.
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


def main() -> None:
    store_plugin_configs()
    _main()


if __name__ == "__main__":
    main()

"""``python -m core.run``: compose the configured plugins (Hydra) and run the configured trainer.

    python -m core.run                                   # the embedded default (trainer=embedded)
    python -m core.run experiment=selfplay               # self-play rounds, no learning (trainer=none)
    python -m core.run proposer=random backend=triton    # choose plugins by group
    python -m core.run -m reward=mixed reward.weights.speedup=0.1,0.5   # sweep reward mixes

``trainer.name`` selects an entry of the ``trainer`` registry (``register_trainers``; the built-ins
are in plugins/trainers.py); the self-play and training loops live in :mod:`core.loop`.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from core.cli import cannot_start
from core.config import conf_dir, store_plugin_configs
from core.loop.selfplay import run_selfplay  # noqa: F401  (re-exported: it lived here before core.loop)
from core.plugins import registry

CONF_DIR = conf_dir()


def run(cfg: DictConfig) -> float | None:
    """Run the trainer ``cfg.trainer.name``; the pass rate of its final metrics (None without any)."""
    from core.loop.console import announcing_run_dir

    trainer = registry("trainer").create(str(cfg.trainer.name))
    with announcing_run_dir(cfg.out_dir):  # where the results go, at the start and at the end
        result = trainer(cfg)
    return (result or {}).get("pass_rate")


@hydra.main(version_base=None, config_path=CONF_DIR, config_name="config")
def _main(cfg: DictConfig) -> float | None:
    from core.loop.console import quiet_console

    quiet_console(cfg.out_dir)
    # Configuration mistakes and missing packages: say what is wrong and what to do, without a traceback.
    with cannot_start():
        return run(cfg)


def main() -> None:
    store_plugin_configs()
    _main()


if __name__ == "__main__":
    main()

"""Run a small training with the test doubles of ``train_fakes`` (used by tests, also as a subprocess).

    python tests/fake_training_run.py OUT_DIR [hydra overrides...]
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT)]
os.environ.setdefault("KERNELZERO_DISABLE_AUTOLOAD", "1")

TINY_OVERRIDES = [
    "trainer=embedded", "coder=llm", "curriculum=adaptive", "trainer.report_to=[]",
    "coder.embedded.vocab_size=400", "coder.embedded.hidden_size=32", "coder.embedded.num_layers=1",
    "coder.embedded.num_heads=2", "coder.embedded.num_kv_heads=1", "coder.embedded.intermediate_size=64",
    "coder.corpus_tasks=12", "coder.max_new_tokens=16", "coder.batch_size=8",
    "trainer.eval_tasks=2", "trainer.phases.distill.steps=3", "trainer.phases.distill.tasks=6",
    "trainer.phases.distill.batch_size=4", "trainer.phases.distill.teacher=copy_teacher",
    "trainer.phases.correctness.steps=3", "trainer.save_steps=1", "trainer.tasks_per_step=2",
    "trainer.num_generations=2", "curriculum.window_attempts=1",
    # two reward terms, so each is checked to log under its own name (the default phase uses correctness only)
    "trainer.phases.correctness.reward={weights: {correctness: 1.0, format: 0.1}, failure_reward: 0.0}",
]


def compose(out_dir: str, overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf, open_dict

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = hydra_compose("config", overrides=[f"out_dir={out_dir}", f"coder.cache_dir={out_dir}/cache",
                                                 *TINY_OVERRIDES, *overrides])
    with open_dict(cfg):
        cfg.proposer = OmegaConf.create({"name": "catalog_fake"})
    return cfg


def install_fakes(*extra_plugins):
    from train_fakes import FakesPlugin

    from core import plugins

    pm = plugins.make_plugin_manager(autoload=False)
    pm.register(FakesPlugin(), name="train_fakes")
    for plugin in extra_plugins:
        pm.register(plugin)
    plugins.set_plugin_manager(pm)


def run(out_dir: str, overrides: list[str], verifier=None, extra_plugins=()):
    from train_fakes import StaticVerifier

    from core.loop.training import Training

    install_fakes(*extra_plugins)
    training = Training(compose(out_dir, overrides), verifier or StaticVerifier())
    return training, training.run()


if __name__ == "__main__":
    _, summary = run(sys.argv[1], sys.argv[2:])
    print("SUMMARY " + json.dumps(summary))

"""`python -m core.run`: the default self-play run, mistakes in the config, and reward-mix sweeps."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "core.run", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_selfplay_run_reports_a_pass_rate_from_real_interpreter_runs(tmp_path):
    proc = run("experiment=selfplay", "rounds=1", "tasks_per_round=3", "device=cpu", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rates = [float(m) for m in re.findall(r"pass rate (\d+\.\d+)", proc.stdout)]
    assert rates and rates[-1] > 0.0
    verdicts = [json.loads(line)["verdict"] for line in (tmp_path / "verdicts.jsonl").read_text().splitlines()]
    # The pass rate comes from verdicts whose correctness trials really ran kernels.
    accepted = [v for v in verdicts if v["accepted"]]
    assert accepted and all(v["checks"]["correctness"]["passed"] and v["compiled"] for v in accepted)
    assert all(v["device"] == "cpu" for v in verdicts)


@pytest.mark.slow
def test_bare_default_run_trains_and_reports_a_held_out_pass_rate(tmp_path):
    # The embedded default: tiny local model, SFT from the expert, GRPO; about 6 minutes on 2 cores.
    proc = run(f"hydra.run.dir={tmp_path}", timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    after = re.findall(r"held-out eval after training: pass rate (\d+\.\d+)", proc.stdout)
    assert after and float(after[-1]) > 0.0
    assert (tmp_path / "metrics.jsonl").exists() and list(tmp_path.glob("*.png"))


def test_unknown_group_option_lists_the_valid_backends(tmp_path):
    proc = run("backend=no_such_backend", f"hydra.run.dir={tmp_path}", timeout=120)
    assert proc.returncode != 0
    assert "triton" in proc.stderr and "no_such_backend" in proc.stderr


def test_unregistered_plugin_name_lists_the_registered_ones(tmp_path):
    proc = run("backend.name=nope", f"hydra.run.dir={tmp_path}", timeout=120)
    assert proc.returncode == 2
    assert "Unknown backend 'nope'. Known backends:" in proc.stderr and "triton" in proc.stderr


def test_misspelled_key_fails(tmp_path):
    proc = run("tasks_per_rund=2", f"hydra.run.dir={tmp_path}", timeout=120)
    assert proc.returncode != 0 and "tasks_per_rund" in proc.stderr


def test_multirun_sweeps_reward_weights(tmp_path):
    proc = run("-m", "experiment=selfplay", "reward.weights.correctness=0.1,0.5", "rounds=1", "tasks_per_round=2",
               "device=cpu",
               f"hydra.sweep.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {}
    for job in sorted(p for p in tmp_path.iterdir() if p.is_dir() and p.name.isdigit()):
        rows[job.name] = json.loads((job / "metrics.jsonl").read_text().splitlines()[0])
    assert set(rows) == {"0", "1"}
    # Same tasks and kernels in both jobs (same seed); only the weight differs, so the rewards scale.
    assert rows["0"]["pass_rate"] == rows["1"]["pass_rate"] > 0
    assert abs(rows["1"]["mean_reward"] - 5 * rows["0"]["mean_reward"]) < 1e-9


def test_unknown_trainer_name_lists_the_registered_trainers(tmp_path):
    proc = run("trainer.name=nope", f"hydra.run.dir={tmp_path}", timeout=120)
    assert proc.returncode == 2
    assert "error: Unknown trainer 'nope'. Known trainers: embedded, grpo, none" in proc.stderr


def test_every_trainer_option_in_conf_names_a_registered_trainer():
    import yaml

    from core.plugins import registry

    for path in sorted((ROOT / "conf" / "trainer").glob("*.yaml")):
        name = yaml.safe_load(path.read_text())["name"]
        assert name in registry("trainer"), f"conf/trainer/{path.name} names unregistered trainer {name!r}"


def test_core_run_runs_the_trainer_a_plugin_registers(register_plugin, tmp_path):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import open_dict

    from core import hookimpl
    from core.run import run as run_config

    seen = []

    def recording_run(cfg):
        seen.append(cfg)
        return {"pass_rate": 0.25, "rounds": 3}

    class TrainerPlugin:
        @hookimpl
        def register_trainers(self, register):
            register("recording", lambda: recording_run)

    register_plugin(TrainerPlugin(), name="trainer_plugin")
    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base=None, config_dir=str(ROOT / "conf")):
        cfg = compose("config", overrides=["trainer=none", f"out_dir={tmp_path}"])
    with open_dict(cfg):
        cfg.trainer.name = "recording"
    assert run_config(cfg) == 0.25
    assert len(seen) == 1 and seen[0].trainer.name == "recording"


def test_misspelled_experiment_exits_non_zero_with_the_presets_and_runs_nothing(tmp_path):
    # `experiment=selfply` used to run the whole default training job and exit 0.
    proc = run("experiment=selfply", f"hydra.run.dir={tmp_path}", timeout=120)
    assert proc.returncode != 0
    assert "selfply" in proc.stderr and "selfplay" in proc.stderr and "density_mcts" in proc.stderr
    assert not (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "verdicts.jsonl").exists()

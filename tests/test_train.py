"""core.loop.training: phases, shared verification for TRL reward functions, metrics, hooks, resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from fake_training_run import run  # noqa: E402
from train_fakes import KERNEL, CatalogProposer, StaticVerifier  # noqa: E402

from core import hookimpl  # noqa: E402
from core.contracts import CurriculumState  # noqa: E402
from core.loop.rewards import RewardMix  # noqa: E402
from core.loop.taskstream import TaskStream  # noqa: E402
from core.loop.training import SharedVerification, TrainingError, TrainSettings  # noqa: E402


class Observer:
    def __init__(self):
        self.steps, self.rounds, self.verdicts = [], [], 0

    @hookimpl
    def on_step_end(self, step, metrics):
        self.steps.append((step, metrics))

    @hookimpl
    def on_round_end(self, round_index, metrics):
        self.rounds.append(round_index)

    @hookimpl
    def on_verdict(self, task, candidate, verdict):
        self.verdicts += 1


@pytest.fixture(scope="module")
def fake_run(tmp_path_factory):
    from core import plugins

    old = plugins._pm
    out = tmp_path_factory.mktemp("run")
    observer = Observer()
    verifier = StaticVerifier()
    training, summary = run(str(out), ["trainer.steps_per_round=2"], verifier=verifier, extra_plugins=[observer])
    yield out, training, summary, observer, verifier
    plugins.set_plugin_manager(old)


def test_metrics_jsonl_contract(fake_run):
    out, training, summary, *_ = fake_run
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows:
        for key in ("pass_rate", "information_density", "reward/correctness", "reward/format", "pass_at_k",
                    "hack_flag_rate", "tasks/tier0"):
            assert key in r, key
        assert 0.0 <= r["information_density"] <= 1.0 and r["samples"] == 4 and r["groups"] == 2
    assert (out / "summary.png").read_bytes()[:4] == b"\x89PNG"
    assert summary["steps"] == 3 and Path(summary["metrics"]) == out / "metrics.jsonl"
    assert json.loads((out / "result.json").read_text())["pass_rate"] == summary["pass_rate"]


def test_distill_phase_trained_on_verified_teacher_pairs(fake_run):
    out, training, *_ = fake_run
    pairs = [json.loads(line) for line in (out / "distill_pairs.jsonl").read_text().splitlines()]
    assert pairs and all(p["completion"].startswith(KERNEL.rstrip()[:30]) for p in pairs)
    assert all(p["prompt"].endswith("```python\n") for p in pairs)
    losses = [json.loads(line)["loss"] for line in (out / "distill_loss.jsonl").read_text().splitlines()]
    assert len(losses) == 3
    assert (out / "models" / "distill" / "config.json").exists()
    assert json.loads((out / "train_state.json").read_text())["done"] == ["distill", "refine", "correctness", "performance",
                                                                         "more_sft"]


def test_held_out_evaluated_between_phases(fake_run):
    out, training, summary, *_ = fake_run
    # trainer=embedded sets eval_each_phase: the held-out set is scored after SFT too, not after the last phase twice
    assert set(summary["pass_rate_after_phase"]) == {"distill"}
    assert 0.0 <= summary["pass_rate_after_phase"]["distill"] <= 1.0
    progress = json.loads((out / "train_state.json").read_text())
    assert progress["eval_phases"]["distill"]["tasks"] == summary["eval_tasks"] == 2


def test_feedback_curriculum_and_hooks_fire_every_step(fake_run):
    out, training, summary, observer, verifier = fake_run
    assert training.proposer.feedbacks == 3
    decisions = [json.loads(line) for line in (out / "curriculum.jsonl").read_text().splitlines()]
    assert len(decisions) == 3 and all("decision" in d for d in decisions)
    # nothing passes with an untrained model: the rule shrinks the parameter space each step
    assert training.curriculum.state.param_scale == pytest.approx(0.7 ** 3)
    assert [s for s, _ in observer.steps] == [0, 1, 2]
    assert observer.rounds == [0, 1]  # two steps per round, the last partial round flushed
    assert observer.verdicts >= 1


def test_checkpoints_carry_proposer_and_curriculum_state(fake_run):
    out, training, *_ = fake_run
    ckpts = sorted((out / "checkpoints" / "correctness").glob("checkpoint-*"))
    assert ckpts
    state = json.loads((ckpts[-1] / "kernelzero_state.json").read_text())
    assert state["proposer"] == training.proposer.state_dict()
    assert state["curriculum"]["state"] == training.curriculum.state_dict()["state"]
    assert (ckpts[-1] / "optimizer.pt").exists()


def _shared(mix_weights, failure_reward=0.0, num_generations=2):
    proposer, verifier = CatalogProposer(seed=1), StaticVerifier()

    class Cur:
        state = CurriculumState(max_tier=1)

    stream = TaskStream(proposer, Cur(), prompt=lambda t: t.source)
    tasks = proposer.propose(2)
    for t in tasks:
        stream.remember(t)
    from plugins.coders.llm.prompts import to_candidate

    mix = RewardMix(weights=mix_weights, failure_reward=failure_reward)
    shared = SharedVerification(verifier=verifier, stream=stream, mix=mix, num_generations=num_generations,
                                to_candidate=lambda t, text: to_candidate(t, text, "triton"))
    return shared, tasks, verifier


def test_reward_functions_share_one_verification_per_completion():
    shared, tasks, verifier = _shared({"correctness": 1.0, "format": 0.1})
    good = KERNEL + "```"
    completions = [good, "garbage(", good, good]
    task_ids = [tasks[0].id, tasks[0].id, tasks[1].id, tasks[1].id]
    fns = shared.reward_functions()
    assert [f.__name__ for f in fns] == ["correctness", "format"]
    values = [f(prompts=["p"] * 4, completions=completions, completion_ids=[[1]] * 4, task_id=task_ids,
                trainer_state=None) for f in fns]
    assert values[0] == [1.0, 0.0, 1.0, 1.0] and values[1] == [1.0, 0.0, 1.0, 1.0]
    # one verify_many call, with duplicates (same task, same source) verified once
    assert verifier.batches == [3]
    attempts = shared.take()
    assert len(attempts) == 4 and [a.group for a in attempts] == [0, 0, 1, 1]
    assert attempts[0].total == pytest.approx(1.1) and attempts[1].total == 0.0


def test_rejected_candidates_earn_only_the_failure_reward():
    shared, tasks, _ = _shared({"roofline": 1.0}, failure_reward=-0.5)
    (fn,) = shared.reward_functions()
    assert fn(prompts=["p"], completions=["not python ("], task_id=[tasks[0].id]) == [-0.5]


def test_reward_function_needs_task_id_column():
    shared, tasks, _ = _shared({"correctness": 1.0})
    with pytest.raises(TrainingError, match="task_id"):
        shared.reward_functions()[0](prompts=["p"], completions=["x"])


def test_settings_report_unknown_keys_and_bad_phases():
    with pytest.raises(TrainingError, match="unknown trainer keys"):
        TrainSettings.from_config({"phases": {"a": {"kind": "sft", "steps": 1}}, "bogus": 1})
    with pytest.raises(TrainingError, match="kind must be one of"):
        TrainSettings.from_config({"phases": {"a": {"kind": "ppo", "steps": 1}}})
    with pytest.raises(TrainingError, match="empty"):
        TrainSettings.from_config({"phases": {}})
    s = TrainSettings.from_config({"phases": {"d": {"kind": "sft", "steps": 2}, "c": {"kind": "grpo", "steps": 3}}})
    assert [(p.name, p.kind, p.steps) for p in s.phases] == [("d", "sft", 2), ("c", "grpo", 3)]


@pytest.mark.parametrize("precision, expected", [("fp32", "no"), ("auto", "no"), ("bf16", "bf16")])
def test_precision_decides_the_trainers_autocast_on_cpu(tmp_path, precision, expected):
    """TRL's configs default to bf16 autocast even on a CPU, where it is emulated (7-10x slower here):
    the run's ``trainer.precision`` decides instead, and ``auto`` trains a CPU run in fp32."""
    from types import SimpleNamespace

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM, Trainer
    from trl import GRPOConfig, SFTConfig

    from core.loop.phase_common import common_args

    settings = TrainSettings.from_config({"phases": {"d": {"kind": "sft", "steps": 2}}, "precision": precision,
                                          "report_to": []})
    training = SimpleNamespace(settings=settings, out=tmp_path, device="cpu", seed=0)
    args = common_args(training, settings.phases[0])
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2))
    for config in (SFTConfig(**args), GRPOConfig(**args)):
        accelerator = Trainer(model=model, args=config).accelerator
        assert accelerator.mixed_precision == expected
        with accelerator.autocast():
            product = torch.ones(2, 2) @ torch.ones(2, 2)
        assert product.dtype == (torch.bfloat16 if expected == "bf16" else torch.float32)
    with pytest.raises(TrainingError, match="precision must be one of"):
        TrainSettings.from_config({"phases": {"d": {"kind": "sft", "steps": 2}}, "precision": "fp8"})


def test_training_a_non_llm_coder_fails_with_advice(tmp_path):
    from fake_training_run import compose, install_fakes
    from omegaconf import OmegaConf, open_dict

    from core import plugins
    from core.loop.training import Training

    old = plugins._pm
    install_fakes()
    try:
        cfg = compose(str(tmp_path), [])
        with open_dict(cfg):
            cfg.coder = OmegaConf.create({"name": "copy_teacher"})
        with pytest.raises(TrainingError, match="coder=llm"):
            Training(cfg, StaticVerifier())
    finally:
        plugins.set_plugin_manager(old)


@pytest.mark.slow
def test_killed_run_resumes_from_last_checkpoint(tmp_path):
    """Kill a training subprocess after a GRPO checkpoint, rerun on the same dir, check continuity."""
    out = tmp_path / "run"
    cmd = [sys.executable, str(HERE / "fake_training_run.py"), str(out), "trainer.phases.correctness.steps=6"]
    env = {**os.environ, "KZ_FAKE_VERIFY_DELAY": "0.4"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=HERE.parent)
    deadline = time.time() + 120
    ckpt_dir = out / "checkpoints" / "correctness"
    while time.time() < deadline and proc.poll() is None:
        if any((c / "kernelzero_state.json").exists() for c in ckpt_dir.glob("checkpoint-*")):
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed: " + proc.stdout.read().decode()[-2000:]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(killed_at) < 6
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=HERE.parent, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "resuming phase correctness from" in done.stdout
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(6))
    final = sorted(ckpt_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))[-1]
    state = json.loads((final / "kernelzero_state.json").read_text())
    assert state["global_step"] == 6
    # the proposer continued from its saved state: one feedback per step across both processes
    assert state["proposer"]["feedbacks"] == 6
    # the phase's steps are those of both processes (its seconds: tests/test_phase_clock.py)
    progress = json.loads((out / "train_state.json").read_text())
    assert progress["steps_done"]["correctness"] == 6


class AcceptEverything(StaticVerifier):
    """Accepts every completion, so a self-imitating phase has successes to replay."""

    def verify_many(self, pairs):
        verdicts = super().verify_many(pairs)
        for v in verdicts:
            v.compiled = v.correct = v.accepted = True
            v.accuracy = 1.0
        return verdicts


def test_self_imitation_replays_the_phases_accepted_completions(tmp_path, capsys):
    import re

    from core import plugins

    old = plugins._pm
    try:
        run(str(tmp_path), ["trainer.phases.correctness.self_imitation=true", "trainer.phases.more_sft.steps=0"],
            verifier=AcceptEverything())
    finally:
        plugins.set_plugin_manager(old)
    line = re.search(r"self-imitation replayed (\d+) accepted\s+completions beside (\d+) teacher", capsys.readouterr().out)
    assert line, "the phase reports what it self-imitated"
    # 3 steps x 2 tasks x 2 samples, all accepted; identical completions of one prompt join once
    assert 1 <= int(line.group(1)) <= 12 and int(line.group(2)) > 0

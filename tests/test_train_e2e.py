"""End to end through the real stack: random proposer, expert teacher, sandboxed verifier, tiny LLM,
TRL SFT then a few GRPO steps, driven by ``python -m core.run`` exactly as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TINY = [
    "trainer=embedded", "coder=llm", "curriculum=adaptive", "trainer.report_to=[tensorboard]",
    "coder.embedded.vocab_size=512", "coder.embedded.hidden_size=32", "coder.embedded.num_layers=1",
    "coder.embedded.num_heads=2", "coder.embedded.num_kv_heads=1", "coder.embedded.intermediate_size=64",
    "coder.corpus_tasks=8", "coder.max_new_tokens=24", "trainer.eval_tasks=2",
    "trainer.phases.distill.steps=2", "trainer.phases.distill.tasks=3", "trainer.phases.distill.batch_size=2", "trainer.phases.distill.max_length=2048",
    "trainer.phases.correctness.steps=2", "trainer.tasks_per_step=2", "trainer.num_generations=2",
    "trainer.save_steps=1", "trainer.phases.more_sft.steps=3",
    # two reward terms, so each is checked to log under its own name (the default phase uses correctness only)
    "trainer.phases.correctness.reward={weights: {correctness: 1.0, format: 0.1}, failure_reward: 0.0}",
]


def test_core_run_trains_a_tiny_model_through_the_full_stack(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "KERNELZERO_CACHE": str(tmp_path / "cache"), "TRITON_INTERPRET": "1"}
    cmd = [sys.executable, "-m", "core.run", *TINY, f"hydra.run.dir={out}"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    for r in rows:
        assert {"pass_rate", "information_density", "reward/correctness", "reward/format"} <= set(r)
        assert r["samples"] == 4
    assert any(out.glob("*.png"))
    # the teacher's kernels passed the real verifier and became the distillation set
    pairs = (out / "distill_pairs.jsonl").read_text().splitlines()
    assert pairs and all("ModelNew" in json.loads(p)["completion"] for p in pairs)
    # TRL logged each reward term under its own name to TensorBoard
    assert list((out / "checkpoints" / "correctness").rglob("events.out.tfevents*"))
    result = json.loads((out / "result.json").read_text())
    assert 0.0 <= result["pass_rate"] <= 1.0 and result["steps"] == 2
    # the final table: before, after SFT, after GRPO and the control arm (more SFT for GRPO's wall clock)
    assert "held-out pass rate (greedy" in proc.stdout and "control more_sft" in proc.stdout
    assert set(result["pass_rate_control"]) == {"more_sft"}
    # a clean screen: library warnings and checkpoint progress bars went to the run's log file
    screen = proc.stdout + proc.stderr
    assert "FutureWarning" not in screen and "Writing model shards" not in screen
    assert "FutureWarning" in (out / "run.log").read_text()


def _gpu_measure_overrides(name: str) -> tuple[str, ...]:
    from gpu_measure_script import load

    return getattr(load(), name)


def test_the_hub_preset_runs_through_the_full_stack_with_its_step_time_breakdown(tmp_path):
    # The GPU measurement's command (scripts/gpu_measure.py hub_grpo: experiment=hub_grpo, Qwen2.5-Coder-1.5B's
    # architecture) with tiny overrides after it (the last value of a key wins): the sandboxed verifier's pools judge
    # each step's share of a generation round from the overlap's thread, and the run logs and prints where each
    # step's time went.
    arch = tmp_path / "tiny-qwen2.json"
    arch.write_text(json.dumps({"model_type": "qwen2", "hidden_size": 32, "intermediate_size": 64,
                                "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
                                "max_position_embeddings": 4096, "tie_word_embeddings": True}))
    out = tmp_path / "run"
    env = {**os.environ, "KERNELZERO_CACHE": str(tmp_path / "cache"), "TRITON_INTERPRET": "1"}
    cmd = [sys.executable, "-m", "core.run", *_gpu_measure_overrides("_HUB_GRPO"),
           f"coder.embedded.architecture={arch}", "device=cpu", "trainer.precision=fp32", "trainer.torch_threads=1",
           "coder.embedded.vocab_size=512", "coder.corpus_tasks=8", "coder.max_new_tokens=24",
           "coder.include_guide=false", "coder.compact_prompt=true",
           "trainer.phases.distill.steps=2", "trainer.phases.distill.tasks=3", "trainer.phases.distill.batch_size=2",
           "trainer.phases.distill.max_length=2048", "trainer.phases.distill.learning_rate=1e-3",
           "trainer.phases.correctness.steps=4", "trainer.tasks_per_step=2",
           "trainer.num_generations=2", "trainer.grpo_kwargs.steps_per_generation=2", f"hydra.run.dir={out}"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3] and all(r["samples"] == 4 for r in rows)
    for i, r in enumerate(rows):
        parts = r["time/generate_s"] + r["time/wait_s"] + r["time/optimize_s"] + r["time/other_s"]
        assert abs(parts - r["time/step_s"]) <= 1e-6 * r["time/step_s"] and r["memory/peak_rss_gib"] > 0
        assert (r["time/verify_s"] > 0) == (r["throughput/verdicts"] > 0)
        assert (r["time/generate_s"] > 0) == (i % 2 == 0)  # a round of two steps is generated in its first
    verdicts = sum(r["throughput/verdicts"] for r in rows)
    assert 0 < verdicts <= 16  # at most one verdict per completion (declined ones are not verified)
    result = json.loads((out / "result.json").read_text())
    assert result["step_time"]["correctness"]["overlap_verification"] == 1.0
    assert "correctness step time: 4 steps, mean step" in proc.stdout

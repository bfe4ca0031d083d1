"""Probe (the scratch script behind grpo_probes.json's warm_start_probes): greedy pass@1, then sampled
pass@1 and pass@k of a model directory on the default run's 64 held-out tasks (seed 0).

    python docs/results/cpu-2026-12-01/training/probes/probe.py MODEL_DIR K [hydra overrides, e.g. coder.temperature=0.6]
"""
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[5]
sys.path.insert(0, str(ROOT))
from hydra import compose, initialize_config_dir
from core.config import store_plugin_configs
from core.loop.training import Training, make_verifier
from core.loop.attempts import attempt

model_dir, k = sys.argv[1], int(sys.argv[2])
store_plugin_configs()
with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
    cfg = compose("config", overrides=[f"out_dir=/tmp/kzl/probe_out", f"coder.model={model_dir}", "trainer.eval_tasks=64"] + sys.argv[3:])
with make_verifier(cfg) as verifier:
    t = Training(cfg, verifier)
    t.coder.load()
    tasks = t._held_out_tasks()
    t0 = time.time()
    greedy = attempt(t.coder, tasks, verifier, t.backend)
    g = sum(v.accepted for v in greedy.verdicts) / len(tasks)
    t.coder.greedy = False
    s = attempt(t.coder, tasks, verifier, t.backend, samples=k)
    per_task = {}
    for task, cand, v in s.outcomes():
        per_task.setdefault(task.id, []).append(bool(v and v.accepted))
    p1 = sum(sum(x) / len(x) for x in per_task.values()) / len(per_task)
    pk = sum(any(x) for x in per_task.values()) / len(per_task)
    print(json.dumps({"model": model_dir, "greedy_pass1": g, "sampled_pass1": p1, f"pass@{k}": pk, "sec": time.time() - t0}))

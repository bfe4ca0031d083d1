"""GRPO on the same 4 training tasks every step: does the training reward on them go up?"""
import sys, json
sys.path.insert(0, "/work/wt/learn2")
from hydra import compose, initialize_config_dir
from core.config import store_plugin_configs
from core.loop.training import Training, make_verifier
from core.loop.grpo import run_grpo
out, lr = sys.argv[1], sys.argv[2]
store_plugin_configs()
with initialize_config_dir(config_dir="/work/wt/learn2/conf", version_base=None):
    cfg = compose("config", overrides=[f"out_dir={out}", "coder.model=/tmp/kzl/s400/models/distill", "coder.max_new_tokens=192",
        "trainer.resume=never", "curriculum=fixed", "curriculum.max_tier=0", "+trainer.grpo_kwargs.lr_scheduler_type=constant",
        f"trainer.phases.correctness.learning_rate={lr}", "trainer.phases.correctness.steps=12", "trainer.eval_tasks=0"] + sys.argv[3:])
with make_verifier(cfg) as verifier:
    t = Training(cfg, verifier)
    t.coder.load()
    # 4 tasks with mixed groups: pick from the first 40 training tasks those whose 8 samples are mixed
    from core.loop.attempts import attempt
    cands = t.proposer.propose(40, t.curriculum.state)
    t.coder.greedy = False; t.coder.temperature = 0.6
    a = attempt(t.coder, cands, verifier, t.backend, samples=8)
    rates = a.solve_rates()
    mixed = [x for x in cands if 0 < rates.get(x.id, 0) < 1][:4]
    print("solve rates of chosen", [round(rates[x.id], 2) for x in mixed], flush=True)
    t.coder.greedy = True
    t.proposer.propose = lambda n, state=None: list(mixed)
    phase = next(p for p in t.settings.phases if p.name == "correctness")
    run_grpo(t, phase, set())
    rows = [json.loads(l) for l in open(f"{out}/metrics.jsonl")]
    print("accept per step", [round(r["accept_rate"], 2) for r in rows])

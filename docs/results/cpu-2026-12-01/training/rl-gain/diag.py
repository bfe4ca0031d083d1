"""Held-out failure diagnosis: greedy answers of MODEL on the default run's held-out tasks (seed S)."""
import json, sys, time, re, collections
from pathlib import Path
ROOT = Path("/work/wt/learn2")
sys.path.insert(0, str(ROOT))
from hydra import compose, initialize_config_dir
from core.config import store_plugin_configs
from core.loop.training import Training, make_verifier
from core.loop.attempts import attempt

model_dir, out = sys.argv[1], sys.argv[2]
store_plugin_configs()
with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
    cfg = compose("config", overrides=[f"out_dir=/tmp/kzl2/diag_out", f"coder.model={model_dir}", "trainer.eval_tasks=64"] + sys.argv[3:])
with make_verifier(cfg) as verifier:
    t = Training(cfg, verifier)
    t.coder.load()
    tasks = t._held_out_tasks()
    t0 = time.time()
    res = attempt(t.coder, tasks, verifier, t.backend)
    rows = []
    for task, cand, v in res.outcomes():
        op = re.search(r'"""(.*?)"""', task.source).group(1)
        rows.append(dict(op=op, accepted=bool(v and v.accepted), reason=(v.reason if v else "declined"),
                         compiled=bool(v and v.compiled), source=task.source, code=cand.source))
    json.dump(rows, open(out, "w"), indent=1)
    print("pass", sum(r["accepted"] for r in rows) / len(rows), "sec", time.time() - t0)
    c = collections.Counter((r["reason"] or "")[:90] for r in rows if not r["accepted"])
    for k, n in c.most_common(): print(n, k)

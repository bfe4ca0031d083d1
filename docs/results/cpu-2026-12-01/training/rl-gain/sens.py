import sys, time, torch
sys.path.insert(0, "/work/wt/learn2")
from hydra import compose, initialize_config_dir
from core.config import store_plugin_configs
from core.loop.training import Training, make_verifier
from core.loop.attempts import attempt
torch.set_num_threads(1)
store_plugin_configs()
with initialize_config_dir(config_dir="/work/wt/learn2/conf", version_base=None):
    cfg = compose("config", overrides=["out_dir=/tmp/kzl2/gt_out", "coder.model=/tmp/kzl/s400/models/distill", "trainer.eval_tasks=64", "coder.max_new_tokens=192"])
with make_verifier(cfg) as verifier:
    t = Training(cfg, verifier)
    m = t.coder.hf_model
    base = {n: p.detach().clone() for n, p in m.named_parameters()}
    print("param abs mean", sum(p.abs().sum().item() for p in base.values()) / sum(p.numel() for p in base.values()))
    tasks = t._held_out_tasks()
    g = torch.Generator().manual_seed(0)
    for eps in [0, 1e-4, 3e-4, 1e-3]:
        with torch.no_grad():
            for n, p in m.named_parameters():
                p.copy_(base[n] + eps * torch.sign(torch.randn(p.shape, generator=g)))
        a = attempt(t.coder, tasks, verifier, t.backend)
        print("eps", eps, "held-out greedy", sum(v.accepted for v in a.verdicts) / len(tasks), flush=True)

"""One-shot verification: the wall clock of one ``python -m core.verify`` call for one small pair,
from process start to exit (interpreter, imports, sandbox, worker start, CUDA context, compile,
checks, timing), as a KernelBench user pays it. Issue 19's target is 10 s or less on the GPU.

    python -m benchmarks.one_shot_verify --kernelbench .kb --device cuda --out one_shot.json

Each pair runs twice: ``cold`` with empty Triton and torch-extension caches (a fresh machine), then
``warm`` with the caches the first run left (a user's second call). The pairs are KernelBench's own
example solutions, unchanged: the Triton one and the ``load_inline`` CUDA one, each against
KernelBench's example reference. The table prints last; the JSON has every verdict.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROMPTS = Path("src/kernelbench/prompts")
# (name, reference, candidate, backend): KernelBench's examples, paths relative to its checkout
PAIRS = {
    "kb_example_add_triton": (PROMPTS / "model_ex_add.py", PROMPTS / "model_new_ex_add_triton.py", "triton"),
    "kb_example_add_load_inline": (PROMPTS / "model_ex_add.py", PROMPTS / "model_new_ex_add.py", "cuda_inline"),
    # ours: a device-agnostic small pair (the red team's honest control), paths relative to this repository
    "redteam_vector_add": (REPO / "tests/redteam/tasks/vector_add.py",
                           REPO / "tests/redteam/candidates/honest_vector_add.py", "triton"),
}
TARGET_S = 10.0


def one_call(kb: Path, reference: Path, candidate: Path, backend: str, device: str, caches: Path,
             timeout_s: float, checks: str | None) -> dict:
    env = {**os.environ, "TRITON_CACHE_DIR": str(caches / "triton"),
           "TORCH_EXTENSIONS_DIR": str(caches / "torch_extensions"),
           "PYTHONPATH": os.pathsep.join(x for x in (str(REPO), os.environ.get("PYTHONPATH")) if x)}
    argv = [sys.executable, "-m", "core.verify", "--reference", str(kb / reference), "--candidate",
            str(kb / candidate), "--backend", backend, "--device", device, "--json",
            *(["--checks", checks] if checks else [])]
    started = time.perf_counter()
    try:
        proc = subprocess.run(argv, cwd=REPO, env=env, text=True, capture_output=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"wall_s": round(time.perf_counter() - started, 2), "status": "timeout", "reason": f"over {timeout_s} s"}
    wall = round(time.perf_counter() - started, 2)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"wall_s": wall, "status": f"exit {proc.returncode}", "reason": (proc.stderr or proc.stdout)[-600:]}
    verdict = json.loads(lines[-1])
    return {"wall_s": wall, "status": verdict["status"], "accepted": verdict["accepted"],
            "verdict_s": verdict.get("elapsed_s"), "reason": verdict.get("reason"),
            "warm_up": verdict.get("warm_up"), "stage_s": verdict.get("stage_s"), "gpu_wait_s": verdict.get("gpu_wait_s"),
            "checks": {k: c["passed"] for k, c in verdict["checks"].items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernelbench", type=Path, required=True, help="a KernelBench checkout")
    parser.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per call")
    parser.add_argument("--out", type=Path, default=Path("one_shot_verify.json"))
    parser.add_argument("--pairs", default=",".join(PAIRS), help=f"comma-separated, of: {', '.join(PAIRS)}")
    parser.add_argument("--checks", default=None, help="core.verify --checks (default: every check that applies)")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="kz-one-shot-") as tmp:
        for name in args.pairs.split(","):
            ref, cand, backend = PAIRS[name]
            caches = Path(tmp) / name  # empty for the cold call, filled by it for the warm one
            for run in ("cold", "warm"):
                row = {"pair": name, "backend": backend, "run": run, "checks": args.checks or "all",
                       **one_call(args.kernelbench, ref, cand, backend, args.device, caches, args.timeout, args.checks)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"device": args.device, "target_s": TARGET_S, "checks": args.checks, "rows": rows},
                                   indent=1))
    print(f"\n{'pair':30} {'backend':12} {'run':5} {'wall s':>7} {'verdict s':>9}  status")
    for r in rows:
        verdict_s = r.get("verdict_s")
        print(f"{r['pair']:30} {r['backend']:12} {r['run']:5} {r['wall_s']:7.2f} "
              f"{'-' if verdict_s is None else f'{verdict_s:.2f}':>9}  {r['status']} {(r.get('reason') or '')[:60]}")
    within = [r for r in rows if r.get("accepted") and r["wall_s"] <= TARGET_S]
    print(f"one-shot: {len(within)}/{len(rows)} calls accepted within {TARGET_S:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

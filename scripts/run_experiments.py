"""Run the published-claim experiments and print a table.

1. Information density with proposer=mcts against proposer=random (claim: 2.3x), same coder and budget.
2. Steps to a pass-rate threshold with the adaptive curriculum against the fixed one (claim: 40% fewer).

Each run is ``python -m core.run experiment=<preset>`` in its own process (Hydra multirun would share
one process, and with it CUDA state), with its own output directory. Every run of a comparison gets
the same seed(s), coder, trainer and step budget; ``--model DIR`` starts every run from one already
distilled model (skipping the distill phase), so the budget goes to self-play.

    python scripts/run_experiments.py --out runs/experiments --seeds 0 1 --steps 12
    python scripts/run_experiments.py --model outputs/<run>/models/distill --steps 20 -- trainer.tasks_per_step=4
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from statistics import mean

ROOT = Path(__file__).resolve().parent.parent
DENSITY = ("density_random", "density_mcts")
CURRICULUM = ("curriculum_fixed", "curriculum_adaptive")


def run_one(preset: str, seed: int, out: Path, steps: int, model: str | None, extra: list[str]) -> Path:
    run_dir = out / f"{preset}-seed{seed}"
    if (run_dir / "result.json").exists():
        return run_dir  # already done (the script resumes a partly finished sweep)
    cmd = [sys.executable, "-m", "core.run", f"experiment={preset}", f"seed={seed}",
           f"trainer.phases.correctness.steps={steps}", f"hydra.run.dir={run_dir}"]
    if model:
        cmd += [f"coder.model={model}", "trainer.phases.distill.steps=0"]
    cmd += extra
    t0 = time.perf_counter()
    print(f"[{preset} seed {seed}] {' '.join(cmd[3:])}", flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    (out / f"{preset}-seed{seed}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"{preset} seed {seed} failed (exit {proc.returncode}); log: {out / f'{preset}-seed{seed}.log'}\n"
                         + proc.stderr[-2000:])
    print(f"[{preset} seed {seed}] done in {time.perf_counter() - t0:.0f}s", flush=True)
    return run_dir


def rows_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def steps_to_threshold(rows: list[dict], threshold: float, window: int) -> int | None:
    """First step after which the mean pass rate over ``window`` steps reaches ``threshold``."""
    rates = [r["pass_rate"] for r in rows]
    for i in range(window - 1, len(rates)):
        if mean(rates[i - window + 1:i + 1]) >= threshold:
            return rows[i]["step"] - rows[0]["step"] + 1
    return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "experiments")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--steps", type=int, default=12, help="GRPO steps per run")
    parser.add_argument("--threshold", type=float, default=0.25, help="pass-rate threshold (steps-to-threshold)")
    parser.add_argument("--window", type=int, default=3, help="steps averaged for the threshold test")
    parser.add_argument("--model", default=None, help="start every run from this distilled model directory")
    parser.add_argument("--only", choices=("density", "curriculum"), default=None)
    parser.add_argument("extra", nargs="*", help="Hydra overrides added to every run (after --)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    from rich.console import Console
    from rich.table import Table

    console = Console(width=160)
    summary: dict = {"density": {}, "curriculum": {}, "steps": args.steps, "seeds": args.seeds,
                     "threshold": args.threshold, "window": args.window}
    if args.only in (None, "density"):
        for preset in DENSITY:
            runs = [rows_of(run_one(preset, s, args.out, args.steps, args.model, args.extra)) for s in args.seeds]
            summary["density"][preset] = {
                "information_density": mean(mean(r["information_density"] for r in rows) for rows in runs),
                "pass_rate": mean(mean(r["pass_rate"] for r in rows) for rows in runs),
                "groups": sum(sum(r["groups"] for r in rows) for rows in runs),
            }
    if args.only in (None, "curriculum"):
        for preset in CURRICULUM:
            runs = [rows_of(run_one(preset, s, args.out, args.steps, args.model, args.extra)) for s in args.seeds]
            hits = [steps_to_threshold(rows, args.threshold, args.window) for rows in runs]
            summary["curriculum"][preset] = {
                "steps_to_threshold": hits,
                "reached": sum(h is not None for h in hits),
                "pass_rate": mean(mean(r["pass_rate"] for r in rows) for rows in runs),
                "final_param_scale": mean(rows[-1].get("curriculum/param_scale", 1.0) for rows in runs),
            }

    table = Table(title=f"KernelZero experiments ({args.steps} GRPO steps x {len(args.seeds)} seed(s))")
    for col in ("experiment", "run", "metric", "value", "ratio", "published claim"):
        table.add_column(col)
    d = summary["density"]
    if d:
        base = d["density_random"]["information_density"]
        for preset, res in d.items():
            if preset == "density_random":
                ratio_text = "1.00"
            elif base:
                ratio_text = f"{res['information_density'] / base:.2f}x"
            else:
                ratio_text = "n/a (random's density is 0)"
            table.add_row("information density", preset, "mean share of groups with reward spread",
                          f"{res['information_density']:.3f} (pass {res['pass_rate']:.3f}, {res['groups']} groups)",
                          ratio_text,
                          "" if preset == "density_random" else "2.3x")
    c = summary["curriculum"]
    if c:
        for preset, res in c.items():
            hits = [h for h in res["steps_to_threshold"] if h is not None]
            value = f"{mean(hits):.1f} steps" if hits else f"not reached in {args.steps}"
            table.add_row("steps to threshold", preset,
                          f"pass rate >= {args.threshold} over {args.window} steps",
                          f"{value} ({res['reached']}/{len(args.seeds)} seeds; mean pass {res['pass_rate']:.3f})",
                          "", "" if preset == "curriculum_fixed" else "40% fewer")
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    console.print(table)


if __name__ == "__main__":
    main()

"""Run the published-claim experiments with several seeds per arm; print tables with 95% bootstrap intervals.

- ``selfplay``: the default run (``make run``) per seed: held-out pass rate after the SFT warm
  start, after GRPO self-play, and of its control arm (the same wall clock spent on more SFT).
- ``density``: information density with proposer=mcts against proposer=random at matched steps (claim: 2.3x),
  and with proposer=replay (prioritized task replay) against the same random arm.
- ``curriculum``: GRPO steps to a pass-rate threshold, adaptive against fixed curriculum (claim: 40% fewer).

Each run is ``python -m core.run`` in its own process (Hydra multirun would share one process, and
with it CUDA state) with its own output directory; a finished run (``result.json``) is not rerun, so
an interrupted sweep resumes. Every arm of a comparison gets the same seeds, coder, trainer and step
budget; ``--model DIR`` starts the density and curriculum runs from one distilled model (skipping
their distill phase), so their budget goes to self-play. Analysis: :mod:`core.loop.experiments`.

    python scripts/run_experiments.py --only selfplay --seeds 0 1 2
    python scripts/run_experiments.py --only density curriculum --seeds 0 1 2 --steps 24 --model runs/x/models/distill
    python scripts/run_experiments.py --jobs 12 ...   # on a many-core host: runs side by side
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from core.loop.experiments import (
    CURRICULUM,
    DENSITY,
    SELFPLAY,
    curriculum_summary,
    density_summary,
    finished,
    launch,
    markdown_table,
    plot_experiments,
    run_parallel,
    selfplay_summary,
    table_rows,
)

EXPERIMENTS = (SELFPLAY, "density", "curriculum")


def run_one(preset: str | None, seed: int, out: Path, overrides: list[str]) -> Path:
    """One ``python -m core.run`` (``experiment=<preset>`` unless None) in ``out/<name>-seed<seed>``."""
    name = preset or SELFPLAY
    run_dir = out / f"{name}-seed{seed}"
    if finished(run_dir):
        return run_dir
    args = [*([f"experiment={preset}"] if preset else []), f"seed={seed}", *overrides]
    t0 = time.perf_counter()
    print(f"[{name} seed {seed}] {' '.join(args)}", flush=True)
    log = out / f"{name}-seed{seed}.log"
    status = launch(run_dir, args, log)
    if status != "ok":
        raise SystemExit(f"{name} seed {seed} failed ({status}); log: {log}\n" + log.read_text()[-2000:])
    print(f"[{name} seed {seed}] done in {time.perf_counter() - t0:.0f}s", flush=True)
    return run_dir


def run_all(work: list[tuple[str | None, int, list[str]]], out: Path, jobs: int) -> list[Path]:
    """``run_one`` for each (preset, seed, overrides), ``jobs`` at a time; directories in the order given."""
    return run_parallel(lambda w: run_one(w[0], w[1], out, w[2]), work, jobs)


def arm_overrides(args: argparse.Namespace) -> list[str]:
    """Overrides of the density and curriculum runs: the step budget, the shared start model, the extras."""
    extra = [f"trainer.phases.correctness.steps={args.steps}", "trainer.phases.more_sft.steps=0"]
    if args.model:
        extra += [f"coder.model={args.model}", "trainer.phases.distill.steps=0", *replay_of(Path(args.model))]
    return extra + list(args.extra)


def replay_of(model: Path) -> list[str]:
    """A run that starts from ``<run>/models/distill`` replays ``<run>``'s verified pairs (the GRPO loss of
    conf/trainer/embedded.yaml), or none when that run left none."""
    pairs = model.parent.parent / "distill_pairs.jsonl"
    if pairs.exists():
        return [f"trainer.phases.correctness.replay_dataset={pairs.resolve()}"]
    print(f"note: {pairs} does not exist: the runs from {model} replay no pairs (replay_weight=0)", flush=True)
    return ["trainer.phases.correctness.replay_weight=0"]


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "experiments")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--only", nargs="+", choices=EXPERIMENTS, default=list(EXPERIMENTS))
    parser.add_argument("--steps", type=int, default=24, help="GRPO steps per density/curriculum run")
    parser.add_argument("--threshold", type=float, default=0.5, help="pass-rate threshold (curriculum)")
    parser.add_argument("--window", type=int, default=4, help="steps averaged for the threshold test")
    parser.add_argument("--model", default=None, help="density/curriculum runs start from this distilled model")
    parser.add_argument("--selfplay-overrides", nargs="*", default=[], help="Hydra overrides of the selfplay runs only")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (each is its own process)")
    parser.add_argument("extra", nargs="*", help="Hydra overrides of the density/curriculum runs (after --)")
    args = parser.parse_args(argv)
    if len(args.seeds) < 2:
        parser.error("intervals need at least 2 seeds per arm (3 or more recommended)")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    summary: dict = {"seeds": args.seeds, "steps": args.steps, "command": sys.argv}
    if SELFPLAY in args.only:
        dirs = run_all([(None, s, list(args.selfplay_overrides)) for s in args.seeds], args.out, args.jobs)
        summary[SELFPLAY] = selfplay_summary(dirs)
    # Both experiments' arms go in one batch of runs, so --jobs can cover all of them at once.
    presets = [p for name, arm in (("density", DENSITY), ("curriculum", CURRICULUM)) if name in args.only for p in arm]
    work = [(p, s, arm_overrides(args)) for p in presets for s in args.seeds]
    arm_dirs = dict(zip([(p, s) for p, s, _ in work], run_all(work, args.out, args.jobs)))
    if "density" in args.only:
        summary["density"] = density_summary({p: [arm_dirs[p, s] for s in args.seeds] for p in DENSITY})
    if "curriculum" in args.only:
        arms = {p: [arm_dirs[p, s] for s in args.seeds] for p in CURRICULUM}
        summary["curriculum"] = curriculum_summary(arms, args.threshold, args.window, args.steps)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    (args.out / "summary.md").write_text(markdown_table(summary))
    plot = plot_experiments(summary, args.out / "experiments.png")

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"KernelZero experiments: {len(args.seeds)} seeds per arm, mean [95% bootstrap interval]")
    for col in ("experiment", "arm", "mean [95% CI]", "per seed", "published claim"):
        table.add_column(col)
    for row in table_rows(summary):
        table.add_row(*row)
    Console(width=170).print(table)
    print(f"summary: {args.out / 'summary.json'}; figure: {plot}")
    return summary


if __name__ == "__main__":
    main()

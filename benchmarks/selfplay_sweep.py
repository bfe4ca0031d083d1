"""Compare recipes of the default self-play job side by side: each variant x seed is one ``python -m core.run``.

A variant is a name and Hydra overrides on top of the default job (``make run``). Runs go in parallel
(``--jobs``), each in its own process and output directory, with a wall-clock limit; a finished run
(its ``result.json``, written last) is not rerun. The table gives, per variant, the held-out
pass rate after the SFT warm start, after GRPO and of the control arm (mean of the seeds), the RL gain
over SFT with its two-stage bootstrap 95% interval, and each run's wall clock. Runs that failed or ran
out of time are listed, not averaged.

    python -m benchmarks.selfplay_sweep --seeds 0 1 --jobs 6 \
        --variant default= \
        --variant small_sft="trainer.phases.distill.tasks=48 trainer.phases.distill.steps=200"

Variants can also come from a JSON file (``--variants FILE``: ``{"name": ["override", ...]}``).

``--warm-starts DIR`` screens the GRPO recipe alone: seed S starts from ``DIR/seedS/models/distill`` (a
finished run's SFT model, e.g. a copy of ``runs/x``) and skips the SFT phase; ``DIR/seedS/distill_pairs.jsonl``
becomes the run's own cached distill pairs, which GRPO replays and the control arm (``--control``) trains
on, as in a whole run; ``DIR/seedS/train_state.json``, when kept, gives the SFT pace the control schedules
its learning rate by (``pace_s``). That model's held-out pass rate is the "after SFT" column.
Every run is forced to ``device=cpu`` unless the variant names a device, so a sweep on a GPU host
measures the CPU job on its cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from core.loop.experiments import finished, gain_points, launch, run_parallel, selfplay_summary

ROOT = Path(__file__).resolve().parent.parent


def parse_variant(text: str) -> tuple[str, list[str]]:
    name, sep, overrides = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"a variant is NAME=OVERRIDES (overrides may be empty), not {text!r}")
    return name, shlex.split(overrides)


def warm_start(warm_starts: Path, seed: int) -> tuple[Path, Path]:
    """Seed ``seed``'s SFT model and its verified pairs in ``warm_starts``."""
    seed_dir = (warm_starts / f"seed{seed}").resolve()
    model, pairs = seed_dir / "models" / "distill", seed_dir / "distill_pairs.jsonl"
    for path in (model, pairs):
        if not path.exists():
            raise FileNotFoundError(f"--warm-starts: {path} does not exist")
    return model, pairs


def start_warm(run_dir: Path, warm_starts: Path, seed: int, controls: Sequence[str]) -> list[str]:
    """Lay out ``run_dir`` as a run whose distill phase is done: its pairs cached for replay and for the
    control arms (the pairs a whole run's controls copy from its distill phase); the overrides to use."""
    model, pairs = warm_start(warm_starts, seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    for name in ("distill", *controls):
        shutil.copyfile(pairs, run_dir / f"{name}_pairs.jsonl")
    overrides = [f"coder.model={model}", "trainer.phases.distill.steps=0"]
    pace = warm_pace(warm_starts, seed)
    if pace is not None:  # the controls' schedule spans their budget, as in a whole run
        # ++: a control phase from a variant or another trainer file may not declare pace_s
        overrides += [f"++trainer.phases.{name}.pace_s={pace:.6g}" for name in controls]
    return overrides


def warm_pace(warm_starts: Path, seed: int) -> float | None:
    """Seconds per SFT step of the run that made seed ``seed``'s warm start (its ``train_state.json``), if kept."""
    state = warm_starts / f"seed{seed}" / "train_state.json"
    if not state.exists():
        return None
    pace = json.loads(state.read_text()).get("seconds_per_step", {}).get("distill")
    return float(pace) if pace else None


def run_one(name: str, overrides: list[str], seed: int, out: Path, limit_s: float,
            warm_starts: Path | None = None, controls: Sequence[str] = ("more_sft",)) -> dict:
    run_dir = out / f"{name}-seed{seed}"
    record = {"variant": name, "seed": seed, "dir": str(run_dir)}
    if finished(run_dir):
        return {**record, "status": "done earlier", "seconds": None}
    if warm_starts is not None:
        overrides = [*start_warm(run_dir, warm_starts, seed, controls), *overrides]
    device = [] if any(o.startswith("device=") for o in overrides) else ["device=cpu"]
    t0 = time.perf_counter()
    status = launch(run_dir, [f"seed={seed}", *device, *overrides], out / f"{name}-seed{seed}.log", limit_s)
    seconds = time.perf_counter() - t0
    print(f"[{name} seed {seed}] {status} in {seconds:.0f} s", flush=True)
    return {**record, "status": status if finished(run_dir) or status != "ok" else "no result", "seconds": seconds}


def summarise(variants: dict[str, list[str]], records: list[dict], warm_start: bool = False) -> list[dict]:
    rows = []
    for name, overrides in variants.items():
        mine = [r for r in records if r["variant"] == name]
        done = [r for r in mine if r["status"] in ("ok", "done earlier")]
        row = {"variant": name, "overrides": overrides, "seeds": [r["seed"] for r in done],
               "failed": {r["seed"]: r["status"] for r in mine if r not in done},
               "seconds": [None if r["seconds"] is None else round(r["seconds"]) for r in done]}
        if done:
            summary = selfplay_summary([Path(r["dir"]) for r in done], warm_start)
            row["stages"] = {k: v["per_seed"] for k, v in summary["stages"].items()}
            row["gains"] = summary["gains"]
        rows.append(row)
    return rows


def _mean(values: list[float]) -> str:
    return f"{sum(values) / len(values):.3f}" if values else "-"


def markdown(rows: list[dict]) -> str:
    lines = ["| variant | seeds | after SFT | after GRPO | control | RL - SFT, points [95% CI] | control - SFT | wall s |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        stages, gains = row.get("stages", {}), row.get("gains", {})

        failed = "".join(f" (seed {s}: {why})" for s, why in row["failed"].items())
        lines.append(f"| {row['variant']} | {len(row['seeds'])}{failed} | {_mean(stages.get('sft', []))} | "
                     f"{_mean(stages.get('rl', []))} | {_mean(stages.get('control', []))} | {gain_points(gains, 'rl-sft')} | "
                     f"{gain_points(gains, 'control-sft')} | {row['seconds']} |")
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", action="append", type=parse_variant, default=[], metavar="NAME=OVERRIDES")
    parser.add_argument("--variants", type=Path, help="JSON file: {name: [override, ...]}")
    parser.add_argument("--common", nargs="*", default=[], help="overrides of every run, before the variant's own")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 3))
    parser.add_argument("--limit-s", type=float, default=1800.0, help="wall-clock limit of one run")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "selfplay-sweep")
    parser.add_argument("--warm-starts", type=Path, default=None,
                        help="DIR/seedS/{models/distill,distill_pairs.jsonl}: start each seed's GRPO there, no SFT")
    parser.add_argument("--control", nargs="*", default=["more_sft"],
                        help="with --warm-starts: the control phases that train on the warm start's pairs")
    args = parser.parse_args(argv)
    variants = dict(args.variant)
    if args.variants:
        variants.update({k: list(v) for k, v in json.loads(args.variants.read_text()).items()})
    if not variants:
        parser.error("name at least one --variant or a --variants file")
    args.variant_map = variants
    return args


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    # Seeds outermost: with fewer job slots than runs, every variant gets its first seed before any its second.
    work = [(name, [*args.common, *overrides], seed) for seed in args.seeds for name, overrides in args.variant_map.items()]
    if args.warm_starts is not None:
        for seed in args.seeds:
            warm_start(args.warm_starts, seed)  # every seed's warm start exists before any run starts
    records = run_parallel(lambda w: run_one(*w, args.out, args.limit_s, args.warm_starts, args.control), work, args.jobs)
    rows = summarise(args.variant_map, records, warm_start=args.warm_starts is not None)
    (args.out / "sweep.json").write_text(json.dumps({"command": sys.argv, "rows": rows, "runs": records}, indent=2))
    table = markdown(rows)
    (args.out / "sweep.md").write_text(table + "\n")
    print(table)
    return rows


if __name__ == "__main__":
    main()

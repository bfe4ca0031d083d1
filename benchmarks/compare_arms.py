"""Compare finished training runs arm by arm: held-out gains and information density, with 95% intervals.

Each ``--arm NAME DIR...`` is one recipe's runs, one per seed (any ``core.run`` output directory, from
``make run``, ``benchmarks.selfplay_sweep`` or ``scripts/run_experiments.py``). A run that started
from another run's SFT model (no SFT phase of its own) counts its "before" evaluation as "after SFT".
Density and accept rate are the GRPO steps' means; the density ratio is over the first arm, with
seeds then steps resampled (``core.loop.stats``).

    python -m benchmarks.compare_arms \\
        --arm default RUNS/default/seed{0,1,2} \\
        --arm replay RUNS/replay/seed{0,1,2}
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from statistics import mean
from typing import Any

from core.loop.experiments import gain_points, metric_rows, selfplay_summary
from core.loop.stats import mean_ci, ratio_ci


def is_warm_start(run_dir: Path) -> bool:
    """The run skipped its own SFT phase: no evaluation between phases was recorded."""
    return not json.loads((run_dir / "train_state.json").read_text()).get("eval_phases")


def grpo_rows(run_dir: Path) -> list[dict[str, Any]]:
    return [r for r in metric_rows(run_dir) if "information_density" in r]


def _per_seed(stages: dict[str, Any], stage: str) -> str:
    return " ".join(f"{v:.3f}" for v in stages[stage]["per_seed"]) if stage in stages else "-"


def compare(arms: dict[str, list[Path]]) -> list[dict[str, str]]:
    """One row of figures per arm."""
    rows, reference = [], None
    for name, dirs in arms.items():
        warm = {is_warm_start(d) for d in dirs}
        if len(warm) != 1:
            raise SystemExit(f"arm {name!r} mixes runs with and without their own SFT phase")
        summary = selfplay_summary(dirs, warm_start=warm.pop())
        steps = [grpo_rows(d) for d in dirs]
        density = [[float(r["information_density"]) for r in run] for run in steps]
        accept = [mean(float(r["accept_rate"]) for r in run) for run in steps]
        stages, gains = summary["stages"], summary["gains"]

        row = {"arm": name, "seeds": str(len(dirs)), "after SFT": _per_seed(stages, "sft"),
               "after GRPO": _per_seed(stages, "rl"), "control": _per_seed(stages, "control"),
               "RL - SFT, points": gain_points(gains, "rl-sft"), "control - SFT": gain_points(gains, "control-sft"),
               "density": str(mean_ci(density)), "accept rate": " ".join(f"{a:.2f}" for a in accept)}
        if reference is None:
            reference, row["density / first"] = (name, density), "-"
        else:
            row["density / first"] = f"{ratio_ci(density, reference[1])} over {reference[0]}"
        rows.append(row)
    return rows


def markdown(rows: list[dict[str, str]]) -> str:
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(row[k] for k in keys) + " |" for row in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arm", nargs="+", action="append", required=True, metavar=("NAME", "DIR"),
                        help="an arm's name, then its run directories (one per seed)")
    args = parser.parse_args(argv)
    arms: dict[str, list[Path]] = {}
    for name, *dirs in args.arm:
        if not dirs:
            parser.error(f"arm {name!r} has no run directories")
        missing = [d for d in dirs if not (Path(d) / "train_state.json").exists()]
        if missing:
            parser.error(f"arm {name!r}: not a finished run (no train_state.json): {', '.join(missing)}")
        arms[name] = [Path(d) for d in dirs]
    print(markdown(compare(arms)))


if __name__ == "__main__":
    main()

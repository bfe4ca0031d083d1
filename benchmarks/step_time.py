"""A training run's GRPO step-time breakdown from what it wrote, finished or not: per GRPO phase, the line the
run prints at a phase's end (:func:`core.loop.step_clock.breakdown_line`: mean step and its parts, verify's
share and what was waited for, tokens/s, verdicts/s, peak memory) from the steps in ``metrics.jsonl``, and the
steps whose gradients were not finite (``<phase>_loss.jsonl``, TRL's logged rows). A run cut by a time limit,
or stopped by a failed step, still reports the steps it took.

    python -m benchmarks.step_time RUN_DIR
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from benchmarks.kb_table import appended_rows
from core.loop.step_clock import breakdown, breakdown_line


def report(run: Path) -> list[str]:
    """The lines for ``run``; one saying so when it took no GRPO step."""
    metrics = [r for r in appended_rows(run / "metrics.jsonl") if "time/step_s" in r]
    phases = list(dict.fromkeys(str(r.get("phase")) for r in metrics))
    lines = []
    for phase in phases:
        steps = [r for r in metrics if str(r.get("phase")) == phase]
        lines.append(breakdown_line(f"{phase} step time", breakdown(steps)))
        bad = [r.get("step") for r in appended_rows(run / f"{phase}_loss.jsonl")
               if any(isinstance(r.get(k), (int, float)) and not math.isfinite(r[k]) for k in ("loss", "grad_norm"))]
        if bad:
            lines.append(f"{phase}: loss or gradient norm not finite at step(s) {', '.join(map(str, bad))}")
    return lines or [f"{run}: no GRPO step in metrics.jsonl"]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    run = Path(argv[0])
    if not run.is_dir():
        print(f"{run} is not a run directory", file=sys.stderr)
        return 2
    lines = report(run)
    print("\n".join(lines))
    return 0 if not lines[0].endswith("no GRPO step in metrics.jsonl") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""One markdown table from several ``core.eval`` runs (their results.json): per run, the tasks measured
and not run, accepted, fast_p at p = 0, 1, 1.2, 1.5, 2 and the geomean speedup, against eager and
against torch.compile, then the names of the tasks each run measured.

    python -m benchmarks.kb_table RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

PS = ("0", "1", "1.2", "1.5", "2")


def _f(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def rows(run: Path) -> list[str]:
    payload = json.loads((run / "results.json").read_text())
    overall = payload["summary"][-1]
    coder = payload["candidates"].split(":")[-1]
    levels = ",".join(g["level"] for g in payload["summary"][:-1])
    out = []
    for base in ("eager", "compile"):
        fast = "/".join(_f(overall["fast_p"][base][p]) for p in PS)
        out.append(f"| {coder} | {levels} | {overall['tasks']} | {len(payload.get('not_run') or [])} | "
                   f"{overall['accepted']} | {overall['timed'][base]} | {base} | {fast} | "
                   f"{_f(overall['geomean_speedup'][base])} |")
    return out


def main(argv: list[str] | None = None) -> int:
    runs = [Path(a) for a in (argv if argv is not None else sys.argv[1:])]
    found = [r for r in runs if (r / "results.json").exists()]
    print("| coder | level | measured | not run | accepted | timed | vs | fast_p p=0/1/1.2/1.5/2 | geomean |")
    print("|---|---|---|---|---|---|---|---|---|")
    for run in found:
        print("\n".join(rows(run)))
    for run in runs:
        if run not in found:
            print(f"| {run.name}: no results.json (the run did not finish) |||||||||")
    for run in found:
        payload = json.loads((run / "results.json").read_text())
        names = ", ".join(f"{t['name']}{'' if t['accepted'] else ' (' + t['status'] + ')'}" for t in payload["tasks"])
        print(f"\n{run.name}: {names}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The warm CPU verdict median of this tree against a git ref's, run alternately on one machine.

    python benchmarks/verify_bench_against.py --ref before-arch --rounds 2 [--repeats 2] [--out r.json]

Each round runs ``benchmarks/verify_bench.py`` once in a detached worktree of ``--ref`` and once
here, in turns, so a noisy machine slows both arms alike; the ratio is of the medians over rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def bench(tree: Path, repeats: int, out: Path) -> dict:
    subprocess.run([sys.executable, str(tree / "benchmarks" / "verify_bench.py"), "--repeats", str(repeats),
                    "--cold", "1", "--out", str(out)], cwd=tree, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ref", default="before-arch")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        other = Path(tmp) / "ref"
        subprocess.run(["git", "worktree", "add", "-q", "--detach", str(other), args.ref], cwd=ROOT, check=True)
        try:
            runs: dict[str, list[dict]] = {"ref": [], "here": []}
            for i in range(args.rounds):
                runs["ref"].append(bench(other, args.repeats, Path(tmp) / f"ref{i}.json"))
                runs["here"].append(bench(ROOT, args.repeats, Path(tmp) / f"here{i}.json"))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(other)], cwd=ROOT, check=False)
    warm = {k: statistics.median(r["warm_median_s"] for r in v) for k, v in runs.items()}
    cold = {k: statistics.median(r["cold_median_s"] for r in v) for k, v in runs.items()}
    result = {"ref": args.ref, "rounds": args.rounds, "repeats": args.repeats, "warm_median_s": warm,
              "cold_median_s": cold, "warm_ratio": warm["here"] / warm["ref"], "runs": runs}
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    print(f"{'':8} {'warm median s':>14} {'cold median s':>14}")
    for k, label in (("ref", args.ref), ("here", "this tree")):
        print(f"{label:12} {warm[k]:10.3f} {cold[k]:14.3f}")
    print(f"warm ratio (this tree / {args.ref}): {result['warm_ratio']:.2f}x")


if __name__ == "__main__":
    main()

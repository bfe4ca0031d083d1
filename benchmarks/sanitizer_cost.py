"""Where a compute-sanitizer verdict's seconds go (GPU): start-up or checking.

Times, alone and N at once: Python + torch + a CUDA context without the sanitizer; the same under
``compute-sanitizer --tool memcheck``; and the memcheck stage's own driver (core's run_sanitizer) on
an honest Triton kernel. Wall and CPU seconds per run (CPU from the children's rusage).

    python -m benchmarks.sanitizer_cost --parallel 8 --out sanitizer_cost.json
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
START = "import torch; torch.empty(1, device='cuda'); torch.cuda.synchronize()"


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _variants() -> dict:
    from plugins.verifiers.sanitizer import run_sanitizer

    exe = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    task = (HERE / "tests/redteam/tasks/vector_add.py").read_text()
    candidate = str(HERE / "tests/redteam/candidates/honest_vector_add.py")

    def plain() -> None:
        subprocess.run([sys.executable, "-c", START], check=True, capture_output=True)

    def sanitized_start() -> None:
        subprocess.run([exe, "--tool", "memcheck", "--leak-check", "no", sys.executable, "-c", START], check=True,
                       capture_output=True)

    def driver() -> None:
        with tempfile.TemporaryDirectory() as scratch:
            out = run_sanitizer("memcheck", task, candidate, Path(scratch), timeout_s=300, extra=("--leak-check", "no"))
        assert out.get("completed") and not out.get("errors"), out

    return {"python+torch+context": plain, "same under memcheck": sanitized_start, "memcheck stage driver": driver}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--parallel", type=int, default=8)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    rows = []
    for name, fn in _variants().items():
        for width in (1, args.parallel):
            cpu0, t0 = _children_cpu(), time.perf_counter()
            with ThreadPoolExecutor(width) as ex:
                list(ex.map(lambda _, fn=fn: fn(), range(args.repeats * width)))
            wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
            runs = args.repeats * width
            rows.append({"variant": name, "at_once": width, "runs": runs, "wall_s_per_run": wall / runs * width,
                         "cpu_s_per_run": cpu / runs, "runs_per_min": 60 * runs / wall})
            print(json.dumps(rows[-1]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    print(f"{'variant':<24} {'at once':>7} {'wall s/run':>10} {'CPU s/run':>9} {'runs/min':>8}")
    for r in rows:
        print(f"{r['variant']:<24} {r['at_once']:>7} {r['wall_s_per_run']:>10.2f} {r['cpu_s_per_run']:>9.2f} "
              f"{r['runs_per_min']:>8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

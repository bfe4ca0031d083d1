"""The race analysis of GPU Triton candidates (``interp_races``) on every KernelBench problem at its own size,
on this host's CPU: does it run on every honest kernel, and what does it cost?

    python benchmarks/interp_races_sweep.py --kb .kb/KernelBench --levels level1 level2 --out /tmp/races

``interp_races`` is the one check of a GPU verdict that runs on the CPU (the Triton interpreter, with
CUDA mapped to the CPU, at the task's own shapes, on a sample of each launch's programs): the GPU host
runs exactly this. A check that could not run fails closed, so on an honest kernel it must pass, and
issue 39 asks that it never fail to run on the expert's level-1 and level-2 kernels. For each problem:
the expert teacher's Triton candidate (declined problems are skipped), then the check's own
``evaluate`` in its sandboxed CPU workers, ``--parallel`` problems at a time. A line per problem as it
ends (passed, rejected, could not run, and the seconds), then the counts; ``--out``: ``sweep.json``.

A problem whose inputs this host cannot hold is "could not run" here with the memory it needs; on the
GPU host (128 GiB) it runs (``--assume-host-mb 131072`` tries it here: the tiled inputs are resident, the
outputs only where the sampled programs write).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def problems(root: Path, levels: list[str], only: list[str] | None) -> list[tuple[str, Path]]:
    """(level, file) of every problem of ``levels`` in KernelBench's numeric order (``only``: names containing one of these)."""
    out = []
    for level in levels:
        files = sorted((root / level).glob("*.py"), key=lambda p: (int(p.name.split("_")[0]) if p.name[0].isdigit() else 0,
                                                                  p.name))
        out += [(level, f) for f in files if not only or any(o in f.name for o in only)]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kb", required=True, help="a KernelBench checkout's KernelBench/ directory")
    parser.add_argument("--levels", nargs="+", default=["level1", "level2"])
    parser.add_argument("--only", nargs="*", help="problems whose file name contains one of these")
    parser.add_argument("--parallel", type=int, default=2, help="problems analysed at once (CPU workers)")
    parser.add_argument("--out", type=Path, help="directory for sweep.json")
    parser.add_argument("--assume-host-mb", type=int,
                        help="size the check's host-memory refusal as if this host had this much memory (the GPU "
                             "host's, to analyse here what it would; the workers' real address-space limits stay)")
    args = parser.parse_args(argv)

    from core.plugins import registry
    from core.task import Candidate, Task
    from core.verification.evidence import Evidence
    from plugins.verifiers.interp_races import InterpreterRaceCheck

    if args.assume_host_mb:
        import plugins.verifiers.interp_races as races

        races.host_memory_mb = lambda: int(args.assume_host_mb)
    chosen = problems(Path(args.kb), args.levels, args.only)
    expert = registry("coder").create("expert")
    check = InterpreterRaceCheck(workers=max(1, args.parallel))
    check.open({"workers": args.parallel})
    rows: list[dict] = []
    started = time.perf_counter()

    # the expert captures each task with torch.export, which is not thread-safe: every candidate first
    written: dict[Path, tuple[Task, Candidate | None, str]] = {}
    for level, path in chosen:
        try:
            task = Task.from_file(path)
            candidate = expert.generate([task], "triton")[0][0]
            written[path] = (task, None if candidate.declined else candidate, str(candidate.declined or ""))
        except Exception as exc:  # noqa: BLE001  (a task the expert cannot load: reported as an error below)
            written[path] = (None, None, f"error: {type(exc).__name__}: {exc}"[:300])
    print(f"{sum(1 for _, c, _ in written.values() if c is not None)} of {len(chosen)} problems written by the "
          f"expert in {time.perf_counter() - started:.0f} s", flush=True)

    def one(level: str, path: Path) -> dict:
        task, candidate, why = written[path]
        t = time.perf_counter()
        if candidate is None:
            return {"level": level, "name": path.stem, "outcome": "error" if why.startswith("error:") else "declined",
                    "seconds": 0.0, "detail": why[:200]}
        evidence = Evidence(task=task, candidate=Candidate(source=candidate.source, backend="triton"),
                            backend="triton", device="cuda")
        result = check.evaluate(evidence)
        outcome = "passed" if result.passed else "could not run" if result.unchecked else "rejected"
        data = result.data or {}
        return {"level": level, "name": path.stem, "outcome": outcome, "seconds": round(time.perf_counter() - t, 1),
                "detail": result.detail[:400], "analysis_s": data.get("seconds"), "memory_mb": data.get("memory_mb")}

    try:
        with ThreadPoolExecutor(max_workers=max(1, args.parallel)) as pool:
            futures = {pool.submit(one, level, path): (level, path) for level, path in chosen}
            for future in as_completed(futures):
                level, path = futures[future]
                try:
                    row = future.result()
                except Exception as exc:  # noqa: BLE001  (a problem the expert or the task itself cannot load)
                    row = {"level": level, "name": path.stem, "outcome": "error", "seconds": 0.0,
                           "detail": f"{type(exc).__name__}: {exc}"[:300]}
                rows.append(row)
                print(f"[{time.perf_counter() - started:7.1f} s] {level}/{row['name']}: {row['outcome']} "
                      f"({row['seconds']} s) {row['detail'][:160]}", flush=True)
    finally:
        check.close()
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["outcome"]] = counts.get(row["outcome"], 0) + 1
    analysed = [r for r in rows if r["outcome"] != "declined"]
    print(f"{len(rows)} problems in {time.perf_counter() - started:.0f} s: "
          + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
          + (f"; slowest: " + ", ".join(f"{r['name']} {r['seconds']} s" for r in
                                        sorted(analysed, key=lambda r: -r["seconds"])[:5]) if analysed else ""))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "sweep.json").write_text(json.dumps({"counts": counts, "rows": rows}, indent=1))
    return 0 if not counts.get("could not run") and not counts.get("rejected") else 1


if __name__ == "__main__":
    sys.exit(main())

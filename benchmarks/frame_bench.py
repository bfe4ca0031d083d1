"""Throughput of the judge-worker message channel: a message holding two 64 MiB tensors written by
one process and read (decoded into tensors) by another, through a pipe.

    python benchmarks/frame_bench.py                       # this checkout
    python benchmarks/frame_bench.py --against 3f0c2d1     # side by side with core/verification/sandbox.py at a revision

Each configuration runs ``--repeats`` times, interleaved, and the median MiB/s is printed.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.revisions import module_at  # noqa: E402  (after the path is set)


def _writer(module, fd: int, messages: int, mib: int) -> None:
    import torch

    x = torch.rand((mib << 20) // 4)
    for _ in range(messages):
        module.write_frame(fd, {"out": [x, x]})
    os.close(fd)


def throughput(module, messages: int = 6, mib: int = 64) -> float:
    r, w = module.channel_pipe() if hasattr(module, "channel_pipe") else os.pipe()
    proc = mp.get_context("fork").Process(target=_writer, args=(module, w, messages, mib))
    proc.start()
    os.close(w)
    seconds = []
    for _ in range(messages):
        t = time.perf_counter()
        module.read_frame(r, time.monotonic() + 300)
        seconds.append(time.perf_counter() - t)
    proc.join()
    os.close(r)
    return 2 * mib / statistics.median(seconds[1:])  # the first includes the writer's start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default=None, help="a git revision whose core/verification/sandbox.py to compare with")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    import torch  # noqa: F401  (imported before forking, as the judge has it)

    import core.verification.sandbox as current

    modules = {"this checkout": current}
    if args.against:
        modules = {f"at {args.against}": module_at(args.against, "core/verification/sandbox.py"), **modules}
    results: dict[str, list[float]] = {name: [] for name in modules}
    for _ in range(args.repeats):
        for name, module in modules.items():
            results[name].append(throughput(module))
    for name, values in results.items():
        print(f"{name:<22} {statistics.median(values):7.0f} MiB/s   ({', '.join(f'{v:.0f}' for v in values)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

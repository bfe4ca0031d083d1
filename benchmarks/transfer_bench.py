"""What drawing inputs from the seed saves: one verdict on a large elementwise task, inputs sent as
tensors against inputs drawn in the candidate worker, side by side in one run.

    python benchmarks/transfer_bench.py --rows 2048 --cols 4096 --repeats 3

CPU by default (the Triton interpreter runs the candidate, so keep the task modest); ``--device
cuda`` on a GPU host. Prints the median verdict time and the reference/trials/extra stage times.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("KERNELZERO_DISABLE_AUTOLOAD", "1")

CANDIDATE = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, tl.where(x > 0, x, 0.0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        block = 1024 if x.is_cuda else 1 << 16
        relu_kernel[(triton.cdiv(x.numel(), block),)](x, y, x.numel(), BLOCK=block)
        return y
'''


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--cols", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)

    from core.plugins import registry
    from core.task import Candidate, Task
    from core.verify import Verifier
    from tests.gpu.gpu_helpers import relu_task

    checks = [n for n in registry("verifier").names() if n not in ("gpu_racecheck", "gpu_synccheck", "races")]
    task, cand = Task(source=relu_task(args.rows, args.cols)), Candidate(source=CANDIDATE)
    results = {}
    verifiers = {mode: Verifier(backend="triton", device=args.device, workers=1, checks=checks,
                                inputs_by_seed=(mode == "by seed"), float64_max_elements=0,
                                performance={"compare_compile": False})
                 for mode in ("tensors", "by seed")}
    try:
        for mode, v in verifiers.items():
            v.verify(task, cand)  # warm: imports and the kernel's first compile
        for _ in range(args.repeats):  # interleaved, so drift on a shared machine hits both alike
            for mode, v in verifiers.items():
                verdict = v.verify(task, cand)
                assert verdict.accepted, verdict.reason
                results.setdefault(mode, []).append(verdict)
    finally:
        for v in verifiers.values():
            v.close()
    mib = args.rows * args.cols * 4 / 2**20
    print(f"relu over {args.rows}x{args.cols} fp32 ({mib:.0f} MiB per tensor), {args.device}, "
          f"median of {args.repeats} verdicts each")
    print(f"{'inputs':<10} {'verdict s':>9} {'reference':>9} {'trials':>8} {'extra':>8}")
    for mode, verdicts in results.items():
        def med(key):
            return statistics.median(v.stage_s.get(key, 0.0) for v in verdicts)
        print(f"{mode:<10} {statistics.median(v.elapsed_s for v in verdicts):>9.2f} {med('reference'):>9.2f} "
              f"{med('trials'):>8.2f} {med('extra'):>8.2f}")
    base = statistics.median(v.elapsed_s for v in results["tensors"])
    seed = statistics.median(v.elapsed_s for v in results["by seed"])
    print(f"by seed / tensors: {seed / base:.2f}x the time")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

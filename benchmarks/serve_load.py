"""Load benchmark of ``kernelzero serve``: a loopback service with 2 CPU workers, 2,000 requests from 32 concurrent
clients, one sandbox worker killed mid-run; every request must end in a verdict or "busy", none lost.

It reports the service's overhead over a direct call, per request: the client's latency minus the verifier's own
time for that verdict (``verdict.elapsed_s``), first one request at a time (no queueing: the service's own cost),
beside the same figure for direct ``executor.verify`` calls; then under load, where the figure includes waiting in
the queue. The candidates are cheap on purpose (a ReLU of 64 elements, checks static + compile + correctness by
default, and half of the load's candidates rejected by the static check in the judge, before any worker): the
point is the service's cost, not the verifier's.

    .venv/bin/python benchmarks/serve_load.py                 # about five minutes on 2 cores
    .venv/bin/python benchmarks/serve_load.py --requests 200  # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.serve.client import ServiceBusy, ServiceError, VerifierClient  # noqa: E402
from core.serve.dispatch import percentiles  # noqa: E402
from core.serve.service import ServiceConfig, running_service, sandbox_worker_pids  # noqa: E402
from core.task import Candidate, Task  # noqa: E402

TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(64)]


def get_init_inputs():
    return []
'''

CANDIDATE = '''import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, tl.where(x > 0, x, 0.0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        relu_kernel[(1,)](x, out, x.numel(), BLOCK=64)
        return out
# variant {i}
'''


# Rejected by the static check in the judge, before any worker: the cheapest verdict there is.
NO_KERNEL = """import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.relu(x)
# variant {i}
"""


def ms(stats: dict[str, float]) -> str:
    return ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in stats.items())


def sequential(client: VerifierClient, executor, n: int) -> tuple[dict, dict]:
    """One request at a time, through the service and directly: latency minus the verifier's own time."""
    service, direct = [], []
    for i in range(n):
        pair = (Task(TASK), Candidate(CANDIDATE.format(i=f"s{i}")))
        start = time.perf_counter()
        verdict = client.verify(*pair)
        service.append(time.perf_counter() - start - verdict.elapsed_s)
        start = time.perf_counter()
        verdict = executor.verify(*pair)
        direct.append(time.perf_counter() - start - verdict.elapsed_s)
    return percentiles(service, (0.5, 0.99)), percentiles(direct, (0.5, 0.99))


async def load(client: VerifierClient, requests: int, concurrency: int, kill_at: float | None,
               static_share: float) -> dict:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(i)
    outcomes: dict[int, str] = {}
    overhead: list[float] = []
    latency: list[float] = []
    killed: list[int] = []

    async def one_client() -> None:
        while True:
            try:
                i = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            if kill_at is not None and not killed and i >= requests * kill_at:
                pids = sandbox_worker_pids("candidate")
                if pids:
                    os.kill(pids[0], signal.SIGKILL)
                    killed.append(pids[0])
            start = time.perf_counter()
            try:
                cheap = (i * static_share) % 1 + static_share >= 1  # an even spread of static_share
                source = (NO_KERNEL if cheap else CANDIDATE).format(i=i)
                verdict = await client.averify(Task(TASK), Candidate(source))
            except ServiceBusy:
                outcomes[i] = "busy"
                continue
            except ServiceError as exc:
                outcomes[i] = f"error {exc.code}"
                continue
            took = time.perf_counter() - start
            latency.append(took)
            overhead.append(took - verdict.elapsed_s)
            outcomes[i] = verdict.status

    start = time.perf_counter()
    await asyncio.gather(*(one_client() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    await client.aclose()
    counts: dict[str, int] = {}
    for status in outcomes.values():
        counts[status] = counts.get(status, 0) + 1
    return {"wall_s": wall, "counts": counts, "lost": requests - len(outcomes), "killed": killed,
            "latency": percentiles(latency, (0.5, 0.99)), "overhead": percentiles(overhead, (0.5, 0.99))}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--sequential", type=int, default=100, help="one-at-a-time requests for the unloaded overhead")
    p.add_argument("--checks", default="static,static_integrity,correctness",
                   help="verifier checks (compile runs with any); 'all' for every check")
    p.add_argument("--kill-at", type=float, default=0.5, help="kill one sandbox worker after this share of requests")
    p.add_argument("--max-queue", type=int, default=256)
    p.add_argument("--static-share", type=float, default=0.5,
                   help="share of load requests whose candidate the static check rejects (no worker needed)")
    args = p.parse_args()
    from core.serve.wire import Limits

    checks = None if args.checks == "all" else args.checks.split(",")
    config = ServiceConfig(device="cpu", workers=args.workers, port=0, checks=checks, timeout_s=60,
                           limits=Limits(max_queue=args.max_queue))
    print(f"# kernelzero serve load benchmark, {time.strftime('%Y-%m-%d')}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores; {args.workers} CPU workers, checks: {args.checks}")
    started = time.perf_counter()
    with running_service(config) as service, VerifierClient(service.url, retries=8, backoff_s=0.2) as client:
        print(f"service up in {time.perf_counter() - started:.1f} s at {service.url}")
        client.verify(TASK, CANDIDATE.format(i="warm"))
        seq_service, seq_direct = sequential(client, service.executor, args.sequential)
        print(f"one at a time ({args.sequential} requests), latency minus the verifier's own time:")
        print(f"  through the service: {ms(seq_service)}")
        print(f"  direct executor.verify: {ms(seq_direct)}")
        print(f"  service overhead: p50 {(seq_service['p50'] - seq_direct['p50']) * 1000:.1f} ms, "
              f"p99 {(seq_service['p99'] - seq_direct['p99']) * 1000:.1f} ms")
        result = asyncio.run(load(client, args.requests, args.concurrency, args.kill_at, args.static_share))
        metrics = client.metrics()
    print(f"load: {args.requests} requests ({args.static_share:.0%} rejected by the static check), "
          f"{args.concurrency} concurrent clients, worker pid {result['killed']} "
          f"killed at {args.kill_at:.0%}: {result['wall_s']:.1f} s, {args.requests / result['wall_s']:.1f} requests/s")
    print(f"  outcomes: {result['counts']}; lost: {result['lost']}")
    print(f"  latency: {ms(result['latency'])}")
    print(f"  latency minus the verifier's own time (queue wait included): {ms(result['overhead'])}")
    print(f"  service metrics: verdicts {metrics['verdicts_total']}, busy {metrics['busy_total']}, "
          f"check time {ms({k: v for k, v in metrics['check_s'].items() if k != 'mean'})}")
    ok = result["lost"] == 0 and sum(result["counts"].values()) == args.requests
    print("every request got a verdict or busy; none lost" if ok else "REQUESTS LOST")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

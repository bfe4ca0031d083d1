"""A worker's warm-up, done once while its pool holds it idle, so that no verdict pays for it.

On the H200 a cold worker's first verdict took ~14 s against 1-3 s for the next. The generic part
(:func:`warm_gpu`: the CUDA context and the lazily loaded kernels of drawing, digesting, poisoning
and comparing) is the engine's own; what a check needs beyond it (the timer's filler kernel, its
fresh-argument draws) the check does in its optional ``warm_up(device)`` member
(:data:`core.contracts.OPTIONAL_MEMBERS`), so the worker imports no check's code itself. Both run
before the audit hook is armed: Triton may still start ptxas then.
"""

from __future__ import annotations

import os
import time
from typing import Any, Iterable

from core.contracts import optional

MAX_REPORT_CHARS = 300
# "1" in a worker's environment: it builds a task's torch.compile baseline (the judge's baseline pool), and warms
# torch.compile up before its hello: Inductor's and Dynamo's imports, its compile workers, Triton's first build.
# A baseline worker is ready seconds before the candidate's, and idles until a verification asks for its build; a
# one-shot verdict (H100, 2026-12-06) waited ~5 s for that first, cold build after the candidate's timing.
WARM_COMPILE_ENV = "KERNELZERO_WARM_COMPILE"


def warm_compile() -> None:
    """torch.compile's one-time costs in this process, paid on a function of one small tensor on the GPU."""
    import torch

    compiled = torch.compile(lambda x: torch.relu(x) * 2.0 + 1.0)
    compiled(torch.randn(4096, device="cuda"))


def warm_gpu() -> None:
    """The generic GPU part: the CUDA context, drawing inputs on the GPU, digesting, poisoning and
    comparing them, and copying to the host. Raises what went wrong."""
    import torch

    from core.verification.digests import device_fingerprint
    from core.verification.evidence import compare_outputs

    torch.manual_seed(0)
    x = torch.randn(4096, device="cuda")
    y = torch.randn_like(x)
    torch.full_like(x, float("nan"))
    compare_outputs([x], [x.clone()])
    compare_outputs([x], [y])
    device_fingerprint(x)
    torch.randint(0, 10, (16,), device="cuda")
    x.cpu()


def applicable_checks(backend: str, device: str) -> list[Any]:
    """Every registered check, built with its defaults, that applies to ``(backend, device)``; a
    check that cannot be built so is left out (the judge, which configures it, reports that)."""
    from core.plugins import registry

    reg = registry("verifier")
    found = []
    for name in reg.names():
        try:
            check = reg.create(name)
            if check.applies(backend, device):
                found.append(check)
        except Exception:
            continue
    return found


def warm_up(device: str, checks: Iterable[Any], role: str | None = None) -> str | None:
    """Warm this worker up for ``device``: :func:`warm_gpu` on CUDA, then the ``warm_up`` of every
    check whose ``warm_up_roles`` hold ``role`` (None: every check's). A reference worker never runs
    the candidate's profile, so it does not load CUPTI, seconds on the critical path of a one-shot verify.

    Returns how it went, for the worker's hello: ``"1.84 s (checks: performance 0.61 s)"``, or
    ``"failed after 0.52 s: performance: RuntimeError: ..."`` (the worker still serves; its first
    verdict pays what is left); ``None`` when there was nothing to warm (the CPU, no check hook).
    """
    t = time.perf_counter()
    failures: list[str] = []
    gpu = device == "cuda"
    if gpu:
        try:
            warm_gpu()
        except Exception as exc:
            return f"failed after {time.perf_counter() - t:.2f} s: {type(exc).__name__}: {exc}"[:MAX_REPORT_CHARS]
    warmed, compiled = [], ""
    if gpu and os.environ.get(WARM_COMPILE_ENV) == "1":
        began = time.perf_counter()
        try:
            warm_compile()
            compiled = f"torch.compile {time.perf_counter() - began:.2f} s"
        except Exception as exc:  # noqa: BLE001  (the worker still serves: its first build pays what is left)
            failures.append(f"torch.compile: {type(exc).__name__}: {exc}")
    for check in checks:
        hook = optional(check, "Check", "warm_up")
        roles = optional(check, "Check", "warm_up_roles")
        if hook is None or (role is not None and roles is not None and role not in roles):
            continue
        began = time.perf_counter()
        try:
            split = hook(device)  # None, or where the hook's seconds went
            detail = f" ({split})" if isinstance(split, str) and split else ""
            warmed.append(f"{check.name} {time.perf_counter() - began:.2f} s{detail}")
        except Exception as exc:
            failures.append(f"{check.name}: {type(exc).__name__}: {exc}")
    if gpu and not failures:
        try:
            import torch

            torch.cuda.synchronize()
        except Exception as exc:
            failures.append(f"{type(exc).__name__}: {exc}")
    seconds = time.perf_counter() - t
    if failures:
        return f"failed after {seconds:.2f} s: {'; '.join(failures)}"[:MAX_REPORT_CHARS]
    if not gpu and not warmed:
        return None
    parts = [compiled] if compiled else []
    if warmed:
        parts.append(f"checks: {', '.join(warmed)}")
    return f"{seconds:.2f} s" + (f" ({'; '.join(parts)})" if parts else "")

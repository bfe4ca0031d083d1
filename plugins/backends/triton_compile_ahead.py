"""A Triton candidate's kernels compiled before its first turn on the GPU (``Backend.compile_ahead``).

A candidate's first call compiles its kernels: for an autotuned kernel every config, seconds of CPU each
(ptxas, LLVM). That call is the first correctness trial, sent holding the GPU lock shared, so every timed
turn of the host waited for the compiler with the GPU idle: on one H100 (2026-12-07, KernelBench level 2)
the candidates' runs held shared turns of 10-13 s for the expert's autotuned convolutions, verifications
waited 607 s in all for a turn, and the GPU was busy 28% of the time.

Here the loaded model is called once, without the lock, on the task's inputs *uninitialised* (shapes,
strides and dtypes from ``get_inputs`` on the meta device, then allocations only), with nothing run on
the GPU:

* every Triton launch compiles and returns instead of launching (``JITFunction.run(warmup=True)``, by the
  launch counter of :mod:`plugins.backends.triton_backend` while ``compile_only`` is set); an autotuner
  compiles each of its configs (after its ``early_config_prune``) and benchmarks none;
* every aten op that would compute is stopped before it runs (a ``TorchDispatchMode`` that lets through
  allocations, views and metadata only): the call ends there, and what it compiled so far stays compiled;
* the compiles run in parallel threads (Triton's ``AsyncCompileMode``, where this Triton has it).

The first trial then finds its kernels in Triton's cache (the same specialisation: the allocations are
aligned as the drawn inputs are) and holds its turn for the GPU's work. Nothing here is judged: the
outputs are uninitialised and discarded, and every check runs as before. Best effort: a call that stops
early, or a kernel that fails to compile, is compiled (or fails) in the first trial as it always was.
Candidate code runs here as in any request (sandboxed, instrumentation verified after); like any
candidate's background work, GPU work it started by other means than aten or Triton would not be held
by the lock.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

# aten ops that allocate, alias or read metadata: nothing runs on the device
NO_COMPUTE_OPS = ("empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "view", "_unsafe_view",
                  "_reshape_alias", "as_strided", "permute", "transpose", "t", "unsqueeze", "squeeze", "expand",
                  "slice", "select", "narrow", "split", "split_with_sizes", "chunk", "unbind", "alias", "detach",
                  "lift_fresh", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "is_contiguous",
                  "unfold", "diagonal", "view_as_real", "view_as_complex", "movedim", "expand_as", "view_as")


class StopAhead(Exception):
    """An op that would compute on the device: the compile-ahead call ends here."""


def _no_compute_mode() -> Any:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    allowed = {p for p in (getattr(torch.ops.aten, name, None) for name in NO_COMPUTE_OPS) if p is not None}

    class NoCompute(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket in allowed:
                return func(*args, **(kwargs or {}))
            raise StopAhead(str(func))

    return NoCompute()


def _parallel(pool: ThreadPoolExecutor) -> Any:
    """Triton's compiles in ``pool``'s threads, finished on exit; a no-op without ``AsyncCompileMode``."""
    try:
        from triton.runtime._async_compile import AsyncCompileMode
    except ImportError:
        return contextlib.nullcontext()
    try:
        return AsyncCompileMode(pool, ignore_errors=True)
    except TypeError:  # an older Triton's: errors are raised on exit (and by the first trial, as always)
        return AsyncCompileMode(pool)


def _started_pool(threads: int) -> ThreadPoolExecutor:
    """A pool whose ``threads`` threads are all running before the candidate's code is called: the worker
    refuses to start a thread while the candidate is on the stack (the ATen audit sees only its own thread),
    and ``ThreadPoolExecutor`` starts its threads at the first submissions, which Triton makes from inside
    the candidate's ``forward``. Each thread, once started, waits for work and is reused."""
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kz-ahead")
    gate = threading.Barrier(threads + 1)
    waiting = [pool.submit(gate.wait) for _ in range(threads)]  # each submission starts a thread: none idle yet
    gate.wait()
    for started in waiting:
        started.result()
    return pool


def compile_ahead(model: Any, inputs: list[Any], local: Any, threads: int | None = None) -> dict[str, Any]:
    """Call ``model(*inputs)`` compiling, never launching, its Triton kernels and computing nothing (module
    docstring); ``local``: the backend's thread-local state, whose ``compile_only`` its launch wrappers
    read. ``{"compiled": kernels compiled or found compiled, "seconds": ..., "stopped": why, if it stopped}``."""
    import torch

    began = time.perf_counter()
    stopped = None
    local.compile_only, local.compiled = True, 0
    try:
        pool = _started_pool(threads or min(8, os.cpu_count() or 1))
        with pool, _parallel(pool), _no_compute_mode(), torch.no_grad():
            try:
                model(*inputs)
            except StopAhead as exc:
                stopped = f"an op that computes: {exc}"
    except Exception as exc:  # noqa: BLE001  (the candidate's forward on uninitialised inputs, a compile error)
        stopped = f"{type(exc).__name__}: {exc}"
    finally:
        local.compile_only = False
    out: dict[str, Any] = {"compiled": int(getattr(local, "compiled", 0)), "seconds": round(time.perf_counter() - began, 3)}
    if stopped:
        out["stopped"] = stopped[:300]
    return out

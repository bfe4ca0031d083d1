"""The worker's main loop: set the process up, say hello, then answer requests until ``exit``.

Which request goes to which answer is built from :mod:`core.verification.protocol` (the wire the
judge imports too): the requests of the worker's role (:class:`ReferenceRole`,
:class:`CandidateRole`) and those of every role; anything else is refused, naming role and request.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
import traceback
from typing import Any, Callable

from core.contracts import optional
from core.verification.protocol import ANY_ROLE_OPS, ROLE_OPS, Op, refusal
from core.verification.sandbox import read_frame, write_frame
from core.verification.worker.callers import Callers
from core.verification.worker.candidate import CANDIDATE_MODULE, CandidateRole
from core.verification.worker.cuda_on_cpu import ENV as CUDA_ON_CPU_ENV
from core.verification.worker.cuda_on_cpu import install as install_cuda_on_cpu
from core.verification.worker.process import AuditGuard, describe, isolate, set_cpu_budget, set_limits
from core.verification.worker.reference import ReferenceRole, deterministic_reference
from core.verification.worker.runtime_guard import install_runtime_guard
from core.verification.worker.warmup import applicable_checks, warm_up

ROLES: dict[str, Callable[["WorkerMain"], Any]] = {"reference": ReferenceRole, "candidate": CandidateRole}
TESTING_ENV = "KERNELZERO_SANDBOX_TESTING"  # "1": also answer ``exec_test`` (tests of the sandbox only)

Handler = Callable[[dict[str, Any]], dict[str, Any]]

# Cached-but-free GPU memory above this is handed back after each GPU request (below it, keeping the
# blocks saves small tasks their cudaMalloc calls).
CACHED_GPU_BYTES_KEPT = 1 << 30


def release_cached_gpu_memory(keep_bytes: int = CACHED_GPU_BYTES_KEPT) -> bool:
    """Give PyTorch's cached, unused GPU blocks back to the driver when they exceed ``keep_bytes``.
    Every worker has its own caching allocator: on the H200 at KernelBench's real sizes an idle
    worker kept 44 GiB reserved after a large task, and its neighbours' references and candidates
    ran out of memory. Live tensors (outputs a keeper holds) are not touched. True if it released."""
    import torch

    if not torch.cuda.is_initialized():
        return False
    if torch.cuda.memory_reserved() - torch.cuda.memory_allocated() <= keep_bytes:
        return False
    torch.cuda.empty_cache()
    return True


def peak_gpu_bytes() -> int | None:
    """The most device memory this worker's allocator reserved since the last call (then reset): what one
    request really took, beside the judge's estimate (core.verification.gpumemory)."""
    import torch

    if not torch.cuda.is_initialized():
        return None
    peak = int(torch.cuda.max_memory_reserved())
    torch.cuda.reset_peak_memory_stats()
    return peak


def exact_fp32_reference() -> None:
    """float32 references (and their eager and torch.compile baselines) run in float32, not TF32.
    cuDNN's default lets convolutions use TF32, whose ~5e-4 relative error is over the float32
    tolerance (1e-4): on the H200 an honest IEEE-fp32 convolution at KernelBench's own sizes was
    rejected against the TF32 reference (max abs err 5.6e-4 at RMS 0.89). PyTorch's matmul default
    is already float32; it is pinned too. Candidates are Triton or CUDA and pick their own precision."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


class WorkerMain:
    """One worker process: its set-up, what every role answers, and the dispatch to its role."""

    # What "hold" keeps back from a run/reference answer until "take_held" asks for it.
    HELD_KEYS = ("output", "inputs_after", "truth", "inputs")

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.role, self.device, self.scratch = args.role, args.device, args.scratch
        self.held: list[dict[str, Any]] | None = None  # tensors of the last "hold" answer
        self.exports: Any = None  # candidate: outputs handed to a keeper (core.verification.devicemem.Exports)
        self.backend: Any = None
        self.guard: AuditGuard | None = None
        self.callers: Callers | None = None  # candidate workers: who is asking (core.verification.worker.callers)
        # candidate workers: () -> the names of the instrumentation that changed since set-up (a closure:
        # the recorded identities are in no module a candidate could name)
        self.verify_instrumentation: Callable[[], list[str]] = lambda: []
        self.serving = ROLES[self.role](self)
        self.handlers = self._handlers()

    def _handlers(self) -> dict[str, Handler]:
        """Request name -> answer, for this role; the protocol says which requests it must answer."""
        common: dict[str, Handler] = {Op.PING: self.ping, Op.UNLOAD: self.unload_request, Op.TAKE_HELD: self.take_held}
        own = self.serving.handlers()
        # Op.EXIT is answered by leaving (main), so it has no handler.
        if set(common) | {Op.EXIT} != ANY_ROLE_OPS or set(own) != ROLE_OPS[self.role]:
            raise RuntimeError(f"the {self.role} worker answers {sorted(set(common) | set(own))}, but the protocol "
                               f"names {sorted(ROLE_OPS[self.role] | ANY_ROLE_OPS)}")
        handlers = {**common, **own}
        if os.environ.get(TESTING_ENV) == "1":
            handlers[Op.EXEC_TEST] = self.exec_test
        return handlers

    def setup(self) -> dict[str, Any]:
        isolation = isolate(self.scratch) if self.args.isolate else "off: isolation disabled by configuration"
        set_limits(self.args.memory_mb, self.args.file_size_mb, self.args.open_files, self.device)
        if self.args.nice > 0:  # before the imports: a start-up beside the GPU's workers yields too
            os.nice(self.args.nice)
        began = time.time()
        import torch  # noqa: F401  (warm: the point of a pool)

        imported_s = time.time() - began

        exact_fp32_reference()
        if self.role == "reference":
            deterministic_reference()
        if self.device == "cpu" and os.environ.get(CUDA_ON_CPU_ENV) == "1":
            install_cuda_on_cpu()  # interp_races' nested verifier: CUDA-only code in the interpreter

        from core.plugins import registry

        self.backend = registry("backend").create(self.args.backend)
        self.backend.prepare_worker(self.device)
        prepared_s = time.time() - began
        # before the audit hook: a check's warm-up may compile (Triton starts ptxas)
        warmed = warm_up(self.device, applicable_checks(self.args.backend, self.device), self.role)
        exec_dirs = list(optional(self.backend, "Backend", "compiler_dirs")())
        self.guard = AuditGuard(self.scratch, exec_dirs)
        from core.verification.devicemem import Exports

        self.exports = Exports(self.device, self.scratch)
        if self.device == "cuda":  # load libcuda now: the snapshot below must see it as the harness uses it
            from core.verification.devicemem import cuda_ipc_available

            cuda_ipc_available()
        if self.role == "candidate":  # last: what it records is the instrumentation as installed
            self.callers, self.verify_instrumentation = install_runtime_guard(self.backend, self.guard)
        sys.addaudithook(self.guard.hook)
        gpu_memory = None
        if self.device == "cuda":  # (free, total) bytes: the judge's admission sizes itself on the total
            try:
                gpu_memory = [int(x) for x in torch.cuda.mem_get_info()]
            except Exception:
                gpu_memory = None
        return {"op": Op.HELLO, "pid": os.getpid(), "isolation": isolation, "role": self.role,
                "gpu_memory": gpu_memory,
                "torch": torch.__version__, "python": sys.version.split()[0], "gpu_warm_up": warmed,
                # where a worker's start-up went (the judge adds the seconds from its spawn to this hello)
                "start_up_s": {"import_torch": round(imported_s, 3), "backend": round(prepared_s - imported_s, 3),
                               "total": round(time.time() - began, 3)}, "sent_at": time.time()}

    # -- requests

    def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        op = req.get("op")
        set_cpu_budget(int(req.get("cpu_s", 600)))
        if op in (Op.REFERENCE, Op.RUN):
            self.held = None
            if req.get("hold"):  # the judge holds the GPU lock for this answer, then fetches the tensors
                answer = self.handle({k: v for k, v in req.items() if k != "hold"})
                items = answer.get("observations") or answer.get("trials") or []
                if answer.get("ok"):
                    self.held = [{k: item.pop(k) for k in self.HELD_KEYS if k in item} for item in items]
                    answer["held"] = True
                return answer
        handler = self.handlers.get(op) if isinstance(op, str) else None
        answer = handler(req) if handler is not None else refusal(self.role, op)
        if self.device == "cuda" and isinstance(answer, dict):
            answer["gpu_peak"] = peak_gpu_bytes()  # the judge compares it with its memory estimate
        if self.device == "cuda" and op == Op.FORGET:  # a verification ended: its memory goes back whole
            release_cached_gpu_memory(0)
        elif self.device == "cuda":  # after every request: a keeper's comparisons and a timed stage's inputs
            # left tens of GiB cached in their process, where the next stage's other worker could not use them
            # (H200, 2026-12-05: six level-1 tasks ran out of memory alone in the performance stage)
            release_cached_gpu_memory()
        return answer

    def ping(self, req: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "pid": os.getpid()}

    def take_held(self, req: dict[str, Any]) -> dict[str, Any]:
        held, self.held = self.held, None
        return {"ok": held is not None, "held": held, "error": None if held is not None else "nothing is held"}

    def unload_request(self, req: dict[str, Any]) -> dict[str, Any]:
        self.unload()
        return {"ok": True}

    def unload(self) -> None:
        """Forget the candidate: its exported outputs, its session, its module."""
        if self.exports is not None:
            self.exports.drop()
        self.serving.unload()
        self.held = None
        sys.modules.pop(CANDIDATE_MODULE, None)
        if self.callers is not None:
            self.callers.candidate_globals = None
        gc.collect()
        if self.device == "cuda":  # a verification ended: its memory goes back whole (after the collect)
            release_cached_gpu_memory(0)

    def exec_test(self, req: dict[str, Any]) -> dict[str, Any]:
        """Tests only (``KERNELZERO_SANDBOX_TESTING=1``): run a snippet under the sandbox guard, as
        trusted code of a module ``sandbox_test`` (so the sandbox's other layers are what is tested)
        or, with ``as_candidate``, as the candidate's code; ``tampered`` lists what the instrumentation
        check finds afterwards."""
        import types

        as_candidate = bool(req.get("as_candidate")) and self.callers is not None
        module = types.ModuleType(CANDIDATE_MODULE if as_candidate else "sandbox_test")
        if as_candidate:
            self.callers.candidate_globals = module.__dict__
        else:
            sys.modules["sandbox_test"] = module
        self.guard.armed = True
        try:
            exec(compile(req["code"], "<sandbox-test>", "exec"), module.__dict__)
            return {"ok": True, "sandbox": self.guard.take(), "tampered": self.verify_instrumentation()}
        except MemoryError:
            raise
        except BaseException as exc:
            return {"ok": False, "error": describe(exc), "sandbox": self.guard.take(),
                    "tampered": self.verify_instrumentation()}
        finally:
            self.guard.armed = False
            if as_candidate:
                self.callers.candidate_globals = None
            sys.modules.pop("sandbox_test", None)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m core.verification.worker",
                                     description="The sandboxed worker (started by core.verification.sandbox).")
    parser.add_argument("--role", choices=tuple(ROLES), required=True)
    parser.add_argument("--backend", required=True)
    parser.add_argument("--device", choices=("cpu", "cuda"), required=True)
    parser.add_argument("--scratch", required=True)
    parser.add_argument("--in-fd", type=int, required=True)
    parser.add_argument("--out-fd", type=int, required=True)
    parser.add_argument("--memory-mb", type=int, default=8192)
    parser.add_argument("--file-size-mb", type=int, default=256)
    parser.add_argument("--open-files", type=int, default=1024)
    parser.add_argument("--isolate", type=int, default=1)
    parser.add_argument("--parent-pid", type=int, default=0)
    parser.add_argument("--nice", type=int, default=0, help="added to this process's CPU niceness (Limits.nice)")
    args = parser.parse_args(argv)
    # The judge that started us may die without a word (SIGKILL, a time limit): leave with it, even in
    # the middle of a request, so no orphan keeps the GPU's memory (core.verification.lifeline).
    from core.verification.lifeline import watch_parent

    watch_parent(args.parent_pid or os.getppid())
    # The channel lives on high descriptors; stdout/stderr go to the worker log.
    in_fd, out_fd = os.dup2(args.in_fd, 900), os.dup2(args.out_fd, 901)
    os.close(args.in_fd)
    os.close(args.out_fd)
    worker = WorkerMain(args)
    write_frame(out_fd, worker.setup())
    while True:
        try:
            req = read_frame(in_fd)
        except EOFError:
            return
        if req.get("op") == Op.EXIT:
            # Leave at once: the interpreter's shutdown with torch and Triton loaded took ~1.8 s, which a
            # one-shot `core.verify` paid on exit. Nothing here outlives the process (the judge removes
            # the scratch directory; exports and held outputs die with it).
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        try:
            answer = worker.handle(req)
        except MemoryError as exc:
            worker.unload()
            answer = {"ok": False, "status": "oom", "error": describe(exc)}
        except Exception as exc:
            answer = {"ok": False, "error": describe(exc), "traceback": traceback.format_exc()[-2000:]}
        try:
            write_frame(out_fd, answer)
        except TypeError as exc:  # an answer with something unsendable (a candidate returned an object)
            write_frame(out_fd, {"ok": False, "error": f"unsendable result: {exc}"})
        sys.stdout.flush()

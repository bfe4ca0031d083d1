"""The sandboxed worker: ``python -m core.verification.worker`` (started by :mod:`core.verification.sandbox`, never by hand).

It isolates itself (namespaces where the kernel allows, limits, an audit hook), imports the
toolchain once (torch + the backend), then answers requests on its private channel:

``reference``  run the *task* (never a candidate): draw inputs from the given seeds, return
               inputs and reference outputs (reference workers only)
``load``       import a candidate from source and build ``ModelNew`` (candidate workers only)
``run``        call the loaded ``ModelNew.forward`` on given inputs and report what happened
``collect``    run a check's worker-side ``collect(session)`` (GPU timing, sanitizers ...)
``unload``     forget the candidate
``exit``

Observations go back as plain data; nothing is decided here (see :mod:`core.verification.evidence`).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import importlib.util
import os
import resource
import sys
import time
import traceback
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Iterator

from core.verification.evidence import input_digests
from core.verification.sandbox import read_frame, to_device, write_frame

CANDIDATE_MODULE = "kz_candidate"
MAX_ERROR_CHARS = 600

# --------------------------------------------------------------------------- isolation

_CLONE_NEWNS, _CLONE_NEWNET, _CLONE_NEWUSER = 0x00020000, 0x40000000, 0x10000000
_MS_RDONLY, _MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18
_SKIP_REMOUNT_TYPES = {"proc", "sysfs", "cgroup", "cgroup2", "devpts", "mqueue"}


def isolate(scratch: str) -> str:
    """Enter private network + mount namespaces; make every mount read-only except ``scratch``.

    Returns a one-line description of what was achieved (the fallback keeps limits + audit hook).
    """
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.getuid(), os.getgid()
    flags = _CLONE_NEWNS | _CLONE_NEWNET
    if libc.unshare(flags) != 0:
        if libc.unshare(flags | _CLONE_NEWUSER) != 0:
            return f"fallback: no namespaces (unshare: {os.strerror(ctypes.get_errno())}); limits + audit hook only"
        try:  # map ourselves to root inside the new user namespace so we may remount
            Path("/proc/self/setgroups").write_text("deny")
            Path("/proc/self/uid_map").write_text(f"0 {uid} 1")
            Path("/proc/self/gid_map").write_text(f"0 {gid} 1")
        except OSError as exc:
            return f"partial: user+net namespaces, mounts writable ({exc}); audit hook guards writes"
    if libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        return f"partial: network namespace only (mount private: {os.strerror(ctypes.get_errno())}); audit hook guards writes"
    if libc.mount(scratch.encode(), scratch.encode(), None, _MS_BIND, None) != 0:
        return f"partial: network namespace only (bind scratch: {os.strerror(ctypes.get_errno())}); audit hook guards writes"
    os.chdir(scratch)  # the working directory still pointed at the directory under the bind mount
    failed = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        parts = line.split()
        target, fstype = parts[1].replace("\\040", " "), parts[2]
        if target == scratch or fstype in _SKIP_REMOUNT_TYPES:
            continue
        if libc.mount(b"none", target.encode(), None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY, None) != 0:
            failed.append(target)
    probe = Path("/") / f".kz-write-probe-{os.getpid()}"
    try:
        probe.write_text("x")
        probe.unlink()
        return "partial: network namespace; root filesystem stayed writable; audit hook guards writes"
    except OSError:
        pass
    ro = "read-only filesystem except scratch" + (f" (could not remount {len(failed)} mounts)" if failed else "")
    return f"namespaces: private network (no interfaces up), private mounts, {ro}"


def warm_gpu() -> str:
    """Do once, while the pool's worker is idle, what every verdict's first GPU work would otherwise
    pay for inside the verdict: the CUDA context, the lazily loaded kernels of drawing inputs on the
    GPU, digesting, poisoning and comparing them, and the timer's filler kernel (Triton compiles it,
    before the audit hook forbids starting ptxas). On the H200 a cold worker's first verdict took
    ~14 s against 1-3 s for the next. Returns how it went, for the worker's hello."""
    t = time.perf_counter()
    try:
        import torch

        from core.verification.evidence import compare_outputs, device_fingerprint
        from core.timing import fresh_arguments, warm_filler

        torch.manual_seed(0)
        x = torch.randn(4096, device="cuda")
        y = fresh_arguments([x], 0)(0)[0]
        torch.full_like(x, float("nan"))
        compare_outputs([x], [x.clone()])
        compare_outputs([x], [y])
        device_fingerprint(x)
        torch.randint(0, 10, (16,), device="cuda")
        x.cpu()
        warm_filler()
        torch.cuda.synchronize()
    except Exception as exc:  # the worker still serves; its first verdict pays what is left
        return f"failed after {time.perf_counter() - t:.2f} s: {type(exc).__name__}: {exc}"[:300]
    return f"{time.perf_counter() - t:.2f} s"


def set_limits(memory_mb: int, file_size_mb: int, open_files: int, device: str) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_mb << 20, file_size_mb << 20))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(open_files, hard), hard))
    if device == "cpu" and memory_mb > 0:  # CUDA reserves huge virtual ranges; cap only on CPU
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))


def set_cpu_budget(seconds: int) -> None:
    """RLIMIT_CPU is cumulative: allow ``seconds`` more CPU time from now (SIGXCPU ends the worker)."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    total = int(used.ru_utime + used.ru_stime) + max(1, seconds)
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if hard != resource.RLIM_INFINITY:
        total = min(total, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (total, hard))


class AuditGuard:
    """``sys.addaudithook`` guard: no writes outside scratch, no sockets, no subprocesses (except
    the toolchain's own compilers), no signals to other processes. Violations are recorded and
    refused with ``PermissionError``. A hook cannot be removed once added."""

    WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    PATH_EVENTS = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.symlink",
                   "os.link", "os.truncate", "shutil.rmtree", "shutil.move", "os.utime"}
    BLOCKED_EVENTS = {"socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
                      "os.system", "os.fork", "os.forkpty",
                      "os.startfile", "sys.setprofile", "sys.settrace",
                      "sys.remote_exec"}

    # Events that start a program, and the position of the program's path in their arguments.
    EXEC_EVENTS = {"subprocess.Popen": 0, "os.posix_spawn": 0, "os.exec": 0, "os.spawn": 1}

    def __init__(self, scratch: str, allowed_exec_dirs: list[str]):
        # allowed_exec_dirs: directories whose programs may start, or single programs (exact paths).
        self.scratch = os.path.realpath(scratch)
        self.allowed_exec_dirs = [os.path.realpath(d) for d in allowed_exec_dirs]
        self.violations: list[str] = []
        self.armed = False

    def _inside_scratch(self, path: Any) -> bool:
        if isinstance(path, int):
            return True
        try:
            p = os.fsdecode(path)
        except TypeError:
            return False
        if p in ("/dev/null",):
            return True
        real = os.path.realpath(os.path.join(self.scratch, p))
        return real == self.scratch or real.startswith(self.scratch + os.sep)

    def _refuse(self, what: str) -> None:
        self.violations.append(what)
        raise PermissionError(f"sandbox: {what} is not allowed in a candidate")

    def __call__(self, event: str, args: tuple) -> None:
        if not self.armed:
            return
        if event == "open":
            path, mode, flags = (list(args) + [None, None, None])[:3]
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & self.WRITE_FLAGS)
            if writing and not self._inside_scratch(path):
                self._refuse(f"writing {os.fsdecode(path)!s} outside the scratch directory")
        elif event in self.PATH_EVENTS:
            paths = [a for a in args if isinstance(a, (str, bytes, os.PathLike))]
            for p in paths:
                if not self._inside_scratch(p):
                    self._refuse(f"{event} on {os.fsdecode(p)} outside the scratch directory")
        elif event in self.EXEC_EVENTS:
            # subprocess.Popen raises its own event and then os.posix_spawn / os.exec for the same
            # program; each must name an executable inside the toolchain's directories (ptxas ...).
            path = args[self.EXEC_EVENTS[event]] if len(args) > self.EXEC_EVENTS[event] else None
            if isinstance(path, (list, tuple)):
                path = path[0] if path else None
            exe = os.path.realpath(os.fsdecode(path)) if isinstance(path, (str, bytes, os.PathLike)) else ""
            if not exe or not any(exe == d or exe.startswith(d + os.sep) for d in self.allowed_exec_dirs):
                self._refuse(f"starting a subprocess ({exe or args!r})")
        elif event in ("os.kill", "os.killpg", "signal.pthread_kill"):
            target = args[0] if args else None
            if target not in (os.getpid(), 0):
                self._refuse(f"sending a signal to process {target}")
        elif event in self.BLOCKED_EVENTS:
            self._refuse(f"{event}")

    def take(self) -> list[str]:
        out, self.violations = self.violations, []
        return out


# --------------------------------------------------------------------------- the ATen audit


def make_audit_mode(tracker: Any):
    """A TorchDispatchMode that records every ATen compute op run outside a kernel launch."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    allowed = ALLOWED_ATEN
    float_width = {torch.float64: 8, torch.float32: 4, torch.float16: 2, torch.bfloat16: 2}

    class AtenAudit(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[str] = []
            self.downcasts: list[str] = []

        def _narrowing(self, src: Any, dst: Any) -> bool:
            return src in float_width and dst in float_width and float_width[dst] < float_width[src]

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if not tracker.inside:
                name = func.overloadpacket.__name__
                if name not in allowed:
                    if str(func) not in self.ops:
                        self.ops.append(str(func))
                elif name == "_to_copy" and args and isinstance(args[0], torch.Tensor):
                    dst = kwargs.get("dtype")
                    if dst is not None and self._narrowing(args[0].dtype, dst):
                        self.downcasts.append(f"{args[0].dtype} -> {dst}")
                elif name == "copy_" and len(args) >= 2 and all(isinstance(a, torch.Tensor) for a in args[:2]):
                    if self._narrowing(args[1].dtype, args[0].dtype):
                        self.downcasts.append(f"{args[1].dtype} -> {args[0].dtype}")
            return func(*args, **kwargs)

    return AtenAudit()


# Allocation, views, copies and metadata: what ModelNew.forward may do outside its kernels.
ALLOWED_ATEN = frozenset("""
empty empty_like empty_strided new_empty new_empty_strided zeros zeros_like ones ones_like full full_like
new_zeros new_ones new_full scalar_tensor fill_ zero_ arange lift_fresh lift_fresh_copy detach alias
resize_ set_ view _unsafe_view reshape _reshape_alias as_strided expand expand_as permute transpose t
squeeze unsqueeze slice select narrow unbind split split_with_sizes chunk flatten unflatten view_as movedim
unfold contiguous clone copy_ _to_copy to _copy_from _copy_from_and_resize sym_size sym_stride sym_numel
sym_storage_offset is_contiguous size stride numel dim is_same_size is_pinned record_stream
_has_compatible_shallow_copy_type real view_as_real view_as_complex
""".split())


# --------------------------------------------------------------------------- helpers


def describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    cause = exc.__cause__ or exc.__context__
    if cause is not None and type(cause).__name__ not in text:
        text += f" (caused by {type(cause).__name__}: {cause})"
    return text[:MAX_ERROR_CHARS]


# Errors only the sandbox produces: a refused write (read-only mounts) or network access (no interfaces).
_SANDBOX_ERRNOS = {30: "writing outside the scratch directory (refused by the read-only mount)",
                   101: "network access (the worker has no network)", 99: "network access (the worker has no network)"}
_SANDBOX_MESSAGES = {"Read-only file system": _SANDBOX_ERRNOS[30], "Network is unreachable": _SANDBOX_ERRNOS[101]}


def sandbox_escape(exc: BaseException) -> str | None:
    """Describe ``exc`` if it is the sandbox refusing something (also through C++ layers)."""
    seen = 0
    while exc is not None and seen < 8:
        errno = getattr(exc, "errno", None)
        if errno in _SANDBOX_ERRNOS:
            return _SANDBOX_ERRNOS[errno]
        for text, what in _SANDBOX_MESSAGES.items():
            if text in str(exc):
                return what
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def flatten_outputs(out: Any) -> list[Any]:
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        flat: list[Any] = []
        for item in out:
            flat.extend(flatten_outputs(item))
        return flat
    return [out]


def seed_everything(seed: int) -> None:
    """Seed every generator a task's get_inputs may draw from, so two workers draw the same inputs."""
    import random

    import torch

    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy

        numpy.random.seed(seed % (1 << 32))
    except ImportError:
        pass


def draw_inputs(module: Any, seed: int, scale: float, device: str = "cpu") -> list[Any]:
    """The task's inputs for one trial: ``get_inputs()`` under ``seed``, floating tensors times ``scale``.

    On ``cuda`` the tensors ``get_inputs`` creates without naming a device are drawn on the GPU
    (``torch.device`` as the default): drawing 100 MB on the CPU and copying it over takes longer
    than the kernel's whole trial. A ``get_inputs`` that cannot run so (a CPU generator, numpy) is
    drawn on the CPU. Every worker draws the same way, so equal seeds still give equal inputs.
    """
    import torch

    seed_everything(int(seed))
    if device == "cpu":
        inputs = list(module.get_inputs())
    else:
        try:
            with torch.device(device):
                inputs = list(module.get_inputs())
        except Exception:
            seed_everything(int(seed))
            inputs = list(module.get_inputs())
    if scale != 1.0:
        inputs = [x * scale if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
    return inputs


def cpu_copy(values: list[Any]) -> list[Any]:
    import torch

    return [v.detach().to("cpu", copy=True) if isinstance(v, torch.Tensor) and v.is_contiguous()
            else (to_device(v.detach(), "cpu") if isinstance(v, torch.Tensor) else v) for v in values]


def load_module(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # triton reads kernel source through the module's file
    spec.loader.exec_module(module)
    return module


def synchronize(device: str) -> None:
    import torch

    if device == "cuda" and torch.cuda.is_available():
        torch.cuda.synchronize()


class Float64Truth:
    """The task's ``Model`` run in float64 on float64 copies of the same inputs (reference workers).

    Judges accuracy against the truth rather than against PyTorch's fp32 rounding: an
    ill-conditioned composition (a normalisation after a bias, at extreme input scales) amplifies
    rounding noise, and the fp32 reference carries that noise too. Gives up quietly (``note`` says
    why; the judge then compares with the fp32 reference alone) when the model cannot run in
    float64, draws random numbers, or the data exceeds ``max_elements`` (0: never compute).
    """

    def __init__(self, model: Any, device: str, max_elements: int):
        self.device, self.max_elements = device, max_elements
        self.model: Any = None
        self.note = "" if max_elements > 0 else "float64 reference disabled"
        self._source = model

    def refuse(self, why: str) -> None:
        self.model, self.note = None, self.note or why

    def rng_state(self) -> list[bytes]:
        import torch

        states = [torch.get_rng_state()]
        if self.device == "cuda" and torch.cuda.is_available():
            states.append(torch.cuda.get_rng_state())
        return [bytes(s.numpy().tobytes()) for s in states]

    def possible(self, inputs: list[Any], reference: list[Any]) -> bool:
        """Whether a float64 run can be made and used here (else ``note`` says why)."""
        import torch

        if self.note:
            return False
        floating = [e for e in reference if isinstance(e, torch.Tensor) and e.is_floating_point()]
        if not floating or all(e.dtype == torch.float64 for e in floating):
            self.note = "no output narrower than float64: the reference is its own float64 run"
            return False
        size = sum(x.numel() for x in [*inputs, *reference] if isinstance(x, torch.Tensor))
        if size > self.max_elements:
            self.note = f"float64 reference skipped: {size} elements > float64_max_elements={self.max_elements}"
            return False
        return True

    def outputs(self, inputs: list[Any], reference: list[Any], keep_device: bool = False) -> list[Any] | None:
        """float64 outputs aligned with ``reference`` (None where an output has no float64 truth);
        CPU copies unless ``keep_device`` (a keeper compares on the device)."""
        import copy

        import torch

        if not self.possible(inputs, reference):
            return None
        try:
            if self.model is None:
                self.model = copy.deepcopy(self._source).double() if isinstance(self._source, torch.nn.Module) \
                    else self._source
            wide = [x.detach().to(torch.float64) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                    for x in inputs]
            with torch.no_grad():
                out = flatten_outputs(self.model(*wide))
            synchronize(self.device)
        except MemoryError:
            raise
        except Exception as exc:  # e.g. a float32-only op or a hard-coded dtype: no truth for this task
            self.refuse(f"the task does not run in float64 ({describe(exc)[:200]})")
            return None
        if len(out) != len(reference):
            self.refuse("the task returns a different number of outputs in float64")
            return None
        aligned = []
        for e, t in zip(reference, out):
            usable = (isinstance(e, torch.Tensor) and isinstance(t, torch.Tensor) and e.is_floating_point()
                      and t.dtype == torch.float64 and t.shape == e.shape)
            aligned.append(t if usable else None)
        return aligned if keep_device else cpu_copy(aligned)


# --------------------------------------------------------------------------- session


class Session:
    """A loaded candidate in a candidate worker; what ``collect`` hooks of checks receive.

    :ivar model: the ``ModelNew`` instance (built with the verification's init seed).
    :ivar module: the imported candidate module.
    :ivar backend: the backend plugin object (``launch_tracker()`` ...).
    :ivar device: ``"cpu"`` or ``"cuda"``.
    """

    def __init__(self, worker: "WorkerMain", module: Any, model: Any):
        self.worker, self.module, self.model = worker, module, model
        self.backend, self.device = worker.backend, worker.device
        self.task: dict[str, Any] | None = None
        self.task_module: Any = None  # imported on demand to draw inputs from a seed
        self.init_seed: int = 0
        self.prepared: dict[str, Any] = {}  # check name -> what its prepare() built for its collect()
        self._held: list[Any] = []  # outputs of earlier calls stay alive, so addresses are unique
        self._held_ptrs: set[int] = set()

    def poison(self, inputs: list[Any]) -> None:
        """Fill memory the allocator is likely to hand out next with NaN (uninitialised outputs fail)."""
        import torch

        for x in inputs:
            if isinstance(x, torch.Tensor) and x.numel():
                dtype = x.dtype if x.is_floating_point() else torch.float32
                junk = torch.full((x.numel(),), float("nan"), dtype=dtype, device=x.device)
                del junk

    def call(self, inputs: list[Any], order_seed: int | None = None, inputs_as_digest: bool = False,
             export: bool = False) -> dict[str, Any]:
        """Run ``forward`` once under launch counting, the ATen audit and the backend's checks.
        ``export``: the outputs stay on the device for the verification's keeper (core.verification.devicemem)."""
        import torch

        caps = self.backend.capabilities(self.device)
        obs: dict[str, Any] = {"launches": 0, "kernels": [], "audit": [], "downcasts": [], "oob": []}
        self.poison(inputs)
        start = time.perf_counter()
        with ExitStack() as stack:
            tracker = stack.enter_context(self.backend.launch_tracker())
            oob = stack.enter_context(self.backend.bounds_checking()) if "bounds_check" in caps else []
            if order_seed is not None and "program_order" in caps:
                stack.enter_context(self.backend.program_order(order_seed))
            audit = make_audit_mode(tracker)
            try:
                self.worker.guard.armed = True
                with torch.no_grad(), audit:
                    out = self.model(*inputs)
                synchronize(self.device)
                obs["output"] = flatten_outputs(out)
            except MemoryError:
                raise
            except Exception as exc:  # the candidate's own failure: an observation, not a crash
                obs["error"] = describe(exc)
                escape = sandbox_escape(exc)
                if escape and not self.worker.guard.violations:
                    self.worker.guard.violations.append(escape)
            finally:
                self.worker.guard.armed = False
            obs.update(launches=tracker.count, kernels=list(tracker.kernels)[:16], audit=audit.ops[:16],
                       downcasts=sorted(set(audit.downcasts))[:8], oob=list(oob)[:16])
        obs["seconds"] = time.perf_counter() - start
        outputs = obs.get("output")
        if outputs is not None:
            ptrs = {o.untyped_storage().data_ptr() for o in outputs if isinstance(o, torch.Tensor) and o.numel()}
            obs["output_reused"] = bool(ptrs & self._held_ptrs)
            self._held_ptrs |= ptrs
            self._held.append(outputs)
            obs["output"] = self.worker.exports.export(outputs) if export else cpu_copy(outputs)
        if inputs_as_digest:
            obs["inputs_digest_after"] = input_digests(inputs)
        else:
            obs["inputs_after"] = cpu_copy(inputs)
        obs["sandbox"] = self.worker.guard.take()
        return obs


# --------------------------------------------------------------------------- the worker loop


class WorkerMain:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.role, self.device, self.scratch = args.role, args.device, args.scratch
        self.session: Session | None = None
        self.loaded = 0
        self.held: list[dict[str, Any]] | None = None  # tensors of the last "hold" answer
        self.vaults: dict[str, Any] = {}  # keeper: verification token -> core.verification.devicemem.Vault
        self.exports: Any = None  # candidate: outputs handed to a keeper (core.verification.devicemem.Exports)

    def setup(self) -> dict[str, Any]:
        isolation = isolate(self.scratch) if self.args.isolate else "off: isolation disabled by configuration"
        set_limits(self.args.memory_mb, self.args.file_size_mb, self.args.open_files, self.device)
        import torch  # noqa: F401  (warm: the point of a pool)

        from core.plugins import registry

        self.backend = registry("backend").create(self.args.backend)
        self.backend.prepare_worker(self.device)
        warmed = warm_gpu() if self.device == "cuda" else None
        exec_dirs = list(getattr(self.backend, "compiler_dirs", lambda: [])())
        self.guard = AuditGuard(self.scratch, exec_dirs)
        sys.addaudithook(self.guard)
        self.checks = {}
        from core.verification.devicemem import Exports

        self.exports = Exports(self.device, self.scratch)
        return {"op": "hello", "pid": os.getpid(), "isolation": isolation, "role": self.role,
                "torch": torch.__version__, "python": sys.version.split()[0], "gpu_warm_up": warmed}

    # -- requests

    # What "hold" keeps back from a run/reference answer until "take_held" asks for it.
    HELD_KEYS = ("output", "inputs_after", "truth", "inputs")

    def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        op = req.get("op")
        set_cpu_budget(int(req.get("cpu_s", 600)))
        if op in ("reference", "run"):
            self.held = None
            if req.get("hold"):  # the judge holds the GPU lock for this answer, then fetches the tensors
                answer = self.handle({k: v for k, v in req.items() if k != "hold"})
                items = answer.get("observations") or answer.get("trials") or []
                if answer.get("ok"):
                    self.held = [{k: item.pop(k) for k in self.HELD_KEYS if k in item} for item in items]
                    answer["held"] = True
                return answer
        if op == "take_held":
            held, self.held = self.held, None
            return {"ok": held is not None, "held": held, "error": None if held is not None else "nothing is held"}
        if op == "reference" and self.role == "reference":
            return self.reference(req)
        if op in ("adopt", "compare", "equal", "fetch", "forget") and self.role == "reference":
            return self.keeper(req)
        if op == "baseline" and self.role == "reference":
            return self.baseline(req)
        if op == "drop_exports" and self.role == "candidate":
            self.exports.drop()
            return {"ok": True}
        if op == "precompile" and self.role == "candidate":
            return self.precompile(req)
        if op == "load" and self.role == "candidate":
            return self.load(req)
        if op == "run" and self.role == "candidate":
            return self.run(req)
        if op == "collect" and self.role == "candidate":
            return self.collect(req)
        if op == "unload":
            self.unload()
            return {"ok": True}
        if op == "ping":
            return {"ok": True, "pid": os.getpid()}
        if op == "exec_test" and os.environ.get("KERNELZERO_SANDBOX_TESTING") == "1":
            return self.exec_test(req)
        return {"ok": False, "error": f"worker of role {self.role!r} does not answer {op!r}"}

    @contextmanager
    def _task_module(self, source: str) -> Iterator[Any]:
        """The task's source imported from a scratch file under a fresh module name; both gone after."""
        path = Path(self.scratch) / f"task_{self.loaded}.py"
        self.loaded += 1
        path.write_text(source)
        name = f"kz_task_{self.loaded}"
        try:
            yield load_module(path, name)
        finally:
            sys.modules.pop(name, None)
            path.unlink(missing_ok=True)

    def reference(self, req: dict[str, Any]) -> dict[str, Any]:
        import torch

        device = self.device
        try:
            with self._task_module(req["source"]) as module:
                init_inputs = list(module.get_init_inputs())
                torch.manual_seed(int(req["init_seed"]))
                model = module.Model(*init_inputs).to(device).eval()
                truth = Float64Truth(model, device, int(req.get("float64_max_elements", 0)))
                keep = req.get("keep")  # a verification token: outputs stay here (core.verification.devicemem.Vault)
                later = bool(req.get("float64_later")) or bool(keep)
                vault = None
                trials = []
                # "digest" mode: the candidate worker draws the inputs itself from the seed, so only
                # digests travel, when get_inputs is reproducible under a seed (checked here, once).
                by_seed, redrawn, redrawn_digest = False, None, None
                if req.get("inputs_mode") == "digest" and req["seeds"]:
                    # digested where the candidate's worker digests them: on the device (the kind of
                    # digest follows the tensor's device, core.verification.evidence.input_digests)
                    seed, scale = req["seeds"][0], req["scales"][0]
                    first = input_digests(to_device(draw_inputs(module, seed, scale, device), device))
                    redrawn = to_device(draw_inputs(module, seed, scale, device), device)
                    redrawn_digest = input_digests(redrawn)
                    by_seed = first == redrawn_digest
                if keep:
                    from core.verification.devicemem import Vault

                    vault = Vault(module, model, device, truth, list(req["seeds"]), list(req["scales"]),
                                  None if by_seed else [], int(req.get("trials", len(req["seeds"]))))
                for i, (seed, scale) in enumerate(zip(req["seeds"], req["scales"])):
                    inputs = redrawn if i == 0 and redrawn is not None else draw_inputs(module, seed, scale, device)
                    dev_inputs = to_device(inputs, device)
                    rng_before = truth.rng_state()
                    with torch.no_grad():
                        out = flatten_outputs(model(*dev_inputs))
                    synchronize(device)
                    if truth.rng_state() != rng_before:
                        truth.refuse("the task's forward draws random numbers")
                    trial = {"output": vault.keep_reference(i, out) if vault is not None else cpu_copy(out)}
                    if vault is not None and vault.inputs is not None:
                        vault.inputs.append(dev_inputs)
                    if later:  # the judge asks again, with the truth, only if a comparison needs it
                        truth.possible(dev_inputs, out)
                    else:
                        trial["truth"] = truth.outputs(dev_inputs, out)
                    if by_seed:
                        trial["inputs_digest"] = redrawn_digest if i == 0 else input_digests(dev_inputs)
                    else:
                        trial["inputs"] = cpu_copy(inputs)
                    trials.append(trial)
                if vault is not None:
                    self.vaults[str(keep)] = vault
                return {"ok": True, "init_inputs": init_inputs, "trials": trials, "truth_note": truth.note,
                        "inputs_by_seed": by_seed, "float64_pending": later and not truth.note and vault is None,
                        "kept": vault is not None}
        except MemoryError:
            raise
        except Exception as exc:
            return {"ok": False, "error": describe(exc), "traceback": traceback.format_exc()[-2000:]}

    def keeper(self, req: dict[str, Any]) -> dict[str, Any]:
        """A verification's outputs, held here: adopt the candidate's, compare, fetch, forget."""
        from dataclasses import asdict

        from core.verification.devicemem import TransportError
        from core.verification.evidence import bitwise_equal, compare_outputs

        op, token = req["op"], str(req.get("token"))
        if op == "forget":
            self.vaults.pop(token, None)
            gc.collect()
            return {"ok": True}
        vault = self.vaults.get(token)
        if vault is None:
            return {"ok": False, "error": f"no verification {token!r} is kept here"}
        try:
            if op == "adopt":
                runs = []
                for run in req["runs"]:
                    try:
                        adopted = vault.adopt(run["outputs"], int(run["expect"]), req.get("allowed_dir"))
                        runs.append({"outputs": adopted})
                    except TransportError as exc:  # a descriptor the candidate's process forged
                        runs.append({"error": describe(exc), "forged": True})
                    except (RuntimeError, ValueError, TypeError, KeyError) as exc:
                        runs.append({"error": describe(exc)})  # that run's outputs cannot be judged
                synchronize(self.device)
                return {"ok": True, "runs": runs}
            if op == "equal":
                a, b = vault.resolve(req["a"]), vault.resolve(req["b"])
                return {"ok": True, "equal": len(a) == len(b) and all(bitwise_equal(x, y) for x, y in zip(a, b))}
            if op == "fetch":
                return {"ok": True, "values": cpu_copy(vault.resolve(req["items"]))}
            tolerances = {k: tuple(v) for k, v in (req.get("tolerances") or {}).items()}
            run = vault.run_of(req["expected"])
            truth = (lambda: vault.truth_of(run, tolerances)) if req.get("truth") and run is not None else None
            cmp = compare_outputs(vault.resolve(req["expected"]), vault.resolve(req["got"]), tolerances=tolerances,
                                  scale_aware=bool(req.get("scale_aware")), truth=truth,
                                  noise_factor=float(req["noise_factor"]))
            return {"ok": True, "comparison": asdict(cmp), "truth_note": vault.truth_note(),
                    "truth_trusted": bool(vault.truth_trusted)}
        except MemoryError:
            raise
        except Exception as exc:
            return {"ok": False, "error": describe(exc)}

    def baseline(self, req: dict[str, Any]) -> dict[str, Any]:
        """A check's measurement of the task's own model (e.g. its eager time), in this trusted process."""
        from core.plugins import registry

        try:
            check = registry("verifier").create(req["check"], **req.get("config", {}))
            with self._task_module(req["source"]) as module:
                return {"ok": True, "data": check.baseline(module, int(req["init_seed"]))}
        except MemoryError:
            raise
        except Exception as exc:
            return {"ok": False, "error": describe(exc)}

    def precompile(self, req: dict[str, Any]) -> dict[str, Any]:
        """The backend's compile of what the candidate's text shows (no candidate code runs), ahead of
        ``load``, which the judge sends holding the GPU; a backend without ``precompile`` skips it."""
        ahead = getattr(self.backend, "precompile", None)
        if ahead is None:
            return {"ok": True, "precompiled": 0}
        self.guard.armed = True  # as in load: the compiler reads what the source includes
        try:
            return {"ok": True, **ahead(req["source"], self.device), "sandbox": self.guard.take()}
        except MemoryError:
            raise
        except Exception as exc:
            return {"ok": False, "error": describe(exc), "sandbox": self.guard.take()}
        finally:
            self.guard.armed = False

    def load(self, req: dict[str, Any]) -> dict[str, Any]:
        import torch

        if self.session is not None or CANDIDATE_MODULE in sys.modules:
            # the judge unloads after each verdict, before asking for the GPU; a full collection here
            # would hold the GPU lock for ~0.1 s
            self.unload()
        path = Path(self.scratch) / f"candidate_{self.loaded}.py"
        self.loaded += 1
        path.write_text(req["source"])
        self.guard.armed = True
        try:
            module = load_module(path, CANDIDATE_MODULE)
            self.backend.load(module, self.device)
            if not hasattr(module, "ModelNew"):
                raise AttributeError("the candidate module defines no ModelNew")
            model = None
            if req.get("construct", True):  # compile-only verdicts never build or call the model
                torch.manual_seed(int(req["init_seed"]))
                model = module.ModelNew(*req["init_inputs"])
                if isinstance(model, torch.nn.Module):
                    model = model.to(self.device).eval()
        except MemoryError:
            raise
        except BaseException as exc:  # SystemExit at import too
            escape = sandbox_escape(exc)
            if escape and not self.guard.violations:
                self.guard.violations.append(escape)
            return {"ok": False, "error": describe(exc), "sandbox": self.guard.take()}
        finally:
            self.guard.armed = False
        self.session = Session(self, module, model)
        self.session.task = req.get("task")  # plain dict (Task.to_dict); a check's collect() may read it
        self.session.init_seed = int(req["init_seed"])
        return {"ok": True, "sandbox": self.guard.take()}

    def run(self, req: dict[str, Any]) -> dict[str, Any]:
        if self.session is None:
            return {"ok": False, "error": "no candidate is loaded"}
        observations = []
        export = bool(req.get("export"))
        self.exports.drop()  # the keeper took the last run's outputs before this request was sent
        for item in req["runs"]:
            if "seed" in item:  # draw the task's inputs here, outside the guard: task code is trusted
                try:
                    inputs = to_device(draw_inputs(self.task_module(), item["seed"], item.get("scale", 1.0),
                                                   self.device), self.device)
                except MemoryError:
                    raise
                except Exception as exc:
                    return {"ok": False, "error": f"drawing the task's inputs failed: {describe(exc)}"}
                before = input_digests(inputs)
                obs = self.session.call(inputs, order_seed=item.get("order_seed"), inputs_as_digest=True,
                                        export=export)
                obs["inputs_digest_before"] = before
            else:
                inputs = to_device(list(item["inputs"]), self.device)
                obs = self.session.call(inputs, order_seed=item.get("order_seed"), export=export)
            obs["name"] = item["name"]
            observations.append(obs)
        return {"ok": True, "observations": observations}

    def collect(self, req: dict[str, Any]) -> dict[str, Any]:
        from core.plugins import registry

        if self.session is None:
            return {"ok": False, "error": "no candidate is loaded"}
        check = registry("verifier").create(req["check"], **req.get("config", {}))
        try:
            if req.get("phase") == "prepare":
                return {"ok": True, "data": check.prepare(self.session)}
            return {"ok": True, "data": check.collect(self.session)}
        except MemoryError:
            raise
        except Exception as exc:
            return {"ok": False, "error": describe(exc)}

    def task_module(self) -> Any:
        """The loaded session's task, imported once (only its ``get_inputs`` is called here)."""
        session = self.session
        if session.task_module is None:
            task = session.task or {}
            if not task.get("source"):
                raise ValueError("the verifier sent no task source to draw inputs from")
            path = Path(self.scratch) / f"task_inputs_{self.loaded}.py"
            path.write_text(task["source"])
            try:
                session.task_module = load_module(path, f"kz_task_inputs_{self.loaded}")
            finally:
                path.unlink(missing_ok=True)
        return session.task_module

    def unload(self) -> None:
        if self.exports is not None:
            self.exports.drop()
        if self.session is not None and self.session.task_module is not None:
            sys.modules.pop(self.session.task_module.__name__, None)
        self.session = None
        sys.modules.pop(CANDIDATE_MODULE, None)
        gc.collect()

    def exec_test(self, req: dict[str, Any]) -> dict[str, Any]:
        """Tests only (``KERNELZERO_SANDBOX_TESTING=1``): run a snippet under the sandbox guard."""
        self.guard.armed = True
        try:
            exec(compile(req["code"], "<sandbox-test>", "exec"), {"__name__": "sandbox_test"})
            return {"ok": True, "sandbox": self.guard.take()}
        except MemoryError:
            raise
        except BaseException as exc:
            return {"ok": False, "error": describe(exc), "sandbox": self.guard.take()}
        finally:
            self.guard.armed = False


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m core.verification.worker", description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=("candidate", "reference"), required=True)
    parser.add_argument("--backend", required=True)
    parser.add_argument("--device", choices=("cpu", "cuda"), required=True)
    parser.add_argument("--scratch", required=True)
    parser.add_argument("--in-fd", type=int, required=True)
    parser.add_argument("--out-fd", type=int, required=True)
    parser.add_argument("--memory-mb", type=int, default=8192)
    parser.add_argument("--file-size-mb", type=int, default=256)
    parser.add_argument("--open-files", type=int, default=1024)
    parser.add_argument("--isolate", type=int, default=1)
    args = parser.parse_args(argv)
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
        if req.get("op") == "exit":
            return
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


if __name__ == "__main__":
    main()

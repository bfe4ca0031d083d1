"""The Triton backend: kernels written with ``@triton.jit``, run on the GPU when there is one and
in the Triton interpreter (``TRITON_INTERPRET=1``) on CPU.

Judge side it only parses (which functions are Triton kernels); worker side it counts launches and,
in the interpreter, bounds-checks memory accesses and shuffles program order
(:mod:`plugins.backends.triton_interp_checks`).
"""

from __future__ import annotations

import ast
import os
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

from core import hookimpl
from core.api.policy import BASE_BARRED_ATTRIBUTES, TORCH_MODULES, TRITON_HOOK_ATTRIBUTES, TYPING, StaticPolicy, module

GUIDE = """\
Write a Python module in KernelBench format that defines `class ModelNew(torch.nn.Module)` with the
same constructor arguments and `forward` signature as the reference `Model`. All of the arithmetic in
`forward` must happen in Triton kernels: functions decorated with `@triton.jit` (import triton and
triton.language as tl) that forward launches as `kernel[grid](...)`. Outside kernels, forward may only
allocate outputs (torch.empty, torch.empty_like), take views/reshape and make contiguous copies; calling
PyTorch compute (torch.relu, x + y, torch.matmul, F.softmax ...) is rejected. Mask every load and store
(`mask=offsets < n`) so sizes that are not a multiple of the block size stay in bounds, keep outputs in the
reference's dtype, and keep reductions numerically stable (subtract the row maximum before exp).
Do not read files, use the network, subprocesses, ctypes, numpy, or patch torch.
"""

# What a candidate may name (plugins/verifiers/policy): torch's tensors and modules, triton's
# decorators and helpers, triton.language in kernels; and the private paths the inductor teacher's
# wrapper keeps from Inductor's output (its allocators, the helper modules its kernels import).
STATIC_POLICY = StaticPolicy(
    backend="triton",
    modules=TORCH_MODULES + (
        TYPING,
        module("triton", members={"jit", "autotune", "heuristics", "Config", "cdiv", "next_power_of_2"}, device=True),
        module("triton.language", submodules=True, device=True),
        module("torch._inductor.runtime.triton_helpers", device=True),
        module("torch._inductor.runtime.triton_heuristics", members=()),
        module("torch._inductor.runtime.hints", members={"AutotuneHint", "ReductionHint", "TileHint", "DeviceProperties"}),
    ),
    exact_paths=frozenset({"torch.cuda._DeviceGuard"} | {f"torch._C._dynamo.guards.{name}" for name in (
        "_empty_strided_cpu", "_empty_strided_cuda", "_reinterpret_tensor", "assert_size_stride", "assert_alignment")}),
    barred_attributes=BASE_BARRED_ATTRIBUTES | {"data_ptr", *TRITON_HOOK_ATTRIBUTES},
    kernel_decorators=frozenset({"triton.jit"}),
    device_constants=frozenset({"triton.language.constexpr"}),
    launch_configurators=frozenset({"triton.heuristics", "triton.autotune", "triton.Config"}),
    callable_configurators=frozenset({"triton.heuristics"}),
)


@dataclass
class TritonLaunchTracker:
    count: int = 0
    kernels: list[str] = field(default_factory=list)
    depth: int = 0
    call: int = 0  # calls of forward since the candidate was loaded, this one excluded (autotune)

    @property
    def inside(self) -> bool:
        return self.depth > 0


_local = threading.local()
_calls = [0]  # forward calls since the last load (the interpreter's autotuner picks configs by it)


def _current_tracker() -> TritonLaunchTracker | None:
    return getattr(_local, "tracker", None)


def _decorator_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


# A ReLU in this backend's format: the candidate of the verifier's pool warm-up (core.verify.WARM_UP_TASK).
WARM_UP_CANDIDATE = """\
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _relu(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, tl.where(x > 0, x, 0.0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        _relu[(triton.cdiv(n, 4096),)](x, y, n, BLOCK=4096)
        return y
"""


@dataclass
class TritonBackend:
    """See the module docstring. ``interpret``: "auto" (interpreter iff device is cpu), "always", "never"."""

    name: str = "triton"
    language: str = "Triton"
    guide: str = GUIDE
    interpret: str = "auto"
    warm_up_candidate: str = WARM_UP_CANDIDATE
    static_policy: StaticPolicy = STATIC_POLICY
    # kernels the judge may use on its own very large CUDA tensors (the plain bound, the input digest)
    from plugins.backends.triton_judge_kernels import judge_kernels as _lend
    from plugins.backends.triton_toolchain import SANDBOX as sandbox  # what the worker must know of Triton
    judge_kernels = staticmethod(_lend)
    del _lend

    # -- judge side

    def supports(self, device: str) -> str | None:
        if device == "cpu":
            return None
        if device == "cuda":
            from core.api.devices import cuda_visible  # torch's import waits: the workers spawn first

            if cuda_visible():
                return None
            return ("backend 'triton' on device 'cuda' needs a GPU; none is visible. Use device=cpu "
                    "(kernels run in the Triton interpreter) or run on a machine with CUDA")
        return f"unknown device {device!r}; expected 'cpu' or 'cuda'"

    def detect_kernels(self, tree: ast.Module) -> list[str]:
        names = []
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if any(_decorator_name(d) == "jit" for d in node.decorator_list):
                    names.append(node.name)
        return names

    def _interpreted(self, device: str) -> bool:
        return self.interpret == "always" or (self.interpret == "auto" and device == "cpu")

    def worker_env(self, device: str) -> dict[str, str]:
        env = {"TRITON_DEFAULT_FP_FUSION": os.environ.get("TRITON_DEFAULT_FP_FUSION", "1")}
        if self._interpreted(device):
            env["TRITON_INTERPRET"] = "1"
        return env

    # -- worker side

    def prepare_worker(self, device: str) -> None:
        import triton  # noqa: F401
        from triton.runtime import jit as triton_jit

        classes: list[type] = [triton_jit.JITFunction]
        if self._interpreted(device):
            from triton.runtime import interpreter

            from plugins.backends import triton_gpu_compile, triton_interp_checks

            triton_interp_checks.install()
            triton_gpu_compile.install()  # a kernel body no GPU compiler accepts never runs here
            classes.append(interpreter.InterpretedFunction)
            _autotune_without_benchmarks()
        for cls in classes:
            _count_launches(cls)
        if device == "cuda" and not self._interpreted(device):
            _autotune_every_config_in_trials()
            try:
                _locate_libcuda()
            except Exception as exc:
                print(f"triton could not locate libcuda: {type(exc).__name__}: {exc}", flush=True)
            try:
                _warm_up_gpu()
            except Exception as exc:  # the worker still serves; the first candidate launch will say more
                print(f"triton GPU warm-up failed: {type(exc).__name__}: {exc}", flush=True)


    def instrumentation(self) -> dict[str, Any]:
        """What :meth:`prepare_worker` patched and where the instruments keep their state, by dotted
        name; the worker verifies each is still in place after every candidate call."""
        import sys

        from triton.runtime import jit

        found: dict[str, Any] = {"plugins.backends.triton_backend._local": _local}
        if getattr(jit.JITFunction.run, "_kz_counting", False):
            found["triton.runtime.jit.JITFunction.run"] = jit.JITFunction.run
        interp = sys.modules.get("triton.runtime.interpreter")
        if interp is not None and getattr(interp.InterpretedFunction.run, "_kz_counting", False):
            from plugins.backends import triton_interp_checks as checks

            found["triton.runtime.interpreter.InterpretedFunction.run"] = interp.InterpretedFunction.run
            found["triton.runtime.interpreter.InterpretedFunction.__call__"] = interp.InterpretedFunction.__call__
            found["plugins.backends.triton_interp_checks.STATE"] = checks.STATE
            for hook in ("create_masked_load", "create_masked_store", "create_atomic_rmw", "create_atomic_cas",
                         "set_grid_dim", "set_grid_idx", "create_dot"):
                found[f"triton.runtime.interpreter.InterpreterBuilder.{hook}"] = getattr(interp.InterpreterBuilder, hook)
            found["triton.runtime.interpreter.GridExecutor.__call__"] = interp.GridExecutor.__call__
        return found

    def compiler_dirs(self) -> list[str]:
        """Directories and programs the worker may start while compiling: Triton's own tools
        (ptxas ...) and the C compiler Triton builds each new kernel signature's launcher with on a
        GPU ($CC, else gcc, else clang — the order of ``triton.runtime.build``)."""
        import shutil

        import triton

        allowed = [os.path.dirname(triton.__file__)]
        # The ptxas Triton is pointed at: $TRITON_PTXAS_PATH, or the one PyTorch bundles, which
        # torch._inductor selects when it is imported (the inductor teacher's kernels import it).
        import torch

        for ptxas in (os.environ.get("TRITON_PTXAS_PATH"), os.path.join(os.path.dirname(torch.__file__), "bin", "ptxas")):
            if ptxas and os.path.isfile(ptxas):
                allowed.append(os.path.realpath(ptxas))
        for cc in (os.environ.get("CC"), shutil.which("gcc"), shutil.which("clang"), shutil.which("cc")):
            if cc:
                allowed.append(os.path.realpath(shutil.which(cc) or cc))
        return allowed

    def toolchain(self) -> dict[str, str | None]:
        """The compiler a verdict depends on (the eval cache keys verdicts on it); read from the
        installed distribution, so nothing is imported."""
        from importlib import metadata

        try:
            return {"triton": metadata.version("triton")}
        except metadata.PackageNotFoundError:
            return {"triton": None}

    def compile_ahead(self, model: Any, inputs: list[Any]) -> dict[str, Any]:
        """The loaded model's kernels compiled for ``inputs`` (uninitialised) with nothing run on the GPU,
        before its first trial's turn (:mod:`plugins.backends.triton_compile_ahead`)."""
        from plugins.backends.triton_compile_ahead import compile_ahead

        return compile_ahead(model, inputs, _local)

    def load(self, module: Any, device: str) -> None:
        """Triton compiles each kernel at its first launch, so the first correctness trial is the
        compile step; nothing to build ahead of time."""
        _calls[0] = 0

    @contextmanager
    def launch_tracker(self) -> Iterator[TritonLaunchTracker]:
        previous = _current_tracker()
        tracker = TritonLaunchTracker(call=_calls[0])
        _calls[0] += 1
        _local.tracker = tracker
        try:
            yield tracker
        finally:
            _local.tracker = previous

    def capabilities(self, device: str) -> frozenset[str]:
        return frozenset({"bounds_check", "program_order", "provenance"}) if self._interpreted(device) else frozenset()

    @contextmanager
    def provenance(self, inputs: list[Any], model: Any) -> Iterator[Any]:
        """One call's provenance ledger (:mod:`plugins.backends.provenance`): it starts from the
        inputs and the module's tensors; the interpreter marks what each launch loads and writes."""
        from plugins.backends import triton_interp_checks as checks
        from plugins.backends.provenance import Ledger, module_tensors

        ledger = Ledger()
        ledger.trust(inputs, "input")
        ledger.trust(module_tensors(model), "module")
        checks.STATE.ledger = ledger
        try:
            yield ledger
        finally:
            checks.STATE.ledger = None

    @contextmanager
    def bounds_checking(self) -> Iterator[list[str]]:
        """Out-of-bounds findings of one call; race findings join them while :meth:`program_order`
        is active (``core.verification.evidence.RACE_FINDING``)."""
        from plugins.backends import triton_interp_checks as checks

        findings: list[str] = []
        checks.reset_findings(findings)
        try:
            yield findings
        finally:
            checks.reset_findings(None)

    @contextmanager
    def program_order(self, seed: int | None, sample: int = 0, launch_s: float = 0.0) -> Iterator[list[dict]]:
        """Programs run in an order shuffled by ``seed``, and every launch's accesses are analysed
        for races between programs (the shuffled runs are the races check's evidence). ``sample``
        > 0: a launch of more programs runs only a sample of that many, chosen from ``seed``
        (``triton_interp_checks.choose_programs``: first, last, neighbours, random); yields the
        record of each launch's sample (empty without ``sample``). ``launch_s`` > 0: no sampled program
        starts after a launch has run that long (its record says how many ran).

        While sampling (a GPU candidate analysed at its task's own shapes) integer arithmetic wraps as
        it does on the GPU: the interpreter's int32 overflow sanitizer, a debug option that GPU builds
        leave off, took 40% of a sampled matmul program's time. An offset that overflows then points
        elsewhere and is found as an out-of-bounds access or an overlap."""
        import dataclasses
        import random

        from plugins.backends.triton_interp_checks import STATE

        launches: list[dict] = []
        STATE.order_rng = random.Random(seed) if seed is not None else None
        STATE.races = True
        STATE.sample, STATE.launches = max(0, int(sample)), launches if sample else None
        STATE.launch_s = float(launch_s)
        builder = _interpreter_builder() if sample else None
        saved_options = builder.options if builder is not None else None
        if builder is not None and getattr(saved_options, "sanitize_overflow", False):
            builder.options = dataclasses.replace(saved_options, sanitize_overflow=False)
        try:
            yield launches
        finally:
            if builder is not None:
                builder.options = saved_options
            STATE.order_rng, STATE.perm, STATE.races = None, None, False
            STATE.sample, STATE.launches, STATE.sampled, STATE.true_grid = 0, None, None, None
            STATE.launch_s = 0.0


def _interpreter_builder() -> Any:
    """The Triton interpreter's builder (its ``options`` say how kernels are interpreted), or None
    where the interpreter is not in use."""
    interp = sys.modules.get("triton.runtime.interpreter")
    return getattr(interp, "interpreter_builder", None)


def _locate_libcuda() -> None:
    """Triton finds libcuda by running ``ldconfig -p`` (its result is cached), which a candidate may not
    do. The warm-up launch below does it too, but needs GPU memory: a worker started while the GPU is
    full (real KernelBench sizes) failed its warm-up, and the candidate's first launch was then refused
    by the sandbox as "starting a subprocess ('/usr/sbin/ldconfig')". This needs no memory."""
    from triton.backends.nvidia import driver

    driver.libcuda_dirs()


def _warm_up_gpu() -> None:
    """Compile and launch one tiny kernel before the sandbox's audit hook is armed: Triton's first
    GPU launch locates libcuda (``ldconfig -p``) and starts ptxas, which candidates may not do."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def _kz_fill(out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, offs.to(tl.float32), mask=offs < n)

    out = torch.empty(100, device="cuda")
    _kz_fill[(1,)](out, 100, BLOCK=128)
    torch.cuda.synchronize()


def _count_launches(cls: type) -> None:
    """Wrap ``cls.run`` (the launch entry point of ``kernel[grid](...)``) to count launches."""
    if getattr(cls.run, "_kz_counting", False):
        return
    original = cls.run

    def run(self, *args, grid, warmup, **kwargs):
        if getattr(_local, "compile_only", False):  # compile_ahead: compile, launch nothing
            _local.compiled = getattr(_local, "compiled", 0) + 1
            return original(self, *args, grid=grid, warmup=True, **kwargs)
        tracker = _current_tracker()
        if warmup or tracker is None:
            return original(self, *args, grid=grid, warmup=warmup, **kwargs)
        from plugins.backends import triton_interp_checks as checks

        name = getattr(getattr(self, "fn", None), "__name__", None) or getattr(self, "__name__", "kernel")
        config = getattr(_local, "config", None)  # the autotune config chosen in the interpreter
        if config:
            name = f"{name}[{config}]"
        tracker.count += 1
        if len(tracker.kernels) < 64:
            tracker.kernels.append(name)
        tracker.depth += 1
        saved = (checks.STATE.ranges, checks.STATE.kernel)
        ranges = checks.storage_ranges([args, list(kwargs.values())])
        checks.STATE.ranges, checks.STATE.kernel = ranges, name
        outer_log = checks.begin_launch(name)
        ledger, marks = checks.STATE.ledger, checks.STATE.marks
        storages: list = []
        if ledger is not None:
            from plugins.backends.provenance import storages_of

            storages = storages_of([args, list(kwargs.values())])
            ledger.before_launch(name, storages)
            checks.STATE.marks = [(s.data_ptr(), s.data_ptr() + s.nbytes(), ledger.written_mask(s.data_ptr()))
                                  for s in storages]
            checks.STATE.loaded = set()
        try:
            return original(self, *args, grid=grid, warmup=warmup, **kwargs)
        finally:
            tracker.depth -= 1
            checks.end_launch(ranges, outer_log)
            checks.STATE.ranges, checks.STATE.kernel = saved
            if ledger is not None:
                ledger.after_launch(name, storages, checks.STATE.loaded)
                checks.STATE.marks, checks.STATE.loaded = marks, None

    run._kz_counting = True  # type: ignore[attr-defined]
    cls.run = run


def _autotune_without_benchmarks() -> None:
    """``@triton.autotune`` in the interpreter, which has no driver to benchmark configs with ("0
    active drivers"): no benchmark; forward call ``i`` since the candidate's load runs config ``i``
    (after the kernel's ``early_config_prune``; its ``perf_model`` ranks speed, a GPU matter) and
    every call after the last config the first one. So every config is run and its outputs checked
    against the reference: by the correctness trials, then the shuffled orders, the repeat and the
    probes (11 calls by default); with no more configs than trials the repeat runs the first config
    again, and otherwise the determinism check compares it with the reference instead of bitwise.
    The launch is named with its config (``add_kernel[BLOCK=256]``). Each call runs its kernel
    once, so ``restore_value`` has nothing to restore and ``reset_to_zero`` is not applied: a GPU
    applies it only around benchmarking (and before the first call's run), so a kernel must zero
    its outputs itself there too."""
    from triton.runtime.autotuner import Autotuner

    if getattr(Autotuner.run, "_kz_interpreted", False):
        return

    def run(self, *args, **kwargs):
        self.nargs = dict(zip(self.arg_names, args))
        configs = list(self.configs)
        if len(configs) > 1 and self.early_config_prune:
            configs = list(self.early_config_prune(configs, self.nargs, **kwargs)) or configs[:1]
        tracker = _current_tracker()
        turn = tracker.call if tracker is not None else 0
        config = configs[turn] if turn < len(configs) else configs[0]
        self.best_config = config
        if config.pre_hook is not None:
            config.pre_hook({**self.nargs, **kwargs, **config.all_kwargs()})
        _local.config = ", ".join(f"{k}={v}" for k, v in config.kwargs.items()) if len(configs) > 1 else None
        try:
            return self.fn.run(*args, **kwargs, **config.all_kwargs())
        finally:
            _local.config = None
            self.nargs = None

    run._kz_interpreted = True  # type: ignore[attr-defined]
    Autotuner.run = run


def every_config_in_trials(original: Any) -> Any:
    """``Autotuner.run`` for GPU workers. The first judged call (calls under a launch tracker: the
    correctness trials, then the shuffled orders, the repeat and the probes) runs the autotuner itself,
    so the config its benchmark picks is always judged; judged call ``i >= 1`` runs config ``i - 1``
    without benchmarking, so every config's output is compared with the reference, as in the
    interpreter (:func:`_autotune_without_benchmarks`); later calls, and calls outside a tracker (the
    timed stage), run the autotuner's choice again. A config this GPU cannot build (out of shared
    memory, ptxas) is skipped, as the autotuner's benchmark skips it. Without this a wrong config that
    the GPU's benchmark did not pick passed unseen (the sampled race analysis compares no outputs)."""

    def run(self, *args, **kwargs):
        if getattr(_local, "compile_only", False):  # compile_ahead: every config compiled, none benchmarked
            return _compile_every_config(self, args, kwargs)
        tracker = _current_tracker()
        if tracker is None or len(self.configs) < 2:
            return original(self, *args, **kwargs)
        self.nargs = dict(zip(self.arg_names, args))
        configs = _pruned_configs(self, kwargs)
        if tracker.call == 0 or tracker.call > len(configs):
            self.nargs = None
            before = len(getattr(tracker, "kernels", []))
            try:
                return original(self, *args, **kwargs)
            finally:
                _name_the_choice(tracker, before, getattr(self, "best_config", None))
        config = configs[tracker.call - 1]
        self.best_config = config
        if config.pre_hook is not None:
            config.pre_hook({**self.nargs, **kwargs, **config.all_kwargs()})
        _local.config = ", ".join(f"{k}={v}" for k, v in config.kwargs.items())
        try:
            return self.fn.run(*args, **kwargs, **config.all_kwargs())
        except Exception as exc:
            if type(exc).__name__ not in ("OutOfResources", "CompileTimeAssertionFailure", "PTXASError"):
                raise
            self.nargs = None
            return original(self, *args, **kwargs)
        finally:
            _local.config = None
            self.nargs = None

    run._kz_every_config = True  # type: ignore[attr-defined]
    return run


def _pruned_configs(tuner: Any, kwargs: dict) -> list[Any]:
    """The autotuner's configs after its pruning (``tuner.nargs`` set by the caller); every config where the
    pruning hook needs the benchmark's state, or prunes them all."""
    try:
        return list(tuner.prune_configs(kwargs)) or list(tuner.configs)
    except Exception:  # noqa: BLE001  (a pruning hook that needs the benchmark's state)
        return list(tuner.configs)


def _compile_every_config(tuner: Any, args: tuple, kwargs: dict) -> None:
    """An autotuner's call under ``compile_ahead``: each of its configs (after its pruning) compiled through
    the launch wrapper, which compiles and launches nothing; a config this GPU cannot build is left to the
    first trial, as its benchmark skips it. No pre-hook runs (one may zero outputs on the device)."""
    tuner.nargs = dict(zip(tuner.arg_names, args))
    try:
        configs = _pruned_configs(tuner, kwargs)
    finally:
        tuner.nargs = None
    for config in configs:
        try:
            tuner.fn.run(*args, **kwargs, **config.all_kwargs())
        except Exception as exc:
            if type(exc).__name__ not in ("OutOfResources", "CompileTimeAssertionFailure", "PTXASError"):
                raise


def _name_the_choice(tracker: Any, before: int, config: Any) -> None:
    """The autotuner's own call ran its benchmark's launches, then its choice: the call's launches are named
    as that one config's (``kernel[BLOCK=256]``), as every other judged call's are. On the H100 the first
    trial's benchmark launches, unnamed, against a repeat on a named config looked like other kernels, not
    other configs, and an honest eight-config row sum was failed for different bits (2026-12-05)."""
    kernels = getattr(tracker, "kernels", None)
    if config is None or not isinstance(kernels, list) or len(kernels) <= before:
        return
    base = kernels[before].split("[", 1)[0]
    del kernels[before:]
    kernels.append(f"{base}[{', '.join(f'{k}={v}' for k, v in config.kwargs.items())}]")


def _autotune_every_config_in_trials() -> None:
    from triton.runtime.autotuner import Autotuner

    if not getattr(Autotuner.run, "_kz_every_config", False):
        Autotuner.run = every_config_in_trials(Autotuner.run)


@hookimpl
def register_backends(register):
    register("triton", TritonBackend)

"""A loaded candidate (:class:`Session`, what a check's ``collect`` receives), the task's float64
run (:class:`Float64Truth`), and the small tensor and module helpers both roles use."""

from __future__ import annotations

import importlib.util
import sys
import time
import weakref
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable, Protocol

from core.contracts import optional
from core.verification.digests import input_digests
from core.verification.protocol import TAMPERED
from core.verification.sandbox import to_device
from core.verification.worker.process import AuditGuard, describe, make_audit_mode, sandbox_escape


class Worker(Protocol):
    """What a session and the roles read of their worker (:class:`~core.verification.worker.loop.WorkerMain`);
    named here, not imported, so the roles do not import the loop that dispatches to them."""

    device: str
    scratch: str
    backend: Any
    guard: AuditGuard
    exports: Any  # core.verification.devicemem.Exports
    callers: Any  # core.verification.worker.callers.Callers (candidate workers)
    verify_instrumentation: Callable[[], list[str]]

    def unload(self) -> None: ...


def record_tampering(worker: Worker, extra: list[str] | None = None) -> list[str]:
    """Verify the instrumentation after candidate code ran; each finding (and each of ``extra``)
    goes to the sandbox's record as ``"instrumentation tampered: <name>"``. Returns the names."""
    names = list(extra or []) + worker.verify_instrumentation()
    for name in names:
        worker.guard.record(f"{TAMPERED}{name}")
    return names


def tracker_findings(tracker: Any, guard: AuditGuard) -> list[str]:
    """What is wrong with the launch tracker and the guard right after ``forward`` returned: the
    counters must be consistent (no kernel named without a launch, not still inside a launch) and
    the guard still armed."""
    found = []
    count, kernels = getattr(tracker, "count", None), getattr(tracker, "kernels", None)
    if type(count) is not int or type(kernels) is not list or len(kernels) > count:
        found.append("the launch tracker's counters")
    if getattr(tracker, "inside", False) is not False:
        found.append("the launch tracker (still inside a launch after forward returned)")
    if guard.armed is not True:
        found.append("the sandbox guard (disarmed during the call)")
    return found

# --------------------------------------------------------------------------- helpers


def inexact_outputs(outputs: list[Any]) -> list[str]:
    """Outputs that are tensors of a subclass (one could compute when the judge first touches it):
    each output must be exactly a ``torch.Tensor`` (or a ``Parameter``, which computes nothing)."""
    import torch

    return [f"output {i} is a {type(o).__name__}, not a torch.Tensor" for i, o in enumerate(outputs)
            if isinstance(o, torch.Tensor) and type(o) not in (torch.Tensor, torch.nn.Parameter)]


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


# Outputs of at least this many bytes a call are weakly referenced, not held (Session._remember).
LARGE_OUTPUT_BYTES = 64 << 20


def cpu_copy(values: list[Any]) -> list[Any]:
    import torch

    return [v.detach().to("cpu", copy=True) if isinstance(v, torch.Tensor) and v.is_contiguous()
            else (to_device(v.detach(), "cpu") if isinstance(v, torch.Tensor) else v) for v in values]


def load_module(path: Path, name: str, before_exec: Callable[[Any], None] | None = None) -> Any:
    """Import ``path`` as module ``name``; ``before_exec(module)`` runs before any of its code does."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # triton reads kernel source through the module's file
    if before_exec is not None:
        before_exec(module)
    spec.loader.exec_module(module)
    return module


def float64_copies(inputs: list[Any]) -> list[Any]:
    """``inputs`` with every floating tensor as a float64 copy (the float64 runs' inputs)."""
    import torch

    return [x.detach().to(torch.float64) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
            for x in inputs]


def synchronize(device: str) -> None:
    import torch

    if device == "cuda" and torch.cuda.is_available():
        torch.cuda.synchronize()


# --------------------------------------------------------------------------- the float64 truth


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
            wide = float64_copies(inputs)
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

    def rounding_noise(self, inputs: list[Any], reference: list[Any], truth: list[Any] | None) -> list[float | None] | None:
        """Per output, how far rounding at the reference's precision moves the float64 run from
        ``truth`` (:mod:`core.verification.worker.rounding`); None when there is no truth or the
        perturbed run fails (the judge then uses the fp32 reference's own error alone)."""

        from core.verification.worker.rounding import rounding_noise, unit_roundoff

        unit = unit_roundoff(reference)
        if truth is None or self.model is None or unit is None:
            return None
        wide = float64_copies(inputs)
        try:
            noise = rounding_noise(lambda: flatten_outputs(self.model(*wide)), truth, unit, self.device)
            synchronize(self.device)
            return noise
        except MemoryError:
            raise
        except Exception:  # an op the dispatch mode cannot wrap: no estimate, nothing widened
            return None


# --------------------------------------------------------------------------- session


class Session:
    """A loaded candidate in a candidate worker; what ``collect`` hooks of checks receive (the public
    contract a check reads is :class:`core.api.session.CheckSession`).

    :ivar model: the ``ModelNew`` instance (built with the verification's init seed).
    :ivar module: the imported candidate module.
    :ivar backend: the backend plugin object (``launch_tracker()`` ...).
    :ivar device: ``"cpu"`` or ``"cuda"``.
    """

    def __init__(self, worker: Worker, module: Any, model: Any):
        self.worker, self.module, self.model = worker, module, model
        self.backend, self.device = worker.backend, worker.device
        self.task: dict[str, Any] | None = None
        self.task_module: Any = None  # imported on demand to draw inputs from a seed
        self.init_seed: int = 0
        self.prepared: dict[str, Any] = {}  # check name -> what its prepare() built for its collect()
        # Earlier calls' outputs, so a call that returns one again is seen (``output_reused``): held, or
        # weakly referenced when large (:meth:`_remember`; holding every run's took 10 x 8 GiB of the GPU).
        self._held: list[Any] = []
        self._held_storages: list[Any] = []
        self._large: list[Any] = []
        # sandbox findings after the trials (a check's collect ran candidate code): the tamper check reports them
        self.late_findings: list[str] = []

    @property
    def scratch(self) -> str:
        return self.worker.scratch

    @property
    def guard(self) -> AuditGuard:
        return self.worker.guard

    def verify_instrumentation(self) -> list[str]:
        return self.worker.verify_instrumentation()

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
            ledger = None
            if "provenance" in caps:
                ledger = stack.enter_context(optional(self.backend, "Backend", "provenance")(inputs, self.model))
            audit = make_audit_mode(tracker, self.worker.callers, ledger)
            state: list[str] = []
            try:
                self.worker.guard.armed = True
                with torch.no_grad(), audit:
                    out = self.model(*inputs)
                state = tracker_findings(tracker, self.worker.guard)
                synchronize(self.device)
                obs["output"] = flatten_outputs(out)
                obs["provenance"] = inexact_outputs(obs["output"])  # before any method of theirs runs
                if obs["provenance"]:  # not touched again: copying them would run the subclass's code
                    obs["output"], obs["error"] = None, f"forward returned {obs['provenance'][0]}"
                elif ledger is not None:
                    obs["provenance"] = ledger.check_outputs(obs["output"])
            except MemoryError:
                raise
            except Exception as exc:  # the candidate's own failure: an observation, not a crash
                obs["error"] = describe(exc)
                escape = sandbox_escape(exc)
                if escape and not self.worker.guard.violations:
                    self.worker.guard.violations.append(escape)
            finally:
                self.worker.guard.armed = False
                # before anything touches the outputs: a patched torch would answer for them
                record_tampering(self.worker, state)
            obs.update(launches=tracker.count, kernels=list(tracker.kernels)[:16], audit=audit.ops[:16],
                       downcasts=sorted(set(audit.downcasts))[:8], oob=list(oob)[:16])
        obs["seconds"] = time.perf_counter() - start
        outputs = obs.get("output")
        if outputs is not None:
            owner = optional(self.backend, "Backend", "output_owner") or (lambda storage: storage)
            storages = [owner(o.untyped_storage()) for o in outputs if isinstance(o, torch.Tensor) and o.numel()]
            obs["output_reused"] = any(self._returned_before(s) for s in storages)
            obs["output"] = self.worker.exports.export(outputs) if export else cpu_copy(outputs)
            self._remember(outputs, storages)
        if inputs_as_digest:
            obs["inputs_digest_after"] = input_digests(inputs)
        else:
            obs["inputs_after"] = cpu_copy(inputs)
        obs["sandbox"] = self.worker.guard.take()
        return obs

    def _returned_before(self, storage: Any) -> bool:
        """Whether ``storage`` is, or lies over the memory of, an earlier call's output still alive: one held
        here, or a large one the candidate kept (torch keeps one Python object per live storage, so a weak
        reference to it dies with the storage). Memory of a live storage is never handed out again, so
        an overlap is the same bytes: ``torch.from_dlpack(kept)`` is a new storage over a kept output."""
        start, end = storage.data_ptr(), storage.data_ptr() + storage.nbytes()
        earlier = [*self._held_storages, *(ref() for ref in self._large)]
        return any(e is storage or (e is not None and e.device == storage.device and e.nbytes()
                                    and e.data_ptr() < end and start < e.data_ptr() + e.nbytes()) for e in earlier)

    def _remember(self, outputs: list[Any], storages: list[Any]) -> None:
        """Hold this call's outputs, so no later output takes their address or id, unless they are large:
        those (KernelBench's 4-8 GiB outputs, 10 runs a verification) are only weakly referenced, so their
        memory is freed unless the candidate itself keeps them, and a call returning one again is still seen."""
        if sum(s.nbytes() for s in storages) >= LARGE_OUTPUT_BYTES:
            self._large += [weakref.ref(s) for s in storages]
            return
        self._held.append(outputs)
        self._held_storages += storages

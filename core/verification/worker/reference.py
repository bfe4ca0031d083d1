"""The reference role: the task's own ``Model`` (trusted code, never a candidate's), its trials
from seeds, the *keeper* that holds a verification's outputs on the device
(:class:`core.verification.devicemem.Vault`), and a check's baseline of the task."""

from __future__ import annotations

import contextlib
import gc
import sys
import time
import traceback
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Iterator

from core.verification.devicemem import TransportError, Vault
from core.verification.digests import input_digests
from core.verification.evidence import bitwise_equal, compare_outputs
from core.verification.inputs import draw_inputs
from core.verification.protocol import Op
from core.verification.sandbox import to_device
from core.verification.worker.process import describe
from core.verification.worker.session import Float64Truth, Worker, cpu_copy, flatten_outputs, load_module, synchronize


class ReferenceRole:
    """What a reference worker answers besides the requests every role answers."""

    def __init__(self, worker: Worker):
        self.worker = worker
        self.device, self.scratch = worker.device, worker.scratch
        self.loaded = 0
        self.vaults: dict[str, Vault] = {}  # keeper: verification token -> its outputs
        # a baseline set up while the GPU was shared (phase "prepare"), until its timed request takes it
        self.prepared_baselines: dict[tuple[Any, ...], Any] = {}

    def handlers(self) -> dict[str, Callable[[dict[str, Any]], dict[str, Any]]]:
        """This role's requests (:data:`core.verification.protocol.ROLE_OPS`) and who answers each."""
        return {Op.REFERENCE: self.reference, Op.BASELINE: self.baseline, Op.FORGET: self.forget,
                Op.FOOTPRINT: self.footprint,
                **{op: self._on_vault(answer) for op, answer in ((Op.ADOPT, self.adopt), (Op.COMPARE, self.compare),
                                                                  (Op.EQUAL, self.equal), (Op.FETCH, self.fetch),
                                                                  (Op.RELEASE, self.release))}}

    def unload(self) -> None:
        """Nothing of a candidate is held here; vaults stay until the judge forgets them."""

    # -- the task's trials

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
                    vault = Vault(module, model, device, truth, list(req["seeds"]), list(req["scales"]),
                                  None if by_seed else [], int(req.get("trials", len(req["seeds"]))))
                for i, (seed, scale) in enumerate(zip(req["seeds"], req["scales"])):
                    # one run's inputs on the device at a time (at real sizes each is 4-16 GiB)
                    inputs = dev_inputs = out = None
                    if i == 0 and redrawn is not None:
                        inputs, redrawn = redrawn, None
                    else:
                        inputs = draw_inputs(module, seed, scale, device)
                    dev_inputs = to_device(inputs, device)
                    rng_before = truth.rng_state()
                    with torch.no_grad():
                        out = flatten_outputs(model(*dev_inputs))
                    synchronize(device)
                    if truth.rng_state() != rng_before:
                        truth.refuse("the task's forward draws random numbers")
                        if vault is not None:  # its outputs cannot be computed again: all stay held
                            vault.recomputable = False
                    trial = {"output": vault.keep_reference(i, out) if vault is not None else cpu_copy(out)}
                    if vault is not None and vault.inputs is not None:
                        vault.inputs.append(dev_inputs)
                    if later:  # the judge asks again, with the truth, only if a comparison needs it
                        truth.possible(dev_inputs, out)
                    else:
                        trial["truth"] = truth.outputs(dev_inputs, out)
                        trial["truth_noise"] = truth.rounding_noise(dev_inputs, out, trial["truth"])
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

    # -- the keeper: a verification's outputs, held here (adopt the candidate's, compare, fetch, forget)

    def forget(self, req: dict[str, Any]) -> dict[str, Any]:
        self.vaults.pop(str(req.get("token")), None)
        self.prepared_baselines = {}  # a baseline set up but never timed (its verification ended first)
        gc.collect()  # the loop then hands the freed blocks back to the driver (release_cached_gpu_memory)
        return {"ok": True}

    def footprint(self, req: dict[str, Any]) -> dict[str, Any]:
        """The task's tensors on the meta device (:func:`core.evaluation.resize.measure`): the judge's
        GPU memory estimate (core.verification.gpumemory). Nothing is allocated or computed."""
        from core.evaluation.resize import measure

        try:
            with self._task_module(req["source"]) as module:
                return {"ok": True, "measured": measure(module)}
        except MemoryError:
            raise
        except Exception as exc:
            return {"ok": False, "error": describe(exc)}

    def _on_vault(self, answer: Callable[[Vault, dict[str, Any]], dict[str, Any]]) -> Callable[..., dict[str, Any]]:
        """``answer`` run on the vault the request's ``token`` names; its failure is the answer's."""

        def on_vault(req: dict[str, Any]) -> dict[str, Any]:
            token = str(req.get("token"))
            vault = self.vaults.get(token)
            if vault is None:
                return {"ok": False, "error": f"no verification {token!r} is kept here"}
            try:
                return answer(vault, req)
            except MemoryError:
                raise
            except Exception as exc:
                return {"ok": False, "error": describe(exc)}

        return on_vault

    def adopt(self, vault: Vault, req: dict[str, Any]) -> dict[str, Any]:
        runs = []
        for run in req["runs"]:
            try:
                adopted = vault.adopt(run["outputs"], int(run["expect"]), req.get("allowed_dir"),
                                      offload=bool(req.get("offload")))
                runs.append({"outputs": adopted})
            except TransportError as exc:  # a descriptor the candidate's process forged
                runs.append({"error": describe(exc), "forged": True})
            except (RuntimeError, ValueError, TypeError, KeyError) as exc:
                runs.append({"error": describe(exc)})  # that run's outputs cannot be judged
        synchronize(self.device)
        return {"ok": True, "runs": runs, "offloaded": vault.offload_count}

    def equal(self, vault: Vault, req: dict[str, Any]) -> dict[str, Any]:
        a, b = vault.resolve(req["a"]), vault.resolve(req["b"])
        return {"ok": True, "equal": len(a) == len(b) and all(bitwise_equal(x, y) for x, y in zip(a, b))}

    def release(self, vault: Vault, req: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "released": vault.release(req["items"])}

    def fetch(self, vault: Vault, req: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "values": cpu_copy(vault.resolve(req["items"]))}

    def compare(self, vault: Vault, req: dict[str, Any]) -> dict[str, Any]:
        tolerances = {k: tuple(v) for k, v in (req.get("tolerances") or {}).items()}
        run = vault.run_of(req["expected"])
        truth = (lambda: vault.truth_of(run, tolerances)) if req.get("truth") and run is not None else None
        noise = (lambda: vault.noise_of(run)) if truth is not None else None
        scale_aware = req.get("scale_aware")
        cmp = compare_outputs(vault.resolve(req["expected"]), vault.resolve(req["got"]), tolerances=tolerances,
                              scale_aware=scale_aware if scale_aware == "median" else bool(scale_aware),
                              truth=truth, truth_noise=noise, noise_factor=float(req["noise_factor"]),
                              rerun=(lambda: jittered_reruns(vault, run)) if run is not None else None)
        from core.verification.devicekernels import in_use

        return {"ok": True, "comparison": asdict(cmp), "truth_note": vault.truth_note(),
                "truth_trusted": bool(vault.truth_trusted), "judge_kernels": in_use()}

    # -- a check's baseline

    def baseline(self, req: dict[str, Any]) -> dict[str, Any]:
        """A check's measurement of the task's own model (e.g. its eager time), in this trusted process."""
        from core.plugins import registry

        key = (req["check"], hash(req["source"]), int(req["init_seed"]))
        try:
            check = registry("verifier").create(req["check"], **req.get("config", {}))
            with self._task_module(req["source"]) as module, eager_algorithms():  # timed as eager runs
                if req.get("phase") == "prepare":  # set up while the GPU is shared; timed by the next request
                    lock = _own_gpu_lock_of(req.get("device_lock"))
                    with lock:
                        self.prepared_baselines = {key: check.baseline_prepare(module, int(req["init_seed"]))}
                    turns = {} if isinstance(lock, contextlib.nullcontext) else {
                        "gpu_lock": {"wait_s": lock.waited_s, "segments": lock.segments}}
                    return {"ok": True, "data": turns}
                prepared = self.prepared_baselines.pop(key, None)
                extra = {"prepared": prepared} if prepared is not None else {}
                return {"ok": True, "data": check.baseline(module, int(req["init_seed"]), **extra)}
        except MemoryError:
            raise
        except Exception as exc:
            return {"ok": False, "error": describe(exc)}


def deterministic_reference() -> None:
    """A reference worker's convolutions use cuDNN's deterministic algorithms: the judge's measure of the
    reference's own rounding (its rerun on inputs moved by an ulp, ``jittered_reruns``) needs the reference
    rerun on the same inputs to give the same bits. cuDNN's transposed convolutions are not reproducible by
    default, and on one H100 (2026-12-07) the expert's honest ConvTranspose kernels of level 2 were rejected by
    a few dozen to a few thousand cancelling elements among 1e8-5e8 with no spread to forgive them by. The
    task's eager and torch.compile baselines are timed with PyTorch's default (:func:`eager_algorithms`)."""
    import torch

    torch.backends.cudnn.deterministic = True


@contextlib.contextmanager
def eager_algorithms() -> Iterator[None]:
    """PyTorch's default cuDNN algorithm choice (not only deterministic ones) inside: what eager runs."""
    import torch

    before = torch.backends.cudnn.deterministic
    torch.backends.cudnn.deterministic = False
    try:
        yield
    finally:
        torch.backends.cudnn.deterministic = before


def _own_gpu_lock_of(description: dict[str, Any] | None) -> Any:
    """The judge's GPU lock taken here, shared but given back while torch.compile builds
    (:class:`core.verification.devicelock.SharedExceptCompiling`); none without a description."""
    if not description:
        return contextlib.nullcontext()
    from core.verification.devicelock import DeviceLock, SharedExceptCompiling

    return SharedExceptCompiling(DeviceLock.from_description(description),
                                 time.monotonic() + float(description.get("wait_s", 600.0)))


def jittered_reruns(vault: Any, run: int) -> list[list[Any]]:
    """The reference rerun on run ``run``'s inputs moved by an ulp (core.verification.evidence.jittered_reruns):
    how far its own rounding moves each element, where no float64 truth does (outputs beyond
    ``float64_max_elements``). Asked for only when an output misses every other bound."""
    import torch

    from core.verification.evidence import jittered_reruns as reruns
    from core.verification.worker.session import flatten_outputs

    def call(inputs: list[Any]) -> list[Any]:
        with torch.no_grad():
            return [o.detach() if isinstance(o, torch.Tensor) else o for o in flatten_outputs(vault.model(*inputs))]

    return reruns(call, vault.inputs_of(run), list(vault.expected_of(run)))

"""The candidate role: compile what the candidate's text shows, import it and build ``ModelNew``
under the audit hook, call ``forward`` on trials (:class:`Session`), and run a check's own
measurement in this process (``Check.collect``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

from core.contracts import optional
from core.verification.digests import input_digests
from core.verification.inputs import draw_inputs
from core.verification.protocol import Op
from core.verification.sandbox import to_device
from core.verification.worker.callers import CANDIDATE_MODULE
from core.verification.worker.process import describe, sandbox_escape
from core.verification.worker.session import Session, Worker, load_module, record_tampering

__all__ = ["CANDIDATE_MODULE", "CandidateRole", "empty_inputs"]


def empty_inputs(module: Any, device: str) -> list[Any]:
    """The task's inputs as ``get_inputs()`` shapes them, uninitialised on ``device``: their shapes, strides and
    dtypes from a call on the meta device, then allocations only (no kernel runs, nothing is drawn)."""
    import torch

    with torch.device("meta"):
        shaped = list(module.get_inputs())
    return [torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=device) if isinstance(x, torch.Tensor)
            else x for x in shaped]


class CandidateRole:
    """What a candidate worker answers besides the requests every role answers."""

    def __init__(self, worker: Worker):
        self.worker = worker
        self.device, self.scratch = worker.device, worker.scratch
        self.session: Session | None = None
        self.loaded = 0

    def handlers(self) -> dict[str, Callable[[dict[str, Any]], dict[str, Any]]]:
        """This role's requests (:data:`core.verification.protocol.ROLE_OPS`) and who answers each."""
        return {Op.PRECOMPILE: self.precompile, Op.COMPILE_AHEAD: self.compile_ahead, Op.LOAD: self.load,
                Op.RUN: self.run, Op.COLLECT: self.collect, Op.DROP_EXPORTS: self.drop_exports}

    def drop_exports(self, req: dict[str, Any]) -> dict[str, Any]:
        self.worker.exports.drop()
        return {"ok": True}

    def precompile(self, req: dict[str, Any]) -> dict[str, Any]:
        """The backend's compile of what the candidate's text shows (no candidate code runs), ahead of
        ``load``, which the judge sends holding the GPU; a backend without ``precompile`` skips it."""
        ahead = optional(self.worker.backend, "Backend", "precompile")
        if ahead is None:
            return {"ok": True, "precompiled": 0}
        self.worker.guard.armed = True  # as in load: the compiler reads what the source includes
        try:
            return {"ok": True, **ahead(req["source"], self.device), "sandbox": self.worker.guard.take()}
        except MemoryError:
            raise
        except Exception as exc:
            return {"ok": False, "error": describe(exc), "sandbox": self.worker.guard.take()}
        finally:
            self.worker.guard.armed = False

    def compile_ahead(self, req: dict[str, Any]) -> dict[str, Any]:
        """The backend's compile of the loaded candidate's kernels for the task's input shapes, with
        uninitialised inputs and no work on the GPU (``Backend.compile_ahead``), sent without the GPU lock:
        the first trial then holds its shared turn for the GPU's work, not for the compiler's. Best effort:
        what it could not compile, the first trial compiles as before."""
        ahead = optional(self.worker.backend, "Backend", "compile_ahead")
        if ahead is None or self.session is None or self.device != "cuda":
            return {"ok": True, "compiled": 0}
        try:
            inputs = empty_inputs(self.task_module(), self.device)
        except MemoryError:
            raise
        except Exception as exc:  # noqa: BLE001  (e.g. a get_inputs that moves its tensors with .cuda())
            return {"ok": True, "compiled": 0, "stopped": f"the task's input shapes: {describe(exc)}"[:300]}
        session = self.session
        self.worker.guard.armed = True
        try:
            return {"ok": True, **ahead(session.model, inputs)}
        except MemoryError:
            raise
        except Exception as exc:  # noqa: BLE001  (best effort: the first trial compiles what this did not)
            return {"ok": True, "compiled": 0, "stopped": describe(exc)[:300]}
        finally:  # the candidate's code ran: verify the instrumentation as after a trial
            self.worker.guard.armed = False
            del inputs
            record_tampering(self.worker)
            session.late_findings.extend(self.worker.guard.take())

    def load(self, req: dict[str, Any]) -> dict[str, Any]:
        import torch

        if self.session is not None or CANDIDATE_MODULE in sys.modules:
            # the judge unloads after each verdict, before asking for the GPU; a full collection here
            # would hold the GPU lock for ~0.1 s
            self.worker.unload()
        path = Path(self.scratch) / f"candidate_{self.loaded}.py"
        self.loaded += 1
        path.write_text(req["source"])
        callers = self.worker.callers

        def mark_candidate(module: Any) -> None:  # before its first line runs: its frames are the candidate's
            if callers is not None:
                callers.candidate_globals = module.__dict__

        self.worker.guard.armed = True
        try:
            module = load_module(path, CANDIDATE_MODULE, before_exec=mark_candidate)
            self.worker.backend.load(module, self.device)
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
            if escape and not self.worker.guard.violations:
                self.worker.guard.violations.append(escape)
            self.worker.guard.armed = False
            record_tampering(self.worker)
            return {"ok": False, "error": describe(exc), "sandbox": self.worker.guard.take()}
        finally:
            self.worker.guard.armed = False
        record_tampering(self.worker)
        self.session = Session(self.worker, module, model)
        self.session.task = req.get("task")  # plain dict (Task.to_dict); a check's collect() may read it
        self.session.init_seed = int(req["init_seed"])
        return {"ok": True, "sandbox": self.worker.guard.take()}

    def run(self, req: dict[str, Any]) -> dict[str, Any]:
        if self.session is None:
            return {"ok": False, "error": "no candidate is loaded"}
        observations = []
        export = bool(req.get("export"))
        self.worker.exports.drop()  # the keeper took the last run's outputs before this request was sent
        for item in req["runs"]:
            inputs = obs = None  # one run's inputs on the device at a time (at real sizes each is 4-16 GiB)
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
        session = self.session
        try:
            if req.get("phase") == "prepare":
                return {"ok": True, "data": check.prepare(session)}
            return {"ok": True, "data": check.collect(session)}
        except MemoryError:
            raise
        except Exception as exc:
            return {"ok": False, "error": describe(exc)}
        finally:  # a check's collect may have called the candidate (timing): verify as after a trial
            record_tampering(self.worker)
            session.late_findings.extend(self.worker.guard.take())

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
        """Forget the candidate's session and the task module it drew inputs with (the worker drops
        the exports and the candidate's module, :meth:`WorkerMain.unload`)."""
        if self.session is not None and self.session.task_module is not None:
            sys.modules.pop(self.session.task_module.__name__, None)
        self.session = None

"""The ``gpu_activity`` check: its worker-side ``collect`` (the task's reference and arguments, the
audited series) and its judge-side ``evaluate`` (the candidate's kernel names, then :func:`judge`)."""

from __future__ import annotations

import secrets
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, ClassVar

from core.api.evidence import PERFORMANCE, Evidence, parse_python
from core.api.numerics import compare_outputs, jittered_reruns
from core.api.sandbox import CUPTI, gpu_tool_applies
from core.verdict import CheckResult, could_not_run
from plugins.verifiers.gpu_activity.attribution import judge
from plugins.verifiers.gpu_activity.recording import (
    CandidateFailed,
    ReferenceFailed,
    audited_series,
    canary_seen,
    profiler_activities,
)
from plugins.verifiers.gpu_activity.trace import aggregate, host_ops, parse_chrome_trace, profiler_calls

# The check's stage: after the performance stage's timed runs. A candidate that counts its calls knows
# where the trials end, so an audit placed before the timing could be passed by behaving until then;
# after the timing it would have to know where the timed runs end, and their number adapts to the
# kernel's measured times. (Hack findings still come first in the verdict's reason.)
AFTER_TIMING = PERFORMANCE + 1


def own_kernel_names(evidence: Evidence) -> list[str]:
    """The candidate's kernel names, as the backend finds them in its source (``detect_kernels``)."""
    from core.plugins import registry

    tree = evidence.tree if evidence.tree is not None else parse_python(evidence.candidate.source)
    return list(registry("backend").create(evidence.backend).detect_kernels(tree))


@dataclass
class GpuActivityCheck:
    """Every kernel that ran during one audited ``forward`` is the candidate's own (CUPTI, process-wide).

    :param calls: calls after the warm-up; one of them, chosen at random, is recorded.
    :param max_activities: distinct GPU activities (:func:`aggregate`) kept from the recorded call;
        with more, nothing foreign among those kept still means the check could not run.
    :param backends: the backends whose candidates this applies to.
    """

    name: str = "gpu_activity"
    reads: ClassVar[frozenset[str]] = frozenset()  # compares no run's outputs through the keeper (Check.reads)
    stage: int = AFTER_TIMING
    hard: bool = True
    where: str = "worker"
    needs: frozenset[str] = frozenset({"trials"})
    calls: int = 3
    max_activities: int = 5_000
    backends: tuple[str, ...] | None = None  # None: the backends that list CUPTI among their gpu_tools
    # only candidate workers profile: a reference worker need not load CUPTI (seconds of its start-up)
    warm_up_roles: ClassVar[frozenset[str]] = frozenset({"candidate"})

    def applies(self, backend: str, device: str) -> bool:
        if self.backends is not None:
            return device == "cuda" and backend in self.backends
        return device == "cuda" and gpu_tool_applies(CUPTI, backend)

    # ----------------------------------------------------------- worker side
    def warm_up(self, device: str) -> str | None:
        """Load Kineto and CUPTI once per worker (the first profile takes seconds), before verdicts. Says where
        the seconds went (3.8-5.3 s on the H100, 2026-12-07: the candidate worker's longest start-up part)."""
        if device != "cuda":
            return None
        began = time.perf_counter()
        import torch
        from torch.profiler import profile

        activities = profiler_activities(True)
        imported = time.perf_counter()
        with profile(activities=activities):
            started = time.perf_counter()
            torch.ones(16, device="cuda").add_(1)
            torch.cuda.synchronize()
            ran = time.perf_counter()
        return (f"import {imported - began:.2f} s, start {started - imported:.2f} s, "
                f"stop {time.perf_counter() - ran:.2f} s")

    def collect(self, session: Any) -> dict[str, Any]:
        import torch

        from core.api.numerics import draw_inputs, to_device
        from plugins.verifiers.performance.check import flatten, has_state, load_task_module, task_source_of
        from plugins.verifiers.performance.timing import fresh_arguments

        began = time.perf_counter()
        if not torch.cuda.is_available():
            return {"error": "no CUDA device is visible in the worker", "blame": "harness"}
        source = task_source_of(session)
        if source is None:
            return {"error": "the worker session exposes no task source (Session.task)", "blame": "harness"}
        worker = getattr(session, "worker", None)
        scratch = str(getattr(worker, "scratch", None) or tempfile.gettempdir())
        guard = getattr(worker, "guard", None)
        try:
            task = load_task_module(source, "kz_gpu_activity_task")
            init_seed = getattr(session, "init_seed", None)
            torch.manual_seed(init_seed if init_seed is not None else secrets.randbits(31))
            reference = task.Model(*task.get_init_inputs()).cuda().eval()
            comparable = init_seed is not None or not has_state(reference)
            # drawn as the trials draw (on the GPU where get_inputs allows), then fresh per call as the timed runs
            base = to_device(draw_inputs(task, secrets.randbits(31), 1.0, "cuda"), "cuda")
            make_args = fresh_arguments(base, secrets.randbits(62))
        except Exception as exc:
            return {"error": f"setting up the task failed: {type(exc).__name__}: {exc}"[:600], "blame": "harness"}
        setup_s = time.perf_counter() - began
        model = session.model

        def call(args: list[Any]) -> Any:
            if guard is not None:
                guard.armed = True
            try:
                with torch.no_grad():
                    return model(*args)
            finally:
                if guard is not None:
                    guard.armed = False

        def compare(args: list[Any], out: Any) -> str | None:
            if not comparable:
                return None
            try:
                with torch.no_grad():
                    want = [o.detach() if isinstance(o, torch.Tensor) else o for o in flatten(reference(*args))]
            except Exception as exc:
                raise ReferenceFailed(f"the task's reference failed: {type(exc).__name__}: {exc}") from exc
            got = [o.detach() if isinstance(o, torch.Tensor) else o for o in flatten(out)]

            def reference_on(a: list[Any]) -> list[Any]:
                with torch.no_grad():
                    return [o.detach() if isinstance(o, torch.Tensor) else o for o in flatten(reference(*a))]

            # an output near zero (a group norm's mean): judged on the reference's own rounding spread
            cmp = compare_outputs(want, got, rerun=lambda: jittered_reruns(reference_on, list(args), want))
            return None if cmp.ok else cmp.detail

        backend = getattr(session, "backend", None)
        tracker = getattr(backend, "launch_tracker", None)
        try:
            series = audited_series(call, make_args, self.calls, scratch=scratch, compare=compare, tracker=tracker,
                                    sync=torch.cuda.synchronize)
        except CandidateFailed as exc:
            return {"error": str(exc), "blame": "candidate"}
        except Exception as exc:  # the profiler (CUPTI, Kineto, the export) or the tracker failed: not checked
            return {"error": f"recording failed: {type(exc).__name__}: {exc}"[:600], "blame": "harness"}
        t = time.perf_counter()
        activities = aggregate(parse_chrome_trace(series.trace))
        data: dict[str, Any] = {
            "calls": series.calls, "audited_call": series.audited, "launches": series.launches,
            "activities": [a.to_dict() for a in activities[: self.max_activities]],
            "dropped": max(0, len(activities) - self.max_activities), "mismatches": series.mismatches,
            "profiler_calls": profiler_calls(series.trace), "host_ops": host_ops(series.trace),
            "outputs_checked": comparable, "harness_tid": threading.get_native_id(),
            "trace_events": len(series.trace.get("traceEvents") or []),
        }
        if not activities:
            try:
                data["canary"] = canary_seen(scratch)
            except Exception as exc:
                data["canary"] = False
                data["canary_error"] = f"{type(exc).__name__}: {exc}"[:300]
        data["phases_s"] = {"setup": setup_s, "series": series.seconds, "parse": time.perf_counter() - t,
                            "total": time.perf_counter() - began}
        return data

    # ----------------------------------------------------------- judging side
    def evaluate(self, evidence: Evidence) -> CheckResult:
        data = evidence.extra.get(self.name)
        if not data:
            return could_not_run("the worker recorded no GPU activity (no data)")
        if data.get("error"):
            if data.get("blame") == "candidate":
                return CheckResult(False, f"forward failed while its GPU work was recorded: {data['error']}",
                                   data=data)
            return could_not_run(f"GPU activity not recorded: {data['error']}", data)
        from core.api.numerics import ALLOWED_ATEN as DISPATCH_AUDIT_ALLOWS  # the trials' list
        from plugins.verifiers.runtime import no_work

        idle = bool(evidence.trials) and all(no_work(t) for t in evidence.trials)
        return judge(data, own_kernel_names(evidence), allowed_ops=DISPATCH_AUDIT_ALLOWS, no_work=idle)

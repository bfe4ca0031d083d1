"""The GPU work of ``forward``, recorded process-wide: every kernel that ran must be the candidate's.

Check ``gpu_activity`` (CUDA; the triton and cuda backends). The ATen audit of the trials is a
``TorchDispatchMode``: it is thread-local, and ``torch._C._DisableTorchDispatch()`` hides ops from
it. CUPTI, through ``torch.profiler`` with ``ProfilerActivity.CUDA``, records every kernel, copy and
fill the process puts on the GPU, whatever thread or library launched it. So:

* ``collect`` (candidate worker, after the performance stage's timed runs: :data:`AFTER_TIMING`):
  the task's reference model and inputs are built as the timed runs build them (``fresh_arguments``
  of :mod:`plugins.verifiers.performance.timing` over inputs drawn as the trials draw); ``forward`` is
  called once to warm up, then ``calls`` times, each on fresh arguments and compared with the reference. One
  of those calls, chosen with :mod:`secrets`, is recorded (:func:`audited_series`). Returns plain
  data: every GPU activity of that call (:class:`Activity`) and the backend's launch count for it.
* ``evaluate`` (judge): :func:`judge`, a pure function of that data and of the candidate's kernel
  names (``Backend.detect_kernels``): each activity is the candidate's own kernel, an allow-listed
  fill or copy (:data:`ALLOWED_ATEN`, :data:`ALLOWED_COPIES`, any memset), or foreign. Anything
  foreign rejects the candidate as a hack, with a reason naming the kernel. The result reports the
  candidate kernels' share of the call's GPU time (``time_coverage``, as KernelGYM reports it).

The audited call looks like its neighbours: same arguments (fresh, drawn alike), same host work
around it, CUPTI already on for every call before it; the candidate cannot read the profiler's
state without private attributes, which the static policy refuses. A profiler that cannot run (no
CUPTI, an exception, nothing recorded) fails closed: :func:`core.verdict.could_not_run`.
"""

from __future__ import annotations

from core import hookimpl
from plugins.verifiers.gpu_activity.attribution import (
    ALLOWED_ATEN,
    ALLOWED_COPIES,
    Attribution,
    Coverage,
    attribute,
    coverage,
    foreign_family,
    host_op_findings,
    judge,
    own_kernel,
)
from plugins.verifiers.gpu_activity.check import AFTER_TIMING, GpuActivityCheck, own_kernel_names
from plugins.verifiers.gpu_activity.recording import (
    CandidateFailed,
    ReferenceFailed,
    SeriesResult,
    audited_series,
    canary_seen,
)
from plugins.verifiers.gpu_activity.trace import Activity, aggregate, host_ops, parse_chrome_trace, profiler_calls


@hookimpl
def register_verifiers(register):
    register(GpuActivityCheck.name, GpuActivityCheck)


__all__ = ["AFTER_TIMING", "ALLOWED_ATEN", "ALLOWED_COPIES", "Activity", "Attribution", "CandidateFailed", "Coverage",
           "GpuActivityCheck", "ReferenceFailed", "SeriesResult", "aggregate", "attribute", "audited_series",
           "canary_seen", "coverage", "foreign_family", "host_op_findings", "host_ops", "judge", "own_kernel",
           "own_kernel_names", "parse_chrome_trace", "profiler_calls"]

"""The performance stage (GPU): the check, and the GPU timing and roofline only it uses.

* :mod:`.check`: :class:`PerformanceCheck` (timed runs in the worker, baselines, the verdict's
  timing and roofline records);
* :mod:`.timing`: the GPU timer (CUDA events, L2 flush, the launch filler, settling medians);
* :mod:`.roofline`: FLOPs and minimum bytes over a registered device's peaks.

To change how GPU timing is measured, edit :mod:`.timing` (and the check's knobs in :mod:`.check`).
"""

from plugins.verifiers.performance.check import (
    PerformanceCheck,
    gpu_inputs,
    load_task_module,
    parse_ncu_csv,
    register_verifiers,
    task_source_of,
    verdict_fields,
    with_speedups,
)

__all__ = ["PerformanceCheck", "gpu_inputs", "load_task_module", "parse_ncu_csv", "register_verifiers",
           "task_source_of", "verdict_fields", "with_speedups"]

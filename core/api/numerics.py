"""The numerics checks share, so a check that draws or compares on its own judges as the trials do.

- ``draw_inputs(task_module, seed, scale, device)``: a task's ``get_inputs()`` drawn from a seed;
  ``seed_everything(seed)``; ``to_device(values, device)``.
- ``compare_outputs(expected, got, tolerances)`` -> ``Comparison``; ``tolerance(dtype_name)``;
  ``bitwise_equal``, ``inputs_intact``, ``jittered_reruns`` (outliers judged against reruns on jittered
  inputs), ``REFERENCE_NOISE_FACTOR``.
- ``Float64Truth``: the task run in float64, and ``truth_for_disputed_nan``, where the reference is NaN.
- ``is_domain``: whether a stability probe's inputs lie where the reference stays finite.
- ``ALLOWED_ATEN``: the ATen ops the dispatch audit allows inside ``forward`` (copies and fills).
- ``BoundStats``, ``JudgeKernels``: what a backend's optional ``judge_kernels(device)`` lends the judge for
  very large tensors (``core.verification.devicekernels``).
"""

from __future__ import annotations

from core.api._forward import forwarding

__all__, __getattr__ = forwarding(__name__, {
    "core.verification.evidence": (
        "REFERENCE_NOISE_FACTOR", "Comparison", "bitwise_equal", "compare_outputs", "inputs_intact", "jittered_reruns",
        "tolerance", "truth_for_disputed_nan"),
    "core.verification.devicekernels": ("BoundStats", "JudgeKernels"),
    "core.verification.inputs": ("draw_inputs", "seed_everything"),
    "core.verification.probes": ("is_domain",),
    "core.verification.sandbox": ("to_device",),
    "core.verification.worker.process": ("ALLOWED_ATEN",),
    "core.verification.worker.session": ("Float64Truth",),
})

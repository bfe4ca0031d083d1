"""The check sets benchmarks/kernelbench_vs_ours.py compares with KernelBench: each must keep what
KernelBench checks (compiles, correct on several trials, timed), and each larger set must contain
the smaller, so "at least as strict" holds for every row of the comparison."""

from __future__ import annotations

from benchmarks.kernelbench_vs_ours import OUR_CONFIGS, SANITIZERS
from core.plugins import registry


def test_every_check_set_is_at_least_kernelbenchs_and_they_nest():
    names = registry("verifier").names()
    sets = {name: config(names) for name, config in OUR_CONFIGS.items()}
    checks = {name: set(c) if c is not None else set(names) for name, (c, _) in sets.items()}
    for name, chosen in checks.items():
        assert {"static", "correctness", "integrity", "performance"} <= chosen, name
        assert chosen <= set(names), name
    assert checks["kb_equivalent"] < checks["kb_scope"] < checks["memcheck"] <= checks["full"]
    # kb_scope leaves out only compute-sanitizer's tools (each a separate, slow pass over the kernel);
    # the GPU-activity audit, which costs one CUPTI trace, stays in
    assert "gpu_memcheck" in checks["memcheck"] and not checks["kb_scope"] & set(SANITIZERS)
    assert set(names) - checks["kb_scope"] <= set(SANITIZERS)
    # KernelBench times against eager only; ours too, except in the full set
    assert all(opts.get("performance", {}).get("compare_compile") is False
               for name, (_, opts) in sets.items() if name != "full")

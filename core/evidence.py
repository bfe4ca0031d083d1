"""What the verifier saw: the judge-side record that every check plugin evaluates.

The worker process only *observes* (outputs, inputs after the call, kernel launches, ATen ops run
inside ``ModelNew.forward``, out-of-bounds accesses ...). Every decision is taken in the judging
process by a :class:`core.contracts.Check` reading an :class:`Evidence`, so a candidate that patches
``torch.allclose`` or the harness in its own process changes nothing about how it is judged.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any

# Stage numbers: checks run cheapest first, and the verdict's reason names the earliest hard failure
# (integrity findings, which explain the others, come first).
STATIC = 0
COMPILE = 1
CORRECTNESS = 2
INTEGRITY = 3
MEMORY = 4
RACES = 5
STABILITY = 6
DETERMINISM = 7
PERFORMANCE = 8

# Observations a worker-side check may ask for (``Check.needs``); "trials" always runs.
OBSERVATIONS = ("trials", "shuffled", "repeat", "probes")

# (atol, rtol) per dtype name; the issue asks for ~1e-4 on fp32 and ~1e-2 on half types.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-6, 1e-6),
    "float32": (1e-4, 1e-4),
    "float16": (1e-2, 1e-2),
    "bfloat16": (2e-2, 2e-2),
}


@dataclass
class RunObservation:
    """One call of ``ModelNew.forward`` as the worker saw it (every tensor is a CPU copy)."""

    name: str
    output: list[Any] | None = None  # tensors (or plain values) the forward returned, flattened
    inputs_after: list[Any] | None = None  # the inputs as they were after the call
    error: str | None = None  # "ExcType: message" when forward raised
    launches: int = 0  # launches of the backend's kernels during the call
    kernels: list[str] = field(default_factory=list)  # names of the kernels launched
    audit: list[str] = field(default_factory=list)  # PyTorch compute ops that ran inside forward
    downcasts: list[str] = field(default_factory=list)  # float copies to a narrower dtype in forward
    oob: list[str] = field(default_factory=list)  # out-of-bounds accesses found by the backend
    output_reused: bool = False  # returned a buffer an earlier call of this session returned
    sandbox: list[str] = field(default_factory=list)  # blocked sandbox escapes (writes, sockets ...)
    seconds: float = 0.0

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunObservation":
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class Trial:
    """Inputs drawn by the reference worker, its outputs, and what the candidate returned for them."""

    seed: int
    inputs: list[Any]
    expected: list[Any]
    observed: RunObservation
    scale: float = 1.0  # stability probes: the factor floating inputs were multiplied by


@dataclass
class Evidence:
    """Everything known about one (task, candidate) pair when a check is evaluated."""

    task: Any  # core.task.Task
    candidate: Any  # core.task.Candidate
    backend: str
    device: str
    tree: ast.Module | None = None  # parsed candidate source (static stage)
    compiled: bool = False
    load_error: str | None = None
    load_sandbox: list[str] = field(default_factory=list)  # escapes blocked while importing
    trials: list[Trial] = field(default_factory=list)
    shuffled: list[Trial] = field(default_factory=list)  # same inputs as trials[0], other program orders
    repeat: list[Trial] = field(default_factory=list)  # same inputs as trials[0], same order again
    probes: list[Trial] = field(default_factory=list)  # stability probes (scaled inputs)
    extra: dict[str, Any] = field(default_factory=dict)  # data from checks' worker-side ``collect``
    config: dict[str, Any] = field(default_factory=dict)  # verifier settings (trials, tolerances ...)

    def all_runs(self) -> list[Trial]:
        return [*self.trials, *self.shuffled, *self.repeat, *self.probes]


def tolerance(dtype_name: str, overrides: dict[str, tuple[float, float]] | None = None) -> tuple[float, float]:
    """(atol, rtol) for comparing outputs of dtype ``dtype_name`` ("float32", "torch.float16" ...)."""
    name = dtype_name.replace("torch.", "")
    table = {**DEFAULT_TOLERANCES, **(overrides or {})}
    return table.get(name, (0.0, 0.0))  # integer and bool outputs must match exactly


@dataclass
class Comparison:
    ok: bool
    detail: str
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0


def compare_outputs(expected: list[Any], got: list[Any] | None, *, tolerances: dict | None = None,
                    scale_aware: bool = False) -> Comparison:
    """Compare a candidate's outputs with the reference's, in the judging process.

    Count, shapes and dtypes must match; NaN must sit where the reference has NaN and infinities
    must match in sign. With ``scale_aware`` the absolute tolerance is relative to the reference's
    largest finite magnitude (stability probes run at extreme input scales).
    """
    import torch

    if got is None:
        return Comparison(False, "no output")
    if len(got) != len(expected):
        return Comparison(False, f"returned {len(got)} outputs, expected {len(expected)}")
    worst_abs = worst_rel = 0.0
    for i, (e, g) in enumerate(zip(expected, got)):
        where = f"output {i}" if len(expected) > 1 else "output"
        if not isinstance(e, torch.Tensor):
            if e != g:
                return Comparison(False, f"{where} is {g!r}, expected {e!r}")
            continue
        if not isinstance(g, torch.Tensor):
            return Comparison(False, f"{where} is a {type(g).__name__}, expected a tensor")
        if tuple(g.shape) != tuple(e.shape):
            return Comparison(False, f"{where} has shape {tuple(g.shape)}, expected {tuple(e.shape)}")
        if g.dtype != e.dtype:
            return Comparison(False, f"{where} has dtype {g.dtype}, expected {e.dtype}")
        atol, rtol = tolerance(str(e.dtype), tolerances)
        if e.numel() == 0:
            continue
        e64, g64 = e.to(torch.float64), g.to(torch.float64)
        e_nan, g_nan = torch.isnan(e64), torch.isnan(g64)
        if not torch.equal(e_nan, g_nan):
            bad = int((e_nan != g_nan).sum())
            kind = "NaN where the reference is a number" if bool((g_nan & ~e_nan).any()) else "a number where the reference is NaN"
            return Comparison(False, f"{where}: {bad} element(s) hold {kind}")
        finite = torch.isfinite(e64) & torch.isfinite(g64)
        inf_mismatch = (~torch.isnan(e64)) & (~finite) & (e64 != g64)
        if bool(inf_mismatch.any()):
            n = int(inf_mismatch.sum())
            return Comparison(False, f"{where}: {n} element(s) are infinite where the reference is not (or vice versa)")
        if scale_aware:
            mag = float(e64[finite].abs().max()) if bool(finite.any()) else 0.0
            atol = atol * max(mag, 1e-30)
        diff = (e64 - g64).abs()[finite]
        if diff.numel():
            ref = e64.abs()[finite]
            max_abs = float(diff.max())
            rel = diff / ref.clamp_min(1e-30)
            max_rel = float(rel[ref > 0].max()) if bool((ref > 0).any()) else 0.0
            worst_abs, worst_rel = max(worst_abs, max_abs), max(worst_rel, max_rel)
            bad = diff > atol + rtol * ref
            if bool(bad.any()):
                n = int(bad.sum())
                return Comparison(False, f"{where}: {n}/{e.numel()} elements differ beyond atol={atol:.3g} "
                                  f"rtol={rtol:.3g} (max abs err {max_abs:.3g})", max_abs, max_rel)
    return Comparison(True, f"matches (max abs err {worst_abs:.3g})", worst_abs, worst_rel)


def bitwise_equal(a: Any, b: Any) -> bool:
    """Same shape, dtype and bytes (so NaN == NaN, and -0.0 != 0.0)."""
    import torch

    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return a == b
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.detach().reshape(-1).contiguous().view(torch.uint8),
                       b.detach().reshape(-1).contiguous().view(torch.uint8))


def same_inputs(before: list[Any], after: list[Any] | None) -> tuple[bool, str]:
    """Bitwise equality of the inputs before and after a call."""
    if after is None:
        return True, ""
    if len(after) != len(before):
        return False, "the number of inputs changed"
    for i, (b, a) in enumerate(zip(before, after)):
        if not bitwise_equal(b, a):
            return False, f"input {i} was modified by forward"
    return True, ""

"""Run a lowered candidate beside its reference in this process (the expert's own tests and tools).

This is for code the expert generated itself; untrusted candidates go through ``core.verify``,
which never imports them in the judging process.
"""

from __future__ import annotations

import importlib.util
import itertools
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

_counter = itertools.count()


def load_module(source: str, stem: str = "mod") -> ModuleType:
    """Import ``source`` from a real file (``triton.jit`` reads kernel source through ``inspect``)."""
    name = f"_kz_{stem}_{next(_counter)}"
    folder = Path(tempfile.mkdtemp(prefix="kz_expert_"))
    path = folder / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(atol, rtol) the verifier's correctness stage uses for a dtype."""
    return (1e-2, 1e-2) if dtype in (torch.float16, torch.bfloat16) else (1e-4, 1e-4)


@dataclass
class PairResult:
    ok: bool
    detail: str


def compare(task_source: str, candidate_source: str, *, device: str = "cpu", seed: int = 0,
            trials: int = 2) -> PairResult:
    """Build ``Model`` and ``ModelNew`` under one seed, run both on the same inputs, compare outputs."""
    ref = load_module(task_source, "ref")
    cand = load_module(candidate_source, "cand")
    for trial in range(trials):
        torch.manual_seed(seed + trial)
        init = ref.get_init_inputs()
        torch.manual_seed(seed + trial)
        model = ref.Model(*init).to(device).eval()  # as the verifier builds both: eval mode
        torch.manual_seed(seed + trial)
        model_new = cand.ModelNew(*init).to(device).eval()
        torch.manual_seed(seed + 1000 + trial)
        inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in ref.get_inputs()]
        before = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
        with torch.no_grad():
            expected = model(*inputs)
            got = model_new(*inputs)
        for x, b in zip(inputs, before):
            if isinstance(x, torch.Tensor) and not torch.equal(x.nan_to_num(), b.nan_to_num()):
                return PairResult(False, "the candidate modified an input")
        if got.shape != expected.shape or got.dtype != expected.dtype:
            return PairResult(False, f"output {tuple(got.shape)} {got.dtype}, expected "
                                     f"{tuple(expected.shape)} {expected.dtype}")
        expected = _with_disputed_nans_resolved(model, inputs, expected, got)
        atol, rtol = tolerance(expected.dtype)
        try:
            torch.testing.assert_close(got, expected, atol=atol, rtol=rtol, equal_nan=True)
        except AssertionError as exc:
            return PairResult(False, f"trial {trial}: {str(exc).splitlines()[0:4]}")
    return PairResult(True, "ok")


def _with_disputed_nans_resolved(model: torch.nn.Module, inputs: list, expected: torch.Tensor,
                                 got: torch.Tensor) -> torch.Tensor:
    """``expected`` as the verifier judges it where it is NaN and the candidate holds a number: the
    task's float64 value stands in there when it has one (``core.verification.evidence.truth_for_disputed_nan``,
    the float64 run as the reference worker makes it)."""
    import sys

    from core.api.numerics import Float64Truth, truth_for_disputed_nan

    disputed = torch.isnan(expected) & ~torch.isnan(got)
    if not bool(disputed.any()):
        return expected
    truth = Float64Truth(model, str(expected.device.type), sys.maxsize).outputs(inputs, [expected])
    stood_in = truth_for_disputed_nan(truth[0] if truth else None, expected, disputed)
    return expected if stood_in is None else stood_in

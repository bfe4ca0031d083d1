"""Running a task's reference on CPU: validity checks and the degenerate-task filter.

A task is *degenerate* (METR's and robust-kbench's filters) when a kernel could pass it without
doing the work: its output is constant, (near) zero everywhere, or does not depend on the inputs;
or when its output is mostly not finite on its own inputs (a chain of ops off their domain, such as
rsqrt -> mul -> sqrt on randn: 80% NaN), so most of what a kernel writes is never compared as a value.
The check runs the reference twice on fresh inputs, at the task's (small) shapes, on CPU.
"""

from __future__ import annotations

import math
import types
from dataclasses import dataclass
from typing import Any, Mapping

# Largest share of an output that may be NaN or infinite (both runs together). One op off half its
# domain on randn (sqrt, log, rsqrt) is NaN on about half of it and stays; chains that compound it go.
MAX_NON_FINITE = 0.6

from core.program import OpSpec, Program
from core.task import Task


def load_module(source: str, name: str = "kernelzero_task") -> types.ModuleType:
    """Execute a KernelBench-format source into a fresh module object."""
    module = types.ModuleType(name)
    exec(compile(source, f"<{name}>", "exec"), module.__dict__)
    return module


def run_reference(source: str | Task, seed: int = 0, module: types.ModuleType | None = None) -> Any:
    """``Model(*get_init_inputs())(*get_inputs())`` on CPU with ``torch.manual_seed(seed)``."""
    import torch  # here, not at the top: loading the plugin registry must not import torch (core.verify)

    if module is None:
        module = load_module(source.source if isinstance(source, Task) else source)
    torch.manual_seed(seed)
    model = module.Model(*module.get_init_inputs())
    with torch.no_grad():
        return model(*module.get_inputs())


@dataclass(frozen=True)
class Degeneracy:
    """Why a task was rejected (``reason``) or ``None`` when it is fine."""

    reason: str | None

    def __bool__(self) -> bool:
        return self.reason is not None


def degeneracy(task: Task, *, near_zero: float = 1e-6, allow_empty: bool = False,
               max_non_finite: float = MAX_NON_FINITE) -> Degeneracy:
    """Check a task's reference output on CPU. Returns a falsy :class:`Degeneracy` when the task is fine.

    :param near_zero: outputs whose largest finite magnitude is below this are "near zero".
    :param allow_empty: accept an empty output (adversarial zero-size tasks are empty on purpose).
    :param max_non_finite: largest share of NaN/Inf output elements; not applied to ``nan_inf``
        adversarial tasks, whose planted NaN and Inf inputs are meant to spread.
    """
    import torch

    try:
        module = load_module(task.source)
        first = run_reference(task, seed=1, module=module)
        second = run_reference(task, seed=2, module=module)
    except Exception as exc:  # the reference itself must run: any failure is a rejection
        return Degeneracy(f"reference failed on CPU: {type(exc).__name__}: {exc}")
    if not isinstance(first, torch.Tensor):
        return Degeneracy(f"reference returned {type(first).__name__}, expected a tensor")
    if first.numel() == 0:
        return Degeneracy(None if allow_empty else "output is empty")
    a, b = first.double(), second.double()
    finite = torch.isfinite(a)
    if not bool(finite.any()):
        return Degeneracy("output has no finite value")
    share = float((~finite).sum() + (~torch.isfinite(b)).sum()) / (a.numel() + b.numel())
    if share > max_non_finite and "nan_inf" not in (task.adversarial or ()):
        return Degeneracy(f"output is mostly not finite ({100 * share:.0f}% NaN or Inf on its own inputs)")
    values = a[finite]
    if float(values.abs().max()) < near_zero:
        return Degeneracy(f"output is near zero (max |y| < {near_zero:g})")
    if a.numel() > 1 and float(values.max() - values.min()) <= 1e-7 * max(1.0, float(values.abs().max())):
        return Degeneracy("output is constant")
    if torch.equal(torch.nan_to_num(a), torch.nan_to_num(b)):
        return Degeneracy("output does not depend on the inputs")
    return Degeneracy(None)


def check_task(task: Task, catalog: Mapping[str, OpSpec]) -> tuple[int, ...]:
    """Assert a task is valid: metadata matches its program, inputs match the declared shapes and
    dtypes, and the reference runs on CPU with the inferred output shape. Returns that shape."""
    program = Program.from_dict(task.program)
    shapes = program.value_shapes(catalog)
    problems = []
    if task.ops != program.ops:
        problems.append(f"ops {task.ops} != program ops {program.ops}")
    if task.shapes != [list(t.shape) for t in program.inputs]:
        problems.append(f"shapes {task.shapes} != program input shapes")
    if task.flops != program.flops(catalog):
        problems.append(f"flops {task.flops} != {program.flops(catalog)}")
    if task.min_bytes != program.min_bytes(catalog):
        problems.append(f"min_bytes {task.min_bytes} != {program.min_bytes(catalog)}")
    module = load_module(task.source)
    inputs = module.get_inputs()
    if [list(x.shape) for x in inputs] != task.shapes:
        problems.append(f"get_inputs() shapes {[list(x.shape) for x in inputs]} != {task.shapes}")
    if [str(x.dtype).removeprefix("torch.") for x in inputs] != task.dtypes:
        problems.append(f"get_inputs() dtypes differ from {task.dtypes}")
    out = run_reference(task, module=module)
    if tuple(out.shape) != tuple(shapes[-1]):
        problems.append(f"output shape {tuple(out.shape)} != inferred {tuple(shapes[-1])}")
    if problems:
        raise AssertionError(f"task {task.id} is invalid: " + "; ".join(problems) + "\n" + task.source)
    return tuple(shapes[-1])


def numel(shape) -> int:
    return math.prod(shape)

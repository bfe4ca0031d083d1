"""CPU-sized copies of KernelBench problems: module-level size constants scaled down to a budget.

KernelBench problems fix their sizes in module-level constants (``batch_size = 16``,
``dim = 16384``, ``height = width = 128``) that ``get_inputs``/``get_init_inputs`` read. At those
sizes most level-1 inputs are gigabytes, out of reach of a CPU worker. :func:`fit_task` rewrites the
constants' assignments in the source (nothing else changes, so the copy still loads in KernelBench's
own harness) so that the task fits a budget.

**Which constants are sizes.** A module-level ``NAME = <int>`` (also ``a, b = 16, 32``,
``h = w = 128``, ``N = 2048 * 2`` and int tuples such as ``input_shape = (4096,)``) is a size when

1. doubling it changes the shape of a drawn input or of a model parameter or buffer (checked on the
   ``meta`` device: no memory, no compute), and
2. its name is not a hyperparameter's: nothing matching :data:`HYPERPARAMETER` (kernel, stride,
   padding, dilation, groups, heads, pool ...).

So ``dim = 16384`` of an elementwise problem is a size and ``dim = 1`` of a reduction (an axis) is
not; ``out_channels`` is (it shapes the weights), ``kernel_size`` and ``num_groups`` are not, and
``num_classes`` is only where an input has that many columns.

**The budget.** Every size is multiplied by one factor ``2**-k`` (rounded, at least 1); ``k`` is the
smallest for which the task still builds and runs on ``meta``, its inputs + weights + every tensor
its forward writes take at most ``mib`` MiB, its products, convolutions and attention at most
``gflop`` GFLOP (torch's FLOP counter, a convolution counted as the implicit GEMM the kernels run:
every output times every tap, so a stride-2 3-D transposed convolution counts 8x its useful FLOPs;
the Triton interpreter spends its time there), and then, if
``seconds`` is given, its reference ``forward`` on the CPU takes at most that long. One factor for every size keeps
the problem's proportions. A task that no factor fits runs at the smallest sizes it still builds
at (or, if none builds smaller, its own), and says so.

The result is recorded on the task (``Task.resized``) and in the evaluation's results; nothing is
shrunk silently (``core.eval`` prints how many tasks were measured at reduced sizes).
"""

from __future__ import annotations

import ast
import importlib.util
import itertools
import math
import re
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from core.task import Task

HYPERPARAMETER = re.compile(r"kernel|stride|pad|dilation|group|head|pool|window|axis", re.IGNORECASE)
MAX_SHIFT = 24  # 2**-24: no KernelBench size needs more
_counter = itertools.count()


@dataclass
class Constant:
    """One size-like literal in the source: its names, value and where its text is."""

    names: tuple[str, ...]
    value: int | tuple[int, ...]
    spans: list[tuple[int, int]]  # character spans of the literal(s) in the source

    @property
    def label(self) -> str:
        return "=".join(self.names)


@dataclass
class FitResult:
    """What :func:`fit_task` chose: the factor, each size before and after, and the measurements."""

    factor: float
    sizes: dict[str, list[Any]]  # label -> [original, used]
    mib: float  # inputs + weights + every tensor one forward writes, at the used sizes
    gflop: float | None = None  # its products/convolutions/attention (torch's FLOP counter), when measured
    reference_s: float | None = None  # the reference forward on CPU at the used sizes, when timed
    fitted: bool = True  # False: no factor met the budget; the task keeps its sizes
    note: str = ""
    budget: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------- finding the constants


def _int_value(node: ast.AST) -> int | None:
    """The value of an int literal or of int arithmetic on literals (``2048 * 2``), else None."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Pow)):
        a, b = _int_value(node.left), _int_value(node.right)
        if a is None or b is None:
            return None
        try:
            return {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b, ast.FloorDiv: a // b if b else None,
                    ast.Pow: a ** b if 0 <= b < 64 else None}[type(node.op)]
        except (ArithmeticError, OverflowError):
            return None
    return None


def _span(node: ast.AST, lines: list[str], starts: list[int]) -> tuple[int, int]:
    """Character span of ``node`` (ast columns count UTF-8 bytes of their line)."""

    def at(line: int, col: int) -> int:
        return starts[line - 1] + len(lines[line - 1].encode("utf-8")[:col].decode("utf-8", errors="ignore"))

    return at(node.lineno, node.col_offset), at(node.end_lineno, node.end_col_offset)


def find_constants(source: str) -> list[Constant]:
    """Every module-level int constant (or int tuple) in assignment order."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    starts = list(itertools.accumulate((len(line) for line in lines), initial=0))
    found: list[Constant] = []
    for stmt in tree.body:
        if not isinstance(stmt, ast.Assign):
            continue
        targets = stmt.targets
        if len(targets) == 1 and isinstance(targets[0], ast.Tuple) and isinstance(stmt.value, ast.Tuple) \
                and len(targets[0].elts) == len(stmt.value.elts):
            for name, value in zip(targets[0].elts, stmt.value.elts):
                number = _int_value(value)
                if isinstance(name, ast.Name) and number is not None:
                    found.append(Constant((name.id,), number, [_span(value, lines, starts)]))
            continue
        if not all(isinstance(t, ast.Name) for t in targets):
            continue
        names = tuple(t.id for t in targets)
        number = _int_value(stmt.value)
        if number is not None:
            found.append(Constant(names, number, [_span(stmt.value, lines, starts)]))
        elif isinstance(stmt.value, ast.Tuple) and stmt.value.elts:
            numbers = [_int_value(e) for e in stmt.value.elts]
            if all(n is not None for n in numbers):
                found.append(Constant(names, tuple(numbers), [_span(e, lines, starts) for e in stmt.value.elts]))
    return found


def rewrite(source: str, values: dict[int, int | tuple[int, ...]], constants: Sequence[Constant]) -> str:
    """``source`` with constant ``i`` (an index into ``constants``) set to ``values[i]``."""
    edits: list[tuple[int, int, str]] = []
    for i, value in values.items():
        const = constants[i]
        parts = value if isinstance(value, tuple) else (value,)
        for (start, end), v in zip(const.spans, parts):
            edits.append((start, end, str(int(v))))
    out = source
    for start, end, text in sorted(edits, reverse=True):
        out = out[:start] + text + out[end:]
    return out


# --------------------------------------------------------------------------- running a variant


def _load(source: str) -> Any:
    name = f"_kz_resize_{next(_counter)}"
    path = Path(tempfile.mkdtemp(prefix="kz_resize_")) / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(name, None)
    return module


@dataclass
class Probe:
    """A variant built on ``meta``: its input/weight shapes and its footprint."""

    input_shapes: list[tuple[int, ...]]
    weight_shapes: list[tuple[int, ...]]
    mib: float  # inputs + weights + every tensor the forward produces (intermediates and output)
    gflop: float = 0.0  # products, convolutions (as gathered work) and attention of one forward


def _written_bytes():
    """A dispatch mode that adds up the bytes of every tensor an op produces, and the implicit-GEMM
    work of every convolution (outputs x taps x 2: what a kernel that gathers its taps computes,
    a strided transposed convolution's skipped taps included)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Written(TorchDispatchMode):
        total = 0
        conv_work = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor):
                    Written.total += t.numel() * t.element_size()
            if func.overloadpacket is torch.ops.aten.convolution and isinstance(out, torch.Tensor):
                weight, transposed, groups = args[1], bool(args[6]), int(args[8])
                taps = (weight.shape[0] // groups if transposed else weight.shape[1]) * math.prod(weight.shape[2:])
                Written.conv_work += 2 * out.numel() * taps
            return out

    return Written


# Tasks probed at once (the judge's threads): the first patches torch's methods, the last puts the real ones back.
_on_meta_lock = threading.Lock()
_on_meta_users = 0
_real_moves: tuple[Any, Any] | None = None  # torch.Tensor.cuda and .to while patched


@contextmanager
def cuda_stays_on_meta() -> Iterator[None]:
    """While active, ``.cuda()`` and ``.to("cuda")`` of a meta tensor return it on meta (KernelBench's own
    ``get_inputs`` move their inputs so); every other tensor moves as ever. Process-wide, as torch's methods are."""
    global _on_meta_users, _real_moves
    import torch

    with _on_meta_lock:
        if _on_meta_users == 0:
            real_cuda, real_to = _real_moves = torch.Tensor.cuda, torch.Tensor.to

            def stay_cuda(self, *args, **kwargs):
                return self if self.is_meta else real_cuda(self, *args, **kwargs)

            def stay_to(self, *args, **kwargs):
                if self.is_meta:
                    args = tuple(a for a in args if not isinstance(a, (str, torch.device)))
                    kwargs.pop("device", None)
                    return real_to(self, *args, **kwargs) if (args or kwargs) else self
                return real_to(self, *args, **kwargs)

            torch.Tensor.cuda, torch.Tensor.to = stay_cuda, stay_to
        _on_meta_users += 1
    try:
        yield
    finally:
        with _on_meta_lock:
            _on_meta_users -= 1
            if _on_meta_users == 0:
                torch.Tensor.cuda, torch.Tensor.to = _real_moves
                _real_moves = None


def probe(source: str, run_forward: bool = True) -> Probe:
    """Build the task on the meta device (and run its forward there); raises if it does not build.
    ``.cuda()`` in its ``get_inputs`` stays on meta (:func:`cuda_stays_on_meta`).

    The footprint counts every intermediate too: the Triton interpreter's time, what a CPU run
    waits on, grows with all the data the kernels write, not just the final output."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    module = _load(source)
    flops = 0
    with cuda_stays_on_meta(), torch.device("meta"):
        model = module.Model(*module.get_init_inputs())
        inputs = list(module.get_inputs())
        tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
        weights = list(model.parameters()) + list(model.buffers())
        total = sum(t.numel() * t.element_size() for t in tensors + weights)
        if run_forward:
            written, counter = _written_bytes(), FlopCounterMode(display=False)
            with torch.no_grad(), counter, written():
                model.eval()(*inputs)
            total += written.total
            # torch's count, with each convolution's useful FLOPs replaced by its gathered work
            conv = sum(v for op, v in counter.get_flop_counts().get("Global", {}).items()
                       if "convolution" in str(op))
            flops = counter.get_total_flops() - conv + written.conv_work
    return Probe([tuple(t.shape) for t in tensors], [tuple(w.shape) for w in weights], total / 2**20, flops / 1e9)


def measure(module: Any) -> dict[str, int]:
    """A loaded task's tensors on the ``meta`` device (no memory, no compute), in bytes: ``inputs``
    (one draw of ``get_inputs``), ``weights`` (parameters and buffers), ``outputs`` (what forward
    returns), ``written`` (every tensor the forward produces, outputs included: a bound on its
    intermediates) and ``elements`` (of inputs and outputs). The verifier's GPU memory estimate
    (:mod:`core.verification.gpumemory`) starts here. ``.cuda()``/``.to("cuda")`` in a task's
    ``get_inputs`` (KernelBench's own files) stay on meta while measuring."""
    import torch

    with cuda_stays_on_meta(), torch.device("meta"):
        model = module.Model(*module.get_init_inputs())
        given = list(module.get_inputs())  # plain values (a scale, a dim) are passed on as they are
        inputs = [x for x in given if isinstance(x, torch.Tensor)]
        weights = list(model.parameters()) + list(model.buffers())
        written = _written_bytes()
        with torch.no_grad(), written():
            out = model.eval()(*given)
    outs = [t for t in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(t, torch.Tensor)]

    def size(ts: list[Any]) -> int:
        return sum(t.numel() * t.element_size() for t in ts)

    return {"inputs": size(inputs), "weights": size(weights), "outputs": size(outs),
            "written": int(written.total), "elements": sum(t.numel() for t in inputs + outs)}


def time_reference(source: str, repeats: int = 1) -> float:
    """Seconds of the reference's forward on the CPU (real tensors), the fastest of ``repeats``."""
    import torch

    module = _load(source)
    torch.manual_seed(0)
    model = module.Model(*module.get_init_inputs()).eval()
    inputs = list(module.get_inputs())
    best = math.inf
    with torch.no_grad():
        for _ in range(max(1, repeats)):
            started = time.perf_counter()
            model(*inputs)
            best = min(best, time.perf_counter() - started)
    return best


def _doubled(value: int | tuple[int, ...]) -> int | tuple[int, ...]:
    return tuple(2 * v for v in value) if isinstance(value, tuple) else 2 * value


def size_constants(source: str, constants: Sequence[Constant] | None = None) -> list[int]:
    """Indices (into :func:`find_constants`) of the constants that are sizes (module docstring rule).

    A constant whose doubling alone breaks the task (``groups=in_channels`` with ``out_channels``
    equal to it) is doubled together with every other candidate of the same value."""
    constants = find_constants(source) if constants is None else constants
    base = probe(source, run_forward=False)
    candidates = []
    for i, const in enumerate(constants):
        values = const.value if isinstance(const.value, tuple) else (const.value,)
        if not any(HYPERPARAMETER.search(n) for n in const.names) and all(v >= 1 for v in values):
            candidates.append(i)

    def changes(indices: Sequence[int]) -> bool | None:
        try:
            changed = probe(rewrite(source, {i: _doubled(constants[i].value) for i in indices}, constants),
                            run_forward=False)
        except Exception:
            return None
        return changed.input_shapes != base.input_shapes or changed.weight_shapes != base.weight_shapes

    sizes = []
    for i in candidates:
        verdict = changes([i])
        if verdict is None:  # tied to another constant: double it with every candidate of its value
            verdict = changes([j for j in candidates if constants[j].value == constants[i].value])
        if verdict:
            sizes.append(i)
    return sizes


def _scaled(value: int | tuple[int, ...], factor: float, snap: int = 1) -> int | tuple[int, ...]:
    """``value * factor`` rounded, at least 1; with ``snap``, a multiple of the power of two (up to
    ``snap``) that divides the original, so divisibility by a fixed ``num_groups`` survives."""

    def one(v: int) -> int:
        step = 1
        while step * 2 <= snap and v % (step * 2) == 0:
            step *= 2
        return max(step, int(round(v * factor / step)) * step, 1)

    return tuple(one(v) for v in value) if isinstance(value, tuple) else one(value)


SNAPS = (1, 2, 4, 8, 16, 32, 64)


# --------------------------------------------------------------------------- fitting


def fit_source(source: str, mib: float, seconds: float | None = None,
               gflop: float | None = None) -> tuple[str, FitResult]:
    """The source rewritten to fit ``mib``, and ``gflop`` of products and convolutions and ``seconds``
    of reference forward on CPU where given."""
    budget = {"mib": mib, "s": seconds, "gflop": gflop}
    constants = find_constants(source)
    try:
        sizes = size_constants(source, constants)
        full = probe(source)
    except Exception as exc:
        return source, FitResult(1.0, {}, math.nan, fitted=False, budget=budget,
                                 note=f"the task does not run on the meta device ({type(exc).__name__}: {str(exc)[:160]})")
    if not sizes:
        fits = full.mib <= mib and (gflop is None or full.gflop <= gflop)
        return source, FitResult(1.0, {}, round(full.mib, 3), round(full.gflop, 4), fitted=fits, budget=budget,
                                 note="" if fits else "no size constant to scale")
    last_error = ""
    previous: dict[int, Any] | None = None
    smallest: tuple[str, float, dict[int, Any], Probe] | None = None  # the last variant that built
    for shift in range(MAX_SHIFT + 1):
        factor = 2.0 ** -shift
        if previous is not None and {i: _scaled(constants[i].value, factor) for i in sizes} == previous:
            break  # every size is at its floor already: smaller factors change nothing
        previous = {i: _scaled(constants[i].value, factor) for i in sizes}
        tried: list[dict[int, Any]] = []
        for snap in SNAPS if shift else (1,):
            values = {i: _scaled(constants[i].value, factor, snap) for i in sizes}
            if values in tried:
                continue
            tried.append(values)
            variant = rewrite(source, values, constants) if shift else source
            try:
                measured = probe(variant)
            except Exception as exc:  # too small for the task (a kernel larger than the input ...)
                last_error = f"{type(exc).__name__}: {str(exc)[:160]}"
                continue
            smallest = (variant, factor, values, measured)
            if measured.mib > mib or (gflop is not None and measured.gflop > gflop):
                break  # over the budget at this factor: try the next one
            elapsed = None
            if seconds is not None:
                elapsed = time_reference(variant)
                if elapsed > seconds:
                    break
            return variant, _result(constants, sizes, factor, values, measured, elapsed, budget)
    if smallest is None or smallest[1] == 1.0:
        note = "no factor fits" + (f" (last: {last_error})" if last_error else "")
        return source, FitResult(1.0, {}, round(full.mib, 3), round(full.gflop, 4), fitted=False, budget=budget,
                                 note=note)
    # nothing meets every budget: the smallest sizes the task still builds at, said so
    variant, factor, values, measured = smallest
    result = _result(constants, sizes, factor, values, measured, None, budget)
    result.fitted = False
    result.note = "over the budget even at the smallest sizes it builds at; measured at those"
    return variant, result


def _result(constants: Sequence[Constant], sizes: list[int], factor: float, values: dict[int, Any], measured: Probe,
            elapsed: float | None, budget: dict[str, Any]) -> FitResult:
    table = {constants[i].label: [_plain(constants[i].value), _plain(values[i])] for i in sizes} if factor < 1 else {}
    return FitResult(factor, table, round(measured.mib, 3), round(measured.gflop, 4),
                     None if elapsed is None else round(elapsed, 4), budget=budget)


def _plain(value: int | tuple[int, ...]) -> Any:
    return list(value) if isinstance(value, tuple) else value


def fit_task(task: Task, mib: float, seconds: float | None = None, gflop: float | None = None) -> Task:
    """A copy of ``task`` fitted to the budget, with ``resized`` recording what was done.

    A task whose source is unchanged (it already fits, or nothing fits) is returned with the
    record too, so a report can say which tasks kept their sizes and why."""
    source, result = fit_source(task.source, mib, seconds, gflop)
    data = task.to_dict()
    data.pop("id", None)
    data["source"] = source
    data["resized"] = result.to_dict()
    if source != task.source:
        data["program"] = None  # an IR drawn at the old sizes no longer describes the task
        data["shapes"], data["flops"], data["min_bytes"] = [], None, None
    return Task.from_dict(data)


def fit_tasks(tasks: Sequence[Task], mib: float, seconds: float | None = None, gflop: float | None = None,
              on_task: Any = None) -> list[Task]:
    out = []
    for task in tasks:
        fitted = fit_task(task, mib, seconds, gflop)
        out.append(fitted)
        if on_task is not None:
            on_task(fitted)
    return out


def is_reduced(task: Task) -> bool:
    """Whether the task runs at sizes other than its source's originals."""
    record = getattr(task, "resized", None) or {}
    return bool(record.get("sizes"))


__all__ = ["Constant", "FitResult", "HYPERPARAMETER", "find_constants", "fit_source", "fit_task", "fit_tasks",
           "is_reduced", "measure", "probe", "rewrite", "size_constants", "time_reference"]



# --------------------------------------------------------------------------- core.eval's switch


def fit_enabled(setting: Any, device: str) -> bool:
    """``fit.enabled``: ``auto`` fits on the CPU only (real sizes on a GPU); ``true``/``false`` always/never."""
    if isinstance(setting, str) and setting.lower() == "auto":
        return device == "cpu"
    if isinstance(setting, str):
        return setting.lower() in ("1", "true", "yes", "on")
    return bool(setting)


def fit_for_eval(tasks: Sequence[Task], fit: Any, device: str) -> tuple[list[Task], dict[str, Any]]:
    """The tasks ``core.eval`` verifies under its ``fit`` config, and what was done to them.

    Returns ``(tasks, info)``: ``info["reduced"]`` counts tasks now at smaller sizes,
    ``info["unfitted"]`` names tasks no factor fitted (with what they run at), ``info["sizes"]`` maps
    each resized task's name to its :class:`FitResult` record."""
    fit = dict(fit or {})
    info: dict[str, Any] = {"enabled": fit_enabled(fit.get("enabled", "auto"), device), "reduced": 0,
                            "total": len(tasks), "unfitted": [], "sizes": {},
                            "budget": {"mib": fit.get("mib"), "s": fit.get("s"), "gflop": fit.get("gflop")}}
    if not info["enabled"]:
        return list(tasks), info
    mib = float(fit.get("mib", 4))
    seconds = None if fit.get("s") is None else float(fit["s"])
    gflop = None if fit.get("gflop") is None else float(fit["gflop"])
    # a task with proposer IR was drawn at its sizes by the proposer; only hand-written files are fitted
    fitted = [task if task.program else fit_task(task, mib, seconds, gflop) for task in tasks]
    for task in fitted:
        record = task.resized or {}
        label = f"{task.level}/{task.name}" if task.level and task.name else (task.name or task.id)
        if record.get("sizes"):
            info["reduced"] += 1
            info["sizes"][label] = record
        if not record.get("fitted", True):
            info["unfitted"].append(f"{label}: {record.get('note', '')}")
    return fitted, info

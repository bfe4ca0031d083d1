"""Instruments for the Triton interpreter (``TRITON_INTERPRET=1``), installed once per worker.

* **Bounds checking**: every masked load/store (and atomic) address is checked against the
  storages of the running launch's tensor arguments. An out-of-bounds access is recorded and
  *suppressed* (its mask bit cleared), so it is reported as a finding instead of reading garbage or
  corrupting the heap; the kernel runs on.
* **Program order**: the grid's programs run in a shuffled order. The interpreter walks the grid
  with nested loops calling ``set_grid_idx``; we remap each linear index through a permutation,
  so every program still runs exactly once.
* **Provenance** (while a ledger is set, :mod:`plugins.backends.provenance`): which argument
  storages each launch loads from, and which bytes it writes (marked as a kernel's).
* **Races** (while the program order is shuffled): every address each program loads, stores or
  touches atomically is logged, and at the end of the launch an address one program writes and
  another touches outside atomics is reported (:mod:`plugins.backends.triton_races`), as a finding
  prefixed ``race: `` beside the bounds findings, with one ``race analysis: `` summary line per call.
* **Sampling** (while a sample budget is set, :func:`sampling`): a launch whose grid has more
  programs than the budget runs only a sample of them, chosen by :func:`choose_programs` (the first
  and the last, their neighbours along each grid axis, random programs with their neighbours), each
  with its true program ids and the true grid (``tl.num_programs``). The interpreter's
  ``GridExecutor.__call__`` is wrapped so that it walks a grid of ``(k, 1, 1)``; ``set_grid_idx(i,
  0, 0)`` becomes the i-th sampled program. So a task runs at its own shape, with the real
  arguments, at the cost of ``k`` programs per launch; each launch's sample is recorded.

They hook the interpreter's builder class (``triton.runtime.interpreter.InterpreterBuilder``) and
``GridExecutor.__call__``, present with the same names in Triton 3.6 and 3.9.
"""

from __future__ import annotations

import ast
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from core.api.evidence import RACE_FINDING, RACE_SUMMARY
from plugins.backends.provenance import KERNEL, tensors_in
from plugins.backends.triton_races import ATOMIC, EXCHANGE, LOAD, MAX_ADDRESSES, STORE, AccessLog, find_races

MAX_FINDINGS = 16
SAMPLED_MAX_ADDRESSES = 4 * MAX_ADDRESSES  # per sampled launch (8 bytes each, plus the stores' bits): 512 MiB


@dataclass
class InterpreterState:
    """What the current launch may touch, and what the instruments found."""

    ranges: list[tuple[int, int]] | None = None  # [lo, hi) byte ranges of the launch's storages
    kernel: str = "?"
    findings: list[str] | None = None  # None: bounds checking is off
    order_rng: random.Random | None = None  # None: natural program order
    perm: list[int] | None = None
    grid: tuple[int, int, int] = (1, 1, 1)
    seen: set = field(default_factory=set)
    races: bool = False  # log every access of each launch and look for races at its end
    log: AccessLog | None = None  # the running launch's accesses
    atomic_depth: int = 0  # >0 inside an atomic op the interpreter builds from plain loads/stores
    analysed: list[int] = field(default_factory=lambda: [0, 0, 0])  # this call: launches, addresses, cut short
    summary_at: int | None = None  # index of this call's summary line in ``findings``
    ledger: Any = None  # the call's provenance ledger (plugins.backends.provenance), None: off
    marks: list[tuple[int, int, Any]] | None = None  # running launch: (lo, hi, producer array) per storage
    loaded: set[int] | None = None  # running launch: low addresses of the storages it loaded from
    sample: int = 0  # >0: a launch with more programs runs a sample of this many (choose_programs)
    sampled: list[int] | None = None  # the running launch's sampled programs (linear ids), in run order
    true_grid: tuple[int, int, int] | None = None  # the running sampled launch's real grid
    launches: list[dict] | None = None  # while sampling: one record per launch (grid, sample, how chosen)
    launch_s: float = 0.0  # while sampling: no program of a launch starts after this many seconds (0: no limit)
    launch_deadline: float = float("inf")  # the running sampled launch's
    loop_seed: int = 0  # the running sampled launch's: which iterations of a long loop run (all its programs alike)
    launch_record: dict | None = None  # the running sampled launch's record


MAX_LAUNCH_RECORDS = 64
# Programs of a sampled launch (of more than one) that run whatever its time budget says: the first
# and its first neighbour. A race is between two programs; with one analysed, a kernel whose programs
# outlast the budget (a deep loop, or one added to outlast it) had none to find.
MIN_SAMPLED_PROGRAMS = 2


# While sampling, a loop of more iterations than LOOP_SAMPLE_ABOVE runs that many of them: the first and the
# last LOOP_EDGE and the rest drawn between, in order, the same ones in every program of the launch. The
# interpreter takes ~0.3-0.7 ms an iteration: a full reduction at KernelBench's sizes is one program of 524288
# iterations (96_HuberLoss: over the analysis' 300 s), a matrix-vector product 32768 a program.
LOOP_SAMPLE_ABOVE = 4096
LOOP_EDGE = 1024


class SampleBudgetSpent(BaseException):
    """Raised before a sampled program starts after its launch's time budget: the launch ends there
    (a BaseException, so the interpreter's ``except Exception`` passes it to the executor's wrapper)."""


def choose_programs(grid: tuple[int, int, int], budget: int, rng: random.Random) -> tuple[list[int], dict[str, int]]:
    """A sample of the programs of ``grid`` (linear ids, x slowest as the interpreter walks), at most
    ``budget`` of them unless the corners and their neighbours alone need more, and how many were
    chosen which way: every program of a grid of at most ``budget``; else the first, its +1
    neighbour along each axis longer than 1, the last and its -1 neighbours, then random programs
    each with its +1 neighbour along every axis (-1 at the edge), then random ones, until the budget
    is spent. The programs come in that order (they run in it: a launch whose time budget is spent
    has run the first pairs). Deterministic given ``rng``'s state."""
    nx, ny, nz = grid
    total = nx * ny * nz
    if total <= max(budget, 0):
        return list(range(total)), {"all": total}
    dims = (nx, ny, nz)
    strides = (ny * nz, nz, 1)
    chosen: dict[int, str] = {}

    def coords(linear: int) -> list[int]:
        x, rest = divmod(linear, ny * nz)
        return [x, *divmod(rest, nz)]

    def add(linear: int, how: str) -> None:
        chosen.setdefault(linear, how)

    def neighbours(linear: int, step: int) -> list[int]:
        c, found = coords(linear), []
        for axis in range(3):
            if dims[axis] < 2:
                continue
            s = step if 0 <= c[axis] + step < dims[axis] else -step
            found.append(linear + s * strides[axis])
        return found

    add(0, "first")
    for n in neighbours(0, 1):
        add(n, "neighbour")
    add(total - 1, "last")
    for n in neighbours(total - 1, -1):
        add(n, "neighbour")
    anchors = max(1, (budget - len(chosen)) // 4)  # random anchors with neighbours, then plain random ones
    for _ in range(anchors):
        if len(chosen) >= budget:
            break
        anchor = rng.randrange(total)
        for _ in range(8):  # an anchor that is a corner's neighbour already would add no random program
            if anchor not in chosen:
                break
            anchor = rng.randrange(total)
        add(anchor, "random")
        for n in neighbours(anchor, 1):
            if len(chosen) < budget:
                add(n, "neighbour")
    tries = 0
    while len(chosen) < budget and tries < 4 * budget:
        add(rng.randrange(total), "random")
        tries += 1
    programs = list(chosen)  # in the order chosen: the first and its neighbours run first
    how: dict[str, int] = {}
    for linear in programs:
        how[chosen[linear]] = how.get(chosen[linear], 0) + 1
    return programs, how


def reset_findings(findings: list[str] | None) -> None:
    """Start one call's findings (None: bounds checking off)."""
    STATE.findings, STATE.seen = findings, set()
    STATE.analysed, STATE.summary_at = [0, 0, 0], None


def begin_launch(kernel: str) -> AccessLog | None:
    """A launch starts: a fresh access log when races are looked for. Returns the enclosing log."""
    saved = STATE.log
    STATE.log = AccessLog(kernel=kernel) if STATE.races and STATE.findings is not None else None
    if STATE.log is not None and STATE.sample > 0:  # few programs, each at a task's own size (a matmul: 1M loads)
        STATE.log.limit = SAMPLED_MAX_ADDRESSES
    return saved


def end_launch(ranges: list[tuple[int, int]] | None, saved: AccessLog | None) -> None:
    """A launch ended: report its races (if its accesses were logged); restore ``saved``."""
    log, STATE.log = STATE.log, saved
    if log is None or STATE.findings is None:
        return
    report = find_races(log, ranges)
    STATE.analysed[0] += 1
    STATE.analysed[1] += log.recorded
    STATE.analysed[2] += int(log.cut_short)
    if report is not None and (log.kernel, "race") not in STATE.seen:
        STATE.seen.add((log.kernel, "race"))
        STATE.findings.append(f"{RACE_FINDING}{log.kernel}: {report.races} address(es) shared between programs "
                              f"outside atomics, e.g. {report.example}")
    launches, addresses, cut = STATE.analysed
    line = (f"{RACE_SUMMARY}{launches} launch(es), {addresses} accesses by program"
            + (f"; cut short after {log.limit or MAX_ADDRESSES} addresses in {cut} launch(es)" if cut else ""))
    if STATE.summary_at is None:
        STATE.summary_at = len(STATE.findings)
        STATE.findings.append(line)
    else:
        STATE.findings[STATE.summary_at] = line


def _log_access(kind: int, ptrs: Any, mask: Any, value: Any = None) -> None:
    """Add an access's active lanes (and a store's bits) to the running launch's log."""
    import numpy as np

    log = STATE.log
    if log is None:
        return
    if STATE.atomic_depth and kind != EXCHANGE:  # atomic_store: the last one wins, as an exchange
        kind = EXCHANGE if kind == STORE else ATOMIC
    addr = ptrs.data
    active = None
    if mask is not None:
        active = np.broadcast_to(mask.data.astype(bool, copy=False), addr.shape)
        if active.all():
            active = None
    lanes = addr.reshape(-1) if active is None else addr[active]
    bits = None
    if kind in (STORE, EXCHANGE) and value is not None:
        data = np.broadcast_to(value.data, addr.shape)
        data = data.reshape(-1) if active is None else data[active]
        width = data.dtype.itemsize
        bits = np.ascontiguousarray(data).view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[width])
        bits = bits.astype(np.uint64)
    log.add(kind, lanes.astype(np.uint64, copy=True), bits)


def _mark(kind: int, ptrs: Any, mask: Any) -> None:
    """Provenance: which storages the running launch loads from, and which bytes it writes."""
    import numpy as np
    from triton.runtime.interpreter import _get_np_dtype

    marks = STATE.marks
    if not marks:
        return
    addr = ptrs.data
    if mask is not None:
        addr = addr[np.broadcast_to(mask.data.astype(bool, copy=False), addr.shape)]
    addr = addr.reshape(-1).astype(np.uint64, copy=False)
    if not addr.size:
        return
    size = np.dtype(_get_np_dtype(ptrs.get_element_ty())).itemsize
    for lo, hi, producer in marks:
        inside = (addr >= np.uint64(lo)) & (addr < np.uint64(hi))
        if not inside.any():
            continue
        if kind == LOAD:
            STATE.loaded.add(lo)
            continue
        offsets = (addr[inside] - np.uint64(lo)).astype(np.int64)
        for j in range(size):
            producer[np.minimum(offsets + j, producer.size - 1)] = KERNEL


STATE = InterpreterState()
_installed = False
_lock = threading.Lock()


def storage_ranges(values: Any) -> list[tuple[int, int]]:
    """Byte ranges of the storages behind every tensor in launch arguments (nested tuples too)."""
    return [(s.data_ptr(), s.data_ptr() + s.nbytes()) for s in (t.untyped_storage() for t in tensors_in(values))]


def _in_bounds(addresses: Any, itemsize: int) -> Any:
    import numpy as np

    addr = addresses.astype(np.uint64, copy=False)
    ok = np.zeros(addr.shape, dtype=bool)
    for lo, hi in STATE.ranges or []:
        if hi - lo >= itemsize:
            ok |= (addr >= np.uint64(lo)) & (addr <= np.uint64(hi - itemsize))
    return ok


def _describe(kind: str, addresses: Any, bad: Any) -> str:
    import numpy as np

    first = int(addresses[bad].reshape(-1)[0])
    nearest = ""
    if STATE.ranges:
        lo, hi = min(STATE.ranges, key=lambda r: min(abs(first - r[0]), abs(first - r[1])))
        nearest = (f"{first - hi} bytes past the end of" if first >= hi else f"{lo - first} bytes before") + \
            " the nearest argument storage"
    n = int(np.count_nonzero(bad))
    return f"{STATE.kernel}: {n} out-of-bounds {kind}(s), e.g. {nearest or hex(first)}"


def _record(kind: str, addresses: Any, bad: Any) -> None:
    if STATE.findings is None:
        return
    key = (STATE.kernel, kind)
    if key in STATE.seen:  # one line per kernel and access kind; the first is the informative one
        return
    STATE.seen.add(key)
    if len(STATE.findings) < MAX_FINDINGS:
        STATE.findings.append(_describe(kind, addresses, bad))


def _checked_mask(kind: str, ptrs: Any, mask: Any) -> Any:
    """The mask with out-of-bounds lanes cleared (and recorded), or ``mask`` itself."""
    import numpy as np
    from triton.runtime.interpreter import TensorHandle, _get_np_dtype

    if STATE.findings is None or STATE.ranges is None:
        return mask
    itemsize = np.dtype(_get_np_dtype(ptrs.get_element_ty())).itemsize
    ok = _in_bounds(ptrs.data, itemsize)
    mask_data = np.broadcast_to(mask.data.astype(bool), ok.shape) if mask is not None else np.ones_like(ok)
    bad = mask_data & ~ok
    if not bad.any():
        return mask
    _record(kind, ptrs.data, bad)
    return TensorHandle(mask_data & ok, mask.dtype if mask is not None else None)


def install() -> None:
    """Patch the interpreter builder once (idempotent); a no-op cost when no check is active."""
    global _installed
    with _lock:
        if _installed:
            return
        from triton.runtime import interpreter as interp

        builder = interp.InterpreterBuilder
        orig_load, orig_store = builder.create_masked_load, builder.create_masked_store
        orig_rmw, orig_cas = builder.create_atomic_rmw, builder.create_atomic_cas
        orig_dim, orig_idx = builder.set_grid_dim, builder.set_grid_idx

        # The cache hints after the mask differ between Triton versions (3.6: cache_modifier,
        # eviction_policy[, is_volatile]; 3.9: cache_policy[, is_volatile]): passed on as they came.
        def create_masked_load(self, ptrs, mask, other, *hints):
            mask = _checked_mask("load", ptrs, mask)
            _log_access(LOAD, ptrs, mask)
            _mark(LOAD, ptrs, mask)
            return orig_load(self, ptrs, mask, other, *hints)

        def create_masked_store(self, ptrs, value, mask, *hints):
            mask = _checked_mask("store", ptrs, mask)
            _log_access(STORE, ptrs, mask, value)
            _mark(STORE, ptrs, mask)
            return orig_store(self, ptrs, value, mask, *hints)

        xchg = getattr(getattr(getattr(interp, "_ir", None), "ATOMIC_OP", None), "XCHG", None)

        def create_atomic_rmw(self, rmwOp, ptr, val, mask, sem, scope):
            mask = _checked_mask("atomic", ptr, mask)
            _mark(STORE, ptr, mask)
            if rmwOp == xchg:  # the last exchange wins: its value matters
                _log_access(EXCHANGE, ptr, mask, val)
            else:
                _log_access(ATOMIC, ptr, mask)
            return orig_rmw(self, rmwOp, ptr, val, mask, sem, scope)

        def create_atomic_cas(self, ptr, cmp, val, sem, scope):
            checked = _checked_mask("atomic_cas", ptr, None)
            if checked is not None:  # cannot be masked: refuse the whole access
                raise IndexError(f"{STATE.kernel}: out-of-bounds atomic_cas")
            _log_access(ATOMIC, ptr, None)
            _mark(STORE, ptr, None)
            return orig_cas(self, ptr, cmp, val, sem, scope)

        def atomic_through_plain(orig):
            """An atomic op the interpreter builds from its own masked load/store: log those as atomic."""

            def op(self, *args, **kwargs):
                STATE.atomic_depth += 1
                try:
                    return orig(self, *args, **kwargs)
                finally:
                    STATE.atomic_depth -= 1

            return op

        def set_grid_dim(self, nx, ny, nz):
            sampled = STATE.sampled
            if sampled is not None:  # the executor walks (k, 1, 1); the programs see the true grid
                nx, ny, nz = STATE.true_grid
            orig_dim(self, nx, ny, nz)
            STATE.grid = (nx, ny, nz)
            if sampled is not None:  # in the order chosen (addresses, not values, are analysed)
                STATE.perm = list(sampled)
            elif STATE.order_rng is not None:
                perm = list(range(nx * ny * nz))
                STATE.order_rng.shuffle(perm)
                STATE.perm = perm
            else:
                STATE.perm = None

        def set_grid_idx(self, x, y, z):
            perm = STATE.perm
            _, ny, nz = STATE.grid
            # sampled: the executor's (i, 0, 0) is the i-th sampled program
            linear = x if STATE.sampled is not None else (x * ny + y) * nz + z
            if STATE.sampled is not None and x >= MIN_SAMPLED_PROGRAMS and time.monotonic() > STATE.launch_deadline:
                raise SampleBudgetSpent  # no new program of this launch: the ones run are analysed
            if perm is not None:
                linear = perm[linear]
                x, rest = divmod(linear, ny * nz)
                y, z = divmod(rest, nz)
            if STATE.log is not None:
                STATE.log.program = linear
                STATE.log.programs += 1
            return orig_idx(self, x, y, z)

        builder.create_masked_load = create_masked_load
        builder.create_masked_store = create_masked_store
        builder.create_atomic_rmw = create_atomic_rmw
        builder.create_atomic_cas = create_atomic_cas
        builder.set_grid_dim = set_grid_dim
        builder.set_grid_idx = set_grid_idx
        _sample_launches(interp)
        _sample_loops(interp)
        for name in ("create_atomic_load", "create_atomic_store", "create_atomic_poll"):  # Triton 3.9
            if hasattr(builder, name):
                setattr(builder, name, atomic_through_plain(getattr(builder, name)))
        _scalar_index_fix(interp)
        _installed = True


def _sample_launches(interp: Any) -> None:
    """While :attr:`InterpreterState.sample` is set, a launch of more programs runs a sample of them
    (see the module's docstring): the executor's grid becomes ``(k, 1, 1)``, the true one is kept
    for ``set_grid_dim``, and the launch's sample is recorded in :attr:`InterpreterState.launches`."""
    executor = interp.GridExecutor
    if getattr(executor.__call__, "_kz_sampling", False):
        return
    builder = interp.InterpreterBuilder
    orig_dot = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        # The interpreter's np.matmul(a, b, dtype=acc) takes numpy's plain loop, not BLAS: 9 ms for one
        # 128x32x128 tile, 3 s per program of a 4096-deep matmul. While sampling (a task's own shapes),
        # the same products in the accumulator's dtype through BLAS (only the summation order differs).
        acc = d.data.dtype
        if STATE.sample <= 0 or acc.kind != "f" or a.dtype.primitive_bitwidth == 8 or b.dtype.primitive_bitwidth == 8:
            return orig_dot(self, a, b, d, input_precision, max_num_imprecise_acc)
        product = np.matmul(np.ascontiguousarray(a.data, dtype=acc), np.ascontiguousarray(b.data, dtype=acc))
        return interp.TensorHandle(product + d.data, d.dtype.scalar)

    import numpy as np

    builder.create_dot = create_dot
    original = executor.__call__

    def __call__(self, *args, **kwargs):
        if STATE.sample <= 0:
            return original(self, *args, **kwargs)
        grid = self.grid
        record: dict[str, Any] = {}

        def sampled_grid(named: Any) -> tuple[int, ...]:
            g = tuple(int(d) for d in (grid(named) if callable(grid) else grid))
            g = g + (1,) * (3 - len(g))
            rng = STATE.order_rng or random.Random(0)
            programs, how = choose_programs(g, STATE.sample, rng)
            STATE.true_grid, STATE.sampled = g, programs
            STATE.launch_deadline = time.monotonic() + STATE.launch_s if STATE.launch_s > 0 else float("inf")
            STATE.loop_seed, STATE.launch_record = rng.getrandbits(32), record
            record.update(kernel=STATE.kernel, grid=list(g), programs=g[0] * g[1] * g[2], sampled=len(programs),
                          how=how, ids=programs[:32])
            if STATE.launches is not None:
                if len(STATE.launches) < MAX_LAUNCH_RECORDS:
                    STATE.launches.append(record)
                elif STATE.launches:  # the rest are counted in the last record
                    last = STATE.launches[-1]
                    last["more_launches"] = last.get("more_launches", 0) + 1
            return (len(programs),)

        self.grid = sampled_grid
        started = time.monotonic()
        try:
            return original(self, *args, **kwargs)
        except SampleBudgetSpent:
            # the programs run so far wrote in place (CPU tensors are the interpreter's own storage)
            ran = STATE.log.programs if STATE.log is not None else None
            record.update(ran=ran, cut_after_s=round(time.monotonic() - started, 1))
            return None
        finally:
            self.grid = grid
            STATE.sampled, STATE.true_grid, STATE.launch_deadline = None, None, float("inf")
            STATE.launch_record = None

    __call__._kz_sampling = True  # type: ignore[attr-defined]
    executor.__call__ = __call__


def sampled_loop(iterations: Any) -> Any:
    """A kernel's ``for`` loop over ``iterations`` (a ``range``): all of them, unless a launch is sampled and
    there are more than :data:`LOOP_SAMPLE_ABOVE`; then the first and last :data:`LOOP_EDGE` and the rest
    drawn between from the launch's seed (the same in each of its programs, so redundant work agrees), in
    order. Only addresses are analysed: the skipped iterations' values are missing from accumulators, and a
    race or out-of-bounds access only in skipped iterations is found by chance (docs/verifier.md)."""
    if STATE.sample <= 0 or not isinstance(iterations, range) or len(iterations) <= LOOP_SAMPLE_ABOVE:
        return iterations
    n = len(iterations)
    rng = random.Random(hash((STATE.loop_seed, iterations.start, iterations.stop, iterations.step)))
    middle = sorted(rng.sample(range(LOOP_EDGE, n - LOOP_EDGE), LOOP_SAMPLE_ABOVE - 2 * LOOP_EDGE))
    record = STATE.launch_record
    if record is not None and n > record.get("loop_iterations", 0):
        record.update(loop_iterations=n, loop_ran=LOOP_SAMPLE_ABOVE)
    return [iterations[k] for k in [*range(LOOP_EDGE), *middle, *range(n - LOOP_EDGE, n)]]


class _LoopSampler(ast.NodeTransformer):
    """``for x in range(...)`` / ``tl.range(...)`` in a kernel becomes ``for x in _kz_sampled_loop(range(...))``."""

    def visit_For(self, node: ast.For) -> ast.For:
        node = self.generic_visit(node)
        func = node.iter.func if isinstance(node.iter, ast.Call) else None
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if name == "range":  # not static_range: unrolled at compile time, short by construction
            node.iter = ast.copy_location(ast.Call(func=ast.Name(id="_kz_sampled_loop", ctx=ast.Load()),
                                                   args=[node.iter], keywords=[]), node.iter)
        return node


def _sample_loops(interp: Any) -> None:
    """Rewrite every interpreted kernel's ``range`` loops through :func:`sampled_loop` (a no-op unless a
    launch is sampled); the name reaches the kernels' globals as the interpreter's own helpers do."""
    rewriter = interp.FunctionRewriter
    if getattr(rewriter._transform_ast, "_kz_loops", False):
        return
    original = rewriter._transform_ast

    def _transform_ast(self, src):
        tree = _LoopSampler().visit(original(self, src))
        ast.fix_missing_locations(tree)
        return tree

    _transform_ast._kz_loops = True  # type: ignore[attr-defined]
    rewriter._transform_ast = _transform_ast
    interp._kz_sampled_loop = sampled_loop


def _scalar_index_fix(interp: Any) -> None:
    """Triton 3.6's interpreter turns a scalar argument into an index with ``int()`` of a one-element
    array, which numpy 2 refuses: ``for r in range(rows)`` fails ("only 0-dimensional arrays can be
    converted"). Triton 3.9 squeezes first; so do we, on every version (a no-op where fixed)."""
    patch = getattr(interp, "_patch_lang_tensor", None)
    if patch is None or getattr(patch, "_kz_index_fix", False):
        return

    def patched(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    patched._kz_index_fix = True
    interp._patch_lang_tensor = patched

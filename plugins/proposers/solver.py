"""Z3 picks the concrete shapes and parameters of a program skeleton.

A :class:`ProgramBuilder` grows a program op by op over *symbolic* dimensions (z3 integers): each
op's ``constrain`` hook (see :mod:`plugins.ops.shape_rules`) states its validity conditions and
returns its output dims. :meth:`ProgramBuilder.solve` then asks z3 for values that satisfy every
validity condition plus the requested :class:`Constraints` (FLOP and byte ranges, a memory budget,
per-tensor element limits, alignment), and returns a concrete :class:`core.program.Program`.

Diversity comes from *preferences*: every free dimension gets a randomly drawn preferred value
(an op's bucketed value for solved parameters). Preferences enter z3 as assumption literals; when
they conflict, the unsat core names which ones, those are first widened to a window around the
preferred value and then dropped, and z3 finds the rest. One solver is reused per program and its
checks are incremental (assumptions, no re-solving from scratch): ~8 ms per check on this machine.
``Tactic('smt').solver()`` would be a little faster but returns no unsat cores.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

import z3

from core.program import DTYPES, Node, OpSpec, Program, ProgramError, TensorSpec

# The rank an op's first argument may take when its spec says "any".
ANY_RANK = (1, 2, 3, 4)


@dataclass(frozen=True)
class Constraints:
    """Requested complexity of a task. ``None`` means unconstrained.

    :param min_ops: fewest ops; ``min_ops - 1`` intermediates need temporaries in an unfused program.
    :param max_ops: most ops.
    :param min_flops: / max_flops: total FLOP range of the program.
    :param min_bytes: / max_bytes: range of the fused minimum of bytes moved (inputs, weights, output).
    :param memory_budget: bytes of every value the eager reference materialises, weights included.
    :param max_numel: elements of any one tensor (keeps the Triton interpreter on CPU fast).
    :param max_dim: largest single dimension.
    :param align: every input's last dimension is a multiple of this (1 = no demand).
    """

    min_ops: int = 1
    max_ops: int = 4
    min_flops: int | None = None
    max_flops: int | None = None
    min_bytes: int | None = None
    max_bytes: int | None = None
    memory_budget: int | None = 64 * 2**20
    max_numel: int = 2**16
    max_dim: int = 4096
    align: int = 1

    def scaled(self, scale: float) -> "Constraints":
        """Shrink the size limits by a curriculum's ``param_scale`` (never below a usable floor)."""
        scale = min(max(scale, 0.01), 1.0)
        if scale == 1.0:
            return self
        return Constraints(
            min_ops=self.min_ops, max_ops=self.max_ops, min_flops=self.min_flops,
            max_flops=None if self.max_flops is None else max(int(self.max_flops * scale), 1),
            min_bytes=self.min_bytes,
            max_bytes=None if self.max_bytes is None else max(int(self.max_bytes * scale), 1),
            memory_budget=self.memory_budget, max_numel=max(int(self.max_numel * scale), 64),
            max_dim=max(int(self.max_dim * scale), 8), align=self.align,
        )


class SolveError(ProgramError):
    """z3 found no shapes for this skeleton under the constraints (the caller draws another).

    ``kind`` is ``"unsat"`` (no shapes exist) or ``"timeout"`` (z3 gave up).
    """

    def __init__(self, message: str, kind: str = "unsat"):
        super().__init__(message)
        self.kind = kind


@dataclass
class _Var:
    var: Any
    lo: int
    hi: int
    prefer: int | None


@dataclass
class SolveStats:
    checks: int = 0
    seconds: float = 0.0
    relaxed: int = 0


class ShapeContext:
    """What an op's ``constrain(ctx, dims, params)`` hook sees.

    ``ctx.need(condition, message)`` adds a validity condition; ``ctx.param(key, lo, hi, prefer)``
    returns the z3 variable of a parameter that z3 solves for the current node (its value is
    written into the node's params); ``ctx.dim(lo, hi, prefer)`` makes a free dimension.
    """

    def __init__(self) -> None:
        # A private z3 context per program: models then depend only on this program's terms, not on
        # what earlier programs put in the global context (determinism: same seed, same tasks).
        self.z3ctx = z3.Context()
        self.vars: list[_Var] = []
        self.conditions: list[Any] = []
        self._pending: list[Any] = []
        self._node_params: dict[str, Any] = {}

    def need(self, condition: Any, message: str = "") -> None:
        if isinstance(condition, bool):
            if not condition:
                raise ProgramError(message or "a shape condition is false")
            return
        self._pending.append(condition)

    def dim(self, lo: int = 1, hi: int = 4096, prefer: int | None = None) -> Any:
        v = z3.Int(f"d{len(self.vars)}", self.z3ctx)
        self.vars.append(_Var(v, lo, hi, prefer))
        return v

    def param(self, key: str, lo: int, hi: int, prefer: int | None = None) -> Any:
        v = self.dim(lo, hi, prefer)
        self._node_params[key] = v
        return v

    # the builder's side ------------------------------------------------------------

    def begin(self) -> None:
        self._pending, self._node_params = [], {}

    def commit(self) -> dict[str, Any]:
        self.conditions.extend(self._pending)
        params, self._pending, self._node_params = self._node_params, [], {}
        return params

    def rollback(self, n_vars: int) -> None:
        del self.vars[n_vars:]
        self._pending, self._node_params = [], {}


@dataclass
class _Ref:
    kind: str  # "in" or "node"
    index: int


@dataclass
class _Draft:
    op: str
    args: list[_Ref]
    params: dict[str, Any]
    solved: dict[str, Any] = field(default_factory=dict)


def _eval_int(model: Any, expr: Any) -> int:
    if isinstance(expr, int):
        return expr
    return model.eval(expr, model_completion=True).as_long()


class ProgramBuilder:
    """Grows a program over symbolic dims, then solves it. One builder per task.

    :param catalog: the op catalog.
    :param rng: the task's random source (preferred values, parameter buckets).
    :param dtype: dtype of every input.
    """

    def __init__(self, catalog: Mapping[str, OpSpec], rng: random.Random, dtype: str = "float32") -> None:
        self.catalog, self.rng, self.dtype = catalog, rng, dtype
        self.ctx = ShapeContext()
        self.inputs: list[list[Any]] = []  # symbolic dims of each input
        self.drafts: list[_Draft] = []
        self.values: list[tuple[_Ref, list[Any]]] = []  # every value, in creation order
        self.layouts: dict[int, str] = {}
        self.hard: list[Any] = []  # extra hard conditions (adversarial demands)
        self.input_edits: dict[str, Any] = {}  # TensorSpec fields for the first input (adversarial)
        self.stats = SolveStats()

    # ------------------------------------------------------------------ growing

    @property
    def current_rank(self) -> int | None:
        return len(self.values[-1][1]) if self.values else None

    def accepts(self, op: str) -> bool:
        """Can ``op`` take the current value (or start the program) as its first argument?"""
        spec = self.catalog[op]
        ranks = spec.ranks or ANY_RANK
        return True if self.current_rank is None else self.current_rank in ranks

    def new_input(self, rank: int, numel_target: int) -> _Ref:
        """A fresh input whose dims prefer values whose product is about ``numel_target``."""
        prefs = split_numel(self.rng, numel_target, rank)
        dims = [self.ctx.dim(1, 4096, p) for p in prefs]
        self.inputs.append(dims)
        ref = _Ref("in", len(self.inputs) - 1)
        self.values.append((ref, dims))
        return ref

    def apply(self, op: str, params: Mapping[str, Any], numel_target: int, residual_share: float = 0.0) -> None:
        """Append ``op`` reading the current value (fresh inputs or earlier values for more operands).

        Raises :class:`ProgramError` (and leaves the builder unchanged) when the op cannot apply.
        """
        spec = self.catalog[op]
        n_vars, n_inputs, n_values = len(self.ctx.vars), len(self.inputs), len(self.values)
        try:
            if not self.values:
                ranks = spec.ranks or (2, 2, 3, 1, 4)
                self.new_input(self.rng.choice(ranks), numel_target)
            first_ref, first_dims = self.values[-1]
            refs, dims = [first_ref], [first_dims]
            for _ in range(spec.arity - 1):
                earlier = [v for v in self.values[:-1] if len(v[1]) == len(first_dims)]
                if earlier and self.rng.random() < residual_share:
                    ref, d = self.rng.choice(earlier)
                else:
                    ref = self.new_input(len(first_dims), numel_target)
                    d = self.values[-1][1]
                refs.append(ref)
                dims.append(d)
            self.ctx.begin()
            if spec.constrain is not None:
                out = list(spec.constrain(self.ctx, dims, params))
            else:  # shape-preserving: every argument has the first one's shape
                for d in dims[1:]:
                    if len(d) != len(first_dims):
                        raise ProgramError(f"{op} needs arguments of equal rank")
                    for a, b in zip(first_dims, d):
                        self.ctx.need(a == b)
                out = list(first_dims)
            solved = self.ctx.commit()
        except ProgramError:
            self.ctx.rollback(n_vars)
            del self.inputs[n_inputs:]
            del self.values[n_values:]
            raise
        draft = _Draft(op, refs, dict(params), solved)
        self.drafts.append(draft)
        self.values.append((_Ref("node", len(self.drafts) - 1), out))

    def draw_params(self, op: str) -> dict[str, Any]:
        """One value per parameter, drawn from the op's buckets (sorted keys: seed-deterministic)."""
        return {k: self.rng.choice(tuple(v)) for k, v in sorted(self.catalog[op].params.items())}

    # ------------------------------------------------------------------ symbolic costs

    def _symbolic_shapes(self) -> list[list[Any]]:
        return [dims for _, dims in self.values]

    def _node_inputs(self, draft: _Draft) -> list[list[Any]]:
        lookup = {(r.kind, r.index): d for r, d in self.values}
        return [lookup[(r.kind, r.index)] for r in draft.args]

    def _costs(self) -> tuple[Any, Any, Any]:
        """Symbolic (flops, fused min bytes, eager memory) of the whole program."""
        item = DTYPES[self.dtype]
        flops, weights = 0, 0
        for draft in self.drafts:
            spec = self.catalog[draft.op]
            shapes = self._node_inputs(draft)
            params = {**draft.params, **draft.solved}
            flops = flops + spec.flops(shapes, params)
            if spec.weight_bytes is not None:
                weights = weights + spec.weight_bytes(shapes, params, item)
        out = self.values[-1][1]
        read = sum(math.prod(d) for d in self.inputs)
        min_bytes = (read + math.prod(out)) * item + weights
        memory = sum(math.prod(d) for d in self._symbolic_shapes()) * item + weights
        return flops, min_bytes, memory

    # ------------------------------------------------------------------ solving

    def solve(self, limits: Constraints, timeout_ms: int = 5000, zero_ok: bool = False,
              rlimit: int = 3_000_000) -> Program:
        """Concrete shapes and solved params meeting validity and ``limits``; raises :class:`SolveError`."""
        if not self.drafts:
            raise SolveError("nothing to solve: the skeleton has no ops")
        started = time.perf_counter()
        try:
            return self._solve(limits, timeout_ms, zero_ok, rlimit)
        finally:
            self.stats.seconds += time.perf_counter() - started

    def _solve(self, limits: Constraints, timeout_ms: int, zero_ok: bool, rlimit: int) -> Program:
        s = z3.Solver(ctx=self.ctx.z3ctx)
        # rlimit is deterministic (work, not time); the wall-clock timeout is only a safety net.
        s.set("rlimit", rlimit)
        s.set("timeout", timeout_ms)
        lo_dim = 0 if zero_ok else 1
        for v in self.ctx.vars:
            s.add(v.var >= min(v.lo, lo_dim), v.var <= min(v.hi, limits.max_dim))
        s.add(*self.ctx.conditions, *self.hard)
        for dims in self._symbolic_shapes():
            s.add(math.prod(dims) <= limits.max_numel)
            for d in dims:  # outputs of a conv/pool must exist (>= 1) unless a zero dim is the point
                s.add(d >= lo_dim)
        if limits.align > 1:
            for dims in self.inputs:
                s.add(dims[-1] % limits.align == 0)
        flops, min_bytes, memory = self._costs()
        if limits.min_flops is not None:
            s.add(flops >= limits.min_flops)
        if limits.max_flops is not None:
            s.add(flops <= limits.max_flops)
        if limits.min_bytes is not None:
            s.add(min_bytes >= limits.min_bytes)
        if limits.max_bytes is not None:
            s.add(min_bytes <= limits.max_bytes)
        if limits.memory_budget is not None:
            s.add(memory <= limits.memory_budget)

        # Preferences as assumption literals: exact value first, then a x4 window, then free.
        exact: dict[Any, Any] = {}
        window: dict[Any, Any] = {}
        for i, v in enumerate(self.ctx.vars):
            if v.prefer is None or isinstance(v.prefer, bool):
                continue
            p = min(max(int(v.prefer), 1), limits.max_dim)
            e, w = z3.Bool(f"exact{i}", self.ctx.z3ctx), z3.Bool(f"window{i}", self.ctx.z3ctx)
            s.add(z3.Implies(e, v.var == p))
            s.add(z3.Implies(w, z3.And(v.var * 4 >= p, v.var <= p * 4)))
            exact[e], window[w] = v, v
        active = list(exact) + list(window)
        for _ in range(12):
            self.stats.checks += 1
            result = s.check(*active)
            if result == z3.sat:
                return self._concretize(s.model())
            if result == z3.unknown:
                raise SolveError(f"z3 gave up ({s.reason_unknown()}) on {[d.op for d in self.drafts]}", "timeout")
            core = set(map(str, s.unsat_core()))
            if not core:
                raise SolveError(f"no valid shapes for {[d.op for d in self.drafts]} under {limits}")
            self.stats.relaxed += len(core)
            dropped_exact = [a for a in active if str(a) in core and a in exact]
            # widen exact preferences first; drop windows only when no exact one is in the core
            drop = set(map(str, dropped_exact)) if dropped_exact else core
            active = [a for a in active if str(a) not in drop]
        self.stats.checks += 1
        if s.check() == z3.sat:
            return self._concretize(s.model())
        raise SolveError(f"no valid shapes for {[d.op for d in self.drafts]} under {limits}")

    def _concretize(self, model: Any) -> Program:
        inputs = []
        for k, dims in enumerate(self.inputs):
            shape = tuple(_eval_int(model, d) for d in dims)
            inputs.append(TensorSpec(shape, dtype=self.dtype, layout=self.layouts.get(k, "contiguous")))
        n_in = len(inputs)

        def index(ref: _Ref) -> int:
            return ref.index if ref.kind == "in" else n_in + ref.index

        nodes = []
        for d in self.drafts:
            params = dict(d.params)
            params.update({k: _eval_int(model, v) for k, v in d.solved.items()})
            nodes.append(Node(d.op, tuple(index(r) for r in d.args), params))
        program = Program(inputs=inputs, nodes=nodes)
        program.value_shapes(self.catalog)  # the concrete rules must agree with what z3 solved
        return program


def split_numel(rng: random.Random, target: int, rank: int) -> list[int]:
    """Preferred dims of a rank-``rank`` tensor with about ``target`` elements, mostly 'nice' sizes."""
    target = max(int(target), 1)
    weights = [rng.random() + 0.2 for _ in range(rank)]
    total = sum(weights)
    dims = []
    for w in weights:
        d = max(1, round(target ** (w / total)))
        if rng.random() < 0.7:  # snap to a multiple of 8 or a power of two
            d = max(1, round(d / 8) * 8) if d >= 8 and rng.random() < 0.5 else 2 ** max(0, round(math.log2(d)))
        dims.append(d)
    return dims


def draw_numel(rng: random.Random, limits: Constraints) -> int:
    """A target element count per tensor: log-uniform between 64 and ``limits.max_numel``."""
    lo, hi = math.log(min(64, limits.max_numel)), math.log(max(limits.max_numel, 64))
    return int(math.exp(rng.uniform(lo, hi)))


def program_costs(program: Program, catalog: Mapping[str, OpSpec]) -> dict[str, int]:
    """Concrete flops, min bytes and eager memory of a program (what :meth:`solve` constrained)."""
    shapes = program.value_shapes(catalog)
    item = DTYPES[program.dtype]
    weights = 0
    for n in program.nodes:
        spec = catalog[n.op]
        if spec.weight_bytes is not None:
            weights += spec.weight_bytes([shapes[a] for a in n.args], n.params, item)
    return {
        "flops": program.flops(catalog),
        "min_bytes": program.min_bytes(catalog),
        "memory": sum(math.prod(s) for s in shapes) * item + weights,
        "max_numel": max(math.prod(s) for s in shapes),
    }

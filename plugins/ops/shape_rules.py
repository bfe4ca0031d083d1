"""One shape rule per op, used both concretely (``infer_shape``) and symbolically (z3 ``constrain``).

A *rule* is ``rule(dims, params, need) -> output_dims``. ``dims`` are the tensor arguments' shapes
(ints, or z3 integer expressions), ``need(condition, message)`` states a validity condition: the
concrete path raises :class:`core.program.ProgramError` when it is false, the symbolic path hands it
to z3. Write rules with ``+ - *``, comparisons and :func:`floordiv` / :func:`divides`, and the same
text serves both. ``dim_params`` names the parameters z3 solves (``out_features`` ...); their
catalog values are the preferred buckets.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

from core.program import OpSpec, ProgramError

Rule = Callable[[Sequence[Sequence[Any]], Mapping[str, Any], Callable[[Any, str], None]], tuple]


def is_symbolic(x: Any) -> bool:
    return not isinstance(x, (int, bool))


def floordiv(a: Any, b: Any) -> Any:
    """``a // b`` for ints; z3 integer division (floor for a positive divisor) for expressions."""
    if is_symbolic(a) or is_symbolic(b):
        return a / b
    return a // b


def divides(b: Any, a: Any) -> Any:
    """``b`` divides ``a`` (as a bool, or a z3 condition)."""
    return a % b == 0


def numel(dims: Sequence[Any]) -> Any:
    return math.prod(dims)


def _need_concrete(condition: Any, message: str) -> None:
    if not bool(condition):
        raise ProgramError(message)


def concrete_shape(rule: Rule) -> Callable[[Sequence[Sequence[int]], Mapping[str, Any]], tuple]:
    def infer_shape(shapes, params):
        return tuple(int(d) for d in rule([tuple(s) for s in shapes], params, _need_concrete))

    return infer_shape


def symbolic_constrain(rule: Rule, dim_params: Mapping[str, tuple[int, int]]) -> Callable[..., tuple]:
    """The ``constrain`` hook of a rule: dim params become solver variables bound to the node."""

    def constrain(ctx, dims, params):
        bound = dict(params)
        for key, (lo, hi) in dim_params.items():
            bound[key] = ctx.param(key, lo, hi, prefer=params.get(key))
        return tuple(rule(dims, bound, ctx.need))

    return constrain


def rule_op(name: str, family: str, tier: int, arity: int, call: str, rule: Rule, flops, render, *,
            params: Mapping[str, tuple] | None = None, dim_params: Mapping[str, tuple[int, int]] | None = None,
            ranks: tuple[int, ...] = (), module=None, weight_bytes=None, description: str = "") -> OpSpec:
    """An :class:`OpSpec` whose ``infer_shape`` and ``constrain`` both come from ``rule``."""
    return OpSpec(
        name=name, family=family, tier=tier, arity=arity, call=call, params=dict(params or {}),
        infer_shape=concrete_shape(rule), flops=flops, render=render, module=module,
        weight_bytes=weight_bytes, constrain=symbolic_constrain(rule, dict(dim_params or {})),
        description=description, ranks=ranks,
    )


def need_rank(dims, ranks: tuple[int, ...], name: str) -> None:
    if len(dims) not in ranks:
        raise ProgramError(f"{name} takes a tensor of rank {' or '.join(map(str, ranks))}, got rank {len(dims)}")


def need_same(a, b, need, what: str) -> None:
    if len(a) != len(b):
        raise ProgramError(f"{what}: ranks differ ({len(a)} vs {len(b)})")
    for x, y in zip(a, b):
        need(x == y, f"{what}: shapes differ ({tuple(a)} vs {tuple(b)})")

"""Mixing weighted reward terms, and adapters that expose each term as a TRL reward function.

A reward term (registered through ``register_rewards``) is called
``term(verdicts, tasks, candidates=...)`` and returns one float per verdict; it must accept extra
keyword arguments, so new context can be passed without breaking third-party terms. The mix
is ``sum(weight[t] * term_t)`` over the configured terms; a candidate that was not accepted earns
``failure_reward`` from every term unless the term declares ``scores_failures = True`` (format and
partial-correctness terms do).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from core.contracts import optional
from core.plugins import registry
from core.task import Candidate, Task
from core.verdict import Verdict


def correctness_reward(accuracy: float) -> float:
    """The published phase-1 reward: ``1 - (1 - accuracy) ** 2``.

    >>> correctness_reward(1.0), correctness_reward(0.0), correctness_reward(0.5)
    (1.0, 0.0, 0.75)
    """
    accuracy = min(1.0, max(0.0, float(accuracy)))
    return 1.0 - (1.0 - accuracy) ** 2


def roofline_reward(flops_utilisation: float, bandwidth_efficiency: float) -> float:
    """The published phase-2 reward: ``0.7 * FLOPs utilisation + 0.3 * bandwidth efficiency``.

    >>> round(roofline_reward(0.5, 1.0), 3)
    0.65
    """
    clip = lambda v: min(1.0, max(0.0, float(v)))  # noqa: E731
    return 0.7 * clip(flops_utilisation) + 0.3 * clip(bandwidth_efficiency)


@dataclass
class RewardMix:
    """Weighted sum of named reward terms, built from the ``reward`` config node."""

    weights: Mapping[str, float]
    failure_reward: float = 0.0
    term_kwargs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    terms: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        reg = registry("reward")
        self.weights = {name: float(w) for name, w in self.weights.items()}
        self.terms = {name: reg.create(name, **dict(self.term_kwargs.get(name, {}))) for name in self.weights}

    def per_term(self, verdicts: Sequence[Verdict], tasks: Sequence[Task],
                 candidates: Sequence[Candidate] | None = None) -> dict[str, list[float]]:
        """Unweighted reward of every term for every verdict (failures already applied)."""
        out: dict[str, list[float]] = {}
        for name, term in self.terms.items():
            values = list(term(verdicts, tasks, candidates=candidates))
            if len(values) != len(verdicts):
                raise ValueError(f"reward term {name!r} returned {len(values)} values for {len(verdicts)} verdicts")
            if not optional(term, "RewardTerm", "scores_failures"):
                values = [v if verdict.accepted else self.failure_reward for v, verdict in zip(values, verdicts)]
            out[name] = [float(v) for v in values]
        return out

    def combine(self, per_term: Mapping[str, Sequence[float]]) -> list[float]:
        """Weighted sum of already computed per-term rewards."""
        n = len(next(iter(per_term.values()), []))  # an empty mix has no terms and yields nothing
        return [sum(self.weights[name] * per_term[name][i] for name in self.terms) for i in range(n)]

    def __call__(self, verdicts: Sequence[Verdict], tasks: Sequence[Task],
                 candidates: Sequence[Candidate] | None = None) -> list[float]:
        return self.combine(self.per_term(verdicts, tasks, candidates))


def trl_reward_function(name: str, fn: Callable[[list[Any], dict[str, Any]], list[float]]) -> Callable[..., list]:
    """Wrap ``fn(completions, kwargs)`` as a TRL reward function whose ``__name__`` is ``name``.

    TRL logs each reward function as ``rewards/<__name__>/mean``, so every term keeps its own name.
    """

    def reward(prompts=None, completions=None, **kwargs: Any) -> list[float]:
        return fn(list(completions or []), kwargs)

    reward.__name__ = reward.__qualname__ = name
    return reward

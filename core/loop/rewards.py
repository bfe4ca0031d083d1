"""Mixing weighted reward terms, and adapters that expose each term as a TRL reward function.

A reward term (registered through ``register_rewards``) is called
``term(verdicts, tasks, candidates=...)`` and returns one float per verdict; it must accept extra
keyword arguments, so new context can be passed without breaking third-party terms. The mix
is ``sum(weight[t] * term_t)`` over the configured terms; a candidate that was not accepted earns
``failure_reward`` from every term unless the term declares ``scores_failures = True`` (format and
partial-correctness terms do).

One source of weights: the run's ``reward`` group. A training phase's own ``reward`` block only adds
what the run's does not set (:func:`phase_reward`), so a sweep of ``reward.*`` reaches every phase; where
a phase's block disagrees with the run's, the run's wins and the run says so at start (:func:`reward_notes`),
as it warns about weighted terms that cannot be nonzero on the run's device (a term's optional
``supports(device)``, :data:`core.contracts.OPTIONAL_MEMBERS`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from core.contracts import optional
from core.plugins import registry
from core.task import Candidate, Task
from core.verdict import Verdict


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


def mix_kwargs(node: Mapping[str, Any] | None) -> dict[str, Any]:
    """A ``reward`` node (a plain mapping) as :class:`RewardMix` keyword arguments (without its ``name``)."""
    return {k: copy.deepcopy(v) for k, v in dict(node or {}).items() if k != "name"}


def phase_reward(run_reward: Mapping[str, Any], own: Mapping[str, Any] | None) -> tuple[dict[str, Any], list[str]]:
    """The :class:`RewardMix` keyword arguments of a training phase, and where its own block gave way.

    The run's ``reward`` group is the one source of every value it sets, so a sweep of
    ``reward.weights.*`` (or any ``reward.*``) reaches every phase. A phase's own ``reward`` block
    (``trainer.phases.<name>.reward``) adds only what the run's group does not set: more terms, their
    weights and ``term_kwargs``. Where both set a value and they differ, the run's wins; each such value
    is one sentence of the returned list (the run prints them at start).

    >>> kwargs, gave_way = phase_reward({"weights": {"correctness": 1.0, "speedup": 0.1}, "failure_reward": 0.0},
    ...                                 {"weights": {"speedup": 0.5, "roofline": 1.0}})
    >>> kwargs["weights"]
    {'correctness': 1.0, 'speedup': 0.1, 'roofline': 1.0}
    >>> gave_way
    ["reward.weights.speedup: the phase's 0.5 gives way to the run's 0.1"]
    """
    merged = mix_kwargs(run_reward)
    gave_way: list[str] = []

    def merge(into: dict[str, Any], extra: Mapping[str, Any], path: str) -> None:
        for key, value in extra.items():
            where = f"{path}.{key}"
            if key not in into or into[key] is None:
                into[key] = copy.deepcopy(value)
            elif isinstance(into[key], Mapping) and isinstance(value, Mapping):
                merge(into[key], value, where)
            elif value is not None and into[key] != value:
                gave_way.append(f"{where}: the phase's {value!r} gives way to the run's {into[key]!r}")

    merge(merged, mix_kwargs(own), "reward")
    return merged, gave_way


def unmeasurable_terms(mixes: Mapping[str, RewardMix], device: str) -> str | None:
    """One warning naming the weighted terms of ``mixes`` (label -> mix) that cannot be nonzero on
    ``device``, and why (each term's optional ``supports(device)``); None when every term can.

    >>> mix = RewardMix(weights={"correctness": 1.0, "speedup": 0.5, "roofline": 0.0})
    >>> print(unmeasurable_terms({"self-play": mix}, "cpu"))
    reward term speedup is 0 for every candidate on device=cpu (weighed in self-play): GPU timing is measured only on device=cuda (the performance check). Runs that differ only in its weight give identical results.
    >>> unmeasurable_terms({"self-play": mix}, "cuda") is None
    True
    """
    reasons: dict[str, str] = {}
    where: dict[str, list[str]] = {}
    for label, mix in mixes.items():
        for name, term in mix.terms.items():
            reason = optional(term, "RewardTerm", "supports")(device) if mix.weights.get(name) else None
            if reason:
                reasons.setdefault(name, str(reason))
                where.setdefault(name, []).append(label)
    if not reasons:
        return None
    names = sorted(reasons)
    labels = list(dict.fromkeys(label for n in names for label in where[n]))
    why = "; ".join(dict.fromkeys(reasons[n] for n in names))
    many = len(names) > 1
    return (f"reward term{'s' if many else ''} {', '.join(names)} {'are' if many else 'is'} 0 for every candidate on "
            f"device={device} (weighed in {', '.join(labels)}): {why}. Runs that differ only in "
            f"{'their weights' if many else 'its weight'} give identical results.")


def reward_notes(run_reward: Mapping[str, Any], phases: Iterable[Any], device: str) -> list[str]:
    """What a training run says at start about its rewards, one warning per line.

    ``phases``: the run's phases (``name``, ``kind``, ``steps``, ``reward``); only GRPO phases that will
    train (``steps > 0``) use a reward. A line for each such phase whose own ``reward`` block gave way to
    the run's ``reward`` group (:func:`phase_reward`), and one line naming the weighted terms that cannot be
    nonzero on ``device`` (:func:`unmeasurable_terms`).
    """
    notes: list[str] = []
    mixes: dict[str, RewardMix] = {}
    for phase in phases:
        if phase.kind != "grpo" or phase.steps <= 0:
            continue
        kwargs, gave_way = phase_reward(run_reward, phase.reward)
        if gave_way:
            notes.append(f"phase {phase.name}: the run's reward group wins over trainer.phases.{phase.name}.reward: "
                         + "; ".join(gave_way))
        mixes[f"phase {phase.name}"] = RewardMix(**kwargs)
    unmeasured = unmeasurable_terms(mixes, device)
    if unmeasured:
        notes.append(unmeasured)
    return notes


def trl_reward_function(name: str, fn: Callable[[list[Any], dict[str, Any]], list[float]]) -> Callable[..., list]:
    """Wrap ``fn(completions, kwargs)`` as a TRL reward function whose ``__name__`` is ``name``.

    TRL logs each reward function as ``rewards/<__name__>/mean``, so every term keeps its own name.
    """

    def reward(prompts=None, completions=None, **kwargs: Any) -> list[float]:
        return fn(list(completions or []), kwargs)

    reward.__name__ = reward.__qualname__ = name
    return reward

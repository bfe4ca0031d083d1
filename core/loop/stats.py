"""Bootstrap confidence intervals for comparing training arms run with several seeds.

An arm's measurements come in clusters: one cluster per seed (a run), holding that run's items
(GRPO steps, or held-out tasks). Runs differ by more than their items' sampling noise (the model,
the task stream and the curriculum all depend on the seed), so the intervals here resample at
both levels, seeds first and then items within each drawn seed (the two-stage cluster bootstrap;
Davison & Hinkley 1997, section 3.8). With one item per seed it is the ordinary bootstrap over seeds.

Percentile intervals, ``resamples`` draws from a seeded generator: the same inputs give the same
interval. numpy only (scipy is not installed here).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

Clusters = Sequence[Sequence[float]]


@dataclass(frozen=True)
class Interval:
    """A point estimate with its confidence interval."""

    estimate: float
    low: float
    high: float
    confidence: float = 0.95

    def __str__(self) -> str:
        return f"{self.estimate:.3f} [{self.low:.3f}, {self.high:.3f}]"

    def to_dict(self) -> dict[str, float]:
        return {"estimate": self.estimate, "low": self.low, "high": self.high, "confidence": self.confidence}


def _check(clusters: Clusters, name: str) -> list[np.ndarray]:
    arrays = [np.asarray(list(c), dtype=float) for c in clusters]
    if not arrays or any(a.size == 0 for a in arrays):
        raise ValueError(f"{name}: need at least one seed with at least one value, got sizes "
                         f"{[a.size for a in arrays]}")
    return arrays


def _resampled_means(arrays: list[np.ndarray], resamples: int, rng: np.random.Generator) -> np.ndarray:
    """``resamples`` means of the pooled items of a two-stage resample (seeds, then items)."""
    out = np.empty(resamples)
    n = len(arrays)
    for r in range(resamples):
        picks = rng.integers(0, n, size=n)
        total = count = 0.0
        for i in picks:
            a = arrays[i]
            draw = a[rng.integers(0, a.size, size=a.size)]
            total += draw.sum()
            count += a.size
        out[r] = total / count
    return out


def pooled_mean(clusters: Clusters) -> float:
    arrays = _check(clusters, "pooled_mean")
    return float(np.concatenate(arrays).mean())


def _interval(estimate: float, draws: np.ndarray, confidence: float) -> Interval:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    tail = (1 - confidence) / 2 * 100
    low, high = np.nanpercentile(draws, [tail, 100 - tail]) if np.isfinite(draws).any() else (np.nan, np.nan)
    return Interval(float(estimate), float(low), float(high), confidence)


def mean_ci(clusters: Clusters, confidence: float = 0.95, resamples: int = 2000, seed: int = 0) -> Interval:
    """The mean of all items, with its two-stage bootstrap interval."""
    arrays = _check(clusters, "mean_ci")
    draws = _resampled_means(arrays, resamples, np.random.default_rng(seed))
    return _interval(pooled_mean(arrays), draws, confidence)


def ratio_ci(numerator: Clusters, denominator: Clusters, confidence: float = 0.95, resamples: int = 2000,
             seed: int = 0) -> Interval:
    """Mean of ``numerator`` over mean of ``denominator`` (two independent arms), with its interval.

    Draws whose denominator mean is 0 are dropped (the ratio is undefined there); the estimate is
    ``nan`` when the denominator's own mean is 0.
    """
    num, den = _check(numerator, "ratio_ci numerator"), _check(denominator, "ratio_ci denominator")
    rng = np.random.default_rng(seed)
    a, b = _resampled_means(num, resamples, rng), _resampled_means(den, resamples, rng)
    with np.errstate(divide="ignore", invalid="ignore"):
        draws = np.where(b != 0, a / np.where(b != 0, b, 1.0), np.nan)
    base = pooled_mean(den)
    estimate = pooled_mean(num) / base if base else float("nan")
    return _interval(estimate, draws, confidence)


def difference_ci(after: Clusters, before: Clusters, confidence: float = 0.95, resamples: int = 2000,
                  seed: int = 0) -> Interval:
    """Mean of paired differences ``after - before`` (same seeds, same items in the same order)."""
    a, b = _check(after, "difference_ci after"), _check(before, "difference_ci before")
    if [x.size for x in a] != [x.size for x in b]:
        raise ValueError(f"difference_ci pairs items: sizes {[x.size for x in a]} and {[x.size for x in b]} differ")
    return mean_ci([x - y for x, y in zip(a, b)], confidence, resamples, seed)

"""Training and self-play metrics: per-step numbers, ``metrics.jsonl`` and a summary plot.

One :class:`Attempt` per verified completion. :func:`step_metrics` turns a step's attempts into the
flat mapping every consumer reads (``on_step_end`` hooks, the curriculum, ``metrics.jsonl``):

``pass_rate``            first-sample pass rate: share of groups whose first sample was accepted
``pass_at_k``, ``k``     share of groups with at least one accepted sample among their k samples
``accept_rate``          share of all samples accepted
``information_density``  share of GRPO groups whose total rewards are not all equal (only those
                         carry gradient)
``reward``, ``reward/<term>``  mean total reward and mean reward of each term
``hack_flag_rate``       share of samples with at least one hack flag (``Verdict.hack_flags``)
``compile_rate``, ``latency_ratio`` (when timed), ``tasks/tier<t>`` (distinct tasks per tier)
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence


@dataclass
class Attempt:
    """One verified sample. ``group`` ties the samples of one prompt (a GRPO group) together."""

    task_id: str
    group: int
    accepted: bool
    rewards: dict[str, float]
    total: float
    tier: int = 0
    compiled: bool = False
    hack_flags: list[str] = field(default_factory=list)
    latency_ratio: float | None = None


def latency_ratio(verdict: Any) -> float | None:
    """Candidate time over the target (eager) time, from ``verdict.timing``; None when untimed."""
    timing = getattr(verdict, "timing", None) or {}
    speedup = timing.get("speedup_eager")
    if speedup:
        return 1.0 / float(speedup)
    median, eager = timing.get("median_ms"), timing.get("eager_ms")
    if median and eager:
        return float(median) / float(eager)
    return None


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def step_metrics(attempts: Sequence[Attempt], terms: Iterable[str], tolerance: float = 1e-9) -> dict[str, float]:
    """The metrics of one step (or round) of attempts; see the module docstring for the keys."""
    terms = list(terms)
    groups: dict[int, list[Attempt]] = defaultdict(list)
    for a in attempts:
        groups[a.group].append(a)
    n = len(attempts)
    metrics: dict[str, float] = {
        "samples": float(n),
        "groups": float(len(groups)),
        "k": float(max((len(g) for g in groups.values()), default=0)),
        "pass_rate": _mean([float(g[0].accepted) for g in groups.values()]),
        "pass_at_k": _mean([float(any(a.accepted for a in g)) for g in groups.values()]),
        "accept_rate": _mean([float(a.accepted) for a in attempts]),
        "information_density": _mean(
            [float(max(a.total for a in g) - min(a.total for a in g) > tolerance) for g in groups.values()]
        ),
        "reward": _mean([a.total for a in attempts]),
        "hack_flag_rate": _mean([float(bool(a.hack_flags)) for a in attempts]),
        "compile_rate": _mean([float(a.compiled) for a in attempts]),
    }
    for term in terms:
        metrics[f"reward/{term}"] = _mean([a.rewards.get(term, 0.0) for a in attempts])
    ratios = [a.latency_ratio for a in attempts if a.latency_ratio is not None and a.accepted]
    if ratios:
        metrics["latency_ratio"] = _mean(ratios)
    tiers: dict[int, set[str]] = defaultdict(set)
    for a in attempts:
        tiers[a.tier].add(a.task_id)
    for tier, ids in sorted(tiers.items()):
        metrics[f"tasks/tier{tier}"] = float(len(ids))
    return metrics


def solve_rates(attempts: Sequence[Attempt]) -> dict[str, float]:
    """Share of accepted samples per task id (what ``Proposer.feedback`` receives)."""
    tried: dict[str, int] = defaultdict(int)
    solved: dict[str, int] = defaultdict(int)
    for a in attempts:
        tried[a.task_id] += 1
        solved[a.task_id] += int(a.accepted)
    return {tid: solved[tid] / tried[tid] for tid in tried}


def aggregate(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Mean of every numeric key over ``rows`` (a round's summary of its steps); counts are summed."""
    summed = {"samples", "groups"}
    keys = sorted({k for r in rows for k, v in r.items() if isinstance(v, (int, float)) and not isinstance(v, bool)})
    out: dict[str, float] = {}
    for key in keys:
        values = [float(r[key]) for r in rows if key in r and isinstance(r[key], (int, float))]
        out[key] = sum(values) if key in summed or key.startswith("tasks/") else _mean(values)
    return out


class MetricsLog:
    """Appends one JSON object per step to ``metrics.jsonl`` (flushed per line, so a killed run keeps it)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.rows: list[dict[str, Any]] = []
        if self.path.exists():
            self.rows = [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def append(self, row: Mapping[str, Any]) -> None:
        row = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
        self.rows.append(dict(row))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")

    def truncate(self, last_step: int) -> None:
        """Keep rows with ``step <= last_step`` (resuming from a checkpoint taken at that step)."""
        self.rows = [r for r in self.rows if r.get("step", -1) <= last_step]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in self.rows))


DECISION_COLOURS = {"shrink": "tab:red", "new APIs": "tab:green", "performance": "tab:orange", "hold": "tab:gray"}


HEADLINE_TITLE = "held-out pass rate"


def plot_summary(rows: Sequence[Mapping[str, Any]], path: str | Path, title: str = "KernelZero training",
                 decisions: Sequence[Mapping[str, Any]] = (),
                 headline: Sequence[tuple[str, float, int]] = ()) -> Path:
    """A PNG with pass rates, information density, the curriculum, rewards per term and hack flags against step,
    and the run's headline comparison.

    ``decisions`` (``curriculum.jsonl`` rows: ``step``, ``decision``) are drawn as vertical lines on the
    learning-curve panels, coloured by kind, so each change of the task distribution sits on the curve
    that caused it. ``headline``: ``(stage, held-out pass rate, tasks)`` in order (before training, after
    each phase, each control arm; :func:`core.loop.report.headline`), drawn as bars in the last panel.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    steps = [r.get("step", i) for i, r in enumerate(rows)]

    def series(key: str) -> list[float]:
        return [float(r[key]) if r.get(key) is not None else float("nan") for r in rows]

    fig, axes = plt.subplots(2, 3, figsize=(15, 7), sharex=True)
    panels = [
        (axes[0][0], "pass rates", ["pass_rate", "pass_at_k", "accept_rate"]),
        (axes[0][1], "information density", ["information_density"]),
        (axes[0][2], "curriculum", ["curriculum/param_scale", "curriculum/perf_share"]),
        (axes[1][0], "reward per term", sorted({k for r in rows for k in r if k.startswith("reward/")})),
        (axes[1][1], "hack flags / compile", ["hack_flag_rate", "compile_rate"]),
    ]
    for ax, name, keys in panels:
        for key in keys:
            ax.plot(steps, series(key), marker=".", label=key)
        ax.set_title(name)
        ax.set_ylim(-0.05, 1.05) if name != "reward per term" else None
        ax.grid(alpha=0.3)
    tiers = axes[0][2].twinx()
    tiers.step(steps, series("curriculum/max_tier"), where="post", color="tab:purple", label="max_tier (right)")
    tiers.set_ylabel("max_tier")
    tiers.legend(fontsize=8, loc="lower right")
    seen: set[str] = set()
    for d in decisions:
        kind = next((k for k in DECISION_COLOURS if str(d.get("decision", "")).startswith(k)), "hold")
        for ax in (axes[0][0], axes[0][1], axes[0][2]):
            ax.axvline(float(d.get("step", 0)), color=DECISION_COLOURS[kind], alpha=0.5, ls="--",
                       label=f"curriculum: {kind}" if kind not in seen and ax is axes[0][0] else None)
        seen.add(kind)
    for ax, _, keys in panels:
        if keys or ax is axes[0][0]:
            ax.legend(fontsize=7)
    fig.delaxes(axes[1][2])
    if headline:
        ax = fig.add_subplot(2, 3, 6)  # its own x axis: stages, not steps
        labels = [label for label, _, _ in headline]
        rates = [float(rate) for _, rate, _ in headline]
        colours = ["tab:gray" if label.startswith("before") else "tab:olive" if label.startswith("control")
                   else "tab:blue" for label in labels]
        bars = ax.bar(range(len(labels)), rates, color=colours)
        for bar, rate, (_, _, tasks) in zip(bars, rates, headline):
            ax.annotate(f"{rate:.3f}\n({round(rate * tasks)}/{tasks})", (bar.get_x() + bar.get_width() / 2, rate),
                        ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize=7)
        ax.set_ylim(0, 1.15)
        ax.set_title(HEADLINE_TITLE)
        ax.grid(alpha=0.3, axis="y")
    for ax in axes[1][:2]:
        ax.set_xlabel("step")
    axes[0][2].set_xlabel("step")
    axes[0][2].xaxis.set_tick_params(labelbottom=True)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def sparkline(values: Sequence[float]) -> str:
    """A one-line text curve of values in [0, 1] (the learning curve printed at the end of a run)."""
    bars = "▁▂▃▄▅▆▇█"
    return "".join(bars[min(7, max(0, int(float(v) * 8)))] if v == v else "?" for v in values)

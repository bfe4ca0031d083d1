"""Evaluation numbers as the field reports them: compiled, correct, fast_p, geometric-mean speedup.

``fast_p`` is KernelBench's metric: the share of *all* tasks of a group whose candidate is correct
and more than ``p`` times faster than the baseline (``speedup > p``). ``fast_0`` is therefore the
correct rate. Here "correct" means *accepted*: it compiled, matched the reference, and no integrity
check flagged it, so a hack never counts as fast. Speedups come only from the verifier's
performance stage (``verdict.timing``), which exists only on a GPU; without timing ``fast_p`` for
``p > 0`` is reported as unavailable, never estimated.
"""

from __future__ import annotations

import csv
import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from core.task import Candidate, Task
from core.verdict import Verdict

THRESHOLDS: tuple[float, ...] = (0.0, 1.0, 1.2, 1.5, 2.0)
BASELINES: tuple[str, ...] = ("eager", "compile")
OVERALL = "overall"


def speedup_of(verdict: Verdict | None, baseline: str) -> float | None:
    """Baseline time over candidate time from ``verdict.timing``, or None when it was not measured.

    Reads ``speedup_<baseline>``, else ``<baseline>_ms / median_ms``.
    """
    timing = (verdict.timing if verdict is not None else None) or {}
    value = timing.get(f"speedup_{baseline}")
    if _positive(value):
        return float(value)
    base, ours = timing.get(f"{baseline}_ms"), timing.get("median_ms")
    if _positive(base) and _positive(ours):
        return float(base) / float(ours)
    return None


def _positive(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _judge_kernels(verdict: Verdict) -> str | None:
    correctness = (verdict.checks or {}).get("correctness")
    return (correctness.data or {}).get("judge_kernels") if correctness is not None else None


# verdict.timing's fields for the timers' own loops: the candidate's (runs, warm-up runs, host seconds), then the
# baseline's (plugins.verifiers.performance.check.TIMER_LOOP_FIELDS)
TIMER_LOOPS = {"runs": "candidate_runs", "warmup_runs": "candidate_warmup_runs", "wall_s": "candidate_wall_s",
               "eager_runs": "eager_runs", "eager_wall_s": "eager_wall_s", "compile_runs": "compile_runs",
               "compile_wall_s": "compile_wall_s"}


def _timer_loops(timing: dict[str, Any] | None) -> dict[str, float] | None:
    loops = {name: float(timing[key]) for key, name in TIMER_LOOPS.items()
             if isinstance((timing or {}).get(key), (int, float))}
    return loops or None


@dataclass
class TaskResult:
    """One task's outcome, flattened for tables and files."""

    task_id: str
    name: str
    level: str
    status: str
    compiled: bool
    correct: bool
    accepted: bool
    speedup: dict[str, float | None]
    hack_flags: list[str]
    reason: str | None = None
    median_ms: float | None = None
    candidate_id: str | None = None
    cached: bool = False
    elapsed_s: float | None = None  # the verification's wall time, and where it went (for slow verdicts)
    gpu_wait_s: float | None = None
    stage_s: dict[str, float] | None = None
    gpu_memory: dict[str, Any] | None = None  # the admission's estimate and each request's peak
    gpu_held_s: dict[str, float] | None = None  # seconds it held the GPU lock per turn ("... alone": exclusive)
    judge_kernels: str | None = None  # what compared its large outputs in the keeper: lent kernels, or torch (why)
    # the timers' own loops: runs and host seconds of the candidate's, eager's and torch.compile's timings
    timer_loops: dict[str, float] | None = None

    @classmethod
    def of(cls, task: Task, level: str, candidate: Candidate, verdict: Verdict | None,
           cached: bool = False) -> TaskResult:
        if verdict is None:  # declined by the coder, or no solution file
            return cls(task.id, task.name or task.id, level, "declined", False, False, False,
                       {b: None for b in BASELINES}, [], reason=candidate.declined)
        median = (verdict.timing or {}).get("median_ms")
        return cls(task.id, task.name or task.id, level, verdict.status, bool(verdict.compiled),
                   bool(verdict.correct), bool(verdict.accepted), {b: speedup_of(verdict, b) for b in BASELINES},
                   verdict.hack_flags, reason=verdict.reason, median_ms=median if _positive(median) else None,
                   candidate_id=candidate.id, cached=cached, elapsed_s=verdict.elapsed_s,
                   gpu_wait_s=verdict.gpu_wait_s, stage_s=dict(verdict.stage_s or {}) or None,
                   gpu_memory=verdict.gpu_memory or None, gpu_held_s=dict(verdict.gpu_held_s or {}) or None,
                   judge_kernels=_judge_kernels(verdict), timer_loops=_timer_loops(verdict.timing))

    def fast(self, p: float, baseline: str) -> bool:
        if not self.accepted:
            return False
        if p == 0:
            return True
        s = self.speedup.get(baseline)
        return s is not None and s > p

    def to_row(self) -> dict[str, Any]:
        row = asdict(self)
        row.pop("speedup")
        row["hack_flags"] = ";".join(self.hack_flags)
        row["stage_s"] = " ".join(f"{k}={v:.1f}" for k, v in (self.stage_s or {}).items())
        row.pop("gpu_memory")  # results.json keeps it; a CSV cell would not
        row.pop("timer_loops")
        row["gpu_held_s"] = " ".join(f"{k}={v:.1f}" for k, v in (self.gpu_held_s or {}).items())
        for b in BASELINES:
            row[f"speedup_{b}"] = self.speedup.get(b)
        return row


@dataclass
class GroupSummary:
    """Numbers of one level (or ``overall``)."""

    level: str
    tasks: int
    declined: int
    compiled: int
    correct: int
    accepted: int
    timed: dict[str, int]
    fast_p: dict[str, dict[str, float | None]]  # baseline -> "p" -> share, None when nothing was timed
    geomean_speedup: dict[str, float | None]
    hack_flags: dict[str, int] = field(default_factory=dict)
    hacked: int = 0
    # verdicts of status "error" (the run's, not the kernel's: e.g. the task does not fit the GPU's
    # memory, core.verification.gpumemory): not judged, so never counted as a rejected kernel's fault
    not_judged: int = 0

    def rate(self, count: int) -> float:
        return count / self.tasks if self.tasks else 0.0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(compiled_rate=self.rate(self.compiled), correct_rate=self.rate(self.correct),
                    accepted_rate=self.rate(self.accepted))
        return data


def p_key(p: float) -> str:
    return f"{p:g}"


def summarise_group(level: str, results: Sequence[TaskResult]) -> GroupSummary:
    n = len(results)
    accepted = [r for r in results if r.accepted]
    timed = {b: sum(r.speedup.get(b) is not None for r in accepted) for b in BASELINES}
    fast: dict[str, dict[str, float | None]] = {}
    geomean: dict[str, float | None] = {}
    for b in BASELINES:
        fast[b] = {}
        for p in THRESHOLDS:
            # Without any timing only fast_0 (the correct rate) is known.
            known = p == 0 or timed[b] > 0
            fast[b][p_key(p)] = (sum(r.fast(p, b) for r in results) / n if n else 0.0) if known else None
        speedups = [r.speedup[b] for r in accepted if r.speedup.get(b) is not None]
        geomean[b] = math.exp(sum(math.log(s) for s in speedups) / len(speedups)) if speedups else None
    flags = Counter(flag for r in results for flag in r.hack_flags)
    return GroupSummary(level=level, tasks=n, declined=sum(r.status == "declined" for r in results),
                        compiled=sum(r.compiled for r in results), correct=sum(r.correct for r in results),
                        accepted=len(accepted), timed=timed, fast_p=fast, geomean_speedup=geomean,
                        hack_flags=dict(sorted(flags.items())), hacked=sum(bool(r.hack_flags) for r in results),
                        not_judged=sum(r.status == "error" for r in results))


def summarise(results: Sequence[TaskResult]) -> list[GroupSummary]:
    """One summary per level, in first-seen order, then ``overall``."""
    levels: dict[str, list[TaskResult]] = {}
    for r in results:
        levels.setdefault(r.level, []).append(r)
    groups = [summarise_group(level, rs) for level, rs in levels.items()]
    groups.append(summarise_group(OVERALL, list(results)))
    return groups


def all_declined_warning(results: Sequence[TaskResult]) -> str | None:
    """The warning when no task was attempted (every candidate declined), naming the commonest
    reasons; None when at least one candidate was verified."""
    if not results or any(r.status != "declined" for r in results):
        return None
    reasons = Counter((r.reason or "no reason given").splitlines()[0][:200] for r in results)
    top = "; ".join(f"{n}x {why}" for why, n in reasons.most_common(3))
    return (f"every one of the {len(results)} task(s) was declined, so nothing was verified and every rate above "
            f"is 0. Commonest reasons: {top}")


# --------------------------------------------------------------------------- presentation


def _fmt(x: float | None, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def has_timing(groups: Sequence[GroupSummary]) -> bool:
    return any(v > 0 for g in groups for v in g.timed.values())


def table(groups: Sequence[GroupSummary], title: str, device: str) -> Any:
    """A rich table: one row per level and baseline, with the ``fast_p`` column at p = 0, 1, 1.2, 1.5, 2."""
    from rich.table import Table

    timed = has_timing(groups)
    caption = ("fast_p = share of all tasks accepted and faster than the baseline by more than p; "
               "geomean over accepted, timed tasks")
    if not timed:
        caption = (f"no timing on {device}: speedups are measured only on a GPU (performance stage), so fast_p "
                   "for p > 0 is n/a and fast_0 = correct (accepted) rate")
    t = Table(title=title, caption=caption + "; '-' = not measured")
    for col in ("level", "tasks", "decl", "not judged", "compiled", "correct", "hacks", "vs"):
        t.add_column(col, justify="left" if col in ("level", "vs") else "right", no_wrap=True)
    t.add_column("fast_p  p=" + "/".join(p_key(p) for p in THRESHOLDS), justify="left", no_wrap=True)
    t.add_column("geomean", justify="right", no_wrap=True)
    for g in groups:
        for i, b in enumerate(BASELINES):
            fast = "/".join("-" if (v := g.fast_p[b][p_key(p)]) is None else f"{v:.2f}" for p in THRESHOLDS)
            head = [g.level, str(g.tasks), str(g.declined), str(g.not_judged), f"{_fmt(g.rate(g.compiled), 2)}",
                    f"{_fmt(g.rate(g.accepted), 2)}", str(g.hacked)] if i == 0 else [""] * 7
            geo = g.geomean_speedup[b]
            t.add_row(*head, b, fast, "-" if geo is None else f"{geo:.2f}x", end_section=i == len(BASELINES) - 1)
    return t


def write_results(out_dir: Path, results: Sequence[TaskResult], groups: Sequence[GroupSummary],
                  meta: dict[str, Any]) -> dict[str, Path]:
    """results.json (everything), results.csv (per task), summary.csv (per level), fast_p.png."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "results.json", "csv": out_dir / "results.csv",
             "summary_csv": out_dir / "summary.csv", "plot": out_dir / "fast_p.png"}
    payload = {**meta, "thresholds": list(THRESHOLDS), "baselines": list(BASELINES),
               "timing_available": has_timing(groups),
               "summary": [g.to_dict() for g in groups], "tasks": [asdict(r) for r in results]}
    paths["json"].write_text(json.dumps(payload, indent=1, sort_keys=True, default=str))
    rows = [r.to_row() for r in results]
    with open(paths["csv"], "w", newline="") as f:
        fields = list(rows[0]) if rows else list(TaskResult.__dataclass_fields__)
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    with open(paths["summary_csv"], "w", newline="") as f:
        writer = csv.writer(f)
        fast_cols = [f"fast_{p_key(p)}_{b}" for b in BASELINES for p in THRESHOLDS]
        writer.writerow(["level", "tasks", "declined", "compiled_rate", "correct_rate", "accepted_rate", "hacked",
                         *fast_cols, *[f"geomean_speedup_{b}" for b in BASELINES]])
        for g in groups:
            writer.writerow([g.level, g.tasks, g.declined, g.rate(g.compiled), g.rate(g.correct),
                             g.rate(g.accepted), g.hacked,
                             *[g.fast_p[b][p_key(p)] for b in BASELINES for p in THRESHOLDS],
                             *[g.geomean_speedup[b] for b in BASELINES]])
    plot(groups, paths["plot"], title=str(meta.get("suite", "")))
    return paths


def plot(groups: Sequence[GroupSummary], path: Path, title: str = "") -> None:
    """Left: compiled/correct rates per level. Right: fast_p against p per level and baseline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_rates, ax_fast) = plt.subplots(1, 2, figsize=(11, 4))
    names = [g.level for g in groups]
    width = 0.27
    for k, (label, attr) in enumerate((("compiled", "compiled"), ("correct", "correct"), ("accepted", "accepted"))):
        xs = [i + (k - 1) * width for i in range(len(groups))]
        ax_rates.bar(xs, [g.rate(getattr(g, attr)) for g in groups], width, label=label)
    ax_rates.set_xticks(range(len(groups)), names)
    ax_rates.set_ylim(0, 1.05)
    ax_rates.set_ylabel("share of tasks")
    ax_rates.legend(loc="upper right", fontsize=8)
    ax_rates.set_title("compiled / correct")
    if has_timing(groups):
        for g in groups:
            for b, style in zip(BASELINES, ("-", "--")):
                ys = [g.fast_p[b][p_key(p)] for p in THRESHOLDS]
                ax_fast.plot(THRESHOLDS, [y if y is not None else math.nan for y in ys], style, marker="o",
                             label=f"{g.level} vs {b}")
        ax_fast.set_xlabel("p (speedup threshold)")
        ax_fast.set_ylabel("fast_p")
        ax_fast.set_ylim(0, 1.05)
        ax_fast.legend(fontsize=7)
    else:
        ax_fast.axis("off")
        ax_fast.text(0.5, 0.5, "no timing on this device:\nfast_p for p > 0 needs the GPU performance stage",
                     ha="center", va="center")
    ax_fast.set_title("fast_p")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

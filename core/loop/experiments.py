"""The published-claim experiments, read from finished run directories: per-seed values, intervals, table, figure.

``scripts/run_experiments.py`` runs every arm with several seeds (one ``python -m core.run`` per
run, started by :func:`launch`, which ``benchmarks/selfplay_sweep.py`` uses too); the rest of this
module only reads what those runs wrote (``metrics.jsonl``, ``train_state.json``) and
compares arms with the two-stage bootstrap of :mod:`core.loop.stats` (seeds, then items):

- **selfplay** (the default run, ``make run``): held-out pass rate after SFT, after GRPO, and of
  the control arm (the same wall clock spent on more SFT); items are held-out tasks, paired
  between stages of one seed.
- **density**: information density (share of GRPO groups whose rewards differ) with
  ``proposer=mcts`` against ``proposer=random`` at matched steps (claim: 2.3x); items are steps.
- **curriculum**: GRPO steps until the pass rate, averaged over ``window`` steps, reaches a
  threshold, ``curriculum=adaptive`` against ``curriculum=fixed`` (claim: 40% fewer); one item per
  seed. A run that never reaches it counts as the whole budget (a lower bound, marked in the table).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from statistics import mean
from typing import Any, TypeVar

from core.loop.stats import Interval, difference_ci, mean_ci, ratio_ci

DENSITY = ("density_random", "density_mcts", "density_replay")
CURRICULUM = ("curriculum_fixed", "curriculum_adaptive")
SELFPLAY = "selfplay"
ROOT = Path(__file__).resolve().parents[2]


def finished(run_dir: Path) -> bool:
    """A run is finished once its ``result.json`` exists (written last, after any control arm)."""
    return (run_dir / "result.json").exists()


# Every run that launch() started and that has not ended, across threads: an interrupt of the parent
# stops them all (run_parallel). Each run is in a session of its own, so nothing else reaches it.
_LIVE: set[subprocess.Popen] = set()
_LIVE_LOCK = threading.Lock()
_STOPPING = threading.Event()  # set by _stop_live_runs: a thread about to launch a run must not start it
T = TypeVar("T")
R = TypeVar("R")


def launch(run_dir: Path, overrides: Sequence[str], log: Path, limit_s: float | None = None,
           program: Sequence[str] = ("-m", "core.run")) -> str:
    """Run ``python -m core.run hydra.run.dir=<run_dir> <overrides>`` in its own process, stdout and
    stderr to ``log``; the status: ``ok``, ``exit N`` or ``over S s`` (killed at ``limit_s``).

    The run gets its own process group, and at ``limit_s`` (or on an interrupt) the whole group is
    stopped: a run's verifier workers are its children, and killing ``core.run`` alone left them running.
    """
    cmd = [sys.executable, *program, f"hydra.run.dir={run_dir}", *overrides]
    with log.open("w") as fh:
        with _LIVE_LOCK:
            if _STOPPING.is_set():
                return "stopped"
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
                                    env={**os.environ, "PYTHONUNBUFFERED": "1"})
            _LIVE.add(proc)
        try:
            returncode = proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            _stop_groups([proc])
            return f"over {limit_s:.0f} s"
        except BaseException:
            _stop_groups([proc])
            raise
        finally:
            with _LIVE_LOCK:
                _LIVE.discard(proc)
    return "ok" if returncode == 0 else f"exit {returncode}"


def _stop_groups(procs: Sequence[subprocess.Popen], grace_s: float = 5.0) -> None:
    """SIGTERM to every run's process group at once; after ``grace_s`` (for all of them together), SIGKILL
    to whatever is left of each (workers that outlived their leader, or a leader that ignored SIGTERM).
    Together, because a parent stopped at a limit (scripts/gpu_measure.py) gets 10 s before its own SIGKILL."""
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def _stop_live_runs() -> None:
    """Stop every run launch() started that is still going (their whole process groups), and any about to
    start; run_parallel lifts the stop once its threads have ended."""
    with _LIVE_LOCK:
        _STOPPING.set()
        procs = list(_LIVE)
    _stop_groups(procs)


def take_interrupts() -> object:
    """SIGINT raises KeyboardInterrupt here even when this process was started ignoring or blocking it
    (a background job of a shell; a parent whose thread blocked it: the mask and an ignored disposition
    are inherited across exec, and Python then leaves SIGINT alone). Returns the previous handler."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    return signal.signal(signal.SIGINT, signal.default_int_handler)


def run_parallel(fn: Callable[[T], R], items: Iterable[T], jobs: int) -> list[R]:
    """``[fn(item) for item in items]``, ``jobs`` at a time in threads, where each ``fn`` may launch() runs.

    An interrupt (SIGINT, or SIGTERM, which it turns into one) of this process stops every launched run
    before it propagates. Without that, the interrupt reached only the main thread: the pool waited for
    its threads, the parent was killed after its grace period, and the runs, each in a session of its own,
    went on as orphans. A later call of a device chain then resumed the same run directory beside its
    orphan, two processes writing one run (scripts/gpu_measure.py, 2026-12-02).
    """
    items = list(items)
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main else None

    def on_sigterm(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous_int = None
    if main:
        signal.signal(signal.SIGTERM, on_sigterm)
        previous_int = take_interrupts()
    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    futures = []
    try:
        futures = [pool.submit(fn, item) for item in items]
        return [future.result() for future in futures]
    except BaseException:
        for future in futures:
            future.cancel()
        _stop_live_runs()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        _STOPPING.clear()
        if main:
            signal.signal(signal.SIGTERM, previous)
            signal.signal(signal.SIGINT, previous_int)


def metric_rows(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def steps_to_threshold(rows: Sequence[dict[str, Any]], threshold: float, window: int) -> int | None:
    """GRPO steps until the mean pass rate over the last ``window`` steps first reaches ``threshold``."""
    rates = [float(r["pass_rate"]) for r in rows]
    for i in range(window - 1, len(rates)):
        if mean(rates[i - window + 1:i + 1]) >= threshold:
            return i + 1
    return None


def stage_outcomes(run_dir: Path, warm_start: bool = False) -> dict[str, list[int]]:
    """Per-task held-out outcomes of one run: ``before``, ``sft`` (after the first phase), ``rl``, ``control``.

    ``warm_start``: the run started from an SFT model and skipped its own SFT phase, so its ``before``
    evaluation is the ``sft`` stage."""
    progress = json.loads((run_dir / "train_state.json").read_text())
    out = {"before": progress["eval_before"]["outcomes"], "rl": progress["eval_after"]["outcomes"]}
    between = progress.get("eval_phases", {})
    if warm_start:
        out["sft"] = out["before"]
    elif between:
        out["sft"] = next(iter(between.values()))["outcomes"]
    controls = progress.get("eval_controls", {})
    if controls:
        out["control"] = next(iter(controls.values()))["outcomes"]
    return out


def selfplay_summary(run_dirs: Sequence[Path], warm_start: bool = False) -> dict[str, Any]:
    """Pass rates per stage and the gains over SFT, with intervals over seeds and held-out tasks."""
    runs = [stage_outcomes(d, warm_start) for d in run_dirs]
    stages = [s for s in ("before", "sft", "rl", "control") if all(s in r for r in runs)]
    result: dict[str, Any] = {"seeds": len(runs), "tasks": [len(r["rl"]) for r in runs], "stages": {}, "gains": {}}
    for stage in stages:
        per_seed = [r[stage] for r in runs]
        result["stages"][stage] = {"ci": mean_ci(per_seed).to_dict(), "per_seed": [mean(v) for v in per_seed]}
    pairs = [("rl", "sft"), ("control", "sft"), ("rl", "control")]
    for after, before in pairs:
        if after in stages and before in stages:
            ci = difference_ci([r[after] for r in runs], [r[before] for r in runs])
            result["gains"][f"{after}-{before}"] = {
                "ci": ci.to_dict(), "per_seed": [mean(r[after]) - mean(r[before]) for r in runs]}
    return result


def density_summary(arms: dict[str, Sequence[Path]]) -> dict[str, Any]:
    """Mean information density per arm (items: steps), and each other proposer over random with its interval
    (``ratio``: MCTS, the published claim; ``ratio_replay``: prioritized task replay)."""
    values = {arm: [[float(r["information_density"]) for r in metric_rows(d)] for d in dirs] for arm, dirs in arms.items()}
    result: dict[str, Any] = {"arms": {}}
    for arm, per_seed in values.items():
        result["arms"][arm] = {"ci": mean_ci(per_seed).to_dict(), "per_seed": [mean(v) for v in per_seed],
                               "steps": [len(v) for v in per_seed],
                               "groups": sum(sum(r["groups"] for r in metric_rows(d)) for d in arms[arm])}
    if "density_random" in values:
        for arm, key in (("density_mcts", "ratio"), ("density_replay", "ratio_replay")):
            if arm in values:
                result[key] = ratio_ci(values[arm], values["density_random"]).to_dict()
    return result


def curriculum_summary(arms: dict[str, Sequence[Path]], threshold: float, window: int, budget: int) -> dict[str, Any]:
    """Steps to the threshold per arm (unreached: the budget), and adaptive over fixed with its interval."""
    result: dict[str, Any] = {"arms": {}, "threshold": threshold, "window": window, "budget": budget}
    steps: dict[str, list[list[float]]] = {}
    for arm, dirs in arms.items():
        hits = [steps_to_threshold(metric_rows(d), threshold, window) for d in dirs]
        steps[arm] = [[float(budget if h is None else h)] for h in hits]
        result["arms"][arm] = {"ci": mean_ci(steps[arm]).to_dict(), "per_seed": hits,
                               "reached": sum(h is not None for h in hits),
                               "pass_rate": [mean(float(r["pass_rate"]) for r in metric_rows(d)) for d in dirs]}
    if all(a in steps for a in CURRICULUM):
        result["ratio"] = ratio_ci(steps["curriculum_adaptive"], steps["curriculum_fixed"]).to_dict()
    return result


def _ci(d: dict[str, float]) -> str:
    return str(Interval(d["estimate"], d["low"], d["high"], d.get("confidence", 0.95)))


def points(ci: dict[str, float]) -> str:
    """A difference of pass rates in percentage points with its interval: ``+1.6 [-3.1, +6.2]``."""
    return f"{100 * ci['estimate']:+.1f} [{100 * ci['low']:+.1f}, {100 * ci['high']:+.1f}]"


def gain_points(gains: dict[str, Any], key: str) -> str:
    """:func:`points` of ``selfplay_summary(...)["gains"][key]`` (``rl-sft``, ...), ``-`` when absent."""
    return points(gains[key]["ci"]) if key in gains else "-"


def _seeds(values: Sequence[Any], fmt: str = "{:.3f}") -> str:
    return " ".join("-" if v is None else fmt.format(v) for v in values)


def table_rows(summary: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """``(experiment, arm, mean [95% CI], per seed, claim)`` rows of the whole summary."""
    rows = []
    labels = {"before": "before training", "sft": "after SFT warm start", "rl": "after GRPO (self-play)",
              "control": "control: more SFT, same wall clock"}
    sp = summary.get(SELFPLAY)
    if sp:
        for stage, res in sp["stages"].items():
            rows.append(("held-out pass rate", labels[stage], _ci(res["ci"]), _seeds(res["per_seed"]), ""))
        for name, res in sp["gains"].items():
            after, before = name.split("-")
            rows.append(("gain (points)", f"{after} - {before}", points(res["ci"]),
                         _seeds([100 * v for v in res["per_seed"]], "{:+.1f}"), "+10 points" if name == "rl-sft" else ""))
    density = summary.get("density")
    if density:
        for arm, res in density["arms"].items():
            rows.append(("information density", arm, _ci(res["ci"]), _seeds(res["per_seed"]), ""))
        if "ratio" in density:
            rows.append(("information density", "mcts / random", _ci(density["ratio"]), "", "2.3x"))
        if "ratio_replay" in density:
            rows.append(("information density", "replay / random", _ci(density["ratio_replay"]), "", ""))
    cur = summary.get("curriculum")
    if cur:
        for arm, res in cur["arms"].items():
            rows.append((f"steps to pass >= {cur['threshold']}", arm, _ci(res["ci"]),
                         _seeds(res["per_seed"], "{:d}") + f" ({res['reached']} reached; '-' = not in {cur['budget']})", ""))
        if "ratio" in cur:
            rows.append((f"steps to pass >= {cur['threshold']}", "adaptive / fixed", _ci(cur["ratio"]), "",
                         "0.6 (40% fewer)"))
    return rows


def markdown_table(summary: dict[str, Any]) -> str:
    """The table of :func:`table_rows` as Markdown (what docs/training.md quotes)."""
    lines = ["| experiment | arm | mean [95% CI] | per seed | published claim |", "|---|---|---|---|---|"]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(summary)]
    return "\n".join(lines) + "\n"


def plot_experiments(summary: dict[str, Any], path: Path) -> Path:
    """One panel per experiment: each arm's mean with its 95% interval, and every seed's value as a dot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(k, summary[k]) for k in (SELFPLAY, "density", "curriculum") if summary.get(k)]
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(5 * max(1, len(panels)), 4), squeeze=False)
    titles = {SELFPLAY: "held-out pass rate (default run)", "density": "information density",
              "curriculum": "GRPO steps to the pass-rate threshold"}
    for ax, (name, res) in zip(axes[0], panels):
        arms = res["stages"] if name == SELFPLAY else res["arms"]
        labels = list(arms)
        for i, arm in enumerate(labels):
            ci = arms[arm]["ci"]
            ax.bar(i, ci["estimate"], color="tab:blue", alpha=0.5)
            ax.errorbar(i, ci["estimate"], yerr=[[ci["estimate"] - ci["low"]], [ci["high"] - ci["estimate"]]],
                        color="black", capsize=6)
            seeds = [v if v is not None else res.get("budget", 0) for v in arms[arm]["per_seed"]]
            ax.scatter([i] * len(seeds), seeds, color="tab:red", zorder=3, s=14)
        ax.set_xticks(range(len(labels)), [label.replace("_", "\n") for label in labels], fontsize=8)
        ax.set_title(titles[name], fontsize=10)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle("KernelZero experiments: mean, 95% bootstrap interval (seeds, then items), seeds as dots", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path

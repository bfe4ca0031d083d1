"""What a training run reports at its end: the held-out table, the learning curve, ``result.json``.

The held-out table has one row per evaluation of the run (``train_state.json``): before training,
after each phase, and each control arm (:mod:`core.loop.control`) beside the phase it controls,
with the change against the evaluation the phase started from.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from core.loop.console import print_table
from core.loop.metrics import sparkline
from core.loop.step_clock import breakdown_line
from core.loop.training_config import Phase


def evaluations(progress: Mapping[str, Any], phases: Sequence[Phase]) -> list[tuple[str, str, dict[str, Any]]]:
    """``(label, phase name or "", evaluation)`` in the order they were made."""
    rows = [("before training", "", progress["eval_before"])]
    between = progress.get("eval_phases", {})
    own = [p for p in phases if p.control_for is None and p.steps > 0]
    for phase in own:
        evaluation = between.get(phase.name) or (progress.get("eval_after") if phase is own[-1] else None)
        if evaluation is not None:
            rows.append((f"after {phase.name} ({phase.kind})", phase.name, evaluation))
    for name, evaluation in progress.get("eval_controls", {}).items():
        kind = next((p.kind for p in phases if p.name == name), "?")
        rows.append((f"control {name}: same time as {evaluation['control_for']}, spent on more {kind}", name, evaluation))
    return rows


def headline(progress: Mapping[str, Any], phases: Sequence[Phase]) -> list[tuple[str, float, int]]:
    """The run's headline comparison, ``(stage, held-out pass rate, tasks)``: before training, after each
    phase (after SFT, after GRPO) and each control arm (what the summary plot's last panel shows)."""
    short = []
    for label, _, e in evaluations(progress, phases):
        if label.startswith("control "):
            label = label.split(":")[0]
        short.append((label, float(e["pass_rate"]), int(e.get("tasks", 0))))
    return short


def proposer_label(cfg: Any) -> str:
    """The proposer as the run chose it: the config group the user named (``single_op``, the default) with
    the registered plugin it builds when that differs (``single_op (random)``); outside Hydra, the plugin."""
    name = str(cfg.proposer.name)
    choice = None
    try:
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():
            choice = HydraConfig.get().runtime.choices.get("proposer")
    except (ImportError, ValueError, AttributeError):
        choice = None
    return f"{choice} ({name})" if choice and choice != name else name


def start_pass_rate(progress: Mapping[str, Any], phases: Sequence[Phase], name: str) -> float | None:
    """Held-out pass rate of the model phase ``name`` (or, for a control, the phase it controls) started from."""
    target = progress.get("eval_controls", {}).get(name, {}).get("control_for", name)
    before = progress["eval_before"]["pass_rate"]
    for phase in phases:
        if phase.name == target:
            return before
        if phase.control_for is None and phase.name in progress.get("eval_phases", {}):
            before = progress["eval_phases"][phase.name]["pass_rate"]
    return None


def run_summary(progress: Mapping[str, Any], eval_tasks: int) -> dict[str, Any]:
    """The ``result.json`` fields about held-out evaluations and phase times."""
    before, after = progress["eval_before"], progress["eval_after"]
    return {
        "pass_rate": after["pass_rate"], "pass_rate_before": before["pass_rate"],
        "compile_rate": after["compile_rate"], "compile_rate_before": before["compile_rate"],
        "pass_rate_after_phase": {name: e["pass_rate"] for name, e in progress.get("eval_phases", {}).items()},
        "pass_rate_control": {name: e["pass_rate"] for name, e in progress.get("eval_controls", {}).items()},
        "controls": dict(progress.get("eval_controls", {})),
        "phase_seconds": dict(progress.get("seconds", {})), "phase_steps": dict(progress.get("steps_done", {})),
        "eval_tasks": eval_tasks,
        "step_time": dict(progress.get("step_time", {})),  # per GRPO phase (core.loop.step_clock.breakdown)
    }


def print_results(console: Console, progress: Mapping[str, Any], phases: Sequence[Phase]) -> None:
    """The final table: held-out pass rate before, after each phase, and of each control arm."""
    seconds, steps = progress.get("seconds", {}), progress.get("steps_done", {})
    rows = []
    for label, name, e in evaluations(progress, phases):
        start = start_pass_rate(progress, phases, name) if name else None
        change = f"{100 * (e['pass_rate'] - start):+.1f} pts" if start is not None else ""
        rows.append((label, f"{e['pass_rate']:.3f}", change, f"{round(e['pass_rate'] * e['tasks'])}/{e['tasks']}",
                     f"{e['compile_rate']:.3f}", f"{seconds[name]:.0f}s" if name in seconds else "",
                     str(steps.get(name, ""))))
    print_table(console, "held-out pass rate (greedy first sample, tasks never trained on)",
                ("stage", "pass rate", "change", "passed", "compile rate", "train time", "steps"), rows,
                left=("stage",))
    for name, b in progress.get("step_time", {}).items():
        console.print(breakdown_line(f"{name} step time", b), soft_wrap=True, markup=False, highlight=False)


def read_decisions(path: Path) -> list[dict[str, Any]]:
    """The curriculum decisions a run logged (``curriculum.jsonl``), in order."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def print_learning_curve(console: Console, rows: Sequence[Mapping[str, Any]]) -> None:
    """The GRPO steps' metrics as a table (at most ~20 rows) and sparklines."""
    if not rows:
        return
    stride = max(1, len(rows) // 20)
    cells = []
    for r in list(rows[::stride]) + ([rows[-1]] if (len(rows) - 1) % stride else []):
        tiers = ",".join(f"{k.split('tier')[-1]}:{int(v)}" for k, v in sorted(r.items()) if k.startswith("tasks/tier"))
        cells.append((str(r["step"]), str(r.get("phase", "")), f"{r['pass_rate']:.3f}", f"{r['pass_at_k']:.3f}",
                      f"{r['information_density']:.3f}", f"{r['reward']:.3f}", f"{r['hack_flag_rate']:.3f}", tiers))
    print_table(console, "learning curve (GRPO steps)",
                ("step", "phase", "pass rate", "pass@k", "info density", "reward", "hack flags", "tiers"), cells)
    console.print("pass rate   " + sparkline([r["pass_rate"] for r in rows]))
    console.print("pass@k      " + sparkline([r["pass_at_k"] for r in rows]))
    console.print("info dens.  " + sparkline([r["information_density"] for r in rows]))

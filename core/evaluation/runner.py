"""One evaluation from a composed ``core.eval`` config: tasks, candidates, cached and fresh verdicts,
the report (the CLI is :mod:`core.eval`).

The suite's tasks (optionally some levels, or the first ``limit``) are recorded as held out, given one
candidate each (ready solutions or the configured coder), verified through the configured executor
unless the cache (:mod:`core.evaluation.cache`) holds their verdict, summarised per level
(:mod:`core.evaluation.report`) and written to the run's output directory.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from core.config import build, resolve_device
from core.evaluation.cache import CacheKey, EvalCache, hardware, software_versions, split_cached
from core.evaluation.report import TaskResult, all_declined_warning, summarise, table, write_results
from core.evaluation.resize import fit_for_eval
from core.evaluation.suites import HeldOut, Suite, SuiteError, level_of, load_solutions, load_suite
from core.task import Candidate, Task
from core.verdict import Verdict
from core.verification.executor import make_executor

# Verifier settings that change what a verdict says (the cache key includes them).
VERDICT_SETTINGS = ("checks", "trials", "tolerances", "probe_scales", "timeout_s", "memory_mb")


def select_tasks(suite: Suite, levels: Any = None, limit: int | None = None, names: Any = None) -> list[Task]:
    """The suite's tasks of ``levels``, then those named in ``names`` (a task's name, or ``level/name``; a
    name no selected task has is an error, not an empty run), then the first ``limit``; in suite order."""
    tasks = suite.tasks
    if levels:
        wanted = {str(x) for x in ([levels] if isinstance(levels, str) else levels)}
        unknown = wanted - set(suite.levels)
        if unknown:
            raise SuiteError(f"levels {sorted(unknown)} are not in the suite; it has {suite.levels}")
        tasks = [t for t in tasks if level_of(t) in wanted]
    if names:
        wanted = [str(x) for x in ([names] if isinstance(names, str) else names)]
        keys = [{t.name, f"{level_of(t)}/{t.name}"} for t in tasks]
        unknown = [n for n in wanted if not any(n in k for k in keys)]
        if unknown:
            raise SuiteError(f"names {unknown} match no selected task of the suite (a task's name is its file's, "
                             f"without .py, e.g. {tasks[0].name if tasks else '1_Square_matrix_multiplication_'}; "
                             "or level/name)")
        tasks = [t for t, k in zip(tasks, keys) if k & set(wanted)]
    if limit is not None:
        tasks = tasks[: int(limit)]
    return tasks


def levels_line(suite: Suite, tasks: list[Task]) -> str:
    """``"200 tasks in 2 level(s) (level1, level2) of the suite's 4"``: the levels of the tasks selected."""
    chosen = list(dict.fromkeys(level_of(t) for t in tasks))
    line = f"{len(tasks)} tasks in {len(chosen)} level(s) ({', '.join(chosen)})"
    return line + (f" of the suite's {len(suite.levels)}" if len(suite.levels) != len(chosen) else "")


def candidates_for(cfg: DictConfig, tasks: list[Task], backend: str, console: Console) -> tuple[list[Candidate], str]:
    """One candidate per task: from the solutions folder, else from the configured coder."""
    if cfg.get("solutions"):
        return load_solutions(cfg.solutions, tasks, backend), f"solutions:{cfg.solutions}"
    coder = build("coder", cfg.coder)
    began = time.perf_counter()
    with console.status(f"coder {coder.name}: writing {len(tasks)} candidates"):
        samples = coder.generate(tasks, backend, 1)
    console.print(f"coder {coder.name}: {len(tasks)} candidates written in {time.perf_counter() - began:.1f} s")
    out = []
    for task, cands in zip(tasks, samples, strict=True):
        if not cands:
            cands = [Candidate(source="", backend=backend, task_id=task.id, coder=coder.name,
                               declined="the coder returned no sample")]
        out.append(cands[0])
    return out, f"coder:{coder.name}"


def verdict_line(task: Task, verdict: Verdict, at_s: float) -> str:
    """One line per verdict as it lands: a cut run still says how far it got and why each failed."""
    speed = ""
    timing = verdict.timing or {}
    if timing.get("speedup_eager") is not None:
        speed = f" {timing['speedup_eager']:.2f}x eager"
        if timing.get("speedup_compile") is not None:
            speed += f" {timing['speedup_compile']:.2f}x compile"
    why = "" if verdict.accepted else f" - {(verdict.reason or '')[:400]}"
    stages = sorted((verdict.stage_s or {}).items(), key=lambda kv: -kv[1])[:4]
    where = ", ".join(f"{k} {v:.1f}" for k, v in stages)
    if verdict.gpu_wait_s >= 0.5:
        where += f"; waited {verdict.gpu_wait_s:.1f} for the GPU"
    alone = sum(v for k, v in (verdict.gpu_held_s or {}).items() if k.endswith(" alone"))
    if alone >= 0.5:
        where += f"; held it alone {alone:.1f}"
    return (f"[{at_s:6.1f} s] {level_of(task)}/{task.name or task.id}: {verdict.status}{speed} "
            f"({verdict.elapsed_s:.1f} s{': ' + where if where else ''}){why}")


LANDED_FILE = "verdicts.jsonl"  # a row per verdict as it lands; results.json is written only at the end


class LandedLog:
    """Each verdict's results.json row (plus ``at_s``, seconds into the run), appended as it lands, so a
    run cut by a time limit still leaves every verdict it reached (``benchmarks.kb_table`` reads it)."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")  # this run's verdicts only

    def add(self, task: Task, candidate: Candidate, verdict: Verdict, at_s: float) -> None:
        row = {**asdict(TaskResult.of(task, level_of(task), candidate, verdict)), "at_s": round(at_s, 2)}
        with open(self.path, "a") as f:
            f.write(json.dumps(row, default=str) + "\n")


class EarlyExecutor:
    """The verification executor started in a thread while the coder writes the candidates: its workers'
    start-up (CUDA contexts, warm-ups: tens of seconds on a GPU host) overlaps the coder's (the expert writes
    KernelBench's 200 candidates in seconds), both before the first verdict. Not taken (every verdict cached, every
    task declined, an error), it is closed once its start ends."""

    def __init__(self, node: Any, *, backend: str, device: str, verifier: Any):
        import concurrent.futures as cf

        def plain(conf: Any) -> dict[str, Any]:  # resolved here: a config is not read from two threads
            return OmegaConf.to_container(conf, resolve=True) if isinstance(conf, DictConfig) else dict(conf or {})

        pool = cf.ThreadPoolExecutor(1, thread_name_prefix="executor-start")
        self._future = pool.submit(make_executor, plain(node), backend=backend, device=device, verifier=plain(verifier))
        pool.shutdown(wait=False)
        self._taken = False

    def take(self) -> Any:
        """The executor, once started (raises what its start raised)."""
        self._taken = True
        return self._future.result()

    def abandon(self) -> None:
        if self._taken:
            return

        def close(started: Any) -> None:
            if started.exception() is None:
                started.result().close()

        self._future.add_done_callback(close)


def evaluate(cfg: DictConfig, console: Console | None = None) -> dict[str, Any]:
    """Run one evaluation from a composed config; return the JSON payload that was written."""
    console = console or Console()
    started = time.perf_counter()
    suite = load_suite(cfg.suite)
    tasks = select_tasks(suite, cfg.get("levels"), cfg.get("limit"), cfg.get("names"))
    if not tasks:
        raise SuiteError(f"no task of suite {cfg.suite} was selected (levels={cfg.get('levels')}, limit={cfg.get('limit')})")
    device = resolve_device(cfg.device)
    backend = cfg.backend.name
    out_dir = Path(cfg.out_dir)
    console.print(f"suite [bold]{suite.name}[/]: {levels_line(suite, tasks)} from {suite.source}")
    originals = tasks
    tasks, fitted = fit_for_eval(tasks, cfg.get("fit"), device)  # CPU-sized copies (core/evaluation/resize.py)
    if fitted["enabled"]:
        budget = fitted["budget"]
        console.print(f"[bold yellow]measured at reduced sizes: {fitted['reduced']} of {len(tasks)} tasks[/] "
                      f"(fit: <= {budget['mib']} MiB, <= {budget['gflop']} GFLOP, reference <= {budget['s']} s "
                      "on CPU; sizes in results.json; fit.enabled=false for the tasks' own sizes)")
        for line in fitted["unfitted"]:
            console.print(f"  over the budget: {line}")

    heldout_path = cfg.heldout.get("path")
    if cfg.heldout.get("record", True):
        new = HeldOut().record(list(originals) + [t for t in tasks if t.id not in {o.id for o in originals}],
                               heldout_path, label=f"core.eval suite {suite.source}")
        console.print(f"held out: {new} new task fingerprint(s) recorded (training excludes them; see core.evaluation.suites)")

    # after the fit, whose CPU timings a starting pool would disturb
    early = EarlyExecutor(cfg.executor, backend=backend, device=device, verifier=cfg.verifier)
    try:
        return _verify_and_report(cfg, console, started, suite, tasks, fitted, device, backend, out_dir, early)
    finally:
        early.abandon()


def _verify_and_report(cfg: DictConfig, console: Console, started: float, suite: Suite, tasks: list[Task],
                       fitted: dict[str, Any], device: str, backend: str, out_dir: Path,
                       early: EarlyExecutor) -> dict[str, Any]:
    candidates, source = candidates_for(cfg, tasks, backend, console)
    attempts = [i for i, c in enumerate(candidates) if not c.declined]
    verifier_cfg = OmegaConf.to_container(cfg.verifier, resolve=True)
    settings = {k: verifier_cfg.get(k) for k in VERDICT_SETTINGS if k in verifier_cfg}
    key = CacheKey(device=device, settings={"backend": backend, **settings})
    cache = EvalCache(cfg.cache.path if cfg.cache.get("enabled", True) else None)
    pairs = [(tasks[i], candidates[i]) for i in attempts]
    found, missing = split_cached(cache, key, pairs)
    verdicts: dict[int, Verdict] = dict(found)
    console.print(f"{len(candidates) - len(attempts)} declined, {len(found)} verdicts from the cache, "
                  f"{len(missing)} to verify")
    budget_s = cfg.get("budget_s")
    not_run: list[int] = []  # indices into `missing` whose verification never started (over budget_s)
    if missing:
        todo = [pairs[i] for i in missing]
        fresh: dict[int, Verdict] = {}
        with early.take() as executor:
            console.print(f"executor {executor.describe()}")
            columns = (TextColumn("verify"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
            # one continuous queue; with a time budget no verification starts after it (the first
            # excepted: a run always measures something)
            deadline = None if budget_s is None else time.monotonic() + float(budget_s) - (time.perf_counter() - started)
            with Progress(*columns, console=console, transient=True) as progress:
                bar = progress.add_task("verify", total=len(todo))

                landed_log = LandedLog(out_dir / LANDED_FILE)

                said_plan: list[str] = []

                def landed(idx: list[int], vs: list[Verdict]) -> None:
                    note = getattr(executor, "dispatch_note", "")  # known before the first verdict lands
                    if note and not said_plan:
                        said_plan.append(note)
                        console.print(note, highlight=False)
                    for i, v in zip(idx, vs):
                        cache.put(key.of(*todo[i]), v)
                        at_s = time.perf_counter() - started
                        console.print(verdict_line(todo[i][0], v, at_s), highlight=False)
                        landed_log.add(todo[i][0], todo[i][1], v, at_s)
                    progress.advance(bar, len(vs))

                for j, v in enumerate(executor.verify_many(todo, on_verdicts=landed, deadline=deadline)):
                    if v is None:
                        not_run.append(j)
                    else:
                        fresh[j] = v
        for k, i in enumerate(missing):
            if k in fresh:
                verdicts[i] = fresh[k]
    cache.close()

    results: list[TaskResult] = []
    slot = {task_index: k for k, task_index in enumerate(attempts)}
    skipped = {attempts[missing[k]] for k in not_run}  # task indices left out of the report
    for i, (task, cand) in enumerate(zip(tasks, candidates)):
        if i in skipped:
            continue
        k = slot.get(i)
        verdict = verdicts.get(k) if k is not None else None
        results.append(TaskResult.of(task, level_of(task), cand, verdict, cached=k in found if k is not None else False))
    not_run_names = [tasks[i].name or tasks[i].id for i in sorted(skipped)]
    if not_run_names:
        console.print(f"[bold yellow]not run: {len(not_run_names)} of {len(tasks)} tasks were not verified within "
                      f"budget_s={budget_s} and are left out of every figure below[/] (listed in results.json)")
    groups = summarise(results)
    console.print(table(groups, f"{suite.name} — {source} — {backend} on {hardware(device)}", device))
    warning = all_declined_warning(results)
    if warning:
        console.print(f"[bold red]WARNING: {warning}[/]")
    meta = {"suite": suite.name, "suite_source": suite.source, "candidates": source, "backend": backend,
            "device": device, "hardware": hardware(device), "software": software_versions(backend),
            "cache": {"path": cfg.cache.path if cfg.cache.get("enabled", True) else None,
                      "hits": len(found), "verified": len(missing)},
            "attempted": len(attempts), "declined": len(candidates) - len(attempts), "all_declined": bool(warning),
            "seconds": round(time.perf_counter() - started, 2),
            "budget_s": budget_s, "not_run": not_run_names,
            "resized": {"reduced": fitted["reduced"], "of": len(tasks), "budget": fitted["budget"],
                        "unfitted": fitted["unfitted"], "tasks": fitted["sizes"]},
            "config": OmegaConf.to_container(cfg, resolve=True)}
    paths = write_results(out_dir, results, groups, meta)
    console.print("results: " + ", ".join(str(p) for p in paths.values()))
    return {**meta, "summary": [g.to_dict() for g in groups]}


__all__ = ["LANDED_FILE", "LandedLog", "VERDICT_SETTINGS", "candidates_for", "evaluate", "levels_line", "select_tasks"]

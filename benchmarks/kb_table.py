"""One markdown table from several ``core.eval`` runs (their results.json): per run, the tasks measured
and not run, accepted, fast_p at p = 0, 1, 1.2, 1.5, 2 and the geomean speedup, against eager and
against torch.compile, then the names of the tasks each run measured, and where its verdicts' time
went (:func:`time_spent`: waits for the GPU, its turns held shared and alone by label, each check's stage,
and the memory admission's estimates against the peaks the workers reported).
A run cut before it wrote results.json is summed from its ``verdicts.jsonl`` (a row per verdict as it landed).

    python -m benchmarks.kb_table RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

PS = ("0", "1", "1.2", "1.5", "2")


def _f(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def rows(run: Path) -> list[str]:
    payload = json.loads((run / "results.json").read_text())
    overall = payload["summary"][-1]
    coder = payload["candidates"].split(":")[-1]
    levels = ",".join(g["level"] for g in payload["summary"][:-1])
    out = []
    for base in ("eager", "compile"):
        fast = "/".join(_f(overall["fast_p"][base][p]) for p in PS)
        out.append(f"| {coder} | {levels} | {overall['tasks']} | {len(payload.get('not_run') or [])} | "
                   f"{overall['accepted']} | {overall['timed'][base]} | {base} | {fast} | "
                   f"{_f(overall['geomean_speedup'][base])} |")
    return out


def time_spent(tasks: list[dict], top: int = 6) -> list[str]:
    """Where the verdicts' time went, summed over ``tasks`` (results.json rows): wall time, the wait for a GPU
    turn, the turns held alone (timing: every other verification waits) and shared, the labels that held
    the GPU longest, and the checks' stages. A timed turn waits until every shared turn inside has left,
    so long shared turns (a baseline's torch.compile build) lengthen the serial part of a run."""
    timed = [t for t in tasks if t.get("elapsed_s") is not None]
    if not timed:
        return []
    held: dict[str, float] = {}
    stages: dict[str, float] = {}
    for t in timed:
        for label, seconds in (t.get("gpu_held_s") or {}).items():
            held[label] = held.get(label, 0.0) + float(seconds)
        for stage, seconds in (t.get("stage_s") or {}).items():
            stages[stage] = stages.get(stage, 0.0) + float(seconds)
    alone = sum(v for k, v in held.items() if k.endswith(" alone"))
    shared = sum(v for k, v in held.items() if not k.endswith(" alone"))

    def biggest(values: dict[str, float]) -> str:
        return ", ".join(f"{k} {v:.1f}" for k, v in sorted(values.items(), key=lambda kv: -kv[1])[:top]) or "-"

    admission = sum(float((t.get("gpu_memory") or {}).get("wait_s") or 0.0) for t in timed)
    return [f"{len(timed)} verdicts: {sum(float(t['elapsed_s']) for t in timed):.1f} s in all, "
            f"{sum(float(t.get('gpu_wait_s') or 0.0) for t in timed):.1f} s waiting for a GPU turn "
            f"({admission:.1f} s of it for memory); "
            f"GPU held alone {alone:.1f} s, shared {shared:.1f} s",
            f"held longest (s): {biggest(held)}",
            f"stages (s): {biggest(stages)}", *memory_estimates(timed)]


def phase_peaks(memory: dict) -> dict[str, int]:
    """Per phase of a verification (reference, trials, extra, timing, baseline), the most device memory its
    workers can have held at once then: each worker role's largest request peak in that phase, summed."""
    return {phase: sum(int(v) for v in roles.values())
            for phase, roles in (memory.get("phase_peak_bytes") or {}).items()}


def measured_peak(memory: dict) -> int:
    """The most device memory a verification's workers can have held at once: its largest phase
    (:func:`phase_peaks`); for a verdict without phases, each role's largest peak over the whole
    verification, summed (keeper, candidate, baseline)."""
    phases = phase_peaks(memory)
    if phases:
        return max(phases.values())
    peaks = memory.get("peak_bytes") or {}
    roles: dict[str, int] = {}
    for label, value in peaks.items():
        role = label.split()[0] if label.split()[0] in ("candidate", "baseline") else "reference"
        roles[role] = max(roles.get(role, 0), int(value))
    return sum(roles.values())


def memory_estimates(tasks: list[dict], top: int = 5) -> list[str]:
    """The admission's estimate against what the workers reported (``gpu_memory``'s ``estimate_bytes`` and
    ``peak_bytes``): how many verdicts it over- and under-estimated, the median ratio, and the tasks it
    under-estimated most (those share the GPU on too small a reservation and can run out of memory)."""
    pairs = []
    for t in tasks:
        memory = t.get("gpu_memory") or {}
        peak, estimate = measured_peak(memory), int(memory.get("estimate_bytes") or 0)
        if peak and estimate:
            pairs.append((estimate / peak, t.get("name") or t.get("task_id"), estimate, peak))
    if not pairs:
        return []
    pairs.sort()
    under = [p for p in pairs if p[0] < 1.0]
    worst = ", ".join(f"{name} {est / 2**30:.1f}/{peak / 2**30:.1f} GiB" for _, name, est, peak in under[:top])
    lines = [f"memory estimate / measured peak: median {pairs[len(pairs) // 2][0]:.2f}, range "
             f"{pairs[0][0]:.2f}-{pairs[-1][0]:.2f}; under-estimated {len(under)} of {len(pairs)}"
             + (f" (estimate/peak: {worst})" if worst else "")]
    # which phase held each verification's peak, the largest peak of each phase over the estimate, and each
    # phase's own estimate (gpumemory.estimate's phases) against what its workers reported then
    top_phase: dict[str, int] = {}
    share: dict[str, float] = {}
    short: dict[str, list[int]] = {}  # phase -> [verdicts it under-estimated, verdicts compared]
    for t in tasks:
        memory = t.get("gpu_memory") or {}
        phases, estimate = phase_peaks(memory), int(memory.get("estimate_bytes") or 0)
        if phases and estimate:
            first = max(phases, key=lambda k: phases[k])
            top_phase[first] = top_phase.get(first, 0) + 1
            for phase, peak in phases.items():
                share[phase] = max(share.get(phase, 0.0), peak / estimate)
                planned = (memory.get("estimate_phases") or {}).get(phase)
                if planned:
                    tally = short.setdefault(phase, [0, 0])
                    tally[0] += int(peak > planned)
                    tally[1] += 1
    if top_phase:
        lines.append("peak phase (verdicts): " + ", ".join(f"{k} {v}" for k, v in sorted(top_phase.items(),
                                                                                        key=lambda kv: -kv[1]))
                     + "; largest phase peak / estimate: " + ", ".join(f"{k} {v:.2f}" for k, v in
                                                                         sorted(share.items(), key=lambda kv: -kv[1])))
    if short:
        lines.append("phase estimates under the phase's measured peak: " +
                     ", ".join(f"{k} {a} of {b}" for k, (a, b) in sorted(short.items())))
    return lines


def appended_rows(path: Path) -> list[dict]:
    """The rows of a JSON-lines file a run appends to as it goes (none if absent; a cut last line is skipped)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # the writer was killed mid-line
    return out


def landed_rows(run: Path) -> list[dict]:
    """The rows ``core.eval`` appended to ``verdicts.jsonl`` as verdicts landed."""
    return appended_rows(run / "verdicts.jsonl")


# the performance check's exclusive turns that time (its set-up and prepare turns are "alone" only in a verification
# that holds the device alone: core.verification.gpusharing)
TIMED_TURNS = ("performance alone", "performance baseline alone")


def timed_turns(tasks: list[dict]) -> list[str]:
    """What the performance stage's exclusive turns held (every other verification waits through them) against
    the timers' own loops (warm-up and timed runs): the rest is the work around the loops inside the turns."""
    timed = [t for t in tasks if t.get("timer_loops")]
    if not timed:
        return []
    held = sum(float(v) for t in timed for k, v in (t.get("gpu_held_s") or {}).items() if k in TIMED_TURNS)
    loops = {who: sum(float(t["timer_loops"].get(f"{who}_wall_s") or 0.0) for t in timed)
             for who in ("candidate", "eager", "compile")}

    def median_runs(who: str) -> str:
        runs = sorted(t["timer_loops"][f"{who}_runs"] for t in timed if f"{who}_runs" in t["timer_loops"])
        return f"{runs[len(runs) // 2]:.0f}" if runs else "-"

    runs = "/".join(median_runs(who) for who in ("candidate", "eager", "compile"))
    return [(f"timed turns: {len(timed)} verdicts held the GPU alone {held:.1f} s to be timed; the timers' loops "
             f"{sum(loops.values()):.1f} s (candidate {loops['candidate']:.1f}, eager {loops['eager']:.1f}, "
             f"torch.compile {loops['compile']:.1f}; median runs {runs})")]


def judge_kernels(tasks: list[dict]) -> list[str]:
    """Which comparisons the keepers made with lent kernels and which with torch (and why): a lent kernel that
    could not build falls back to torch with only a warning in the worker's log, so the table says so."""
    used = Counter(t["judge_kernels"] for t in tasks if t.get("judge_kernels"))
    return ["large outputs compared by: " + "; ".join(f"{k} ({n})" for k, n in used.most_common())] if used else []


def device_alone(tasks: list[dict]) -> list[str]:
    """The verdicts whose memory reservation held the whole device (an estimate over half the admitted memory
    waits for the others to leave, one over all of it runs alone): no other verification ran beside them, so
    their wall time is a serial part of the run."""
    alone = [t for t in tasks if (t.get("gpu_memory") or {}).get("alone") and t.get("elapsed_s") is not None]
    if not alone:
        return []
    spent = sum(float(t["elapsed_s"]) for t in alone)
    return [f"held the device alone: {len(alone)} of {len(tasks)} verdicts, {spent:.1f} s of wall time"]


def memory_retries(tasks: list[dict]) -> list[str]:
    """The verdicts judged again after running out of GPU memory: alone, then lean (the keeper holding the
    candidate's outputs in host memory), with their outcome."""
    out = []
    for mode in ("alone", "lean"):
        hit = [t for t in tasks if f"retried_{mode}_after" in (t.get("gpu_memory") or {})]
        if hit:
            out.append(f"judged again {mode} after running out of GPU memory: {len(hit)} ("
                       + ", ".join(f"{t['name']} {t['status']}" for t in hit) + ")")
    return out


def in_flight(landed: list[dict]) -> list[str]:
    """How many verifications ran at once, from the landed rows (each began ``elapsed_s`` before its ``at_s``):
    when the first began, the mean over the span, and how long one or none ran. On the H100 (2026-12-06) one ran
    at a time for 125 of 427 s: a loss the per-verdict figures do not show (most of it went to problems over the
    whole admitted memory, which run alone)."""
    spans = sorted((float(t["at_s"]) - float(t["elapsed_s"]), float(t["at_s"]))
                   for t in landed if t.get("at_s") is not None and t.get("elapsed_s") is not None)
    if not spans:
        return []
    events = sorted([(b, 1) for b, _ in spans] + [(e, -1) for _, e in spans])
    first, last = events[0][0], events[-1][0]
    running, at, alone, idle, most, busy = 0, first, 0.0, 0.0, 0, 0.0
    for when, change in events:
        alone += (when - at) if running == 1 else 0.0
        idle += (when - at) if running == 0 else 0.0
        busy += (when - at) * running
        running += change
        most, at = max(most, running), when
    span = max(last - first, 1e-9)
    line = (f"in flight: first verification began at {first:.1f} s; {busy / span:.2f} at once on average over "
            f"{span:.0f} s (at most {most}); one alone for {alone:.0f} s, none for {idle:.0f} s")
    return [line] + thin_stretch(landed, events, busy / span)


def thin_stretch(landed: list[dict], events: list[tuple[float, int]], mean: float) -> list[str]:
    """The longest stretch before the final drain with at most half the mean in flight, and what ran then.
    On the H200 (2026-12-07) level 1's twenty elementwise and norm problems ran one after another for 120 s,
    2-7 at once against a mean of 6, while the small problems waited behind a held pair."""
    if mean < 2:  # one at a time is the usual: "one alone for" says it
        return []
    limit = int(mean / 2)
    running, start, best = 0, None, (0.0, 0.0, 0.0)
    for when, change in events[:-1]:
        running += change
        if running <= limit and start is None:
            start = when
        elif running > limit and start is not None:
            best = max(best, (when - start, start, when))
            start = None
    length, begin, end = best
    if length <= 0:
        return []
    timed = [t for t in landed if t.get("at_s") is not None and t.get("elapsed_s") is not None]
    names = [t.get("name", "?") for t in sorted(timed, key=lambda t: float(t["at_s"]) - float(t["elapsed_s"]))
             if float(t["at_s"]) - float(t["elapsed_s"]) < end and float(t["at_s"]) > begin]
    shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
    return [f"thinnest stretch: {begin:.0f}-{end:.0f} s with at most {limit} in flight ({shown})"]


def cut_run(run: Path) -> list[str]:
    """What a run that never wrote results.json reached: its landed verdicts by status, the last one's
    time, the rejections and errors with their reasons, and where the time went."""
    landed = landed_rows(run)
    if not landed:
        return ["no verdict landed (no verdicts.jsonl rows)"]
    counts: dict[str, int] = {}
    for t in landed:
        counts[t["status"]] = counts.get(t["status"], 0) + 1
    last = max(float(t.get("at_s") or 0.0) for t in landed)
    out = [f"cut run: {len(landed)} verdicts landed by {last:.1f} s: "
           + ", ".join(f"{n} {status}" for status, n in sorted(counts.items(), key=lambda kv: -kv[1]))]
    out += [f"  {t['name']}: {t['status']} - {(t.get('reason') or '')[:300]}" for t in landed if not t["accepted"]]
    return out + time_spent(landed) + timed_turns(landed) + judge_kernels(landed) + device_alone(landed) + \
        memory_retries(landed) + in_flight(landed)


def main(argv: list[str] | None = None) -> int:
    runs = [Path(a) for a in (argv if argv is not None else sys.argv[1:])]
    found = [r for r in runs if (r / "results.json").exists()]
    print("| coder | level | measured | not run | accepted | timed | vs | fast_p p=0/1/1.2/1.5/2 | geomean |")
    print("|---|---|---|---|---|---|---|---|---|")
    for run in found:
        print("\n".join(rows(run)))
    for run in runs:
        if run not in found:
            print(f"| {run.name}: no results.json (the run did not finish) |||||||||")
    for run in runs:
        if run not in found:
            for line in cut_run(run):
                print(f"{run.name}: {line}")
    for run in found:
        payload = json.loads((run / "results.json").read_text())
        names = ", ".join(f"{t['name']}{'' if t['accepted'] else ' (' + t['status'] + ')'}" for t in payload["tasks"])
        print(f"\n{run.name}: {names}")
        tasks = payload["tasks"]
        for line in time_spent(tasks) + timed_turns(tasks) + judge_kernels(tasks) + device_alone(tasks) + \
                memory_retries(tasks) + in_flight(landed_rows(run)):
            print(f"{run.name}: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

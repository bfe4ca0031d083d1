"""How much of KernelBench the expert teacher can answer: captured, lowered, declined by op, per level.

    python benchmarks/kernelbench_coverage.py --kb /path/to/KernelBench --levels 1 2 --mib 16 --out /tmp/cov

Each problem is first fitted to ``--mib`` (``core.evaluation.resize``, the CPU-sized copies that
``core.eval`` verifies), then captured (``torch.export`` of ``Model.forward`` on the meta device),
translated to the expert's IR and lowered to a Triton candidate. Nothing runs: this counts what the
expert *attempts*; whether the attempts are right is ``core.eval``'s job (docs/eval.md).

Per level: problems, captured (the model built and traced), lowered (a candidate was written),
declined, each decline's stage; then the ops that cost the most problems (an op counts once per
problem it blocks). ``--out``: ``coverage.json`` with every problem's outcome.

``--check cpu|cuda`` also runs each lowered candidate beside its reference in this process
(``plugins.coders.expert_lowering.selfcheck.compare``: the expert's own code, one seed, outputs
compared at the verifier's tolerances) - a quick look at a device's kernels, not a verdict.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DEFAULT_KB = os.environ.get("KERNELBENCH_DIR", "/work/main/.kb/KernelBench")


@dataclass
class Outcome:
    level: str
    name: str
    stage: str  # "lowered" | "capture" | "op" | "lower" | "fit"
    reason: str = ""
    op: str = ""
    ops: list[str] | None = None  # ATen ops of the captured graph
    sizes: dict | None = None
    check: str = ""  # with --check: "ok" or the mismatch, and the seconds it took


def classify(level: str, path: Path, mib: float | None, catalog, check: str | None = None) -> Outcome:
    from core.evaluation.resize import fit_source
    from core.task import Task
    from plugins.coders.expert_capture import capture
    from plugins.coders.expert_lowering import lower_program
    from plugins.coders.expert_lowering.errors import CaptureFailed, MissingOp, Unsupported

    source = path.read_text()
    sizes = None
    if mib is not None:
        source, fit = fit_source(source, mib)
        sizes = fit.sizes
        if not fit.fitted:
            return Outcome(level, path.stem, "fit", fit.note, sizes=sizes)
    task = Task(source=source, name=path.stem, level=level)
    try:
        captured = capture(task, catalog)
    except CaptureFailed as exc:
        return Outcome(level, path.stem, "capture", str(exc), sizes=sizes)
    except MissingOp as exc:
        return Outcome(level, path.stem, "op", str(exc), op=exc.op, sizes=sizes)
    except Unsupported as exc:
        return Outcome(level, path.stem, "op", str(exc), op="(translation)", sizes=sizes)
    try:
        candidate = lower_program(captured.program, catalog, captured.binding)
    except Unsupported as exc:
        return Outcome(level, path.stem, "lower", str(exc), ops=captured.aten_ops, sizes=sizes)
    outcome = Outcome(level, path.stem, "lowered", ops=captured.aten_ops, sizes=sizes)
    if check:
        from plugins.coders.expert_lowering.selfcheck import compare

        started = time.perf_counter()
        try:
            result = compare(source, candidate, device=check, trials=1)
            verdict = "ok" if result.ok else f"MISMATCH {result.detail[:200]}"
        except Exception as exc:  # the candidate raised: that is the finding
            verdict = f"ERROR {type(exc).__name__}: {str(exc)[:200]}"
        outcome.check = f"{verdict} ({time.perf_counter() - started:.1f} s)"
    return outcome


def problems(root: Path, levels: list[str]) -> list[tuple[str, Path]]:
    out = []
    for level in levels:
        folder = root / (level if level.startswith("level") else f"level{level}")
        if not folder.is_dir():
            raise SystemExit(f"{folder} does not exist; pass --kb <the folder that holds level1/>")
        files = sorted(folder.glob("*.py"), key=lambda p: (int(p.stem.split("_")[0]) if p.stem.split("_")[0].isdigit()
                                                           else 1 << 30, p.stem))
        out += [(folder.name, f) for f in files]
    return out


def report(outcomes: list[Outcome]) -> str:
    lines = ["| level | problems | captured | lowered (attempted) | declined: op | declined: lowering | "
             "not captured | not fitted |", "|---|---|---|---|---|---|---|---|"]
    levels = list(dict.fromkeys(o.level for o in outcomes)) + ["all"]
    for level in levels:
        group = [o for o in outcomes if level in ("all", o.level)]
        count = Counter(o.stage for o in group)
        captured = len(group) - count["capture"] - count["fit"]
        share = f"{count['lowered']} ({100 * count['lowered'] / max(1, len(group)):.0f}%)"
        lines.append(f"| {level} | {len(group)} | {captured} | {share} | {count['op']} | {count['lower']} | "
                     f"{count['capture']} | {count['fit']} |")
    missing = Counter(o.op for o in outcomes if o.stage == "op")
    lines += ["", "Top missing ops (problems each blocks):", ""]
    lines += [f"- `{op}`: {n} ({', '.join(o.level + '/' + o.name.split('_')[0] for o in outcomes if o.op == op)})"
              for op, n in missing.most_common(25)]
    checked = [o for o in outcomes if o.check]
    if checked:
        good = sum(o.check.startswith("ok") for o in checked)
        lines += ["", f"Checked beside the reference: {good} of {len(checked)} match", ""]
        lines += [f"- {o.level}/{o.name}: {o.check}" for o in checked if not o.check.startswith("ok")]
    other = [o for o in outcomes if o.stage in ("lower", "capture", "fit")]
    if other:
        lines += ["", "Other declines:", ""] + [f"- {o.level}/{o.name} ({o.stage}): {o.reason[:160]}" for o in other]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kb", default=DEFAULT_KB, help="the KernelBench folder that holds level1/ level2/ ...")
    ap.add_argument("--levels", nargs="+", default=["1", "2"])
    ap.add_argument("--mib", type=float, default=16.0, help="fit each problem to this many MiB first (0: real sizes)")
    ap.add_argument("--every", type=int, default=1, help="only every k-th problem (a quick sample)")
    ap.add_argument("--check", default=None, choices=["cpu", "cuda"], help="run each candidate beside its reference")
    ap.add_argument("--out", default=None, help="folder for coverage.json")
    args = ap.parse_args(argv)
    os.environ.setdefault("KERNELZERO_DISABLE_AUTOLOAD", "1")
    import warnings

    warnings.filterwarnings("ignore")
    from core.plugins import registry

    ops = registry("op")
    catalog = {n: ops.get(n) for n in ops.names()}
    started = time.perf_counter()
    outcomes = []
    for i, (level, path) in enumerate(problems(Path(args.kb), args.levels)):
        if i % args.every:
            continue
        outcomes.append(classify(level, path, args.mib or None, catalog, args.check))
        if args.check:
            print(f"{level}/{path.stem}: {outcomes[-1].stage} {outcomes[-1].check}", flush=True)
    text = report(outcomes)
    print(text)
    print(f"\n{len(outcomes)} problems in {time.perf_counter() - started:.1f} s (fit to {args.mib} MiB)")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "coverage.json").write_text(json.dumps([asdict(o) for o in outcomes], indent=1))
        (out / "coverage.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

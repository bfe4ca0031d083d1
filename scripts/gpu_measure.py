#!/usr/bin/env python3
"""Every GPU measurement of the project, as named steps, each under its own time limit.

    python3 scripts/gpu_measure.py --list                  # each step: limit, typical time, commands
    python3 scripts/gpu_measure.py suites kernelbench      # these steps, in this order
    python3 scripts/gpu_measure.py --dry-run timing expert # print the commands, run nothing
    python3 scripts/gpu_measure.py --limit suites=400 suites

`install` always runs first: it installs the wheels carried in `.whl/` (those of ../shared/gpu-wheels:
what the GPU machine lacks) into /tmp/site and reports the machine and versions. Carry `.whl` and, for
`kernelbench`, `.kb` (a KernelBench checkout). Everything lands in $OUT (default ./gpu_out):
measure.log (all of it), steps.tgz (each step's log and outputs; the device tool returns only 8 files
from $OUT) and the JSON results; a table of step, status, seconds and key figure prints last. Pick
steps whose limits add up to less than one device call (600 s); docs/benchmarks.md has the figures.
Standard library only: it runs on the GPU machine before anything is installed.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Self

REPO = Path(__file__).resolve().parent.parent
SITE = "/tmp/site"  # where the carried wheels go (/work/shared/NOTES.md)
CALL_S = 600  # one device call
# Subsets whose limits, install's included, fit one device call; together they cover every 1-GPU step.
ONE_CALL = ("suites", "redteam", "kernelbench timing sanitizer", "expert", "scaling inductor",
            "oneshot quantiles", "compare", "kbeval", "training_sft", "hub_grpo")
MIN_STEP_S = 15  # with --call-s, a step is skipped rather than started with less than this left
SUMMARY_S = 30  # what a summary command (Command.after_timeout) gets after its step's limit
STOP_GRACE_S = 10  # after SIGINT at the limit, before SIGKILL (as `timeout --kill-after=10` did)
PYTEST = ("-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "--durations=25")
# The versions that differ between hosts. A module that is absent is reported, not an error; one that
# fails to import fails the install step (nothing after it would run). The serving packages (whether `oneshot`
# can time a served verdict) are read from their metadata, never imported: they decide nothing else.
_PROBE = ("import importlib, importlib.util, importlib.metadata, platform; "
          "print('versions: python ' + platform.python_version(), *[m + ' ' + (str(getattr("
          "importlib.import_module(m), '__version__', 'present')) if importlib.util.find_spec(m) else 'missing') "
          "for m in ('torch', 'triton', 'cupy', 'transformers', 'trl', 'datasets', 'hydra', 'z3', 'pluggy')], "
          "sep=', '); "
          "names = {(d.metadata['Name'] or '').lower().replace('_', '-'): d.version "
          "for d in importlib.metadata.distributions()}; "
          "print('serving: ' + ', '.join(n + ' ' + names.get(n, 'missing') "
          "for n in ('starlette', 'uvicorn', 'h11', 'httpx', 'httpcore', 'anyio')))").replace("'", '"')
# The larger model of the GPU training job (scripts/gpu_train_experiments.sh until 2026-12-01).
_TRAIN_MODEL = ("coder.embedded.hidden_size=512", "coder.embedded.num_layers=8", "coder.embedded.num_heads=8",
                "coder.embedded.num_kv_heads=4", "coder.embedded.intermediate_size=1536",
                "coder.embedded.vocab_size=8192", "coder.corpus_tasks=1000")


@dataclass(frozen=True)
class Command:
    """One program of a step, with what it adds to the steps' environment."""

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    background: bool = False  # started without waiting for it; its step waits for all of them at the end
    # a summary of what the commands before it left (e.g. a cut run's verdicts): it runs even after one of
    # them was stopped at the step's limit, within SUMMARY_S more
    after_timeout: bool = False

    def shell(self) -> str:
        prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in self.env)
        return prefix + shlex.join(self.argv)


@dataclass(frozen=True)
class Context:
    """What a step's commands depend on. `listing` shows placeholders instead of this host's values."""

    python: str
    work: Path
    gpus: int
    kb: Path
    kb_configs: str
    listing: bool = False
    kb_names: str = ""  # kbeval: only these problems (comma-separated names), e.g. to check a fix in one call
    kb_budget_s: int = 460  # kbeval's budget_s: kb_budget_s() of the limit it runs under
    overrides: tuple[tuple[str, str], ...] = ()  # (step, Hydra override) added to that step's core.run/core.eval commands

    @property
    def gpus_text(self) -> str:
        return "$NGPU" if self.listing else str(self.gpus)

    def py(self, *args: str | Path, env: tuple[tuple[str, str], ...] = (), background: bool = False) -> Command:
        return Command((self.python, *map(str, args)), env, background)

    def one_gpu(self) -> tuple[tuple[str, str], ...]:
        # single-GPU steps take the first visible GPU, as the old lanes pinned GPU 0
        return (("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]),)


@dataclass(frozen=True)
class Step:
    name: str
    limit_s: int
    typical: str  # from the history in docs/benchmarks.md
    what: str
    commands: Callable[[Context], list[Command]]
    figure: Callable[[str], str] = lambda log: ""
    gpus: int = 1  # GPUs it needs; skipped with fewer
    note: Callable[[Context], str | None] = lambda ctx: None  # printed before it runs
    skip: Callable[[Context], str | None] = lambda ctx: None
    results: tuple[tuple[str, str], ...] = ()  # (path under the work folder, name in $OUT)
    tail: int = 8  # log lines shown after the run
    chain: bool = False  # stop at the first failing command (a later one needs its output)

    def why_skipped(self, ctx: Context) -> str | None:
        if ctx.gpus < self.gpus:
            return f"needs {self.gpus} GPU(s); {ctx.gpus} visible"
        return self.skip(ctx)


@dataclass
class Outcome:
    step: str
    status: str  # ok | failed | timeout | skipped
    seconds: float = 0.0
    figure: str = ""


# ---------------------------------------------------------------- key figures, read from a step's log


def _lines(log: str) -> list[str]:
    return [line.rstrip() for line in log.splitlines() if line.strip()]


def _pytest_summary_lines(log: str) -> list[str]:
    """Every pytest run's summary line ("33 passed, 1 warning"), in order, without its duration."""
    return [re.sub(r"\s+in [\d.]+s.*$", "", line.strip(" =")) for line in _lines(log)
            if re.search(r"\b\d+ (passed|failed|errors?|skipped|deselected)\b", line) and not line.startswith("$ ")]


def pytest_summary(log: str) -> str:
    """pytest's last summary line ("33 passed, 1 warning"), without its duration."""
    found = _pytest_summary_lines(log)
    return found[-1] if found else ""


def pytest_summaries(log: str) -> str:
    """Every pytest run's summary line in the step, in order ("6 passed; 93 passed"): a step of several runs."""
    return "; ".join(_pytest_summary_lines(log))


def timing_figure(log: str) -> str:
    verdicts = re.findall(r"\s(PASS|FAIL)$", log, re.MULTILINE)
    rep = f"repeatability {verdicts.count('PASS')}/{len(verdicts)} within 1%" if verdicts else ""
    return "; ".join(x for x in (pytest_summary(log), rep) if x)


def kernelbench_figure(log: str) -> str:
    kb = re.findall(r"^KernelBench: ([\d.]+) verdicts/min", log, re.MULTILINE)
    ours = re.findall(r"^ours\[([^\]]+)\]: ([\d.]+) verdicts/min = ([\d.]+)x KernelBench", log, re.MULTILINE)
    parts = ([f"KernelBench {kb[-1]}/min"] if kb else []) + [f"{c} {r}/min ({x}x)" for c, r, x in ours]
    return ", ".join(parts)


def expert_figure(log: str) -> str:
    rows = re.findall(r"^(\w+)\s+\d+\s+\d+\s+([\d.]+|nan)\s+([\d.]+|nan)(?:\s+\S+%)*(?:\s+x eager by dtype.*)?$", log,
                      re.MULTILINE)
    return ", ".join(f"{family} {eager}/{compiled}" for family, eager, compiled in rows) + (
        " (x eager/x compile)" if rows else "")


def scaling_figure(log: str) -> str:
    scaled = re.findall(r"^scaling (\d+) vs 1: ([\d.]+)x", log, re.MULTILINE)
    if scaled and scaled[-1][0] != "1":
        return f"{scaled[-1][0]} vs 1 GPU: {scaled[-1][1]}x"
    one = re.findall(r"^1 shard\s+(\d+)\s+[\d.]+\s+([\d.]+)", log, re.MULTILINE)
    return f"1 GPU: {one[-1][1]} verdicts/min ({one[-1][0]} verdicts)" if one else ""


def sanitizer_figure(log: str) -> str:
    rows = re.findall(r"^memcheck stage driver\s+(\d+)\s+([\d.]+)", log, re.MULTILINE)
    runs = [f"{wall} s {'alone' if n == '1' else f'{n} at once'}" for n, wall in rows]
    return "memcheck stage " + ", ".join(runs) if runs else ""


def refinement_figure(log: str) -> str:
    found = [line.split(" on ")[0].strip() for line in _lines(log) if "pass@1 after turn" in line]
    return "; ".join(found)[:160]


def geomean_figure(log: str) -> str:
    """The geomean speedup vs eager of each core.eval table in the log (teacher, before, after phase 2)."""
    found = re.findall(r"\beager\b.*?(\d+\.\d+x)\s*\S?\s*$", log, re.MULTILINE)
    return "geomean vs eager " + "/".join(found) + " (teacher/before/after)" if found else ""


def held_out_figure(log: str) -> str:
    found = [line.strip() for line in _lines(log) if "held-out pass rate" in line]
    return found[-1][:100] if found else ""


def install_figure(log: str) -> str:
    found = re.findall(r"^versions: (.*)$", log, re.MULTILINE)
    return found[-1] if found else ""


# ---------------------------------------------------------------- the steps


def _install(ctx: Context) -> list[Command]:
    wheels = sorted(glob.glob(str(REPO / ".whl" / "*.whl")))
    cmds = []
    if wheels or ctx.listing:  # the command of /work/shared/NOTES.md, verbatim
        cmds.append(ctx.py("-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", SITE,
                           *([".whl/*.whl"] if ctx.listing else [os.path.relpath(w, REPO) for w in wheels])))
    if shutil.which("nvidia-smi") or ctx.listing:
        cmds.append(Command(("nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader")))
    return [*cmds, ctx.py("-c", _PROBE)]


def _no_wheels(ctx: Context) -> str | None:
    if glob.glob(str(REPO / ".whl" / "*.whl")):
        return None
    return "no wheels in .whl/: nothing installed (carry .whl, a copy of ../shared/gpu-wheels)"


def _suites(ctx: Context) -> list[Command]:
    # The timer tests run here beside the other GPU tests under -n 6 (issue 18: the time charged must hold
    # when neighbours share the GPU), and alone in `redteam` and `timing`.
    return [ctx.py(*PYTEST, "-n", "6", "tests/gpu", "tests/redteam_gpu/test_gpu_activity_gpu.py", env=ctx.one_gpu())]


def _redteam(ctx: Context) -> list[Command]:
    # The red team on the GPU: the timer tests first, with the GPU to themselves (their repeatability bound failed
    # beside five other test processes on an H100, 2026-12-07; 3 s alone), then the races the interpreter finds
    # there, the GPU-only hacks and one verdict per red-team candidate, six at a time.
    return [ctx.py(*PYTEST, "tests/gpu/test_timing_gpu.py", env=ctx.one_gpu()),
            ctx.py(*PYTEST, "-n", "6", "tests/redteam_gpu/test_interp_races_gpu.py",
                   "tests/redteam_gpu/test_gpu_hacks.py", "tests/redteam_gpu/test_redteam_on_gpu.py",
                   env=ctx.one_gpu())]


def _timing(ctx: Context) -> list[Command]:
    return [ctx.py(*PYTEST, "tests/gpu/test_timing_gpu.py", env=ctx.one_gpu()),
            ctx.py("-m", "benchmarks.timing_repeatability", "--out", ctx.work / "repeatability.json",
                   "--sizes-mib", "32,128,2048,6144", "--chains", "1,16", "--repeats", "8",
                   "--variants", "default,min5",
                   env=ctx.one_gpu())]


def _inductor(ctx: Context) -> list[Command]:
    return [ctx.py(*PYTEST, "-m", "gpu", "tests/test_inductor.py", env=ctx.one_gpu())]


def _kernelbench(ctx: Context) -> list[Command]:
    return [ctx.py("-m", "benchmarks.kernelbench_vs_ours", "--kernelbench", ctx.kb, "--dim-scale", "0.015625",
                   "--threads", "256,512,1024", "--workers", "8", "--rounds", "3", "--ours-configs", ctx.kb_configs,
                   "--out", ctx.work / "kernelbench_vs_ours.json", env=ctx.one_gpu())]


def _no_kernelbench(ctx: Context) -> str | None:
    if ctx.kb.is_dir():
        return None
    return f"no KernelBench checkout at {ctx.kb} (carry .kb, or pass --kb DIR)"


# KernelBench's own problems at their real sizes (issue 19, item 7): (coder, level, first N, seconds after
# which core.eval starts no further verification wave). The inductor teacher compiles every task on the
# host before any verdict, so it gets fewer tasks. What was not verified is listed in results.json.
# Issue 39's run: every level-1 and level-2 problem at its real size in one evaluation, one continuous
# queue, no verification started after KB_BUDGET_S (those are listed as not run).
KB_LEVELS, KB_BUDGET_S = ("level1", "level2"), 460
# The step's limit less this is its budget (at most KB_BUDGET_S): the verifications started last, the table and the
# report end within the limit. With a fixed budget a shorter --limit cut the run before its results.json (2026-12-07).
KB_WIND_DOWN_S = 70


def kb_budget_s(limit_s: int) -> int:
    """kbeval's ``budget_s`` under a step limit of ``limit_s``: 460 s at ``--limit kbeval=530``."""
    return max(30, min(KB_BUDGET_S, limit_s - KB_WIND_DOWN_S))


# The scope of kbeval and oneshot is conf/verifier/kb_scope.yaml's: every check but compute-sanitizer's
# three tools, which at these sizes take minutes per verdict.
def _kb_scope_checks() -> str:
    # its flow list read without a YAML parser (this script is standard library only)
    found = re.search(r"^checks:\s*\[([^\]]*)\]", (REPO / "conf" / "verifier" / "kb_scope.yaml").read_text(), re.M)
    if not found:
        raise SystemExit("conf/verifier/kb_scope.yaml has no 'checks: [...]' list")
    return ",".join(name.strip() for name in found.group(1).split(",") if name.strip())


def _oneshot(ctx: Context) -> list[Command]:
    # One-shot verify (issue 39: one small pair in <= 10 s wall) on KernelBench's example solution and a
    # red-team pair, each a fresh `core.verify` process, as a user runs it.
    root = ctx.work / "kb"
    return [ctx.py("-m", "benchmarks.one_shot_verify", "--kernelbench", ctx.kb, "--device", "cuda",
                   "--pairs", "kb_example_add_triton,redteam_vector_add", "--checks", _kb_scope_checks(),
                   "--served", "--out", root / "one_shot_verify.json", env=ctx.one_gpu())]


def _quantiles(ctx: Context) -> list[Command]:
    # the judge's exact quantiles of whole outputs (core/verification/selection.py) against torch.kthvalue
    return [ctx.py("-m", "benchmarks.quantile_bench", "--device", "cuda", "--sizes", "1e8,1.6e9",
                   "--out", ctx.work / "quantiles.json", env=ctx.one_gpu())]


def quantiles_figure(log: str) -> str:
    rows = re.findall(r"^\s*([\d,]+) .*?bisect ([\d.]+) s\s+kthvalue ([\d.]+) s", log, re.MULTILINE)
    return "; ".join(f"{n} elements: bisect {b} s, kthvalue {k} s" for n, b, k in rows[-2:])


def _compare(ctx: Context) -> list[Command]:
    # the plain bound's fused kernels against the torch passes: their tests on the device, then the timings
    return [ctx.py(*PYTEST, "tests/test_judge_kernels.py", env=ctx.one_gpu()),
            ctx.py("-m", "benchmarks.compare_bench", "--device", "cuda", "--sizes", "1e8,1.6e9",
                   "--out", ctx.work / "compare.json", env=ctx.one_gpu())]


def compare_figure(log: str) -> str:
    rows = re.findall(r"^\s*([\d,]+) (.*?)\s+torch ([\d.]+) s\s+fused ([\d.]+) s", log, re.MULTILINE)
    return "; ".join(f"{n} {rule}: torch {t} s, fused {f} s" for n, rule, t, f in rows[-3:])


def _kbeval(ctx: Context) -> list[Command]:
    # core.eval with the expert teacher on KernelBench's own level-1 and level-2 files at their real sizes.
    root = ctx.work / "kb"
    env = (("KERNELZERO_CACHE", str(root / "cache")), ("COLUMNS", "200"), ("PYTHONUNBUFFERED", "1"), *ctx.one_gpu())
    run_dir = root / "expert_l1_l2"
    return [ctx.py("-m", "core.eval", f"suite={ctx.kb / 'KernelBench'}", f"levels=[{','.join(KB_LEVELS)}]",
                   f"budget_s={ctx.kb_budget_s}", "coder=expert", "device=cuda", "heldout.record=false",
                   "cache.enabled=false",
                   "verifier=kb_scope", *([f"names=[{ctx.kb_names}]"] if ctx.kb_names else []),
                   f"hydra.run.dir={run_dir}", env=env),
            replace(ctx.py("-m", "benchmarks.kb_table", run_dir), after_timeout=True)]


def kbeval_figure(log: str) -> str:
    shots = re.findall(r"^one-shot: (\d+/\d+) calls accepted within", log, re.MULTILINE)
    served = re.findall(r"^served: (\d+/\d+) calls accepted within", log, re.MULTILINE)
    geo = re.findall(r"geomean[^\n]*?(\d+\.\d+)x", log)
    return "; ".join(x for x in ([f"one-shot {shots[-1]} within 10 s"] if shots else []) +
                     ([f"served {served[-1]} within 10 s"] if served else []) +
                     ([f"{len(geo)} geomeans"] if geo else []))


def _expert(ctx: Context) -> list[Command]:
    return [ctx.py("benchmarks/expert_gpu.py", "--out", ctx.work / "expert", "--budget-s", "340", "--rounds", "3",
                   "--precompile-limit-s", "120",
                   env=ctx.one_gpu())]


def _scaling(ctx: Context) -> list[Command]:
    return [ctx.py("benchmarks/pool_scaling.py", "--out", ctx.work / "scaling", "--tasks", "96", "--warm", "8",
                   "--workers-per-gpu", "8", "--sanitizers", "none")]


def _one_gpu_arm(ctx: Context) -> str | None:
    if ctx.gpus == 1:
        return "1 GPU visible: only the 1-GPU arm runs (the scaling figure needs a 2-GPU host, nvidia-h200-x2)"
    return None


def _sanitizer(ctx: Context) -> list[Command]:
    return [ctx.py("-m", "benchmarks.sanitizer_cost", "--repeats", "2", "--parallel", "8",
                   "--out", ctx.work / "sanitizer_cost.json", env=ctx.one_gpu())]


# What every GPU-scale training run shares: verdicts on the GPU (the fast check set, as on CPU), one torch
# thread per process (up to 15 runs share the host's 16 cores), and sampling at T 1.0: at the default's
# T 0.6 this model's 8 samples of a task were nearly always identical after SFT (58 distinct of 256,
# information density 0.00 in 6 of 8 steps; measured alone on one H200, docs/training.md "GPU scale"),
# which leaves GRPO no advantages; at T 1.0 density was 0.25-0.75 a step (2026-12-02).
_GPU_RUN = ("device=cuda", "verifier=fast", "coder.temperature=1.0", "trainer.torch_threads=1")
# GRPO runs save every 4 steps, so one cut at a device call's end resumes in the next from at most 4 steps
# back. SFT's steps take ~0.1 s: saving a 27M-parameter model and its optimiser every 4 of them is what
# made the first warm starts overrun their call (632-724 of 800 steps in 420 s); they save every 200.
_GRPO_SAVES, _SFT_SAVES = "trainer.save_steps=4", "trainer.save_steps=200"
_TRAIN_SEEDS = ("0", "1", "2")
_SFT = ("trainer.phases.distill.steps=800", "trainer.phases.distill.tasks=256", "trainer.phases.distill.batch_size=16",
        "trainer.phases.distill.learning_rate=5e-4")
_GRPO_STEPS = 20  # per seed, then its control arm: the same wall clock on more SFT
_GRPO_LONG_STEPS = 60  # the long arm: does the gain grow with steps, as on CPU in float32 (16, 40, 80 steps: +1.6, +3.1, +5.2)?
_EXPERIMENT_STEPS = 12  # per density/curriculum run
_HEADROOM_K = 4  # samples per held-out task in training_headroom: 256 per model, 9 models in ~one call
# Every self-play run from a warm start. Its control arm saves every 200 of its ~0.1 s steps: at every 4
# (2026-12-02) it spent its wall clock saving.
_SELFPLAY = (*_GPU_RUN, _GRPO_SAVES, "trainer.eval_tasks=64", f"trainer.phases.correctness.steps={_GRPO_STEPS}",
             "trainer.phases.more_sft.batch_size=16", "trainer.phases.more_sft.learning_rate=5e-4",
             "trainer.phases.more_sft.save_steps=200")


def _training_dirs(ctx: Context) -> tuple[Path, tuple[tuple[str, str], ...]]:
    root = ctx.work / "training"
    return root, (("KERNELZERO_CACHE", str(root / "cache")),)


def _training_sft(ctx: Context) -> list[Command]:
    # The default job's SFT warm start (make run's first phase) with the larger model, one per seed, side by
    # side on the one GPU: build the model and tokenizer, verify the teacher's answers to 256 tasks, 800 SFT
    # steps, the held-out pass rate (64 tasks) before and after. A warm start finished in an earlier call
    # of a chain (--work) is not rerun.
    root, cache = _training_dirs(ctx)
    runs = [(seed, root / "warm" / f"seed{seed}") for seed in _TRAIN_SEEDS]
    return [ctx.py("-m", "core.run", f"seed={seed}", *_TRAIN_MODEL, *_GPU_RUN, _SFT_SAVES, "trainer.eval_tasks=64", *_SFT,
                   "trainer.phases.correctness.steps=0", "trainer.phases.more_sft.steps=0", f"hydra.run.dir={run}",
                   env=cache, background=True)
            for seed, run in runs if ctx.listing or not (run / "result.json").exists()]


def _training(ctx: Context) -> list[Command]:
    # From training_sft's warm starts, side by side, the rest of the default job per seed: GRPO self-play
    # with the proposer and the adaptive curriculum (4 tasks x 8 samples a step), then its control arm
    # (GRPO's wall clock spent on more SFT on the same 256 pairs), held-out pass rate after each. Task replay,
    # which moved nothing here, no longer runs. Finished runs are not rerun and cut ones resume from their
    # last checkpoint, so a chain of calls (--work) completes it.
    return [_sweep(ctx, "gpu", _SELFPLAY, "selfplay")]


def _training_long(ctx: Context) -> list[Command]:
    # GRPO for 3x training's steps with its own control: on CPU in float32 the gain grew with steps, and so
    # did the control's (2026-12-02). Its own step, so a chain short of device time can leave it out.
    long = [*_SELFPLAY, f"trainer.phases.correctness.steps={_GRPO_LONG_STEPS}"]
    return [_sweep(ctx, "gpu_long", long, "selfplay_long")]


def _sweep(ctx: Context, variant: str, overrides: Sequence[str], out: str) -> Command:
    root, cache = _training_dirs(ctx)
    return ctx.py("-m", "benchmarks.selfplay_sweep", "--warm-starts", root / "warm", "--seeds", *_TRAIN_SEEDS,
                  "--jobs", "3", "--limit-s", "7200", "--out", root / out, "--variant",
                  f"{variant}=" + " ".join(overrides), env=cache, background=True)


def _training_headroom(ctx: Context) -> list[Command]:
    # GRPO optimises the sampled policy; the table scores the greedy answer. benchmarks/headroom on each
    # seed's three models (SFT warm start, after GRPO, its control) gives both, plus pass@k, on the same
    # held-out tasks at the training temperature: does RL move the sampled pass rate more than more SFT?
    # Only finished runs (their result.json): after training_sft alone, the warm starts' sharpening ceiling.
    root, cache = _training_dirs(ctx)
    runs = [(root / "warm" / f"seed{seed}", "distill", seed) for seed in _TRAIN_SEEDS]
    runs += [(root / "selfplay" / f"gpu-seed{seed}", phase, seed) for seed in _TRAIN_SEEDS for phase in ("correctness", "more_sft")]
    out = root / "headroom"
    return [ctx.py("-m", "benchmarks.headroom", "--run", run, "--phase", phase, "--k", str(_HEADROOM_K),
                   "--out", out / f"{phase}-seed{seed}.json", env=cache, background=True)
            for run, phase, seed in runs
            if ctx.listing or ((run / "result.json").exists() and not (out / f"{phase}-seed{seed}.json").exists())]


def _training_experiments(ctx: Context) -> list[Command]:
    # Issue 20's two experiments from seed 0's warm start, 3 seeds per arm: information density, MCTS and
    # task replay vs random proposer, and steps to a pass-rate threshold, adaptive vs fixed curriculum.
    root, cache = _training_dirs(ctx)
    return [ctx.py("scripts/run_experiments.py", "--only", "density", "curriculum", "--seeds", *_TRAIN_SEEDS,
                   "--steps", str(_EXPERIMENT_STEPS), "--jobs", "15", "--model", root / "warm" / "seed0" / "models" / "distill",
                   "--out", root / "experiments", "--", *_GPU_RUN, _GRPO_SAVES, env=cache, background=True)]


def warm_starts_figure(log: str) -> str:
    """Every warm start's held-out pass rate after SFT (the runs share one log)."""
    found = re.findall(r"held-out eval after training: pass rate (\d\.\d+)", log)
    return f"held-out after SFT {'/'.join(found)}" if found else held_out_figure(log)


def training_figure(log: str) -> str:
    """RL - SFT (and control - SFT where it ran) per variant of the self-play table (benchmarks/selfplay_sweep's
    rows), from the step's log."""
    rows = {}
    for line in _lines(log):
        cells = [c.strip() for c in line.split("|")]
        if len(cells) >= 9 and cells[1].startswith("gpu"):
            rows[cells[1]] = cells  # the last table printed wins
    if not rows:
        return held_out_figure(log)
    figures = []
    for name, cells in rows.items():
        control = f", control - SFT {cells[7]}" if cells[7] not in ("", "-") else ""
        figures.append(f"{name}: RL - SFT {cells[6]}{control} points")
    return "; ".join(figures)


def headroom_figure(log: str) -> str:
    """Mean sampled pass@1 per model kind (phase) over the seeds, from benchmarks/headroom's JSON lines."""
    import json

    by_phase: dict[str, list[float]] = {}
    for line in _lines(log):
        if line.startswith("{") and '"sampled_pass1"' in line:
            row = json.loads(line)
            by_phase.setdefault(row["phase"], []).append(row["sampled_pass1"])
    if not by_phase:
        return held_out_figure(log)
    return "sampled pass@1 " + ", ".join(f"{phase} {sum(v) / len(v):.3f} (n={len(v)})" for phase, v in by_phase.items())


def experiments_figure(log: str) -> str:
    """The two ratios of scripts/run_experiments.py's summary table (mcts / random, adaptive / fixed)."""
    found = {}
    for line in _lines(log):
        cells = [c.strip() for c in line.split("|")]
        if len(cells) >= 4 and cells[2] in ("mcts / random", "adaptive / fixed"):
            found[cells[2]] = cells[3]
    return "; ".join(f"{arm} {value}" for arm, value in found.items()) or held_out_figure(log)


def _refinement(ctx: Context) -> list[Command]:
    # The CPU default's recipe (distillation only: the model the refinement is measured on), then
    # benchmarks/refinement.py: held-out pass@1 after turn 1..3, before and after SFT on feedback pairs.
    root = ctx.work / "refinement"
    cache = (("KERNELZERO_CACHE", str(root / "cache")), *ctx.one_gpu())
    return [
        # verifier=kb_scope: no compute-sanitizer process per verdict (conf/verifier/kb_scope.yaml); the benchmark
        # judges with the run's verifier
        ctx.py("-m", "core.run", "device=cuda", "verifier=kb_scope", "executor=local_small_tasks",
               "trainer.torch_threads=null",
               "trainer.phases.correctness.steps=0", "trainer.phases.more_sft.steps=0",
               f"hydra.run.dir={root / 'run'}", env=cache),
        ctx.py("-m", "benchmarks.refinement", "--run", root / "run", "--turns", "3", "--feedback-sft", "300",
               "--out", root / "refinement.json", "--plot", root / "refinement.png", env=cache),
    ]


# experiment=hub_grpo (conf/experiment/hub_grpo.yaml: bf16, gradient checkpointing, verification overlapped with
# generation, steps_per_generation 4) with a model of Qwen2.5-Coder-1.5B's architecture, randomly initialised (no
# weights can be downloaded) and paired with the embedded tokenizer: a brief SFT warm start on the expert's verified
# pairs, so that its completions are kernels for the verifier to judge, then 20 GRPO steps of 8 tasks x 8 samples x
# up to 512 new tokens. No held-out evaluation (random weights: nothing to compare) and no checkpoints (a 1.3B model
# with its optimiser state is ~16 GB a save); the phases' models are still saved at their ends.
_HUB_GRPO = ("experiment=hub_grpo", "coder.model=embedded", "coder.embedded.architecture=qwen2.5-coder-1.5b",
             "device=cuda", "trainer.eval_tasks=0", "trainer.save_steps=1000", "trainer.report_to=[]",
             "trainer.phases.distill.tasks=64", "trainer.phases.distill.steps=60", "trainer.phases.distill.batch_size=16",
             "trainer.phases.distill.learning_rate=1e-4", "trainer.phases.correctness.steps=20",
             "trainer.tasks_per_step=8", "trainer.num_generations=8", "coder.max_new_tokens=512")


def _hub_grpo(ctx: Context) -> list[Command]:
    root = ctx.work / "hub_grpo"
    env = (("KERNELZERO_CACHE", str(root / "cache")), *ctx.one_gpu())
    # the breakdown from metrics.jsonl also when the limit or a failed step cut the run before it printed its own
    return [ctx.py("-m", "core.run", *_HUB_GRPO, f"hydra.run.dir={root / 'run'}", env=env),
            replace(ctx.py("-m", "benchmarks.step_time", root / "run"), after_timeout=True)]


def hub_grpo_figure(log: str) -> str:
    """The GRPO phase's step-time line (core/loop/step_clock.py, breakdown_line), shortened."""
    found = re.findall(r"^correctness step time: (\d+) steps, mean step ([\d.]+) s = .*?; verify ([\d.]+) s a step "
                       r"\((\d+)% of step time, (\d+)% waited for\); (\d+) tokens/s generating, ([\d.]+) verdicts/s "
                       r"verifying; (?:peak GPU memory ([\d.]+) GiB)?", log, re.MULTILINE)
    if not found:
        return held_out_figure(log)
    steps, step_s, verify_s, verify_pct, wait_pct, tokens, verdicts, gpu = found[-1]
    return (f"{steps} steps, {step_s} s/step, verify {verify_s} s/step ({verify_pct}% of step, {wait_pct}% waited), "
            f"{tokens} tokens/s, {verdicts} verdicts/s" + (f", peak GPU {gpu} GiB" if gpu else ""))


# Phase 2 on tasks where the teacher has headroom: fused chains of 2-3 ops (block sizes, num_warps and
# fusion choices matter there), the larger model of `training`.
_PHASE2_TASKS = ("proposer=random", "proposer.min_ops=2", "proposer.max_ops=3")


def _phase2(ctx: Context) -> list[Command]:
    root = ctx.work / "phase2"
    tasks = root / "tasks.jsonl"
    cache = (("KERNELZERO_CACHE", str(root / "cache")), *ctx.one_gpu())
    run = root / "run"

    def evaluate(name: str, *coder: str) -> Command:
        return ctx.py("-m", "core.eval", f"suite={tasks}", *coder, "device=cuda", "cache.enabled=false",
                      f"hydra.run.dir={root / name}", env=cache)

    return [
        ctx.py("-m", "core.propose", *_PHASE2_TASKS, "n=64", "seed=20261201", f"out={tasks}", "progress=false", env=cache),
        evaluate("eval_teacher", "coder=expert"),  # also records the tasks as held out: training never draws them
        ctx.py("-m", "core.run", "device=cuda", *_PHASE2_TASKS, *_TRAIN_MODEL, "trainer.torch_threads=null",
               "curriculum.max_tier=1", "trainer.tasks_per_step=8", "trainer.num_generations=8",
               "trainer.phases.distill.steps=2000", "trainer.phases.distill.tasks=1024",
               "trainer.phases.distill.batch_size=16", "trainer.phases.distill.learning_rate=5e-4",
               "trainer.phases.correctness.steps=100", "trainer.phases.performance.steps=200",
               f"hydra.run.dir={run}", env=cache),
        evaluate("eval_before_phase2", "coder=embedded", f"coder.model={run / 'models' / 'correctness'}"),
        evaluate("eval_after_phase2", "coder=embedded", f"coder.model={run / 'models' / 'performance'}"),
    ]


def _multigpu(ctx: Context) -> list[Command]:
    # Every accelerate rank re-runs the Hydra main; Hydra's default run dir is a timestamp that can differ
    # between ranks started a second apart, so one run dir is fixed here and given to every rank.
    # tasks_per_step 2 x num_generations 4 = 8 per device: any number of ranks divides it.
    return [ctx.py("-m", "accelerate.commands.launch", "--num_processes", ctx.gpus_text, "--num_machines", "1",
                   "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "core.run", "device=cuda",
                   "trainer.phases.distill.steps=20", "trainer.phases.distill.tasks=16",
                   "trainer.phases.correctness.steps=4", "trainer.eval_tasks=4", "trainer.eval_each_phase=false",
                   "trainer.report_to=[]", f"hydra.run.dir={ctx.work / 'multigpu'}")]


INSTALL = Step("install", 90, "not timed apart in the history (31 MB of wheels, then the imports)",
               "the carried wheels (.whl/*.whl) into /tmp/site; the GPUs, tools and versions", _install,
               install_figure, gpus=0, note=_no_wheels, tail=4, chain=True)
STEPS: dict[str, Step] = {s.name: s for s in (
    INSTALL,
    Step("suites", 450, "48 tests in 213 s on one H100 (2026-12-07; load_inline's setups 80-100 s each), 47 passed",
         "the GPU test suites and the GPU activity audit, with the timer tests beside them (pytest -n 6)", _suites,
         pytest_summary, tail=40),
    Step("redteam", 420, "not timed apart before 2026-12-01 (the 79 red-team candidates were part of `suites`)",
         "the timer tests alone, then interp_races, the GPU-only hacks and one verdict per red-team candidate "
         "(pytest -n 6)", _redteam, pytest_summaries, tail=40),
    Step("timing", 120, "timer tests 6 s (2026-11-30 d); repeatability not timed apart (its old limit: 120 s)",
         "the timer's GPU tests alone, then benchmarks/timing_repeatability.py (default vs previous policy)",
         _timing, timing_figure, results=(("repeatability.json", "repeatability.json"),), tail=10),
    Step("inductor", 120, "77 s (2026-11-30, second session)", "the inductor teacher's GPU test", _inductor,
         pytest_summary, tail=6),
    Step("kernelbench", 200, "~110 s alone (2026-11-30 d, call 5: 132 s for the whole call)",
         "benchmarks/kernelbench_vs_ours.py, part 21's options (1/64 size, 8 workers, 3 rounds)", _kernelbench,
         kernelbench_figure, skip=_no_kernelbench, results=(("kernelbench_vs_ours.json", "kernelbench_vs_ours.json"),),
         tail=10),
    Step("oneshot", 240, "135 s on one H100 (2026-12-07): 17.6-20.3 s a call, served 1.5-2.5 s",
         "benchmarks/one_shot_verify.py: one `core.verify --device cuda` process per small pair, wall time, then "
         "`core.verify --server` on a `kernelzero serve` started for the pair, then `core.verify --keep-warm` (the "
         "call that starts a service, then those that reuse it; skipped where starlette, uvicorn or "
         "httpx is missing: carry their wheels in .whl, docs/benchmarks.md)",
         _oneshot, kbeval_figure, skip=_no_kernelbench,
         results=(("kb/one_shot_verify.json", "one_shot_verify.json"),), tail=20),
    Step("quantiles", 90, "not run yet; kthvalue's single-slice compares took 12-16 s at 1.6e9 elements in kbeval "
         "(2026-12-05)", "benchmarks/quantile_bench.py: the judge's exact quantiles by bisection against "
         "torch.kthvalue at 1e8 and 1.6e9 elements", _quantiles, quantiles_figure,
         results=(("quantiles.json", "quantiles.json"),), tail=8),
    Step("compare", 200, "not run yet; the keeper's compares took 2-5 s each for elementwise level-1 tasks on the "
         "H100 (2026-12-05), the domain probe's median bisection 68 s at 1e8 elements on a 2-core CPU",
         "tests/test_judge_kernels.py on the device, then benchmarks/compare_bench.py: the plain bound by the lent "
         "Triton kernels against the chunked torch passes at 1e8 and 1.6e9 elements, per rule", _compare, compare_figure,
         results=(("compare.json", "compare.json"),), tail=12),
    Step("kbeval", 480, "one H100, 460 s budget (2026-12-07, 136ea10): 74 of 191 judged, 74 accepted",
         "core.eval with the expert teacher on all of KernelBench's level-1 and level-2 files at their real sizes "
         "in one continuous queue (a line per verdict; fast_p, geomean vs eager and torch.compile)", _kbeval,
         kbeval_figure, skip=_no_kernelbench, results=(("kb/expert_l1_l2/results.csv", "kbeval_results.csv"),),
         tail=80),
    Step("expert", 400, "185-232 s for the 46 cases (before the verifier's timer and the precompile pool)",
         "benchmarks/expert_gpu.py: the expert's speedups over eager and torch.compile, ResNet-50 convs vs cuDNN, "
         "timed by the verifier's GpuTimer in 3 interleaved rounds, roofline per case (starts no case after 340 s)",
         _expert, expert_figure,
         results=(("expert/expert_gpu.json", "expert_gpu.json"),), tail=12),
    Step("scaling", 300, "191 s for both arms on 2 GPUs (2026-11-30 c, call 4); the 1-GPU arm ~110 s",
         "benchmarks/pool_scaling.py: verdicts/min on 1 GPU, then on every GPU (96 tasks, no sanitizer)", _scaling,
         scaling_figure, note=_one_gpu_arm, results=(("scaling/pool_scaling.json", "pool_scaling.json"),)),
    Step("sanitizer", 150, "88 s (2026-11-30 b, call 4)",
         "benchmarks/sanitizer_cost.py: what a compute-sanitizer verdict costs", _sanitizer, sanitizer_figure,
         results=(("sanitizer_cost.json", "sanitizer_cost.json"),)),
    Step("training_sft", 480, "2026-12-02, three side by side with checkpoints every 4 steps: build, 256 teacher "
         "verdicts (248-252 accepted) and 632-724 of 800 SFT steps in 420 s, the rest and both evaluations in 155 s "
         "of a second call (each evaluation of 64 tasks 25-58 s)",
         "the default job's SFT warm start at GPU scale (8 layers, 512 wide, ~27M parameters), seeds 0-2 side by "
         "side: 256 teacher pairs, 800 SFT steps, held-out pass rate of 64 tasks", _training_sft, warm_starts_figure,
         tail=20),
    Step("training", 1500, "2026-12-03: 406-454 s a run (3 seeds, beside training_long's 3), one call after "
         "training_sft's; third session, alone: 226-276 s a run from a resume after 200 s; "
         "2026-12-02: GRPO ~10 s a step (20 steps in 204-218 s) with 15 runs side by side",
         "from training_sft's warm starts, side by side: GRPO 20 steps x 4 tasks x 8 samples and its control arm "
         "per seed. Longer than one device call with training_sft: chain calls with --work", _training,
         training_figure, results=(("training/selfplay/sweep.md", "training_selfplay.md"),), tail=40),
    Step("training_long", 1500, "2026-12-02: finished over three chained calls beside training (183, 527, 438 s)",
         "as training, with GRPO for 60 steps and its control arm", _training_long, training_figure,
         results=(("training/selfplay_long/sweep.md", "training_selfplay_long.md"),), tail=40),
    Step("training_headroom", 900, "2026-12-03, third session: 9 side by side, none finished in 274 s; "
         "2026-12-04: the 3 warm starts alone, none finished in 204 s (each model: greedy and 4 samples of 64 "
         "held-out tasks)",
         "benchmarks/headroom on training's models per seed (SFT warm start, after GRPO, its control): greedy and "
         "sampled pass@1 and pass@4 at T 1.0 on the held-out tasks (its JSON in steps.tgz)", _training_headroom,
         headroom_figure, tail=20),
    Step("training_experiments", 900, "2026-12-02: its 12 runs 337-363 s each, beside the self-play runs",
         "issue 20's density (MCTS and replay vs random) and curriculum (adaptive vs fixed) experiments from training_sft's "
         "seed 0 warm start, 3 seeds per arm, 12 steps each", _training_experiments, experiments_figure,
         results=(("training/experiments/summary.md", "training_experiments.md"),
                  ("training/experiments/experiments.png", "training_experiments.png")), tail=40),
    Step("refinement", 1000, "2026-12-06, one H100: the run 505 s (128 teacher verdicts 353 s on 3 workers, since "
         "8: executor=local_small_tasks), the benchmark cut at the 560 s limit: run it detached (gpu_detached.py)",
         "the embedded default distilled on the GPU, then benchmarks/refinement.py: held-out pass@1 after turn "
         "1..3 from verdict feedback, before and after SFT on feedback pairs", _refinement, refinement_figure,
         results=(("refinement/refinement.json", "refinement.json"), ("refinement/refinement.png", "refinement.png")),
         tail=12, chain=True),
    Step("hub_grpo", 480, "2026-12-06, H100: build and load 40 s, teacher verdicts + SFT ~195 s, then 54-102 s "
         "per round of 4 GRPO steps: the 20 steps took 753 s, over one call: run it detached "
         "(scripts/gpu_detached.py, --limit hub_grpo=1100); a cut run's breakdown is read from metrics.jsonl",
         "experiment=hub_grpo with Qwen2.5-Coder-1.5B's architecture at random init: a brief SFT warm start on 64 "
         "teacher pairs, then 20 GRPO steps of 8 tasks x 8 samples x <= 512 tokens; tokens/s, verdicts/s, the step "
         "time breakdown and peak GPU memory", _hub_grpo, hub_grpo_figure,
         results=(("hub_grpo/run/metrics.jsonl", "hub_grpo_metrics.jsonl"), ("hub_grpo/run/result.json", "hub_grpo_result.json"),
                  ("hub_grpo/run/correctness_loss.jsonl", "hub_grpo_loss.jsonl"),
                  ("hub_grpo/run/train_state.json", "hub_grpo_train_state.json")),
         tail=12),
    Step("phase2", 3 * 3600, "not yet run; estimated 2-3 GPU hours: not for a 600 s device call",
         "phase 2 (performance GRPO) on fused 2-3 op tasks: geomean speedup vs eager of the coder's accepted "
         "kernels before and after phase 2, and of the teacher's, on 64 held-out tasks", _phase2, geomean_figure,
         results=tuple((f"phase2/{name}/results.json", f"phase2_{name}.json") for name in
                       ("eval_teacher", "eval_before_phase2", "eval_after_phase2")), tail=40, chain=True),
    Step("multigpu", 300, "231 s on 2 GPUs (2026-11-29, call 2)",
         "a short GRPO run under accelerate, one rank per GPU, one Hydra run dir for all ranks", _multigpu,
         held_out_figure, gpus=2, results=(("multigpu/metrics.jsonl", "multigpu_metrics.jsonl"),), tail=15),
)}


# ---------------------------------------------------------------- running


def count_gpus() -> int:
    if not shutil.which("nvidia-smi"):
        return 0
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], check=False, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in listed.splitlines() if line.startswith("GPU "))


def steps_env() -> dict[str, str]:
    env = dict(os.environ)
    paths = ([SITE] if glob.glob(str(REPO / ".whl" / "*.whl")) else []) + [str(REPO)]
    env["PYTHONPATH"] = ":".join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(KERNELZERO_DISABLE_AUTOLOAD="1", TRITON_DEFAULT_FP_FUSION="1", PYTHONUNBUFFERED="1")
    return env


def start_command(cmd: Command, env: dict[str, str], log) -> subprocess.Popen | int:
    """The started process, or 127 when it could not start."""
    log.write(f"$ {cmd.shell()}" + (" &" if cmd.background else "") + "\n")
    log.flush()
    try:
        return subprocess.Popen(cmd.argv, cwd=REPO, env={**env, **dict(cmd.env)}, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    except OSError as exc:
        log.write(f"could not start: {exc}\n")
        return 127


def wait_command(proc: subprocess.Popen, log, deadline: float) -> int | None:
    """The process's exit status, or None when it ran past the deadline and was stopped."""
    try:
        return proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        stop_all([proc])
        log.write("\n== stopped at the step's limit\n")
        return None
    except BaseException:
        stop_all([proc])
        raise


def stop_all(procs: list[subprocess.Popen]) -> None:
    """SIGINT to every process group at once (pytest and the benches print what they have), one shared
    grace period, then SIGKILL to what is left and to what the groups left behind (pytest-xdist workers)."""
    for sig, grace in ((signal.SIGINT, STOP_GRACE_S), (signal.SIGKILL, 5)):
        for proc in procs:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
        until = time.monotonic() + grace
        for proc in procs:
            try:
                proc.wait(timeout=max(0.0, until - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        if all(proc.poll() is not None for proc in procs):
            break
    for proc in procs:  # what the groups left behind
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_all(procs: list[subprocess.Popen], log, deadline: float) -> list[int | None]:
    """Each process's exit status, None for those still running at the deadline (all stopped together)."""
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            break
    late = [proc for proc in procs if proc.poll() is None]
    if late:
        stop_all(late)
        log.write(f"\n== stopped at the step's limit ({len(late)} background command(s))\n")
    return [None if proc in late else proc.returncode for proc in procs]


@contextmanager
def _interrupt_deferred():
    """Hold SIGINT until the block ends, then raise it. A handler, not a blocked signal mask: the
    started process inherits a mask across exec, but a caught signal is back to its default there."""
    pending: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: pending.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if pending:
            raise KeyboardInterrupt


def run_command(cmd: Command, env: dict[str, str], log, deadline: float) -> int | None:
    """The command's exit status, or None when it ran past the deadline and was stopped."""
    proc = start_command(cmd, env, log)
    return proc if isinstance(proc, int) else wait_command(proc, log, deadline)


def commands_of(step: Step, ctx: Context) -> list[Command]:
    """``step``'s commands, each ``core.run`` or ``core.eval`` given the step's ``--override``s (one replaces
    the same key's value the step sets: Hydra refuses a key given twice)."""
    extra = [o for name, o in ctx.overrides if name == step.name]
    if not extra:
        return step.commands(ctx)
    keys = {o.split("=", 1)[0].lstrip("+~") for o in extra}
    out = []
    for cmd in step.commands(ctx):
        if "core.run" in cmd.argv or "core.eval" in cmd.argv:
            kept = tuple(a for a in cmd.argv if a.split("=", 1)[0].lstrip("+~") not in keys or "=" not in a)
            cmd = replace(cmd, argv=(*kept, *extra))
        out.append(cmd)
    return out


def run_step(step: Step, ctx: Context, limit_s: int, env: dict[str, str], say: Callable[[str], None]) -> Outcome:
    reason = step.why_skipped(ctx)
    if reason:
        say(f"== {step.name}: skipped: {reason}")
        return Outcome(step.name, "skipped", figure=reason)
    log_path = ctx.work / f"{step.name}.log"
    t0 = time.monotonic()
    deadline = t0 + limit_s
    status = "ok"
    with open(log_path, "w") as log:
        note = step.note(ctx)
        if note:
            say(f"== {step.name}: {note}")
            log.write(note + "\n")
        if step is INSTALL:
            tools = ", ".join(f"{t} {shutil.which(t) or 'missing'}" for t in ("compute-sanitizer", "ncu", "nvcc"))
            log.write(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {socket.gethostname()}, "
                      f"{ctx.gpus} GPU(s); {tools}\n")
        background: list[subprocess.Popen | int] = []
        monitor = HostMonitor(ctx.work / f"{step.name}.monitor.tsv") if step is not INSTALL and not ctx.listing \
            else None
        try:
            if monitor is not None:
                monitor.__enter__()
            for cmd in commands_of(step, ctx):
                if status == "timeout":
                    if not cmd.after_timeout:
                        continue
                    deadline = time.monotonic() + SUMMARY_S
                say(f"== {step.name} (limit {limit_s} s): {cmd.shell()}" + (" &" if cmd.background else ""))
                if cmd.background:
                    with _interrupt_deferred():  # an interrupt between start and append would orphan the run
                        background.append(start_command(cmd, env, log))
                    continue
                rc = run_command(cmd, env, log, deadline)
                log.flush()
                if rc is None:
                    status = "timeout"
                    continue  # only summaries run after this (Command.after_timeout)
                if rc != 0:
                    log.write(f"== exit status {rc}\n")
                    status = "failed"
                    if step.chain:
                        break
            running = [p for p in background if not isinstance(p, int)]
            codes = wait_all(running, log, deadline if status != "timeout" else 0.0)
        except BaseException:  # an interrupt: stop every process started in the background, then re-raise
            stop_all([p for p in background if not isinstance(p, int)])
            raise
        finally:
            if monitor is not None:
                monitor.__exit__()
                usage = monitor.summary()
                if usage:
                    log.write(f"== {step.name}: {usage}\n")
                    say(f"== {step.name}: {usage}")
        for rc in [p for p in background if isinstance(p, int)] + codes:
            if rc is None and status == "ok":
                status = "timeout"
            elif rc and status == "ok":
                log.write(f"== exit status {rc}\n")
                status = "failed"
    seconds = time.monotonic() - t0
    text = log_path.read_text(errors="replace")
    figure = step.figure(text)
    if not figure and status == "timeout":
        figure = f"stopped at its {limit_s} s limit"
    if not figure and status == "failed":  # the program's last words, not ours
        figure = ([line for line in _lines(text) if not line.startswith("== ")] or [""])[-1][:100]
    return Outcome(step.name, status, seconds, figure)


class HostMonitor:
    """Samples, every ``every_s`` while a step runs, the host's CPU busy share (``/proc/stat``) and each GPU's
    utilisation and memory in use (``nvidia-smi``), to ``path`` (TSV); :meth:`summary` says whether the step
    was held back by the host's cores or by the GPU (a verification pipeline can be either)."""

    def __init__(self, path: Path, every_s: float = 5.0):
        self.path, self.every_s = path, every_s
        self.rows: list[tuple[float, float | None, float | None, float | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="host-monitor", daemon=True)
        self._smi = shutil.which("nvidia-smi")

    @staticmethod
    def cpu_times() -> tuple[int, int] | None:
        """(busy, total) jiffies of all cores since boot, or None without /proc/stat."""
        try:
            fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        except (OSError, ValueError):
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields) - idle, sum(fields)

    def gpu_sample(self) -> tuple[float | None, float | None]:
        """(mean utilisation %, GiB in use summed) over the visible GPUs, or (None, None)."""
        if not self._smi:
            return None, None
        try:
            out = subprocess.run([self._smi, "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=10, check=False).stdout
            rows = [[float(v) for v in line.split(",")] for line in out.strip().splitlines() if line.strip()]
        except (OSError, ValueError, subprocess.SubprocessError):
            return None, None
        if not rows:
            return None, None
        return sum(r[0] for r in rows) / len(rows), sum(r[1] for r in rows) / 1024

    def _run(self) -> None:
        began, last = time.monotonic(), self.cpu_times()
        with open(self.path, "w") as f:
            f.write("seconds\tcpu_busy_pct\tgpu_util_pct\tgpu_mem_gib\n")
            while not self._stop.wait(self.every_s):
                now = self.cpu_times()
                cpu = None
                if now and last and now[1] > last[1]:
                    cpu = 100.0 * (now[0] - last[0]) / (now[1] - last[1])
                last = now
                util, mem = self.gpu_sample()
                row = (time.monotonic() - began, cpu, util, mem)
                self.rows.append(row)
                f.write("\t".join("" if v is None else f"{v:.1f}" for v in row) + "\n")
                f.flush()

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    def summary(self) -> str:
        """``host CPU busy: mean 61% (p90 88%) of 16 cores; GPU busy: mean 72%; GPU memory in use: at most
        120.3 GiB (24 samples, every 5 s)``, or "" with no sample."""
        def spread(values: list[float]) -> str:
            ordered = sorted(values)
            return f"mean {sum(ordered) / len(ordered):.0f}% (p90 {ordered[int(0.9 * (len(ordered) - 1))]:.0f}%)"

        cpu = [r[1] for r in self.rows if r[1] is not None]
        util = [r[2] for r in self.rows if r[2] is not None]
        mem = [r[3] for r in self.rows if r[3] is not None]
        if not (cpu or util):
            return ""
        parts = [f"host CPU busy: {spread(cpu)} of {os.cpu_count()} cores"] if cpu else []
        if util:
            parts.append(f"GPU busy: {spread(util)}")
        if mem:
            parts.append(f"GPU memory in use: at most {max(mem):.1f} GiB")
        return "; ".join(parts) + f" ({len(self.rows)} samples, every {self.every_s:g} s)"


def _pack(work: Path, out: Path) -> None:
    skip = {"models", "checkpoints", "cache"}  # weights and caches: too large to come back

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        return None if skip & set(Path(info.name).parts) else info

    with tarfile.open(out / "steps.tgz", "w:gz") as tar:
        tar.add(work, arcname=".", filter=keep)


def table(outcomes: list[Outcome]) -> str:
    rows = [f"{'step':<12} {'status':<8} {'seconds':>7}  key figure"]
    rows += [f"{o.step:<12} {o.status:<8} {o.seconds:>7.0f}  {o.figure}" for o in outcomes]
    return "\n".join(rows)


def _listing(limits: dict[str, int]) -> str:
    ctx = Context("python3", Path("$WORK"), 0, Path(".kb"), "kb_scope,memcheck", listing=True)
    text = []
    for step in STEPS.values():
        text.append(f"{step.name:<12} limit {limits[step.name]:>5} s   typical: {step.typical}")
        text.append(f"    {step.what}" + (f"; needs {step.gpus} GPUs" if step.gpus > 1 else ""))
        text += [f"    $ {c.shell()}" + (" &" if c.background else "") for c in step.commands(ctx)]
    fits = [f"'{calls}' ({sum(limits[n] for n in ('install', *calls.split()))} s)" for calls in ONE_CALL]
    text.append(f"within one {CALL_S} s device call: " + ", ".join(fits))
    return "\n".join(text)


def _parse_override(value: str) -> tuple[str, str]:
    name, sep, override = value.partition(":")
    if not sep or "=" not in override:
        raise argparse.ArgumentTypeError(f"expected STEP:KEY=VALUE (a Hydra override for that step), got {value!r}")
    return name, override


def _parse_limit(value: str) -> tuple[str, int]:
    name, sep, seconds = value.partition("=")
    if not sep or not seconds.isdigit() or int(seconds) < 1:
        raise argparse.ArgumentTypeError(f"expected STEP=SECONDS (a whole number of seconds), got {value!r}")
    return name, int(seconds)


def parse_args(argv: list[str] | None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="steps: " + ", ".join(STEPS),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("steps", nargs="*", metavar="STEP", help="steps to run, in this order (install is implicit)")
    parser.add_argument("--list", action="store_true", help="list every step, its limit, typical time and commands")
    parser.add_argument("--dry-run", action="store_true", help="print the chosen steps' commands, run nothing")
    parser.add_argument("--limit", action="append", type=_parse_limit, default=[], metavar="STEP=SECONDS",
                        help="a step's time limit (repeatable)")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "gpu_out"),
                        help="where results go (default: $OUT, else ./gpu_out)")
    parser.add_argument("--call-s", type=int, default=None, metavar="SECONDS",
                        help="stop every step by this many seconds after the start: each step's limit is cut to "
                             "what is left (a chain of device calls: leave the call's end for the transfers)")
    parser.add_argument("--work", type=Path, default=None,
                        help="the steps' work folder, kept (default: a fresh temporary one). Steps that resume "
                             "(training_sft, training) continue there in a later call on the same machine")
    parser.add_argument("--kb", type=Path, default=REPO / ".kb", help="KernelBench checkout (default: .kb)")
    parser.add_argument("--kb-configs", default="kb_scope,memcheck", help="our check sets in kernelbench")
    parser.add_argument("--kb-names", default="", metavar="NAMES",
                        help="kbeval: only these problems, comma-separated (e.g. 26_GELU_,level2/45_Gemm_Sigmoid_LogSumExp)")
    parser.add_argument("--override", action="append", type=_parse_override, default=[], metavar="STEP:KEY=VALUE",
                        help="a Hydra override added to STEP's core.run and core.eval commands, replacing the step's "
                             "own value of KEY (repeatable), e.g. hub_grpo:coder.attn_implementation=eager or "
                             "'kbeval:levels=[level2]'")
    parser.add_argument("--gpus", type=int, default=None, help="GPUs to assume (default: counted by nvidia-smi -L)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter the steps run (default: this one)")
    return parser, parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    parser, args = parse_args(argv)
    if threading.current_thread() is threading.main_thread():
        # an interrupt stops every step even when this process was started ignoring or blocking SIGINT
        # (a shell's background job, a parent thread's mask: both are inherited across exec)
        if hasattr(signal, "pthread_sigmask"):
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # the steps run in the repository's root: paths given relative to here must still point where meant
    args.kb = Path(os.path.abspath(args.kb))
    if os.sep in args.python:
        args.python = os.path.abspath(args.python)  # not resolve(): a venv's python is a link to keep
    limits = {name: step.limit_s for name, step in STEPS.items()}
    for name, seconds in args.limit:
        if name not in STEPS:
            parser.error(f"--limit names an unknown step {name!r}; known steps: {', '.join(STEPS)}")
        limits[name] = seconds
    if args.list:
        print(_listing(limits))
        return 0
    unknown_override = [name for name, _ in args.override if name not in STEPS]
    if unknown_override:
        parser.error(f"--override names an unknown step {unknown_override[0]!r}; known steps: {', '.join(STEPS)}")
    unknown = [s for s in args.steps if s not in STEPS]
    if unknown:
        parser.error(f"unknown step(s) {', '.join(map(repr, unknown))}; known steps: {', '.join(STEPS)}")
    if not args.steps:
        parser.error(f"name the steps to run (or --list); known steps: {', '.join(STEPS)}")
    names = list(dict.fromkeys(["install", *args.steps]))
    planned = sum(limits[n] for n in names)
    gpus = count_gpus() if args.gpus is None else args.gpus
    budget = f"limits add up to {planned} s" + (
        f": more than one {CALL_S} s device call if every step used its limit" if planned > CALL_S else "")
    if args.dry_run:
        ctx = Context(args.python, Path("$WORK"), gpus, args.kb, args.kb_configs, kb_names=args.kb_names,
                      overrides=tuple(args.override), kb_budget_s=kb_budget_s(limits["kbeval"]))
        env = steps_env()
        where = f"{args.work} (kept)" if args.work is not None else "a fresh temporary folder"
        print(f"# WORK: {where}, packed into {args.out}/steps.tgz; {gpus} GPU(s); {budget}")
        print("# env: " + " ".join(f"{k}={env[k]}" for k in
                                   ("PYTHONPATH", "KERNELZERO_DISABLE_AUTOLOAD", "TRITON_DEFAULT_FP_FUSION")))
        for name in names:
            step = STEPS[name]
            reason = step.why_skipped(ctx)
            print(f"== {name} (limit {limits[name]} s)" + (f": skipped: {reason}" if reason else ""))
            note = step.note(ctx)
            if note and not reason:
                print(f"# {note}")
            if not reason:
                print("\n".join(f"$ {c.shell()}" + (" &" if c.background else "") for c in commands_of(step, ctx)))
        return 0

    args.out.mkdir(parents=True, exist_ok=True)
    if args.work is not None:
        args.work.mkdir(parents=True, exist_ok=True)
    work = args.work.resolve() if args.work is not None else Path(tempfile.mkdtemp(prefix="kz-steps."))
    ctx = Context(args.python, work, gpus, args.kb, args.kb_configs, kb_names=args.kb_names,
                  overrides=tuple(args.override))
    env = steps_env()
    with open(args.out / "measure.log", "w") as mlog:
        def say(line: str) -> None:
            print(line, flush=True)
            mlog.write(line + "\n")
            mlog.flush()

        started = time.monotonic()
        say(f"== gpu_measure: {' '.join(names)} on {socket.gethostname()}, {gpus} GPU(s); {budget}")
        outcomes: list[Outcome] = []
        for name in names:
            if outcomes and outcomes[0].status != "ok":
                outcomes.append(Outcome(name, "skipped", figure="install did not finish (see install.log)"))
                continue
            limit = limits[name]
            if args.call_s is not None:
                left = int(started + args.call_s - time.monotonic())
                if left < MIN_STEP_S:
                    outcomes.append(Outcome(name, "skipped", figure=f"{left} s left of --call-s {args.call_s}"))
                    continue
                limit = min(limit, left)
            # kbeval's budget follows the limit it runs under, --call-s's cut included
            outcome = run_step(STEPS[name], replace(ctx, kb_budget_s=kb_budget_s(limit)), limit, env, say)
            outcomes.append(outcome)
            log_path = work / f"{name}.log"
            if log_path.exists():
                mlog.write(f"== {name} log\n{log_path.read_text(errors='replace')}\n")
            for src, dest in STEPS[name].results:
                if (work / src).is_file():
                    shutil.copyfile(work / src, args.out / dest)
        _pack(work, args.out)
        for outcome in outcomes:
            log_path = work / f"{outcome.step}.log"
            if outcome.status != "skipped" and log_path.exists():
                tail = _lines(log_path.read_text(errors="replace"))[-STEPS[outcome.step].tail:]
                say(f"\n== {outcome.step} (tail)\n" + "\n".join(tail))
        say(f"\nstep logs and outputs: {args.out / 'steps.tgz'} (from {work}); all of it: {args.out / 'measure.log'}")
        say(table(outcomes))
    return 0 if all(o.status in ("ok", "skipped") for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())

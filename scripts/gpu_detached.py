#!/usr/bin/env python3
"""scripts/gpu_measure.py past the end of one device call: started detached, attached to by the next calls.

A device call lasts at most 600 s and ends what it left running, except a process that began a session of its
own; the machine stays warm about 30 s between calls, and each call brings a fresh copy of the working tree.
A step longer than one call (hub_grpo's 20 GRPO steps: about 12 minutes on an H100) is started detached, from
a copy of the repository (and of the KernelBench checkout its ``--kb`` names) under DIR, so that the next call's
working tree is not swapped from under it:

    python3 scripts/gpu_detached.py start /tmp/kzrun -- --limit hub_grpo=1100 hub_grpo    # returns at once
    python3 scripts/gpu_detached.py attach /tmp/kzrun --wait-s 540 --out $OUT           # the rest of this call
    python3 /tmp/kzrun/repo/scripts/gpu_detached.py attach /tmp/kzrun --wait-s 560      # each next call

``attach`` prints the run's console as it grows; once the run has ended it copies its results (the files
gpu_measure wrote to its ``--out``: measure.log, steps.tgz, the steps' results) to ``--out``. Its exit status is
the run's once it ended, 3 while it still runs (attach again in the next call, without delay: an idle machine is
given back). Standard library only, like gpu_measure.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STILL_RUNNING = 3  # attach's exit status while the detached run goes on
# not copied: version control, caches, and earlier runs' results
IGNORED = shutil.ignore_patterns(".git", "__pycache__", ".pytest_cache", ".hypothesis", ".ruff_cache", "gpu_out",
                                 ".venv", "build", "*.egg-info", ".snap", ".kbsub")


def _rewrite_kb(args: list[str], run_dir: Path) -> list[str]:
    """``--kb PATH`` (or ``--kb=PATH``) pointed at a copy under ``run_dir``, made now."""
    out, i = [], 0
    while i < len(args):
        arg = args[i]
        if arg == "--kb" and i + 1 < len(args):
            path, i = args[i + 1], i + 2
        elif arg.startswith("--kb="):
            path, i = arg.split("=", 1)[1], i + 1
        else:
            out.append(arg)
            i += 1
            continue
        source = Path(path).resolve()
        if source.is_dir():
            shutil.copytree(source, run_dir / "kb", ignore=IGNORED, symlinks=True)
            path = str(run_dir / "kb")
        out += ["--kb", path]
    return out


def start(run_dir: Path, measure_args: list[str], repo: Path = REPO) -> int:
    """Copy ``repo`` to ``run_dir/repo`` and start its gpu_measure there in a session of its own."""
    if (run_dir / "pid").exists() and not (run_dir / "rc").exists() and _alive(run_dir):
        print(f"a detached run is already going in {run_dir} (pid {(run_dir / 'pid').read_text().strip()})",
              file=sys.stderr)
        return 2
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    shutil.copytree(repo, run_dir / "repo", ignore=IGNORED, symlinks=True)
    measure_args = _rewrite_kb(measure_args, run_dir)
    command = [sys.executable, str(run_dir / "repo" / "scripts" / "gpu_measure.py"), *measure_args,
               "--out", str(run_dir / "out"), "--work", str(run_dir / "work")]
    # the shell records the run's exit status for attach, which is not its parent
    wrapper = ["/bin/sh", "-c", '"$@"; echo $? > "$RC.tmp" && mv "$RC.tmp" "$RC"', "sh", *command]
    with open(run_dir / "console.log", "wb") as console:
        proc = subprocess.Popen(wrapper, cwd=run_dir / "repo", stdout=console, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                env={**os.environ, "RC": str(run_dir / "rc"), "PYTHONUNBUFFERED": "1"})
    (run_dir / "pid").write_text(f"{proc.pid}\n")
    print(f"started detached (pid {proc.pid}): {' '.join(command)}\n"
          f"attach: python3 scripts/gpu_detached.py attach {run_dir} --wait-s SECONDS --out DIR")
    return 0


def _alive(run_dir: Path) -> bool:
    try:
        os.kill(int((run_dir / "pid").read_text()), 0)
    except (OSError, ValueError):
        return False
    return True


def _exit_status(run_dir: Path) -> int | None:
    try:
        return int((run_dir / "rc").read_text())
    except (OSError, ValueError):
        return None


def attach(run_dir: Path, wait_s: float, out: Path, poll_s: float = 2.0) -> int:
    """Follow the run's console for up to ``wait_s`` seconds; its results to ``out`` once it ended."""
    if not (run_dir / "pid").exists():
        print(f"no detached run in {run_dir} (start one first)", file=sys.stderr)
        return 2
    deadline = time.monotonic() + wait_s
    offset = 0

    def follow() -> None:
        nonlocal offset
        with open(run_dir / "console.log", "rb") as console:
            console.seek(offset)
            chunk = console.read()
        offset += len(chunk)
        if chunk:
            sys.stdout.write(chunk.decode(errors="replace"))
            sys.stdout.flush()

    while True:
        follow()
        rc = _exit_status(run_dir)
        if rc is None and not _alive(run_dir):  # ended without its status (killed with its shell)
            rc = _exit_status(run_dir)
            rc = 1 if rc is None else rc
        if rc is not None or time.monotonic() >= deadline:
            break
        time.sleep(poll_s)
    follow()
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(run_dir / "console.log", out / "detached_console.log")
    if rc is None:
        print(f"\n== still running after {wait_s:.0f} s: attach again ({run_dir})")
        return STILL_RUNNING
    for path in sorted((run_dir / "out").glob("*")):
        if path.is_file():
            shutil.copyfile(path, out / path.name)
    print(f"\n== the detached run ended with exit status {rc}; its results are in {out}")
    return rc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    begin = sub.add_parser("start", help="start gpu_measure detached; its steps and options follow --")
    begin.add_argument("dir", type=Path, help="the run's folder (emptied): repo copy, console.log, out/, work/")
    begin.add_argument("--repo", type=Path, default=REPO, help="the repository to copy and run (default: this one)")
    follow = sub.add_parser("attach", help="follow a detached run; copy its results once it ended")
    follow.add_argument("dir", type=Path)
    follow.add_argument("--wait-s", type=float, default=540.0, help="return after this long if it still runs")
    follow.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "gpu_out"),
                        help="where its results go (default: $OUT, else ./gpu_out)")
    argv = sys.argv[1:] if argv is None else list(argv)
    cut = argv.index("--") if "--" in argv else len(argv)  # gpu_measure's own arguments, passed on as they are
    args, measure_args = parser.parse_args(argv[:cut]), argv[cut + 1:]
    if args.verb == "start":
        if not measure_args or any(a in ("--out", "--work") or a.startswith(("--out=", "--work="))
                                   for a in measure_args):
            parser.error("start needs gpu_measure's steps after --, without --out or --work (the run's folder "
                         "holds them)")
        return start(args.dir.resolve(), measure_args, args.repo.resolve())
    return attach(args.dir.resolve(), args.wait_s, args.out)


if __name__ == "__main__":
    sys.exit(main())

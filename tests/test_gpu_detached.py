"""scripts/gpu_detached.py: a gpu_measure run that outlives one device call (started in a session of its own,
from a copy of the repository), followed and collected by later calls."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "gpu_detached.py"

# stands in for scripts/gpu_measure.py: says where it runs and what it was given, waits to be released, then
# writes a result to its --out and exits with status 4
FAKE_MEASURE = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    args = sys.argv[1:]
    out = Path(args[args.index("--out") + 1])
    out.mkdir(parents=True, exist_ok=True)
    print("cwd", os.getcwd(), flush=True)
    print("kb holds", sorted(p.name for p in Path(args[args.index("--kb") + 1]).iterdir()), flush=True)
    release = Path(os.environ["FAKE_RELEASE"])
    for _ in range(600):
        if release.exists():
            break
        time.sleep(0.05)
    (out / "result.json").write_text(" ".join(args))
    (out / "sub").mkdir(exist_ok=True)  # folders are not results
    print("done", flush=True)
    sys.exit(4)
""")


def _detached(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=60, check=False)


@pytest.fixture()
def fake_repo(tmp_path):
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    (repo / "scripts" / "gpu_measure.py").write_text(FAKE_MEASURE)
    (repo / ".git").mkdir()  # not copied
    kb = tmp_path / "kb"
    (kb / "level1").mkdir(parents=True)
    return repo, kb


def test_a_detached_run_outlives_its_starter_and_is_collected_by_a_later_attach(fake_repo, tmp_path):
    repo, kb = fake_repo
    run_dir, out1, out2 = tmp_path / "run", tmp_path / "out1", tmp_path / "out2"
    env = {**os.environ, "FAKE_RELEASE": str(tmp_path / "release")}
    started = _detached("start", str(run_dir), "--repo", str(repo), "--", "--kb", str(kb), "--limit", "x=9", "x",
                        env=env)
    assert started.returncode == 0, started.stderr
    pid = int((run_dir / "pid").read_text())
    assert os.getsid(pid) == pid  # a session of its own: a device call's end does not end it
    assert not (run_dir / "repo" / ".git").exists()
    # the working tree it came from may be swapped (the next device call's copy): the run uses its own copy
    (repo / "scripts" / "gpu_measure.py").unlink()
    # a second start while it runs is refused, and leaves it alone
    again = _detached("start", str(run_dir), "--repo", str(repo), "--", "x", env=env)
    assert again.returncode == 2 and "already going" in again.stderr

    waiting = _detached("attach", str(run_dir), "--wait-s", "1", "--out", str(out1), env=env)
    assert waiting.returncode == 3 and "still running" in waiting.stdout
    assert f"cwd {run_dir / 'repo'}" in waiting.stdout and "kb holds ['level1']" in waiting.stdout
    assert (out1 / "detached_console.log").exists() and not (out1 / "result.json").exists()

    (tmp_path / "release").touch()
    ended = _detached("attach", str(run_dir), "--wait-s", "30", "--out", str(out2), env=env)
    assert ended.returncode == 4, ended.stdout + ended.stderr  # the run's own exit status
    given = (out2 / "result.json").read_text().split()
    # gpu_measure's own arguments as given, its KernelBench checkout copied too, its results under the run's folder
    assert given == ["--kb", str(run_dir / "kb"), "--limit", "x=9", "x", "--out", str(run_dir / "out"),
                     "--work", str(run_dir / "work")]
    assert "done" in (out2 / "detached_console.log").read_text() and not (out2 / "sub").exists()


def test_start_and_attach_refuse_what_they_cannot_do(fake_repo, tmp_path):
    repo, _ = fake_repo
    env = dict(os.environ)
    for bad in ([], ["x", "--out", "/tmp/elsewhere"], ["--work=/tmp/w", "x"]):
        done = _detached("start", str(tmp_path / "run"), "--repo", str(repo), "--", *bad, env=env)
        assert done.returncode == 2 and "steps after --" in done.stderr
    missing = _detached("attach", str(tmp_path / "nothing"), "--wait-s", "0", env=env)
    assert missing.returncode == 2 and "no detached run" in missing.stderr


def test_a_run_killed_before_it_recorded_its_status_is_a_failure(fake_repo, tmp_path):
    repo, kb = fake_repo
    run_dir = tmp_path / "run"
    env = {**os.environ, "FAKE_RELEASE": str(tmp_path / "never")}
    assert _detached("start", str(run_dir), "--repo", str(repo), "--", "--kb", str(kb), "x", env=env).returncode == 0
    pid = int((run_dir / "pid").read_text())
    os.killpg(pid, 9)  # the whole session, its status-writing shell too
    ended = _detached("attach", str(run_dir), "--wait-s", "10", "--out", str(tmp_path / "out"), env=env)
    assert ended.returncode == 1 and "exit status 1" in ended.stdout

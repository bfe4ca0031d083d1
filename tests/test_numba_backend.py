"""A third backend shipped from outside the package (examples/kernelzero-numba): installed as a third
party installs it, it is listed by kernelzero-plugins and judged through the full verifier
(``core.verify --backend numba``) in Numba's CUDA simulator, honest candidates accepted and the red-team
families' hacks rejected by the stage that owns them. No file of core/ or conf/ names it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e  # a pip install and the CLIs in subprocesses (make test-e2e)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "kernelzero-numba"


def expectations() -> dict[str, tuple[str, str, str | None]]:
    """candidate name -> (task, "accepted"/"rejected", the check that must fail or None)."""
    out = {}
    for path in sorted((EXAMPLE / "candidates").glob("*.py")):
        text = path.read_text()
        task = re.search(r"^# task: (\w+)$", text, re.M).group(1)
        expect = re.search(r"^# expect: (\w+)(?: (\w+))?$", text, re.M)
        out[path.stem] = (task, expect.group(1), expect.group(2))
    return out


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict[str, str]:
    pytest.importorskip("numba", reason="the example backend needs numba (pip install -e .[dev])")
    site = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target",
                    str(site), str(EXAMPLE)], check=True, capture_output=True, text=True, timeout=300)
    assert list(site.glob("kernelzero_numba-*.dist-info/entry_points.txt")), "entry points were not installed"
    env = {k: v for k, v in os.environ.items() if k != "KERNELZERO_DISABLE_AUTOLOAD"}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT)])
    return env


def test_kernelzero_plugins_lists_the_installed_backend(installed):
    proc = subprocess.run([sys.executable, "-m", "core.plugins"], cwd=ROOT, env=installed, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "kernelzero-numba" in proc.stdout and "entry point" in proc.stdout  # its distribution, and how it came
    assert "backend: numba" in proc.stdout


def test_core_verify_judges_the_numba_candidates_through_the_full_verifier(installed, tmp_path):
    batch = tmp_path / "batch"
    batch.mkdir()
    expected = expectations()
    for name, (task, _, _) in expected.items():
        (batch / f"{name}.py").write_text((EXAMPLE / "tasks" / f"{task}.py").read_text())
        (batch / f"{name}_solution.py").write_text((EXAMPLE / "candidates" / f"{name}.py").read_text())
    proc = subprocess.run([sys.executable, "-m", "core.verify", "--backend", "numba", "--device", "cpu", "--batch",
                           str(batch), "--json", "--workers", "2", "--timeout", "300"],
                          cwd=ROOT, env=installed, capture_output=True, text=True, timeout=1200)
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == len(expected), proc.stdout[-3000:] + proc.stderr[-3000:]
    wrong = []
    for verdict in rows:  # {"pair": NAME, **the verdict}
        name = verdict["pair"].removesuffix(".py")  # a directory batch names a pair by its task file
        _, outcome, check = expected[name]
        if outcome == "accepted" and not verdict["accepted"]:
            wrong.append(f"{name}: rejected ({verdict.get('reason')})")
        elif outcome == "rejected":
            failed = [c for c, r in verdict["checks"].items() if not r["passed"]]
            if verdict["accepted"] or (check and check not in failed):
                wrong.append(f"{name}: expected {check or 'a'} failure, got {failed} ({verdict.get('reason')})")
    assert wrong == [], "\n".join(wrong)


def test_no_file_of_core_or_conf_names_the_third_backend():
    named = [str(p.relative_to(ROOT)) for folder in ("core", "conf") for p in (ROOT / folder).rglob("*")
             if p.is_file() and p.suffix in (".py", ".yaml", ".md", ".txt") and re.search(r"numba", p.read_text(), re.I)]
    assert named == []

"""`make test` and `make test-e2e` split the suite by tests/conftest.py's E2E_PATHS; CI runs both."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import E2E_PATHS, is_e2e

REPO = Path(__file__).resolve().parents[1]


def test_every_e2e_path_exists():
    missing = [p for p in E2E_PATHS if not (REPO / p).exists()]
    assert not missing, f"E2E_PATHS names files that are gone: {missing}"


def test_ci_runs_both_targets_and_the_targets_split_by_the_marker():
    ci = (REPO / ".ci" / "run").read_text()
    assert "make test\n" in ci and "make test-e2e" in ci
    make = (REPO / "Makefile").read_text()
    assert '-m "not slow and not gpu and not e2e"' in make and '-m "e2e and not slow and not gpu"' in make


def test_e2e_matches_files_and_folders_by_path():
    assert is_e2e("tests/redteam/test_redteam.py") and is_e2e("tests/test_wheel.py")
    assert not is_e2e("tests/test_wheel_extra.py") and not is_e2e("tests/test_plugins.py")

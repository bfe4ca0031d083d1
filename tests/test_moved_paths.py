"""Paths third parties imported before the engine moved into core.verification still work for one
release, warn, and give the very same objects; core.verify:Verifier stays valid across processes."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("old, new, names", [
    ("core.evidence", "core.verification.evidence", ["Evidence", "compare_outputs", "tolerance", "STATIC"]),
    ("core.executor", "core.verification.executor", ["make_executor", "executor_for_run", "BaseExecutor"]),
])
def test_an_old_path_warns_and_gives_the_same_objects(old, new, names):
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=new):
        module = importlib.import_module(old)
    target = importlib.import_module(new)
    for name in names:
        assert getattr(module, name) is getattr(target, name)


def test_core_verify_names_the_judge_for_other_processes():
    code = ("from core.verification.executor import load_object; from core.verification.judge import Verifier; "
            "assert load_object('core.verify:Verifier') is Verifier; print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "ok", proc.stderr

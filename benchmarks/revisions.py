"""A module of this repository as it was at an earlier git revision, for side-by-side benchmarks
(``--against REV``): the old and the new code measured in one run, on one machine."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def module_at(revision: str, path: str) -> ModuleType:
    """Import ``path`` (e.g. ``core/verification/sandbox.py``) as it was at ``revision``, under its own name."""
    source = subprocess.run(["git", "show", f"{revision}:{path}"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    name = f"{Path(path).stem}_{revision}"
    file = Path(tempfile.mkdtemp()) / f"{name}.py"
    file.write_text(source)
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module

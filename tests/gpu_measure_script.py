"""scripts/gpu_measure.py loaded as a module, for the tests that read its steps and their commands."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gpu_measure.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_measure", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_measure"] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["gpu_measure"]
    return module

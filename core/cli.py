"""What the ``python -m core.*`` commands share: a run that cannot start says why in one ``error:`` line.

A configuration mistake (an unknown plugin, a verifier or executor that cannot work here) or a missing
package is the user's to fix, not a bug: the command prints ``error: ...`` (for a missing optional
dependency, the extra to install) and exits :data:`EXIT_CANNOT_START`, without a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

EXIT_CANNOT_START = 2

# Top-level module -> the extra of pyproject.toml that installs it.
EXTRAS = {"cupy": "cuda", "cupy_backends": "cuda", "nvidia": "cuda", "ray": "ray", "starlette": "serve",
          "uvicorn": "serve", "httpx": "serve"}
# Top-level module -> its distribution, for what `pip install kernelzero` itself brings.
DEPENDENCIES = {"trl": "trl", "transformers": "transformers", "datasets": "datasets", "accelerate": "accelerate",
                "peft": "peft", "triton": "triton", "z3": "z3-solver", "pluggy": "pluggy", "hydra": "hydra-core",
                "omegaconf": "omegaconf", "rich": "rich", "matplotlib": "matplotlib", "tensorboard": "tensorboard"}


def missing_dependency(exc: ImportError) -> str | None:
    """One line naming what to install for a package that is not installed; None for any other import error
    (a bug, or a module of this project, keeps its traceback)."""
    name = (exc.name or "").partition(".")[0] if isinstance(exc, ModuleNotFoundError) else ""
    if name in EXTRAS:
        return f"the optional dependency {name!r} is not installed: pip install 'kernelzero[{EXTRAS[name]}]'"
    if name in DEPENDENCIES:
        return (f"{name!r} is not installed (kernelzero needs {DEPENDENCIES[name]}): pip install kernelzero, "
                f"or pip install -e . in a checkout")
    return None


def fail(message: str) -> None:
    """Print ``error: message`` to stderr and exit :data:`EXIT_CANNOT_START`."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(EXIT_CANNOT_START)


@contextmanager
def cannot_start(*more: type[BaseException]) -> Iterator[None]:
    """Turn configuration errors (and ``more``), and a missing package, into one ``error:`` line and exit 2."""
    from core.plugins import PluginError
    from core.verification.executor import ExecutorError
    from core.verification.judge import VerifierConfigError

    try:
        yield
    except (PluginError, VerifierConfigError, ExecutorError, *more) as exc:
        fail(str(exc))
    except ImportError as exc:
        line = missing_dependency(exc)
        if line is None:
            raise
        fail(line)

"""KernelZero core: contracts (hook specs, data model, program IR) and the orchestration loop.

Nothing here imports a concrete plugin; every concrete choice arrives through :mod:`core.plugins`.
"""

from core.hookspecs import hookimpl

__all__ = ["hookimpl"]
__version__ = "0.1.0"

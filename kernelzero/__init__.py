"""KernelZero for other training stacks: the adapters in :mod:`kernelzero.envs` (TRL, verl, verifiers, OpenEnv).

This top-level module is also the ``kernelzero`` taskset of ``verifiers.v1``: verifiers imports the module an id
names and takes the ``Taskset`` and ``Env`` subclasses it exports in ``__all__``. They load lazily, so importing
``kernelzero`` does not need verifiers installed.
"""

from __future__ import annotations

from typing import Any

__all__ = ["KernelZeroEnv", "KernelZeroTaskset"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from kernelzero.envs import verifiers_taskset

        return getattr(verifiers_taskset, name)
    raise AttributeError(f"module 'kernelzero' has no attribute {name!r}")

"""A task's footprint: what a check that sizes its own workers reads (``interp_races``)."""

from __future__ import annotations

from typing import Any


def task_footprint(source: str, run_forward: bool = True) -> Any:
    """The task built on the meta device (and its forward run there): ``.mib`` is the memory of its inputs,
    weights and every tensor forward writes (without ``run_forward``: inputs and weights only). Raises if
    the task does not build there."""
    from core.evaluation.resize import probe

    return probe(source, run_forward=run_forward)

"""The task's inputs for a trial, drawn from a seed: what reference and candidate workers, and a
keeper that needs a trial's inputs again (:mod:`core.verification.devicemem`), all draw alike."""

from __future__ import annotations

from typing import Any

from core.verification.probes import apply as apply_probe


def seed_everything(seed: int) -> None:
    """Seed every generator a task's get_inputs may draw from, so two workers draw the same inputs."""
    import random

    import torch

    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy

        numpy.random.seed(seed % (1 << 32))
    except ImportError:
        pass


def draw_inputs(module: Any, seed: int, scale: float | dict = 1.0, device: str = "cpu") -> list[Any]:
    """The task's inputs for one trial: ``get_inputs()`` under ``seed``, floating tensors times
    ``scale``, or transformed by a stability probe (``{"scale", "dist"}``, core.verification.probes).

    On ``cuda`` the tensors ``get_inputs`` creates without naming a device are drawn on the GPU
    (``torch.device`` as the default): drawing 100 MB on the CPU and copying it over takes longer
    than the kernel's whole trial. A ``get_inputs`` that cannot run so (a CPU generator, numpy) is
    drawn on the CPU. Every worker draws the same way, so equal seeds still give equal inputs.
    """
    import torch

    seed_everything(int(seed))
    if device == "cpu":
        inputs = list(module.get_inputs())
    else:
        try:
            with torch.device(device):
                inputs = list(module.get_inputs())
        except Exception:
            seed_everything(int(seed))
            inputs = list(module.get_inputs())
    return apply_probe(inputs, scale, seed)

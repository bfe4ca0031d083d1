"""The built-in trainers: what ``python -m core.run`` does with the composed config (``trainer.name``).

- ``none``: self-play rounds with the coder held fixed, no learning (:mod:`core.loop.selfplay`);
- ``grpo``: the TRL phases, SFT then GRPO (:mod:`core.loop.training`); conf/trainer/grpo.yaml and
  conf/trainer/embedded.yaml both name it;
- ``embedded``: the same phases under the name the ``register_trainers`` hook documents.

A factory returns the entry function ``run(cfg) -> dict | None``. The loop's modules are imported
only when a trainer is chosen, so building the registries stays cheap (training imports TRL).
"""

from __future__ import annotations

from typing import Any, Callable

from core import hookimpl

Entry = Callable[[Any], "dict[str, Any] | None"]


def selfplay() -> Entry:
    from core.loop.selfplay import selfplay_trainer

    return selfplay_trainer


def trl_phases() -> Entry:
    from core.loop.training import run_training

    return run_training


@hookimpl
def register_trainers(register):
    register("none", selfplay)
    register("grpo", trl_phases)
    register("embedded", trl_phases)

"""Every KernelZero extension point, one documented hook each.

Registry hooks receive a ``register(name, factory)`` callback: a name written in the Hydra config
selects the factory, and that config node's remaining keys become the factory's keyword arguments.
Built-in plugins (``plugins/...``) implement these hooks exactly as a third-party package does.

Event hooks are notifications: every implementation is called and return values are ignored.
"""

from __future__ import annotations

from typing import Any, Callable

import pluggy

PROJECT_NAME = "kernelzero"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

Register = Callable[[str, Callable[..., Any]], None]


# --------------------------------------------------------------------------- registries


@hookspec
def register_ops(register: Register) -> None:
    """Add PyTorch API ops to the catalog the proposers compose programs from.

    :param register: call ``register(name, op_spec)`` once per op, where ``op_spec`` is a
        :class:`core.program.OpSpec` (the op's call, parameter space, shape rule, cost and tier).
        Names are global: registering a name twice is an error naming both plugins.

    Called once, when the op catalog is first built.
    """


@hookspec
def register_proposers(register: Register) -> None:
    """Add task proposers.

    :param register: call ``register(name, factory)``; ``factory(**config, catalog=..., seed=...)``
        returns an object following :class:`core.contracts.Proposer`.

    Called once, when the proposer registry is first built.
    """


@hookspec
def register_backends(register: Register) -> None:
    """Add kernel backends (Triton, CUDA through CuPy RawModule, ...).

    :param register: call ``register(name, factory)``; ``factory(**config)`` returns an object
        following :class:`core.contracts.Backend`. The backend's methods run inside sandboxed
        worker processes, never in the judging process.

    Called once, when the backend registry is first built.
    """


@hookspec
def register_verifiers(register: Register) -> None:
    """Add verification checks (stages of the verifier pipeline).

    :param register: call ``register(name, factory)``; ``factory(**config)`` returns an object
        following :class:`core.contracts.Check`. Checks run cheapest first (by their ``stage``);
        a failed hard check stops the pipeline.

    Called once, when the verifier registry is first built.
    """


@hookspec
def register_rewards(register: Register) -> None:
    """Add reward terms.

    :param register: call ``register(name, factory)``; ``factory(**config)`` returns a callable
        ``term(verdicts, tasks) -> list[float]`` with a stable ``name`` attribute (TRL logs
        ``rewards/<name>/mean``). :mod:`core.loop.rewards` mixes terms by the weights in the config.

    Called once, when the reward registry is first built.
    """


@hookspec
def register_coders(register: Register) -> None:
    """Add coders: anything that turns a task into candidate kernels (LLMs, expert teachers).

    :param register: call ``register(name, factory)``; ``factory(**config)`` returns an object
        following :class:`core.contracts.Coder`.

    Called once, when the coder registry is first built.
    """


@hookspec
def register_curricula(register: Register) -> None:
    """Add curricula that steer the task distribution between steps.

    :param register: call ``register(name, factory)``; ``factory(**config)`` returns an object
        following :class:`core.contracts.Curriculum`.

    Called once, when the curriculum registry is first built.
    """


@hookspec
def register_devices(register: Register) -> None:
    """Add GPU descriptions (peak FLOP/s per dtype and memory bandwidth) for roofline terms.

    :param register: call ``register(name, device_spec)`` with a :class:`core.contracts.DeviceSpec`.
        ``name`` is matched against ``torch.cuda.get_device_name()`` (case-insensitive substring),
        so a new GPU drops in as a plugin.

    Called once, when the device registry is first built.
    """


@hookspec
def register_executors(register: Register) -> None:
    """Add verification executors: what spreads verdicts over workers, GPUs or machines.

    :param register: call ``register(name, factory)``; ``factory(backend=, device=, verifier=, **config)``
        returns an object following :class:`core.contracts.Executor`. ``executor.name`` in the run
        config selects one (``local``, ``ray``).

    Called once, when the executor registry is first built.
    """


@hookspec
def register_trainers(register: Register) -> None:
    """Add trainers: what ``python -m core.run`` does with the composed config.

    :param register: call ``register(name, factory)``; ``factory()`` returns a callable
        ``run(cfg) -> dict | None`` (the run's final metrics, or None). ``trainer.name`` selects one:
        ``none`` (self-play rounds, no learning) and ``embedded`` (TRL phases) are built in.

    Called once, when the trainer registry is first built.
    """


@hookspec
def register_configs(config_store: Any) -> None:
    """Store a plugin's Hydra config groups and options, without touching ``conf/``.

    :param config_store: Hydra's ``ConfigStore`` instance; call
        ``config_store.store(group="reward", name="my_term", node={...})``.

    Called once before Hydra composes the configuration of any ``python -m core.*`` command.
    """


# --------------------------------------------------------------------------- events


@hookspec
def on_verdict(task: Any, candidate: Any, verdict: Any) -> None:
    """Observe a verdict as soon as the verifier reaches it.

    :param task: the :class:`core.task.Task` that was attempted.
    :param candidate: the :class:`core.task.Candidate` that was judged.
    :param verdict: the :class:`core.verdict.Verdict`.

    Called in the judging process, once per verdict, in completion order.
    """


@hookspec
def on_step_end(step: int, metrics: dict[str, float]) -> None:
    """Observe the metrics of a finished training or self-play step.

    :param step: the global step number (0-based).
    :param metrics: flat mapping of metric name to value (``pass_rate``, ``reward/<term>``, ...).

    Called once per step, after the curriculum was updated.
    """


@hookspec
def on_round_end(round_index: int, metrics: dict[str, float]) -> None:
    """Observe the summary of a finished self-play round.

    :param round_index: the round number (0-based).
    :param metrics: aggregated metrics of the round (tasks, pass rate, mean reward, ...).

    Called once per round, after every verdict of the round was reached.
    """

"""verifiers (prime-rl): the ``kernelzero`` taskset of ``verifiers.v1``, whose reward is the verdict, and its
multi-turn environment, which feeds a rejected attempt's verdict back to the model.

verifiers finds a taskset by importing the module its id names and taking the ``Taskset`` (and optional ``Env``)
subclass that module exports in ``__all__``; the top-level ``kernelzero`` package exports these lazily, so::

    import verifiers.v1 as vf
    taskset = vf.load_taskset(vf.TasksetConfig(id="kernelzero"))                        # this module's config type
    # or from the CLI: --env.taskset.id kernelzero --env.taskset.source KernelBench --env.max_turns 3

Tasks come from a KernelBench folder or a proposer JSONL (``source``), or are drawn from the proposer
(``propose: N``); with neither, 16 proposer tasks. Each task's reward is KernelZero's reward mix on the verdict
of the model's last reply, judged by ``task.service_url`` (a ``kernelzero serve``) or a local sandboxed verifier.
"""

from __future__ import annotations

from typing import Any

import verifiers.v1 as vf

from kernelzero.envs.judge import KernelJudge, VerdictCache
from kernelzero.envs.tasks import SYSTEM_PROMPT, backend_guide, iter_proposed, load_tasks

FIX_PROMPT = "Fix the module: answer with the whole corrected ```python block defining ModelNew."
_JUDGES: dict[tuple, KernelJudge] = {}
_CACHE = VerdictCache()  # the env's last verdict is the task's reward: judged once


class KernelZeroTaskConfig(vf.TaskConfig):
    """How each task is judged (``--env.taskset.task.*``)."""

    service_url: str | None = None
    """A ``kernelzero serve`` URL; unset: ``KERNELZERO_SERVICE_URL``, else a local verifier."""
    token: str | None = None
    backend: str = "triton"
    correctness_weight: float = 1.0
    """Weight of the published correctness term, ``1 - (1 - accuracy)^2`` (failures earn 0)."""


class KernelZeroConfig(vf.TasksetConfig):
    """Which tasks load (``--env.taskset.*``)."""

    task: KernelZeroTaskConfig = KernelZeroTaskConfig()
    source: str | None = None
    """A KernelBench-layout folder (level1/*.py ...) or a proposer JSONL (python -m core.propose)."""
    propose: int = 0
    """Draw this many tasks from the proposer instead (16 when neither is set)."""
    proposer: str = "random"
    seed: int = 0


class KernelZeroData(vf.TaskData):
    info: dict
    """``task``: the task JSON (source, id, metadata); ``backend``."""


def judge_of(config: KernelZeroTaskConfig) -> KernelJudge:
    key = (config.service_url, config.token, config.backend, config.correctness_weight)
    if key not in _JUDGES:
        _JUDGES[key] = KernelJudge(service_url=config.service_url, token=config.token, backend=config.backend,
                                   weights={"correctness": config.correctness_weight})
    return _JUDGES[key]


async def verdict_of(task: KernelZeroTask, reply: str) -> Any:
    judge = judge_of(task.config)
    pairs = judge.pairs([task.data.info["task"]], [reply])
    return pairs, (await _CACHE.get(judge, pairs))[0]


class KernelZeroTask(vf.Task[KernelZeroData, vf.State, KernelZeroTaskConfig]):
    @vf.reward
    async def kernel_verdict(self, trace: vf.Trace) -> float:
        """KernelZero's reward on the verdict of the model's last reply."""
        pairs, verdict = await verdict_of(self, trace.last_reply)
        trace.info["kernelzero_verdict"] = {"status": verdict.status, "reason": verdict.reason,
                                            "accuracy": verdict.accuracy, "hack": bool(verdict.hack_flags)}
        return judge_of(self.config).rewards(pairs, [verdict])[0]


class KernelZeroTaskset(vf.Taskset[KernelZeroTask, KernelZeroConfig]):
    def __init__(self, config: vf.TasksetConfig) -> None:
        # vf.load_taskset(vf.TasksetConfig(id="kernelzero")) hands over the base config: read it as ours
        if not isinstance(config, KernelZeroConfig):
            config = KernelZeroConfig.model_validate(config.model_dump(exclude_unset=True))
        super().__init__(config)

    def load(self):
        config = self.config
        if config.source:
            tasks = load_tasks(config.source)
        else:
            tasks = iter_proposed(config.propose or 16, config.proposer, config.seed)
        backend = config.task.backend
        system = f"{SYSTEM_PROMPT}\n\n{backend_guide(backend)}".strip()
        for task in tasks:
            prompt = f"Reference (PyTorch):\n```python\n{task.source.rstrip()}\n```\nWrite `ModelNew` using {backend} kernels."
            yield KernelZeroTask(KernelZeroData(id=task.id, name=task.name or task.id, prompt=prompt,
                                                system_prompt=system, info={"task": task.to_json(), "backend": backend}),
                                 config.task)


class KernelZeroEnvConfig(vf.EnvConfig):
    coder: vf.AgentConfig = vf.AgentConfig()
    """The model writing kernels (``--env.coder.*``)."""
    max_turns: int = 1
    """Attempts per task: after a rejected attempt the verdict's reason is the next user turn (1: single-turn)."""


class KernelZeroEnv(vf.Env[KernelZeroEnvConfig]):
    """Attempt -> verdict -> feedback -> attempt, up to ``max_turns``; the task scores the last attempt."""

    async def run(self, task, agents):
        from core.loop.turns import feedback_text

        async with agents.coder.interaction(task) as interaction:
            segment = await interaction.turn()
            for _ in range(1, max(1, self.config.max_turns)):
                if segment.terminated:
                    break
                _, verdict = await verdict_of(task, segment.last_reply)
                if verdict.accepted:
                    break
                segment = await interaction.turn(f"{feedback_text(verdict)}\n{FIX_PROMPT}")


__all__ = ["KernelZeroEnv", "KernelZeroTaskset"]

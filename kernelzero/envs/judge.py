"""What every adapter shares: a model's completion for a task -> a verdict -> the reward, judged by a running
service (``kernelzero serve``) or, without one, by a local sandboxed verifier started on first use.

The reward is KernelZero's own reward mix (:class:`core.loop.rewards.RewardMix`: by default the published
correctness term, ``1 - (1 - accuracy)^2``, and 0 for anything not accepted), so a framework's reward equals
the one our trainer computes from the same verdict.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from core.task import Candidate, Task
from core.verdict import Verdict

SERVICE_ENV = "KERNELZERO_SERVICE_URL"  # where adapters find the service when none is passed
DEFAULT_WEIGHTS: Mapping[str, float] = {"correctness": 1.0}


def extract_source(completion: Any) -> str:
    """The code in a completion: a string, or chat messages (the last assistant turn's content)."""
    from plugins.coders.llm.prompts import extract_code

    if isinstance(completion, list):  # TRL / verifiers conversational completions
        texts = [m.get("content") or "" for m in completion if isinstance(m, dict) and m.get("role") == "assistant"]
        completion = texts[-1] if texts else ""
    return extract_code(str(completion or ""))


@dataclass
class KernelJudge:
    """Verdicts and rewards for completions.

    :param service_url: a ``kernelzero serve`` URL (default: ``KERNELZERO_SERVICE_URL``); none: a local verifier.
    :param token: the service's token (default: ``KERNELZERO_SERVE_TOKEN``).
    :param weights: reward terms and weights (``core.loop.rewards.RewardMix``); ``failure_reward`` for the rest.
    :param verifier: local verifier settings (``workers``, ``trials``, ``timeout_s``, ``device`` ...).
    """

    service_url: str | None = None
    token: str | None = None
    backend: str = "triton"
    weights: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    failure_reward: float = 0.0
    verifier: Mapping[str, Any] = field(default_factory=dict)
    timeout_s: float = 900.0

    def __post_init__(self) -> None:
        self.service_url = self.service_url or os.environ.get(SERVICE_ENV) or None
        self._lock = threading.Lock()
        self._backend: Any = None
        self._mix: Any = None

    # -- verifying

    @property
    def judge(self) -> Any:
        """The client of the service, or the local executor (started once, stopped at exit)."""
        with self._lock:
            if self._backend is None:
                if self.service_url:
                    from core.serve.client import VerifierClient

                    self._backend = VerifierClient(self.service_url, self.token, timeout_s=self.timeout_s)
                else:
                    from core.verification.executor import make_executor

                    options = dict(self.verifier)
                    device = options.pop("device", "auto")
                    from core.config import resolve_device

                    device = resolve_device(device)
                    workers = int(options.pop("workers", 2))
                    node = {"name": "local", ("workers_per_gpu" if device == "cuda" else "cpu_workers"): workers}
                    self._backend = make_executor(node, backend=self.backend, device=device, verifier=options)
                    atexit.register(self._backend.close)
            return self._backend

    def pairs(self, tasks: Sequence[Any], completions: Sequence[Any]) -> list[tuple[Task, Candidate]]:
        from kernelzero.envs.tasks import task_from

        out = []
        for task, completion in zip(tasks, completions, strict=True):
            task = task_from(task)
            out.append((task, Candidate(source=extract_source(completion), backend=self.backend, task_id=task.id,
                                        completion=completion if isinstance(completion, str) else None)))
        return out

    def verdicts(self, pairs: Sequence[tuple[Task, Candidate]]) -> list[Verdict]:
        todo = [i for i, (_, c) in enumerate(pairs) if c.source.strip()]
        verdicts: list[Verdict] = [Verdict.failure("declined", "empty completion: no code found", task_id=t.id,
                                                   candidate_id=c.id) for t, c in pairs]
        if todo:
            for i, v in zip(todo, self.judge.verify_many([pairs[i] for i in todo])):
                verdicts[i] = v
        return verdicts

    async def averdicts(self, pairs: Sequence[tuple[Task, Candidate]]) -> list[Verdict]:
        judge = self.judge
        if hasattr(judge, "averify_many"):
            todo = [i for i, (_, c) in enumerate(pairs) if c.source.strip()]
            verdicts: list[Verdict] = [Verdict.failure("declined", "empty completion: no code found", task_id=t.id,
                                                       candidate_id=c.id) for t, c in pairs]
            for i, v in zip(todo, await judge.averify_many([pairs[i] for i in todo])):
                verdicts[i] = v
            return verdicts
        return await asyncio.to_thread(self.verdicts, pairs)  # the local verifier blocks: off the event loop

    # -- rewards

    @property
    def mix(self) -> Any:
        if self._mix is None:
            from core.loop.rewards import RewardMix

            self._mix = RewardMix(weights=dict(self.weights), failure_reward=self.failure_reward)
        return self._mix

    def per_term(self, pairs: Sequence[tuple[Task, Candidate]], verdicts: Sequence[Verdict]) -> dict[str, list[float]]:
        return self.mix.per_term(list(verdicts), [t for t, _ in pairs], [c for _, c in pairs])

    def rewards(self, pairs: Sequence[tuple[Task, Candidate]], verdicts: Sequence[Verdict]) -> list[float]:
        return self.mix.combine(self.per_term(pairs, verdicts))

    def score(self, tasks: Sequence[Any], completions: Sequence[Any]) -> tuple[list[float], list[Verdict]]:
        pairs = self.pairs(tasks, completions)
        verdicts = self.verdicts(pairs)
        return self.rewards(pairs, verdicts), verdicts

    async def ascore(self, tasks: Sequence[Any], completions: Sequence[Any]) -> tuple[list[float], list[Verdict]]:
        pairs = self.pairs(tasks, completions)
        verdicts = await self.averdicts(pairs)
        return self.rewards(pairs, verdicts), verdicts

    def close(self) -> None:
        with self._lock:
            backend, self._backend = self._backend, None
        if backend is not None:
            backend.close()

    def __getstate__(self) -> dict[str, Any]:  # picklable (TRL and verl may ship reward functions to workers)
        state = dict(self.__dict__)
        state.update(_lock=None, _backend=None, _mix=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


class VerdictCache:
    """Verdicts of recent (task id, candidate id) pairs, shared by several reward functions of one batch: the
    first asks, the others await the same answer (TRL runs async reward functions concurrently)."""

    def __init__(self, keep: int = 4096):
        self.keep = keep
        self._entries: OrderedDict[tuple[str, str], Any] = OrderedDict()

    async def get(self, judge: KernelJudge, pairs: Sequence[tuple[Task, Candidate]]) -> list[Verdict]:
        loop = asyncio.get_running_loop()
        keys = [(t.id, c.id) for t, c in pairs]
        mine = []
        for i, key in enumerate(keys):
            entry = self._entries.get(key)
            if entry is None or (isinstance(entry, asyncio.Future) and entry.get_loop() is not loop):
                self._entries[key] = loop.create_future()
                mine.append(i)
        if mine:
            try:
                fresh = await judge.averdicts([pairs[i] for i in mine])
            except BaseException as exc:
                for i in mine:
                    future = self._entries.pop(keys[i], None)
                    if isinstance(future, asyncio.Future) and not future.done():
                        future.set_exception(exc)
                raise
            for i, verdict in zip(mine, fresh):
                future = self._entries[keys[i]]
                if not future.done():
                    future.set_result(verdict)
        out = []
        for key in keys:
            entry = self._entries[key]
            out.append(await asyncio.shield(entry) if isinstance(entry, asyncio.Future) else entry)
        while len(self._entries) > self.keep:
            self._entries.popitem(last=False)
        return out

"""OpenEnv: a KernelZero environment server (``reset`` gives a task, ``step`` judges an answer) and its client.

An episode is one task: ``reset`` returns its prompt; each ``step(KernelAction(completion=...))`` is one attempt,
judged in the sandbox, its reward KernelZero's reward mix on the verdict; a rejected attempt's observation carries
the verdict's feedback, and the episode ends when an attempt is accepted or after ``max_turns``::

    python -m kernelzero.envs.openenv --source KernelBench --port 8001 --service-url http://127.0.0.1:8000

    with KernelZeroEnvClient(base_url="http://127.0.0.1:8001").sync() as env:
        first = env.reset(seed=3)                      # first.observation.prompt
        result = env.step(KernelAction(completion=model(first.observation.prompt)))
        result.reward, result.done, result.observation.feedback

The server is OpenEnv's own (``openenv.core.env_server.http_server.create_fastapi_app``); each session gets its own
environment, and all share one judge (the service, or one local verifier).
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Sequence
from typing import Any

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

from core.task import Task
from kernelzero.envs.judge import KernelJudge
from kernelzero.envs.tasks import chat_prompt


class KernelAction(Action):
    completion: str = Field(description="the model's answer: a ```python block defining ModelNew (or bare code)")


class KernelObservation(Observation):
    prompt: str = Field(default="", description="the task: the reference module and what to write")
    task_id: str = ""
    turn: int = 0
    status: str | None = Field(default=None, description="the last attempt's verdict status")
    accepted: bool = False
    feedback: str | None = Field(default=None, description="why the last attempt was rejected")


class KernelState(State):
    task_id: str | None = None
    accepted: bool = False
    rewards: list[float] = Field(default_factory=list)


class KernelZeroEnvironment(Environment[KernelAction, KernelObservation, KernelState]):
    """One episode per task; see the module doc."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # an instance per session; the judge they share is thread-safe

    def __init__(self, tasks: Sequence[Task], judge: KernelJudge, max_turns: int = 3, backend: str = "triton"):
        super().__init__()
        if not tasks:
            raise ValueError("KernelZeroEnvironment needs at least one task")
        self.tasks, self.judge, self.max_turns, self.backend = list(tasks), judge, max(1, int(max_turns)), backend
        self._task: Task | None = None
        self._state = KernelState()

    def reset(self, seed: int | None = None, episode_id: str | None = None, task_id: str | None = None,
              **kwargs: Any) -> KernelObservation:
        if task_id is not None:
            matches = [t for t in self.tasks if t.id == task_id or t.name == task_id]
            if not matches:
                raise ValueError(f"no task {task_id!r}; this server has {len(self.tasks)} (ids or names)")
            self._task = matches[0]
        else:
            self._task = random.Random(seed).choice(self.tasks)
        self._state = KernelState(episode_id=episode_id or uuid.uuid4().hex, task_id=self._task.id)
        return KernelObservation(prompt=self._prompt(), task_id=self._task.id, reward=None, done=False)

    def _prompt(self) -> str:
        return "\n\n".join(m["content"] for m in chat_prompt(self._task, self.backend))

    def _judged(self, reward: float, verdict: Any) -> KernelObservation:
        from core.loop.turns import feedback_text

        state = self._state
        state.step_count += 1
        state.rewards.append(reward)
        state.accepted = bool(verdict.accepted)
        done = state.accepted or state.step_count >= self.max_turns
        return KernelObservation(prompt="" if done else self._prompt(), task_id=self._task.id, turn=state.step_count,
                                 status=verdict.status, accepted=state.accepted, reward=reward, done=done,
                                 feedback=None if verdict.accepted else feedback_text(verdict),
                                 metadata={"reason": verdict.reason, "accuracy": verdict.accuracy,
                                           "hack": bool(verdict.hack_flags)})

    def _check(self) -> None:
        if self._task is None:
            raise RuntimeError("call reset() before step()")

    def step(self, action: KernelAction, timeout_s: float | None = None, **kwargs: Any) -> KernelObservation:
        self._check()
        rewards, verdicts = self.judge.score([self._task], [action.completion])
        return self._judged(rewards[0], verdicts[0])

    async def step_async(self, action: KernelAction, timeout_s: float | None = None, **kwargs: Any) -> KernelObservation:
        self._check()
        rewards, verdicts = await self.judge.ascore([self._task], [action.completion])
        return self._judged(rewards[0], verdicts[0])

    @property
    def state(self) -> KernelState:
        return self._state


def create_kernelzero_app(tasks: Sequence[Task], judge: KernelJudge | None = None, max_turns: int = 3,
                          max_concurrent_envs: int = 64) -> Any:
    """OpenEnv's FastAPI app serving :class:`KernelZeroEnvironment` sessions over ``tasks``."""
    from openenv.core.env_server.http_server import create_fastapi_app

    judge = judge or KernelJudge()
    return create_fastapi_app(lambda: KernelZeroEnvironment(tasks, judge, max_turns, judge.backend), KernelAction,
                              KernelObservation, max_concurrent_envs=max_concurrent_envs, env_name="kernelzero",
                              state_cls=KernelState)


class KernelZeroEnvClient(EnvClient[KernelAction, KernelObservation, KernelState]):
    """The typed client of :func:`create_kernelzero_app` (async; ``.sync()`` for a blocking one)."""

    def _step_payload(self, action: KernelAction) -> dict[str, Any]:
        return action.model_dump()

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[KernelObservation]:
        fields = {k: v for k, v in dict(payload.get("observation") or {}).items() if k in KernelObservation.model_fields}
        observation = KernelObservation(**fields, reward=payload.get("reward"), done=payload.get("done", False))
        return StepResult(observation=observation, reward=payload.get("reward"), done=payload.get("done", False))

    def _parse_state(self, payload: dict[str, Any]) -> KernelState:
        return KernelState(**payload)


def main(argv: list[str] | None = None) -> int:
    import argparse

    import uvicorn

    from kernelzero.envs.tasks import load_tasks, propose

    p = argparse.ArgumentParser(prog="python -m kernelzero.envs.openenv", description="KernelZero as an OpenEnv server")
    p.add_argument("--source", help="a KernelBench-layout folder or a proposer JSONL (default: 16 proposer tasks)")
    p.add_argument("--propose", type=int, default=16)
    p.add_argument("--service-url", help="a kernelzero serve URL (default: a local sandboxed verifier)")
    p.add_argument("--max-turns", type=int, default=3)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8001)
    args = p.parse_args(argv)
    tasks = load_tasks(args.source) if args.source else propose(args.propose)
    app = create_kernelzero_app(tasks, KernelJudge(service_url=args.service_url), args.max_turns)
    uvicorn.run(app, host=args.host, port=args.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

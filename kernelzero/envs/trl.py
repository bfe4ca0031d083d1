"""TRL: KernelZero's verdict as ``GRPOTrainer(reward_funcs=...)`` reward functions, async (TRL awaits async reward
functions concurrently), one per reward term so TRL logs ``rewards/kernelzero_<term>/mean``::

    from kernelzero.envs.tasks import load_tasks, to_dataset
    from kernelzero.envs.trl import reward_funcs

    trainer = GRPOTrainer(model=..., reward_funcs=reward_funcs(service_url="http://127.0.0.1:8000"),
                          train_dataset=to_dataset(load_tasks("KernelBench")), args=GRPOConfig(...))

Every term of one batch shares one verification per completion (:class:`kernelzero.envs.judge.VerdictCache`).
The dataset's ``answer`` column (the task JSON, :mod:`kernelzero.envs.tasks`) tells each function which task a
completion answers; TRL passes every dataset column to reward functions as a keyword argument.

For multi-turn refinement (the verdict fed back, the model tries again), TRL's ``rollout_func`` is
:class:`core.loop.refinement.RefinementEnv`; it takes a :class:`core.serve.client.VerifierClient` as its verifier.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kernelzero.envs.judge import KernelJudge, VerdictCache


class KernelRewardFunction:
    """One reward term as an async TRL reward function (a callable whose ``__name__`` TRL logs)."""

    def __init__(self, judge: KernelJudge, term: str, cache: VerdictCache):
        self.judge, self.term, self.cache = judge, term, cache
        self.__name__ = f"kernelzero_{term}"

    async def __call__(self, prompts: Sequence[Any] | None = None, completions: Sequence[Any] | None = None,
                       answer: Sequence[Any] | None = None, **kwargs: Any) -> list[float]:
        tasks = answer if answer is not None else kwargs.get("task")
        if tasks is None:
            raise ValueError("the dataset has no 'answer' column (the task JSON): build it with "
                             "kernelzero.envs.tasks.to_dataset, or name each row's task in an 'answer' column")
        pairs = self.judge.pairs(list(tasks), list(completions or []))
        verdicts = await self.cache.get(self.judge, pairs)
        return self.judge.per_term(pairs, verdicts)[self.term]


def reward_funcs(service_url: str | None = None, *, token: str | None = None, backend: str = "triton",
                 weights: Mapping[str, float] | None = None, failure_reward: float = 0.0,
                 verifier: Mapping[str, Any] | None = None) -> list[KernelRewardFunction]:
    """One async reward function per term of ``weights`` (default: ``correctness``). Pass ``weights``' values to
    ``GRPOConfig(reward_weights=...)`` in the same order; each function returns its term unweighted.

    No ``service_url`` (nor ``KERNELZERO_SERVICE_URL``): a local sandboxed verifier, ``verifier`` its settings."""
    judge = KernelJudge(service_url=service_url, token=token, backend=backend,
                        weights=dict(weights or {"correctness": 1.0}), failure_reward=failure_reward,
                        verifier=dict(verifier or {}))
    cache = VerdictCache()
    return [KernelRewardFunction(judge, term, cache) for term in judge.weights]

"""verl: KernelZero's verdict as a custom reward function, async as verl's reward loop prefers, and its batch form.

In a verl config (the dataset from ``python -m kernelzero.envs.tasks --out train.parquet``)::

    reward:
      custom_reward_function:
        path: pkg://kernelzero.envs.verl
        name: compute_score            # async; verl's NaiveRewardManager awaits it per sample
        reward_kwargs:                 # on the command line: +reward.custom_reward_function.reward_kwargs.service_url=
          service_url: http://127.0.0.1:8000

``compute_score_batch`` is the form verl's ``verl.workers.reward_manager.batch.BatchRewardManager`` calls (verl
0.9.1's trainer reward loop scores per sample and has no ``batch`` manager). verl 0.9.1 pins transformers<5.11, so
KernelZero goes into verl's environment with ``--no-deps`` (docs/environments.md); neither function needs TRL.

``ground_truth`` is the row's ``reward_model.ground_truth`` (the task JSON). Without ``service_url`` (nor
``KERNELZERO_SERVICE_URL``) a local sandboxed verifier is started in the reward worker on first use.
The result is ``{"score": reward, "accepted": 0|1, "correct": 0|1, "hack": 0|1}``: verl keeps the extra keys as
``reward_extra_info``. Tested with verl itself: tests/envs/test_verl_adapter.py (``make test-envs``).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from kernelzero.envs.judge import KernelJudge

_JUDGES: dict[tuple, KernelJudge] = {}
_LOCK = threading.Lock()


def judge_for(service_url: str | None = None, token: str | None = None, backend: str = "triton",
              weights: Mapping[str, float] | None = None, verifier: Mapping[str, Any] | None = None) -> KernelJudge:
    """One judge per configuration and process: verl calls the reward function once per sample."""
    key = (service_url, token, backend, tuple(sorted((weights or {}).items())), tuple(sorted((verifier or {}).items())))
    with _LOCK:
        if key not in _JUDGES:
            _JUDGES[key] = KernelJudge(service_url=service_url, token=token, backend=backend,
                                       weights=dict(weights or {"correctness": 1.0}), verifier=dict(verifier or {}))
        return _JUDGES[key]


def _result(reward: float, verdict: Any) -> dict[str, float]:
    return {"score": float(reward), "accepted": float(verdict.accepted), "correct": float(verdict.correct),
            "hack": float(bool(verdict.hack_flags))}


async def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None, *,
                        service_url: str | None = None, token: str | None = None, backend: str = "triton",
                        weights: Mapping[str, float] | None = None, verifier: Mapping[str, Any] | None = None,
                        **kwargs: Any) -> dict[str, float]:
    """The reward of one response (verl's ``compute_score(data_source, solution_str, ground_truth, extra_info)``)."""
    judge = judge_for(service_url, token, backend, weights, verifier)
    rewards, verdicts = await judge.ascore([ground_truth], [solution_str])
    return _result(rewards[0], verdicts[0])


def compute_score_batch(data_sources: Sequence[str], solution_strs: Sequence[str], ground_truths: Sequence[Any],
                        extra_infos: Sequence[Any] | None = None, *, service_url: str | None = None,
                        token: str | None = None, backend: str = "triton", weights: Mapping[str, float] | None = None,
                        verifier: Mapping[str, Any] | None = None, **kwargs: Any) -> list[dict[str, float]]:
    """The rewards of a batch (verl's ``BatchRewardManager``: ``data_sources, solution_strs, ground_truths,
    extra_infos``), judged concurrently."""
    judge = judge_for(service_url, token, backend, weights, verifier)
    rewards, verdicts = judge.score(list(ground_truths), list(solution_strs))
    return [_result(r, v) for r, v in zip(rewards, verdicts)]

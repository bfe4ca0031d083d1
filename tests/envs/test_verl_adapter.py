"""verl: kernelzero.envs.verl has verl's custom reward function contract and gives the native verifier's rewards.

verl itself is not installed here: verl 0.9.1 pins transformers<5.11, below what TRL in this environment needs.
So this test calls the functions exactly as verl's reward managers do (read from verl 0.9.1's source):
``verl.trainer.ppo.reward.get_custom_reward_fn`` loads ``custom_reward_function.path`` (``pkg://`` imports the
module) and ``name``, wraps an async function so it stays a coroutine function with ``reward_kwargs`` merged in;
``NaiveRewardManager.run_single`` awaits ``compute_score(data_source=, solution_str=, ground_truth=,
extra_info=)`` and reads ``result["score"]``; ``BatchRewardManager.verify`` calls ``compute_score(data_sources=,
solution_strs=, ground_truths=, extra_infos=)``. With verl installed, the same checks run on verl's own loader.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
from functools import partial

import pytest
from kernel_cases import COMPLETIONS, TASK, native_rewards

from core.serve.service import ServiceConfig, running_service
from core.task import Task
from kernelzero.envs.tasks import task_row


def load_custom_reward_fn(path: str, name: str, reward_kwargs: dict):
    """verl's get_custom_reward_fn when verl is installed; otherwise its documented behaviour for pkg:// paths."""
    try:
        from omegaconf import OmegaConf
        from verl.trainer.ppo.reward import get_custom_reward_fn
    except ImportError:
        raw = getattr(importlib.import_module(path.removeprefix("pkg://").replace("/", ".")), name)

        async def merged_async(*args, **kwargs):
            return await raw(*args, **{**kwargs, **reward_kwargs})

        def merged(*args, **kwargs):
            return raw(*args, **{**kwargs, **reward_kwargs})

        return partial(merged_async if inspect.iscoroutinefunction(raw) else merged)
    config = OmegaConf.create({"reward": {"custom_reward_function": {"path": path, "name": name,
                                                                     "reward_kwargs": reward_kwargs}}})
    return get_custom_reward_fn(config)


@pytest.fixture(scope="module")
def native():
    return native_rewards()


@pytest.fixture(scope="module")
def service():
    with running_service(ServiceConfig(device="cpu", workers=2, port=0, timeout_s=90)) as running:
        yield running


def test_compute_score_is_verls_async_reward_function_and_matches_the_native_verifier(native, service):
    row = task_row(Task(TASK))
    compute_score = load_custom_reward_fn("pkg://kernelzero.envs.verl", "compute_score", {"service_url": service.url})
    assert inspect.iscoroutinefunction(compute_score)  # NaiveRewardManager awaits it

    async def per_sample():
        return await asyncio.gather(*(compute_score(data_source=row["data_source"], solution_str=c,
                                                    ground_truth=row["reward_model"]["ground_truth"],
                                                    extra_info={**row["extra_info"], "num_turns": None})
                                      for c in COMPLETIONS.values()))

    results = asyncio.run(per_sample())
    assert [r["score"] for r in results] == pytest.approx([native[c][0] for c in COMPLETIONS])
    assert [(r["accepted"], r["hack"]) for r in results] == [(1.0, 0.0), (0.0, 0.0), (0.0, 1.0)]


def test_compute_score_batch_is_verls_batch_form(native, service):
    row = task_row(Task(TASK))
    batch = load_custom_reward_fn("pkg://kernelzero.envs.verl", "compute_score_batch", {"service_url": service.url})
    results = batch(data_sources=[row["data_source"]] * 3, solution_strs=list(COMPLETIONS.values()),
                    ground_truths=[row["reward_model"]["ground_truth"]] * 3, extra_infos=[{}] * 3)
    assert [r["score"] for r in results] == pytest.approx([native[c][0] for c in COMPLETIONS])

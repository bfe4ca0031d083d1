"""TRL: the async reward functions of kernelzero.envs.trl, as TRL's GRPOTrainer sees and calls them, give the
native verifier's rewards on honest, wrong and hacked completions, through the service and locally."""

from __future__ import annotations

import asyncio

import pytest

trl_utils = pytest.importorskip("trl.trainer.utils")

from kernel_cases import COMPLETIONS, TASK, native_rewards  # noqa: E402

from core.serve.service import ServiceConfig, running_service  # noqa: E402
from core.task import Task  # noqa: E402
from kernelzero.envs.tasks import to_dataset  # noqa: E402
from kernelzero.envs.trl import reward_funcs  # noqa: E402


@pytest.fixture(scope="module")
def native():
    return native_rewards()


def trl_call(funcs, rows, completions):
    """What GRPOTrainer._calculate_rewards does with async reward functions: every dataset column but the prompt
    as a keyword list, all functions awaited together."""
    keys = [k for k in rows[0] if k not in ("prompt", "completion", "completion_ids")]
    kwargs = {k: [row[k] for row in rows] for k in keys}

    async def run():
        return await asyncio.gather(*(f(prompts=[r["prompt"] for r in rows], completions=completions,
                                        completion_ids=[[0]] * len(rows), trainer_state=None, **kwargs) for f in funcs))

    return asyncio.run(run())


@pytest.mark.parametrize("where", ["service", "local"])
def test_trl_reward_functions_match_the_native_verifier(native, where):
    dataset = to_dataset([Task(TASK)])
    rows = [dataset[0]] * len(COMPLETIONS)
    completions = [[{"role": "assistant", "content": c}] for c in COMPLETIONS.values()]  # conversational
    if where == "service":
        with running_service(ServiceConfig(device="cpu", workers=2, port=0, timeout_s=90)) as service:
            funcs = reward_funcs(service.url, weights={"correctness": 1.0, "format": 0.0})
            results = trl_call(funcs, rows, completions)
            assert service.dispatcher.verdicts_total == len(COMPLETIONS)  # both terms shared one verification each
    else:
        funcs = reward_funcs(verifier={"device": "cpu", "workers": 2, "timeout_s": 90})
        results = trl_call(funcs, rows, completions)
        funcs[0].judge.close()
    assert [trl_utils.get_callable_name(f) for f in funcs] == ["kernelzero_correctness", "kernelzero_format"][:len(funcs)]
    assert all(trl_utils.is_async_callable(f) for f in funcs)
    assert results[0] == pytest.approx([native[case][0] for case in COMPLETIONS])
    assert results[0] == [1.0, 0.0, 0.0]  # honest, wrong, hacked


def test_a_dataset_without_the_task_column_is_an_error_that_says_what_to_do():
    funcs = reward_funcs("http://127.0.0.1:9")
    with pytest.raises(ValueError, match="to_dataset"):
        asyncio.run(funcs[0](prompts=["p"], completions=["c"]))

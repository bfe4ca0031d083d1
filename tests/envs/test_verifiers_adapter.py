"""verifiers (prime-rl): ``vf.load_taskset(vf.TasksetConfig(id="kernelzero"))`` finds our taskset, and its task's
reward, scored by verifiers' own ``Task.score`` on a trace whose reply is the completion, equals the native
verifier's reward on honest, wrong and hacked completions. Runs where ``kernelzero[envs-verifiers]`` is installed
(its own environment: verifiers 0.4.0 pins mcp==2.0.0); skipped elsewhere."""

from __future__ import annotations

import asyncio

import pytest

vf = pytest.importorskip("verifiers.v1")

from kernel_cases import COMPLETIONS, TASK, native_rewards  # noqa: E402
from verifiers.v1.trace import AgentInfo, TraceTask  # noqa: E402

from core.serve.service import ServiceConfig, running_service  # noqa: E402


@pytest.fixture(scope="module")
def kernelbench(tmp_path_factory):
    root = tmp_path_factory.mktemp("kb")
    (root / "level1").mkdir()
    (root / "level1" / "1_relu.py").write_text(TASK)
    return root


def scored(task, completion: str) -> tuple[float, str]:
    trace = vf.Trace(task=TraceTask(type=type(task).__name__, data=task.data), agent=AgentInfo(config=vf.AgentConfig()),
                     root_reply=completion)
    asyncio.run(task.score(trace))
    return trace.rewards["kernel_verdict"].score, trace.info["kernelzero_verdict"]["status"]


def test_the_id_kernelzero_loads_our_taskset_and_env():
    taskset = vf.load_taskset(vf.TasksetConfig(id="kernelzero"))  # the base config, read as ours: proposer tasks
    assert type(taskset).__name__ == "KernelZeroTaskset" and taskset.config.propose == 0
    tasks = list(taskset.take(2))  # drawn as read
    assert len(tasks) == 2 and all("ModelNew" in t.data.prompt_text for t in tasks)
    assert vf.environment_class("kernelzero").__name__ == "KernelZeroEnv"  # the multi-turn form, max_turns=1 default
    assert vf.taskset_config_type("kernelzero").__name__ == "KernelZeroConfig"


@pytest.mark.parametrize("where", ["service", "local"])
def test_the_taskset_reward_matches_the_native_verifier(kernelbench, where):
    native = native_rewards()
    from kernelzero.envs.verifiers_taskset import KernelZeroConfig

    def rewards(url: str | None):
        config = KernelZeroConfig(id="kernelzero", source=str(kernelbench), task={"service_url": url})
        (task,) = list(vf.load_taskset(config))
        return {case: scored(task, completion) for case, completion in COMPLETIONS.items()}

    if where == "service":
        with running_service(ServiceConfig(device="cpu", workers=2, port=0, timeout_s=90)) as service:
            got = rewards(service.url)
    else:
        got = rewards(None)
    assert got == native and got["honest"][0] == 1.0 and got["hacked"][0] == 0.0

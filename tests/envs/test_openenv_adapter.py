"""OpenEnv: KernelZero's environment served by OpenEnv's own server and driven by its client over a real socket;
each attempt's reward equals the native verifier's on honest, wrong and hacked completions, and a rejected
attempt's observation carries the verdict's feedback. Runs where ``kernelzero[envs-openenv]`` is installed (its
own environment: openenv 0.10.0 needs fastmcp, mcp<2); skipped elsewhere."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("openenv.core.env_server.http_server")

from kernel_cases import COMPLETIONS, TASK, native_rewards  # noqa: E402

from core.serve.service import ServiceConfig, bind, running_service, url_of, uvicorn_server  # noqa: E402
from core.task import Task  # noqa: E402
from kernelzero.envs.judge import KernelJudge  # noqa: E402
from kernelzero.envs.openenv import KernelAction, KernelZeroEnvClient, create_kernelzero_app  # noqa: E402


@pytest.fixture(scope="module")
def env_url():
    with running_service(ServiceConfig(device="cpu", workers=2, port=0, timeout_s=90)) as service:
        app = create_kernelzero_app([Task(TASK, name="relu")], KernelJudge(service_url=service.url), max_turns=2)
        sock = bind("127.0.0.1", 0)
        server = uvicorn_server(app)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.05)
        yield url_of(sock)
        server.should_exit = True
        thread.join(timeout=30)


def test_reset_and_step_give_the_native_verifiers_rewards(env_url):
    native = native_rewards()
    got = {}
    with KernelZeroEnvClient(base_url=env_url).sync() as env:
        for case, completion in COMPLETIONS.items():
            first = env.reset(seed=1)
            assert "ModelNew" in first.observation.prompt and first.observation.task_id == Task(TASK).id
            result = env.step(KernelAction(completion=completion))
            got[case] = (result.reward, result.observation.status)
            if case == "honest":
                assert result.done and result.observation.accepted and result.observation.feedback is None
            else:  # rejected: feedback, and one more turn (max_turns=2)
                assert not result.done and result.observation.feedback.startswith("# Verdict: rejected")
                again = env.step(KernelAction(completion=COMPLETIONS["honest"]))
                assert again.done and again.reward == 1.0 and again.observation.turn == 2
    assert got == native


def test_an_unknown_task_id_is_an_error_that_names_the_count(env_url):
    with KernelZeroEnvClient(base_url=env_url).sync() as env, pytest.raises(Exception, match="no task 'nope'"):
        env.reset(task_id="nope")

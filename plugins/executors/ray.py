"""``executor=ray``: verification shards as Ray actors, on a local Ray instance or any cluster (see
:mod:`core.verification.executor`).

Ray is imported only when a :class:`RayExecutor` is built (or :func:`init_ray` called), so
registering this plugin costs nothing and works where Ray is not installed.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
from collections.abc import Mapping
from typing import Any

from core import hookimpl
from core.api.executor import (
    DEFAULT_VERIFIER,
    REPO_ROOT,
    BaseExecutor,
    ExecutorError,
    ShardLost,
    ShardSet,
    load_object,
    verify_encoded,
)


class RayExecutor(BaseExecutor):
    """Shards as Ray actors: one per GPU in the cluster (each reserves ``num_gpus=1``; Ray pins it), or
    CPU actors of ``workers_per_actor`` interpreter workers each.

    :param address: Ray cluster address (``null``: start or join a local instance; ``auto``: the
        running cluster).
    :param actors: number of actors (``null``: every GPU of the cluster, or cluster CPUs // workers).
    :param workers_per_actor: sandbox workers in each actor's pool (CPUs it reserves).
    :param init_kwargs: extra ``ray.init`` arguments (``num_cpus``, ``runtime_env`` ...).
    """

    name = "ray"

    def __init__(self, backend: str, device: str, verifier: Mapping[str, Any] | None = None, *,
                 address: str | None = None, actors: int | None = None, workers_per_actor: int = 2,
                 init_kwargs: Mapping[str, Any] | None = None, cpu_stage: Mapping[str, Any] | None = None,
                 max_attempts: int = 3, verifier_path: str = DEFAULT_VERIFIER, extra_in_flight: int = 1,
                 shutdown_on_close: bool | None = None):
        super().__init__(backend, device, verifier, cpu_stage, max_attempts, verifier_path)
        try:
            import ray
        except ImportError:
            raise ExecutorError("executor=ray needs Ray: pip install 'kernelzero[ray]' "
                                "(or use executor=local)") from None
        self.ray = ray
        self.verifier_kwargs.pop("workers", None)
        self._started_ray = False
        if not ray.is_initialized():
            init_ray(address, **dict(init_kwargs or {}))
            self._started_ray = True
        self.shutdown_on_close = self._started_ray if shutdown_on_close is None else shutdown_on_close
        self.workers_per_actor = int(workers_per_actor)
        resources = ray.cluster_resources()
        gpu = device == "cuda"
        if gpu and resources.get("GPU", 0) < 1:
            raise ExecutorError("device=cuda but the Ray cluster has no GPU; use device=cpu or add GPU nodes")
        if actors is None:
            actors = int(resources.get("GPU", 0)) if gpu else max(1, int(resources.get("CPU", 1)) // self.workers_per_actor)
        self._actor_cls = ray.remote(_VerifierActor)
        self._serial = 0
        self.main = ShardSet([self._start(device, gpu) for _ in range(int(actors))],
                             replace=lambda old: self._start(device, gpu), extra_in_flight=extra_in_flight)
        if self.cpu_stage:
            n = int(self.cpu_stage.get("actors") or 1)
            checks = list(self.cpu_stage["checks"])
            self.pre = ShardSet([self._start("cpu", False, checks) for _ in range(n)],
                                replace=lambda old: self._start("cpu", False, checks), extra_in_flight=extra_in_flight)

    def _start(self, device: str, gpu: bool, checks: Any = "inherit") -> RayShard:
        self._serial += 1
        options = {"num_gpus": 1, "num_cpus": 1} if gpu else {"num_cpus": self.workers_per_actor}
        options["max_concurrency"] = self.workers_per_actor + 2  # threaded actor: verify calls overlap
        actor = self._actor_cls.options(**options).remote(
            self.verifier_path, self.verifier_config(device, self.workers_per_actor, checks))
        shard = RayShard(f"ray-{'gpu' if gpu else 'cpu'}{self._serial}", actor, self.workers_per_actor, self.ray)
        shard.wait_ready()
        return shard

    def close(self) -> None:
        super().close()
        if self.shutdown_on_close and self.ray.is_initialized():
            self.ray.shutdown()


def init_ray(address: str | None = None, **init_kwargs: Any) -> None:
    """``ray.init`` with what actors need to import KernelZero and run the interpreter: the repo on
    ``PYTHONPATH`` and the Triton/KernelZero environment variables, for every worker of the job."""
    import ray

    env_vars = {"PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)}
    for k in ("TRITON_INTERPRET", "TRITON_DEFAULT_FP_FUSION", "KERNELZERO_DISABLE_AUTOLOAD", "KERNELZERO_BLOCK_PLUGINS"):
        if k in os.environ:
            env_vars[k] = os.environ[k]
    runtime_env = dict(init_kwargs.pop("runtime_env", None) or {})
    runtime_env["env_vars"] = {**env_vars, **dict(runtime_env.get("env_vars") or {})}
    kwargs = {"address": address, "include_dashboard": False, "log_to_driver": False, "runtime_env": runtime_env}
    kwargs.update(init_kwargs)
    ray.init(**kwargs)


class _VerifierActor:
    """The Ray actor: one Verifier whose sandbox workers see only the actor's GPU."""

    def __init__(self, verifier_path: str, kwargs: dict[str, Any]):
        self.verifier = load_object(verifier_path)(**kwargs)
        if hasattr(self.verifier, "__enter__"):
            self.verifier = self.verifier.__enter__() or self.verifier

    def ready(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}

    def verify_many(self, data: list[list[dict[str, Any]]]) -> list[str]:
        return verify_encoded(self.verifier, data)

    def shutdown(self) -> None:
        exit_ = getattr(self.verifier, "__exit__", None)
        if exit_ is not None:
            exit_(None, None, None)


class RayShard:
    def __init__(self, name: str, actor: Any, capacity: int, ray: Any):
        self.name, self.actor, self.capacity, self.ray = name, actor, capacity, ray
        self.info: dict[str, Any] = {}

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        try:
            self.info = self.ray.get(self.actor.ready.remote(), timeout=timeout_s)
        except Exception as exc:
            raise ExecutorError(f"Ray actor {self.name} did not start: {exc}") from None

    @property
    def pid(self) -> int:
        return int(self.info["pid"])

    def submit(self, data: list[list[dict[str, Any]]]) -> cf.Future:
        inner = self.actor.verify_many.remote(data).future()
        outer: cf.Future = cf.Future()

        def relay(f: cf.Future) -> None:
            try:
                outer.set_result(f.result())
            except (self.ray.exceptions.RayActorError, self.ray.exceptions.ActorUnavailableError,
                    self.ray.exceptions.NodeDiedError, self.ray.exceptions.WorkerCrashedError) as exc:
                outer.set_exception(ShardLost(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"))
            except Exception as exc:
                outer.set_exception(exc)

        inner.add_done_callback(relay)
        return outer

    def close(self) -> None:
        try:
            self.ray.get(self.actor.shutdown.remote(), timeout=30)
        except Exception:
            pass
        try:
            self.ray.kill(self.actor)
        except Exception:
            pass


@hookimpl
def register_executors(register):
    register(RayExecutor.name, RayExecutor)

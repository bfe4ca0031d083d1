"""``executor=local``: verification shards on this machine, one host process per GPU, or one
in-process pool of interpreter workers on CPU (see :mod:`core.verification.executor`).

Every run needs an executor, so this plugin cannot be blocked (``core.plugins.UNBLOCKABLE_PLUGINS``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from core import hookimpl
from core.api.executor import (
    DEFAULT_VERIFIER,
    BaseExecutor,
    ExecutorError,
    InProcessShard,
    ProcessShard,
    ShardSet,
    load_object,
)


def _visible_gpus(device: str, gpus: Sequence[int] | None) -> list[int]:
    if device != "cuda":
        return []
    if gpus:
        return list(gpus)
    import torch

    count = torch.cuda.device_count()
    if count == 0:
        raise ExecutorError("device=cuda but no GPU is visible; use device=cpu (the Triton interpreter) or a GPU host")
    return list(range(count))


def _cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


# ``workers_per_gpu: auto``: one verification per ``gib_per_worker`` of GPU memory (the admission of
# core.verification.gpumemory still lets a large task run alone), and per two cores (its candidate
# worker and its keeper), at most AUTO_MAX_WORKERS. KernelBench at its real sizes needs the default's
# 20 GiB; a training run's tasks (proposer sizes) a few (experiment=hub_grpo: 4).
AUTO_GIB_PER_WORKER = 20
AUTO_MAX_WORKERS = 8


def auto_workers_per_gpu(gpu_total_bytes: int | None, cores: int, gpus: int,
                         gib_per_worker: float = AUTO_GIB_PER_WORKER) -> int:
    """Verifications per GPU sized to its memory and to this host's cores shared by ``gpus`` shards."""
    if gib_per_worker <= 0:
        raise ExecutorError(f"executor.gib_per_worker must be > 0, got {gib_per_worker}")
    by_cores = max(1, cores // max(1, gpus) // 2)
    by_memory = max(1, int((gpu_total_bytes or 0) / 2**30 // gib_per_worker)) if gpu_total_bytes else by_cores
    return max(1, min(by_cores, by_memory, AUTO_MAX_WORKERS))


def _gpu_total_bytes(index: int) -> int | None:
    try:
        import torch

        return int(torch.cuda.get_device_properties(index).total_memory)
    except Exception:
        return None


class LocalExecutor(BaseExecutor):
    """Shards on this machine: one host process per GPU, or one in-process pool on CPU.

    :param workers_per_gpu: sandbox workers in each GPU's pool; ``"auto"``: sized to the GPU's memory
        (one per ``gib_per_worker``) and the host's cores (:func:`auto_workers_per_gpu`).
    :param cpu_workers: interpreter workers per CPU shard (``null``: one per core, shared among shards).
    :param cpu_shards: CPU shards (host processes when more than one).
    :param gpus: GPU indices to use (``null``: every visible GPU).
    :param processes: force host processes even for a single CPU shard (so a shard can be lost and
        replaced; GPU shards always are processes).
    :param dispatch: ``"memory"`` (default): a GPU shard with a free slot starts the first pair whose
        estimated footprint fits beside those it runs (:mod:`core.verification.dispatch`); ``"fifo"``:
        strictly in order.
    """

    name = "local"

    def __init__(self, backend: str, device: str, verifier: Mapping[str, Any] | None = None, *,
                 workers_per_gpu: int | str = "auto", cpu_workers: int | None = None, cpu_shards: int = 1,
                 gpus: Sequence[int] | None = None, processes: bool = False, cpu_stage: Mapping[str, Any] | None = None, max_attempts: int = 3,
                 verifier_path: str = DEFAULT_VERIFIER, extra_in_flight: int = 1, dispatch: str = "memory",
                 gib_per_worker: float = AUTO_GIB_PER_WORKER):
        super().__init__(backend, device, verifier, cpu_stage, max_attempts, verifier_path, dispatch)
        gpu_ids = _visible_gpus(device, gpus)
        self._serial = 0
        if isinstance(workers_per_gpu, str):
            if workers_per_gpu.strip().lower() != "auto":
                workers_per_gpu = int(workers_per_gpu)
            else:
                smallest = min((_gpu_total_bytes(g) or 0 for g in gpu_ids), default=0) or None
                workers_per_gpu = auto_workers_per_gpu(smallest, _cores(), len(gpu_ids) or 1, gib_per_worker)
        if gpu_ids:
            env: dict[str, str] = {}
            if "OMP_NUM_THREADS" not in os.environ:  # the host's cores shared by every shard's workers
                keepers = int(self.verifier_kwargs.get("reference_workers", 1))
                if self.verifier_kwargs.get("compare_on_device") is not False:  # each verdict holds one
                    keepers = max(keepers, workers_per_gpu)
                per_shard = workers_per_gpu + keepers
                env["OMP_NUM_THREADS"] = str(max(1, _cores() // max(1, len(gpu_ids) * per_shard)))
            specs = [(f"gpu{g}", "cuda", workers_per_gpu, {"CUDA_VISIBLE_DEVICES": str(g), **env}) for g in gpu_ids]
        else:
            workers = cpu_workers or max(1, _cores() // max(1, cpu_shards))
            specs = [(f"cpu{k}", "cpu", int(workers), {}) for k in range(max(1, cpu_shards))]
        self.verifier_kwargs.pop("workers", None)
        use_processes = processes or bool(gpu_ids) or len(specs) > 1
        shards = []
        try:
            for name, dev, workers, env in specs:
                shards.append(self._start(name, dev, workers, env, use_processes))
            self.main = ShardSet(shards, replace=self._replacer() if use_processes else None, extra_in_flight=extra_in_flight)
            if self.cpu_stage:
                n = int(self.cpu_stage.get("workers") or _cores())
                pre = self._start("cpu-stage", "cpu", n, {"CUDA_VISIBLE_DEVICES": ""}, True,
                                  checks=list(self.cpu_stage["checks"]))
                self.pre = ShardSet([pre], replace=self._replacer(), extra_in_flight=extra_in_flight)
        except Exception:
            for s in shards:
                s.close()
            raise

    def _start(self, name: str, device: str, workers: int, env: Mapping[str, str], process: bool,
               checks: Any = "inherit") -> Any:
        kwargs = self.verifier_config(device, workers, checks)
        if not process:
            verifier = load_object(self.verifier_path)(**kwargs)
            if hasattr(verifier, "__enter__"):
                verifier = verifier.__enter__() or verifier
            return InProcessShard(name, verifier, workers)
        shard = ProcessShard(name, self.verifier_path, kwargs, workers, env)
        shard.spec = (name, device, workers, dict(env), checks)  # type: ignore[attr-defined]
        return shard

    def _replacer(self) -> Callable[[Any], Any]:
        def replace(old: Any) -> Any:
            name, device, workers, env, checks = old.spec
            self._serial += 1
            new = self._start(f"{name.split('~')[0]}~{self._serial}", device, workers, env, True, checks)
            return new
        return replace


@hookimpl
def register_executors(register):
    register(LocalExecutor.name, LocalExecutor)

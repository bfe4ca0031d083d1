"""The executor base an executor plugin (``register_executors``) builds on, as Hydra's launchers build on
``hydra.plugins.launcher.Launcher``.

``BaseExecutor`` spreads pairs over shards (``Shard``) and schedules them; a plugin supplies the shards
(``InProcessShard``/``ProcessShard`` on one host, Ray actors on a cluster) in a ``ShardSet``.
``ExecutorError`` is a configuration a user must change; ``ShardLost`` a shard that died, whose pairs are
retried elsewhere. ``load_object("module:Name")``, ``verify_encoded`` and ``DEFAULT_VERIFIER`` carry a
verifier across processes.
"""

from __future__ import annotations

from core.api._forward import forwarding

__all__, __getattr__ = forwarding(__name__, {
    "core.verification.executor": (
        "DEFAULT_VERIFIER", "REPO_ROOT", "BaseExecutor", "ExecutorError", "InProcessShard", "ProcessShard", "Shard",
        "ShardLost", "ShardSet", "PairFeed", "load_object", "verify_encoded"),
})

"""The plugin manager and the name -> factory registries built from it.

Built-in plugins are listed by module path in :data:`BUILTIN_PLUGINS` and loaded by the same call
that loads third-party packages from the ``kernelzero`` entry-point group, so core never imports a
concrete plugin by name in code.

Environment variables:

``KERNELZERO_DISABLE_AUTOLOAD=1``
    do not load third-party entry points (tests use this for a clean, predictable manager).
``KERNELZERO_BLOCK_PLUGINS=name1,name2``
    never register the named plugins (entry-point names or built-in module paths).
"""

from __future__ import annotations

import importlib
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import pluggy

from core import hookspecs

# One line per built-in plugin module; each registers itself through the hooks in core.hookspecs.
BUILTIN_PLUGINS: tuple[str, ...] = (
    "plugins.ops.elementwise",
    "plugins.ops.reductions",
    "plugins.ops.norms",
    "plugins.ops.matmul",
    "plugins.ops.conv",
    "plugins.ops.pool",
    "plugins.ops.layout",
    "plugins.ops.attention",
    "plugins.proposers.random_proposer",
    "plugins.proposers.mcts",
    "plugins.rewards.builtin",
    "plugins.curricula.builtin",
    "plugins.backends.triton_backend",
    "plugins.verifiers.builtin",
    "plugins.backends.cuda_backend",
    "plugins.devices",
    "plugins.verifiers.performance",
    "plugins.verifiers.sanitizer",
    "plugins.curricula.adaptive",
    "plugins.coders.llm",
    "plugins.coders.expert",
    "plugins.coders.inductor",
    "plugins.trainers",
)

ENV_DISABLE_AUTOLOAD = "KERNELZERO_DISABLE_AUTOLOAD"
ENV_BLOCK = "KERNELZERO_BLOCK_PLUGINS"

# Registry kinds and the hook that fills each.
REGISTRY_HOOKS: dict[str, str] = {
    "op": "register_ops",
    "proposer": "register_proposers",
    "backend": "register_backends",
    "verifier": "register_verifiers",
    "reward": "register_rewards",
    "coder": "register_coders",
    "curriculum": "register_curricula",
    "device": "register_devices",
    "executor": "register_executors",
    "trainer": "register_trainers",
}


class PluginError(Exception):
    """A plugin could not be loaded or registered something invalid."""


class UnknownPluginError(KeyError, PluginError):
    """A name in the config matches nothing that was registered."""

    def __init__(self, kind: str, name: str, known: list[str]):
        self.kind, self.name, self.known = kind, name, sorted(known)
        super().__init__(
            f"Unknown {kind} {name!r}. Known {kind}s: {', '.join(self.known) or '(none registered)'}"
        )

    def __str__(self) -> str:  # KeyError would otherwise quote the whole message
        return self.args[0]


@dataclass
class Registry:
    """Names to factories for one kind of plugin (``backend``, ``reward`` ...)."""

    kind: str
    entries: dict[str, Callable[..., Any]] = field(default_factory=dict)
    owners: dict[str, str] = field(default_factory=dict)

    def register(self, name: str, factory: Callable[..., Any], owner: str = "?") -> None:
        if not isinstance(name, str) or not name:
            raise PluginError(f"plugin {owner!r} registered a {self.kind} with an empty or non-string name")
        if name in self.entries:
            raise PluginError(
                f"{self.kind} {name!r} is registered twice: by {self.owners[name]!r} and by {owner!r}"
            )
        self.entries[name] = factory
        self.owners[name] = owner

    def get(self, name: str) -> Callable[..., Any]:
        try:
            return self.entries[name]
        except KeyError:
            raise UnknownPluginError(self.kind, name, list(self.entries)) from None

    def create(self, name: str, /, **kwargs: Any) -> Any:
        """Build the named plugin, passing its config node as keyword arguments."""
        return self.get(name)(**kwargs)

    def names(self) -> list[str]:
        return sorted(self.entries)

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


def _blocked() -> set[str]:
    return {n.strip() for n in os.environ.get(ENV_BLOCK, "").split(",") if n.strip()}


def make_plugin_manager(*, autoload: bool | None = None, builtins: bool = True) -> pluggy.PluginManager:
    """A fresh manager with the hook specs, the built-ins and (unless disabled) entry points.

    :param autoload: load third-party entry points; defaults to ``KERNELZERO_DISABLE_AUTOLOAD`` unset.
    :param builtins: register :data:`BUILTIN_PLUGINS`.
    """
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    blocked = _blocked()
    for name in blocked:
        pm.set_blocked(name)
    if builtins:
        for modname in BUILTIN_PLUGINS:
            if modname in blocked:
                continue
            pm.register(importlib.import_module(modname), name=modname)
    if autoload is None:
        autoload = os.environ.get(ENV_DISABLE_AUTOLOAD, "") in ("", "0", "false", "False")
    if autoload:
        # Third-party plugins are registered after built-ins, so pluggy calls them first.
        pm.load_setuptools_entrypoints(hookspecs.PROJECT_NAME)
    pm.check_pending()
    return pm


_lock = threading.RLock()
_pm: pluggy.PluginManager | None = None
_registries: dict[str, Registry] = {}


def get_plugin_manager() -> pluggy.PluginManager:
    """The process-wide manager, created on first use."""
    global _pm
    with _lock:
        if _pm is None:
            _pm = make_plugin_manager()
        return _pm


def set_plugin_manager(pm: pluggy.PluginManager | None) -> None:
    """Replace the process-wide manager (tests) and forget every registry built from the old one."""
    global _pm
    with _lock:
        _pm = pm
        _registries.clear()


def _plugin_name(pm: pluggy.PluginManager, impl: Any) -> str:
    return pm.get_name(impl.plugin) or repr(impl.plugin)


def build_registry(kind: str, pm: pluggy.PluginManager | None = None) -> Registry:
    """Call every implementation of the registry hook of ``kind`` and collect what it registers."""
    if kind not in REGISTRY_HOOKS:
        raise UnknownPluginError("registry kind", kind, list(REGISTRY_HOOKS))
    pm = pm or get_plugin_manager()
    hook_name = REGISTRY_HOOKS[kind]
    registry = Registry(kind)
    hook_caller = getattr(pm.hook, hook_name)
    # Call implementations one at a time so every registration knows its owner.
    for impl in reversed(hook_caller.get_hookimpls()):
        owner = _plugin_name(pm, impl)
        impl.function(register=lambda n, f, _o=owner: registry.register(n, f, owner=_o))
    return registry


def registry(kind: str) -> Registry:
    """The cached registry of ``kind`` for the process-wide manager."""
    with _lock:
        if kind not in _registries:
            _registries[kind] = build_registry(kind)
        return _registries[kind]


def create(kind: str, name: str, /, **kwargs: Any) -> Any:
    """Shorthand for ``registry(kind).create(name, **kwargs)``."""
    return registry(kind).create(name, **kwargs)


def register_configs(config_store: Any, pm: pluggy.PluginManager | None = None) -> None:
    """Let every plugin store its Hydra config groups (see ``hookspecs.register_configs``)."""
    (pm or get_plugin_manager()).hook.register_configs(config_store=config_store)


def notify(event: str, **kwargs: Any) -> None:
    """Fire an event hook (``on_verdict``, ``on_step_end``, ``on_round_end``) on every plugin."""
    getattr(get_plugin_manager().hook, event)(**kwargs)

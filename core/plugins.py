"""The plugin manager and the name -> factory registries built from it.

Built-in plugins are listed by module path in :data:`BUILTIN_PLUGINS` and loaded by the same call
that loads third-party packages from the ``kernelzero`` entry-point group, so core never imports a
concrete plugin by name in code.

Environment variables:

``KERNELZERO_DISABLE_AUTOLOAD=1``
    do not load third-party entry points (tests use this for a clean, predictable manager).
``KERNELZERO_BLOCK_PLUGINS=name1,name2``
    never register the named plugins (entry-point names or built-in module paths). The plugins in
    :data:`UNBLOCKABLE_PLUGINS` are always registered: naming one warns and is otherwise ignored.
``KERNELZERO_TRACE_PLUGINS=1``
    print every hook call, its implementations and what it returned, to stderr (pluggy's
    ``add_hookcall_monitoring``; as ``DATASETTE_TRACE_PLUGINS`` does).

``python -m core.plugins`` lists every plugin, where it came from and what it registered.
"""

from __future__ import annotations

import importlib
import inspect
import os
import threading
import warnings
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
    "plugins.proposers.replay",
    "plugins.rewards.builtin",
    "plugins.curricula.builtin",
    "plugins.backends.triton_backend",
    "plugins.verifiers.builtin",
    "plugins.verifiers.tamper",
    "plugins.backends.cuda_backend",
    "plugins.backends.load_inline",
    "plugins.devices",
    "plugins.verifiers.performance",
    "plugins.verifiers.sanitizer",
    "plugins.verifiers.gpu_activity",
    "plugins.verifiers.interp_races",
    "plugins.curricula.adaptive",
    "plugins.coders.llm",
    "plugins.coders.expert",
    "plugins.coders.inductor",
    "plugins.executors.local",
    "plugins.executors.ray",
    "plugins.trainers",
)

# Built-ins every run needs, which KERNELZERO_BLOCK_PLUGINS cannot remove: without the local
# executor nothing could verify a candidate.
UNBLOCKABLE_PLUGINS: frozenset[str] = frozenset({"plugins.executors.local"})

ENV_DISABLE_AUTOLOAD = "KERNELZERO_DISABLE_AUTOLOAD"
ENV_BLOCK = "KERNELZERO_BLOCK_PLUGINS"
ENV_TRACE = "KERNELZERO_TRACE_PLUGINS"

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
    named = {n.strip() for n in os.environ.get(ENV_BLOCK, "").split(",") if n.strip()}
    for name in sorted(named & UNBLOCKABLE_PLUGINS):
        warnings.warn(f"{ENV_BLOCK} names {name!r}, which cannot be blocked (every run needs it); "
                      "it stays registered", stacklevel=3)
    return named - UNBLOCKABLE_PLUGINS


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
    if _tracing():
        _trace_hook_calls(pm)
    return pm


def _tracing() -> bool:
    return os.environ.get(ENV_TRACE, "") not in ("", "0", "false", "False")


def _trace_hook_calls(pm: pluggy.PluginManager) -> None:
    import sys

    def before(hook_name: str, impls: list[Any], kwargs: dict[str, Any]) -> None:
        names = ", ".join(_plugin_name(pm, i) for i in impls)
        print(f"[kernelzero] hook {hook_name}({', '.join(kwargs)}) -> {len(impls)} impl(s): {names}", file=sys.stderr)

    def after(outcome: Any, hook_name: str, impls: list[Any], kwargs: dict[str, Any]) -> None:
        error = outcome.exception
        result = f"raised {type(error).__name__}: {error}" if error else f"returned {outcome.get_result()!r}"[:200]
        print(f"[kernelzero] hook {hook_name} {result}", file=sys.stderr)

    pm.add_hookcall_monitoring(before, after)


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
    """Call the registry hook of ``kind`` through pluggy and collect what every implementation registers.

    The hook is called once, as pluggy calls any hook, so ``hookwrapper=True`` and ``wrapper=True``
    implementations run around the others (and may register names themselves). Each registration is
    owned by the implementation whose code made it: the innermost frame of the calling stack that
    runs one of the hook's implementations (a helper it calls to register is fine).
    """
    if kind not in REGISTRY_HOOKS:
        raise UnknownPluginError("registry kind", kind, list(REGISTRY_HOOKS))
    pm = pm or get_plugin_manager()
    hook_name = REGISTRY_HOOKS[kind]
    registry = Registry(kind)
    hook_caller = getattr(pm.hook, hook_name)
    impls = list(reversed(hook_caller.get_hookimpls()))  # pluggy's calling order (the last registered first)
    by_code: dict[Any, list[Any]] = {}
    for impl in impls:
        for fn in {impl.function, inspect.unwrap(impl.function)}:
            code = getattr(fn, "__code__", None)
            if code is not None and impl not in by_code.setdefault(code, []):
                by_code[code].append(impl)
    added: dict[str, list[str]] = {_plugin_name(pm, impl): [] for impl in impls}

    def owner_of_caller() -> str:
        frame = inspect.currentframe()
        frame = frame.f_back.f_back if frame is not None and frame.f_back is not None else None
        while frame is not None:
            candidates = by_code.get(frame.f_code)
            if candidates:
                if len(candidates) > 1:  # one function (a method) shared by several plugins: match its ``self``
                    this = frame.f_locals.get("self")
                    candidates = [i for i in candidates if i.plugin is this] or candidates
                return _plugin_name(pm, candidates[0])
            frame = frame.f_back
        return "?"

    def register(name: str, factory: Callable[..., Any]) -> None:
        owner = owner_of_caller()
        registry.register(name, factory, owner=owner)
        added.setdefault(owner, []).append(name)

    hook_caller(register=register)
    if _tracing():  # one line per implementation, with what it registered
        import sys

        for owner, names in added.items():
            print(f"[kernelzero] hook {hook_name}(register) by {owner}: {', '.join(sorted(names)) or 'nothing'}",
                  file=sys.stderr)
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



# --------------------------------------------------------------------------- listing (python -m core.plugins)
# As ``llm plugins`` or ``pytest --trace-config`` do: a user can see which package provides a name.


@dataclass
class PluginInfo:
    """One registered plugin.

    :param name: the plugin's name in the manager (built-ins: their module path).
    :param origin: ``"built-in"``, ``"entry point <dist> <version>"`` or ``"registered at runtime"``.
    :param module: the module that implements its hooks.
    :param registered: registry kind -> names this plugin registered there.
    :param hooks: every hook it implements.
    """

    name: str
    origin: str
    module: str
    registered: dict[str, list[str]] = field(default_factory=dict)
    hooks: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "origin": self.origin, "module": self.module,
                "registered": self.registered, "hooks": self.hooks}


def list_plugins(pm: pluggy.PluginManager | None = None) -> list[PluginInfo]:
    """Every plugin of ``pm`` (default: the process-wide manager), built-ins first, in load order."""
    pm = pm or get_plugin_manager()
    dists = {id(plugin): dist for plugin, dist in pm.list_plugin_distinfo()}
    infos: dict[str, PluginInfo] = {}
    for plugin in pm.get_plugins():
        name = pm.get_name(plugin) or repr(plugin)
        if name in BUILTIN_PLUGINS:
            origin = "built-in"
        elif id(plugin) in dists:
            dist = dists[id(plugin)]
            origin = f"entry point {dist.project_name} {dist.version}"
        else:
            origin = "registered at runtime"
        module = plugin.__name__ if inspect.ismodule(plugin) else type(plugin).__module__
        hooks = sorted(h.name for h in pm.get_hookcallers(plugin) or [])
        infos[name] = PluginInfo(name, origin, module, hooks=hooks)
    for kind in REGISTRY_HOOKS:
        reg = build_registry(kind, pm)
        for entry in reg.names():
            owner = infos.get(reg.owners[entry])
            if owner is not None:
                owner.registered.setdefault(kind, []).append(entry)
    order = {n: i for i, n in enumerate(BUILTIN_PLUGINS)}
    return sorted(infos.values(), key=lambda i: (i.origin != "built-in", order.get(i.name, 0), i.name))


def print_listing(infos: list[PluginInfo]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="KernelZero plugins")
    for column in ("plugin", "from", "registered", "event hooks"):
        table.add_column(column, overflow="fold")
    for info in infos:
        registered = "\n".join(f"{kind}: {', '.join(names)}" for kind, names in sorted(info.registered.items()))
        events = ", ".join(h for h in info.hooks if not h.startswith("register_"))
        table.add_row(info.name, info.origin, registered or "-", events or "-")
    Console().print(table)


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="python -m core.plugins",
                                     description="List every loaded plugin and what it registered.")
    parser.add_argument("--json", action="store_true", help="one JSON object per plugin")
    args = parser.parse_args(argv)
    try:
        infos = list_plugins()
    except PluginError as exc:
        print(f"error: {exc}")
        return 2
    if args.json:
        for info in infos:
            print(json.dumps(info.to_dict(), sort_keys=True))
    else:
        print_listing(infos)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())

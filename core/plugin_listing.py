"""What is loaded: every plugin, where it came from and what it registered (``python -m core.plugins``).

As ``llm plugins`` or ``pytest --trace-config`` do: a user can see which package provides a name
before asking why a config option does not exist.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import pluggy

from core import plugins


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
    pm = pm or plugins.get_plugin_manager()
    dists = {id(plugin): dist for plugin, dist in pm.list_plugin_distinfo()}
    infos: dict[str, PluginInfo] = {}
    for plugin in pm.get_plugins():
        name = pm.get_name(plugin) or repr(plugin)
        if name in plugins.BUILTIN_PLUGINS:
            origin = "built-in"
        elif id(plugin) in dists:
            dist = dists[id(plugin)]
            origin = f"entry point {dist.project_name} {dist.version}"
        else:
            origin = "registered at runtime"
        module = plugin.__name__ if inspect.ismodule(plugin) else type(plugin).__module__
        hooks = sorted(h.name for h in pm.get_hookcallers(plugin) or [])
        infos[name] = PluginInfo(name, origin, module, hooks=hooks)
    for kind in plugins.REGISTRY_HOOKS:
        reg = plugins.build_registry(kind, pm)
        for entry in reg.names():
            owner = infos.get(reg.owners[entry])
            if owner is not None:
                owner.registered.setdefault(kind, []).append(entry)
    order = {n: i for i, n in enumerate(plugins.BUILTIN_PLUGINS)}
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
    except plugins.PluginError as exc:
        print(f"error: {exc}")
        return 2
    if args.json:
        for info in infos:
            print(json.dumps(info.to_dict(), sort_keys=True))
    else:
        print_listing(infos)
    return 0

"""Turning composed Hydra config nodes into plugin instances, and Hydra start-up shared by commands."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from core.plugins import create, get_plugin_manager, register_configs


def conf_dir(source: str | None = None) -> str:
    """The Hydra config tree: ``conf/`` beside the packages in a source tree or an editable install,
    else where a wheel installs it (``<prefix>/share/kernelzero/conf``, pyproject's data-files)."""
    import site
    import sysconfig
    from pathlib import Path

    source = Path(source) if source is not None else Path(__file__).resolve().parent.parent / "conf"
    candidates = [source, Path(sysconfig.get_paths()["data"]) / "share" / "kernelzero" / "conf",
                  Path(site.getuserbase()) / "share" / "kernelzero" / "conf"]
    for candidate in candidates:
        if (candidate / "config.yaml").is_file():
            return str(candidate)
    return str(source)  # Hydra then says which config it could not find, under this path


def node_kwargs(node: DictConfig | dict | None) -> tuple[str, dict[str, Any]]:
    """Split a group node ``{name: x, **kwargs}`` into the plugin name and its keyword arguments."""
    data = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node or {})
    if "name" not in data:
        raise ValueError(f"config node {data!r} has no 'name' key selecting a plugin")
    name = data.pop("name")
    return str(name), data


def build(kind: str, node: DictConfig | dict | None, **extra: Any) -> Any:
    """Create the plugin ``node.name`` of registry ``kind`` with the node's keys (plus ``extra``)."""
    name, kwargs = node_kwargs(node)
    kwargs.update(extra)
    return create(kind, name, **kwargs)


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when a GPU is visible, else ``cpu`` (kernels then run in the Triton interpreter)."""
    if device != "auto":
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device must be auto, cpu or cuda; got {device!r}")
        return device
    from core.api.devices import cuda_visible  # without importing torch: a one-shot verify's workers start first

    return "cuda" if cuda_visible() else "cpu"


_configs_registered = False


def store_plugin_configs() -> None:
    """Let plugins add their Hydra config groups (``register_configs``) before composition. Idempotent."""
    global _configs_registered
    if _configs_registered:
        return
    from hydra.core.config_store import ConfigStore

    register_configs(ConfigStore.instance(), get_plugin_manager())
    _configs_registered = True

"""``python -m core.plugins``: every plugin, where it came from, what it registered; hook tracing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from core import hookimpl
from core.plugins import list_plugins

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "kernelzero-brevity"


class _ExtraBackend:
    @hookimpl
    def register_backends(self, register):
        register("listing_test_backend", dict)

    @hookimpl
    def on_round_end(self, round_index, metrics):
        pass


def test_listing_names_builtins_and_a_runtime_plugin_with_what_each_registered(register_plugin):
    register_plugin(_ExtraBackend(), name="listing-test")
    infos = {i.name: i for i in list_plugins()}
    triton = infos["plugins.backends.triton_backend"]
    assert triton.origin == "built-in"
    assert triton.registered == {"backend": ["triton"]}
    extra = infos["listing-test"]
    assert extra.origin == "registered at runtime"
    assert extra.registered == {"backend": ["listing_test_backend"]}
    assert "on_round_end" in extra.hooks and "register_backends" in extra.hooks
    # every registered name of every kind is owned by exactly one listed plugin
    owned = [(k, n) for i in infos.values() for k, names in i.registered.items() for n in names]
    assert len(owned) == len(set(owned))
    assert ("verifier", "correctness") in owned and ("device", "H200") in owned


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "KERNELZERO_DISABLE_AUTOLOAD"}
    env.update(extra)
    return env


def test_cli_shows_an_entry_point_plugin_and_its_distribution(tmp_path):
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(EXAMPLE)], check=True, capture_output=True, text=True)
    proc = subprocess.run([sys.executable, "-m", "core.plugins", "--json"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=_env(PYTHONPATH=os.pathsep.join([str(site), str(ROOT)])))
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    third = [r for r in rows if r["origin"].startswith("entry point")]
    assert len(third) == 1, rows
    assert third[0]["origin"].startswith("entry point kernelzero-brevity ")
    assert third[0]["registered"]["reward"] == ["brevity"]
    assert rows[0]["origin"] == "built-in"  # built-ins first
    assert {r["name"] for r in rows if r["origin"] == "built-in"} >= {"plugins.backends.triton_backend"}


def test_trace_env_var_prints_hook_calls_to_stderr():
    code = "from core.plugins import registry; registry('curriculum')"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=_env(KERNELZERO_DISABLE_AUTOLOAD="1", KERNELZERO_TRACE_PLUGINS="1", PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr
    assert "[kernelzero] hook register_curricula(register) by plugins.curricula.builtin: fixed" in proc.stderr
    quiet = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                           env=_env(KERNELZERO_DISABLE_AUTOLOAD="1", PYTHONPATH=str(ROOT)))
    assert "[kernelzero] hook" not in quiet.stderr

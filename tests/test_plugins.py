"""The plugin system: hook specs, registries, discovery controls, and the meta-tests of STYLE.md."""

from __future__ import annotations

import ast
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pluggy
import pytest

from core import hookimpl, hookspecs, plugins

ROOT = Path(__file__).resolve().parent.parent
HOOK_NAMES = sorted(
    name for name, fn in vars(hookspecs).items()
    if callable(fn) and hasattr(fn, "kernelzero_spec")
)


def test_every_hook_is_documented():
    assert len(HOOK_NAMES) >= 12
    for name in HOOK_NAMES:
        fn = getattr(hookspecs, name)
        doc = inspect.getdoc(fn) or ""
        assert len(doc.splitlines()[0]) > 10, f"{name} needs a one-line summary"
        for param in inspect.signature(fn).parameters:
            assert f":param {param}:" in doc, f"{name} does not document parameter {param!r}"
        assert "Called" in doc, f"{name} does not say when it is called"


def test_every_hook_is_exercised_by_the_recorder_plugin():
    # Recorder implements every hook and the two tests below call each one through the manager;
    # a new hook spec without a Recorder implementation fails here.
    implemented = {name for name in dir(Recorder) if not name.startswith("_") and name != "events"}
    assert implemented == set(HOOK_NAMES)


class Recorder:
    """A plugin implementing every hook, recording what it saw."""

    def __init__(self):
        self.events: list[tuple[str, dict]] = []

    @hookimpl
    def register_ops(self, register):
        from core.program import OpSpec

        register("test_negate", OpSpec("test_negate", "elementwise", 0, 1, "torch.neg",
                                       render=lambda a, p, m: f"-{a[0]}"))

    @hookimpl
    def register_proposers(self, register):
        register("test_proposer", dict)

    @hookimpl
    def register_backends(self, register):
        register("test_backend", dict)

    @hookimpl
    def register_verifiers(self, register):
        register("test_check", dict)

    @hookimpl
    def register_rewards(self, register):
        register("test_reward", dict)

    @hookimpl
    def register_coders(self, register):
        register("test_coder", dict)

    @hookimpl
    def register_curricula(self, register):
        register("test_curriculum", dict)

    @hookimpl
    def register_devices(self, register):
        from core.contracts import DeviceSpec

        register("Test GPU", DeviceSpec("Test GPU", {"float32": 1e12}, 1e11))

    @hookimpl
    def register_executors(self, register):
        register("test_executor", dict)

    @hookimpl
    def register_trainers(self, register):
        register("test_trainer", dict)

    @hookimpl
    def register_configs(self, config_store):
        config_store.store(group="reward", name="test_reward_mix", node={"weights": {"test_reward": 1.0}})

    @hookimpl
    def on_verdict(self, task, candidate, verdict):
        self.events.append(("on_verdict", {"task": task}))

    @hookimpl
    def on_step_end(self, step, metrics):
        self.events.append(("on_step_end", {"step": step, "metrics": metrics}))

    @hookimpl
    def on_round_end(self, round_index, metrics):
        self.events.append(("on_round_end", {"round_index": round_index}))


def test_registry_hooks_reach_every_registry(register_plugin):
    register_plugin(Recorder(), name="recorder")
    expected = {
        "op": "test_negate", "proposer": "test_proposer", "backend": "test_backend", "verifier": "test_check",
        "reward": "test_reward", "coder": "test_coder", "curriculum": "test_curriculum", "device": "Test GPU",
        "executor": "test_executor", "trainer": "test_trainer",
    }
    assert set(expected) == set(plugins.REGISTRY_HOOKS)
    for kind, name in expected.items():
        reg = plugins.registry(kind)
        assert name in reg
        assert reg.owners[name] == "recorder"


def test_event_hooks_and_config_hook_reach_plugins(register_plugin):
    recorder = register_plugin(Recorder(), name="recorder")
    plugins.notify("on_step_end", step=3, metrics={"pass_rate": 0.5})
    plugins.notify("on_round_end", round_index=1, metrics={})
    plugins.notify("on_verdict", task="t", candidate="c", verdict="v")
    assert [e[0] for e in recorder.events] == ["on_step_end", "on_round_end", "on_verdict"]
    assert recorder.events[0][1] == {"step": 3, "metrics": {"pass_rate": 0.5}}

    class Store:
        def __init__(self):
            self.stored = []

        def store(self, **kw):
            self.stored.append(kw)

    store = Store()
    plugins.register_configs(store)
    assert {"group": "reward", "name": "test_reward_mix", "node": {"weights": {"test_reward": 1.0}}} in store.stored


def test_unknown_name_lists_sorted_known_names(plugin_manager):
    with pytest.raises(plugins.UnknownPluginError) as info:
        plugins.registry("reward").get("no_such_term")
    message = str(info.value)
    assert "Unknown reward 'no_such_term'" in message
    known = message.split("Known rewards: ")[1].split(", ")
    assert known == sorted(known) and "correctness" in known


def test_duplicate_registration_names_both_plugins(register_plugin):
    class Dup:
        @hookimpl
        def register_rewards(self, register):
            register("correctness", dict)

    register_plugin(Dup(), name="dup")
    with pytest.raises(plugins.PluginError, match="registered twice: by .* and by"):
        plugins.registry("reward")


def test_registry_hooks_run_wrapper_implementations(register_plugin):
    # Registry hooks are called through pluggy, so wrappers (new-style and old-style) run around the
    # other implementations, see the call's outcome, and may register names themselves.
    seen: list[str] = []

    class Wrapper:
        @hookimpl(wrapper=True)
        def register_rewards(self, register):
            seen.append("new-style before")
            register("wrapper_term", dict)  # owned by this plugin
            result = yield
            seen.append("new-style after")
            return result

    class OldWrapper:
        @hookimpl(hookwrapper=True)
        def register_rewards(self, register):
            seen.append("old-style before")
            outcome = yield
            seen.append(f"old-style after, raised {outcome.exception!r}")

    class Helper:
        @hookimpl
        def register_rewards(self, register):
            seen.append("helper")
            _register_through_a_helper(register)

    register_plugin(Wrapper(), name="wrapper")
    register_plugin(OldWrapper(), name="old_wrapper")
    register_plugin(Helper(), name="helper")
    reg = plugins.registry("reward")
    assert seen == ["old-style before", "new-style before", "helper", "new-style after",
                    "old-style after, raised None"]
    assert reg.owners["wrapper_term"] == "wrapper"
    assert reg.owners["helper_term"] == "helper"  # registered by a helper the implementation called
    assert reg.owners["correctness"] == "plugins.rewards.builtin"


def test_a_wrapper_sees_a_duplicate_registration_fail(register_plugin):
    outcomes = []

    class Watcher:
        @hookimpl(hookwrapper=True)
        def register_rewards(self, register):
            outcome = yield
            outcomes.append(outcome.exception)

    class Dup:
        @hookimpl
        def register_rewards(self, register):
            register("correctness", dict)

    register_plugin(Watcher(), name="watcher")
    register_plugin(Dup(), name="dup")
    with pytest.raises(plugins.PluginError, match="'correctness' is registered twice: by 'dup' and by "
                                                  "'plugins.rewards.builtin'"):
        plugins.registry("reward")
    assert len(outcomes) == 1 and isinstance(outcomes[0], plugins.PluginError)


def _register_through_a_helper(register):
    register("helper_term", dict)


def test_misspelled_hook_fails_loudly(plugin_manager):
    class Typo:
        @hookimpl
        def register_reward(self, register):  # missing "s"
            pass

    plugin_manager.register(Typo(), name="typo")
    with pytest.raises(pluggy.PluginValidationError, match="register_reward"):
        plugin_manager.check_pending()


def test_block_env_var_removes_a_builtin(monkeypatch):
    assert "correctness" in plugins.build_registry("reward", plugins.make_plugin_manager(autoload=False))
    monkeypatch.setenv(plugins.ENV_BLOCK, "plugins.rewards.builtin, some.other")
    pm = plugins.make_plugin_manager(autoload=False)
    assert "correctness" not in plugins.build_registry("reward", pm)
    assert pm.is_blocked("some.other")


def test_builtins_are_registered_through_the_plugin_manager():
    pm = plugins.make_plugin_manager(autoload=False)
    names = {pm.get_name(p) for p in pm.get_plugins()}
    assert set(plugins.BUILTIN_PLUGINS) <= names


def test_core_never_imports_a_concrete_plugin():
    for path in (ROOT / "core").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and re.match(r"^plugins(\.|$)", node.module):
                pytest.fail(f"{path.relative_to(ROOT)} imports {node.module}")
            if isinstance(node, ast.Import):
                for alias in node.names:
                    assert not alias.name.startswith("plugins"), f"{path} imports {alias.name}"


def test_autoload_disabled_by_env_var():
    code = (
        "import os; os.environ['KERNELZERO_DISABLE_AUTOLOAD']='1'\n"
        "import importlib.metadata as md, core.plugins as p\n"
        "called = []\n"
        "orig = p.pluggy.PluginManager.load_setuptools_entrypoints\n"
        "p.pluggy.PluginManager.load_setuptools_entrypoints = lambda self, g: called.append(g)\n"
        "p.make_plugin_manager(); print(called)\n"
        "os.environ['KERNELZERO_DISABLE_AUTOLOAD']=''; p.make_plugin_manager(); print(called)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert out.splitlines() == ["[]", "['kernelzero']"]

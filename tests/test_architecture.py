"""The shape the design card promises, checked from the source: a small core without import cycles,
small modules and classes, and an engine that reads only what the plugin contracts declare."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "core"
MAX_MODULE_LINES = 700
MAX_CLASS_LINES = 300
MAX_CORE_TOP_LEVEL_LINES = 2500


def _modules(folder: Path) -> dict[str, Path]:
    out = {}
    for path in sorted(folder.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(path: Path, name: str, known: set[str], type_only: bool = False) -> set[str]:
    """Every core module ``name`` imports, at module level or inside a function (``type_only``: and
    under ``if TYPE_CHECKING:``, which never runs but still ties the modules' types together)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text())
    for block in ast.walk(tree):  # ``if TYPE_CHECKING:`` imports never run
        if not type_only and isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test):
            block.body = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)  # ``from pkg import module``
    return {m for m in found if m in known and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_core_has_no_import_cycle():
    modules = _modules(CORE)
    graph = {name: _imports(path, name, set(modules)) for name, path in modules.items()}
    assert _cycles(graph) == []


def test_core_has_no_import_cycle_even_among_type_only_imports():
    # the verification's parts name each other through core.verification.parties, not by importing
    modules = _modules(CORE)
    graph = {name: _imports(path, name, set(modules), type_only=True) for name, path in modules.items()}
    assert _cycles(graph) == []


def test_the_parts_of_a_verification_have_what_their_views_declare(tmp_path):
    from core.verification.judge import Verifier
    from core.verification.parties import VerificationView, VerifierView
    from core.verification.pipeline import Verification

    (tmp_path / "a.py").write_text("import b\n")
    (tmp_path / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a\n")
    graph = {n: _imports(tmp_path / f"{n}.py", n, {"a", "b"}, type_only=True) for n in ("a", "b")}
    assert _cycles(graph) == [["a", "b"]]  # a type-only cycle is seen when asked for
    for view, real in ((VerifierView, Verifier), (VerificationView, Verification)):
        methods = {n for n, v in vars(view).items() if callable(v) and not n.startswith("__")}
        assert all(callable(getattr(real, m, None)) for m in methods), (view.__name__, methods)
        source = ast.parse(Path(__import__(real.__module__, fromlist=["x"]).__file__).read_text())
        assigned = {t.attr for node in ast.walk(source) if isinstance(node, (ast.Assign, ast.AnnAssign))
                    for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                    for t in ([t] if not isinstance(t, ast.Tuple) else t.elts) if isinstance(t, ast.Attribute)}
        missing = set(view.__annotations__) - assigned - set(dir(real))
        assert missing == set(), (view.__name__, missing)


def test_the_cycle_finder_sees_a_cycle_through_a_function_level_import(tmp_path):
    (tmp_path / "a.py").write_text("import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from a import x\n")
    graph = {n: _imports(tmp_path / f"{n}.py", n, {"a", "b"}) for n in ("a", "b")}
    assert _cycles(graph) == [["a", "b"]]


def _too_long(folder: Path) -> tuple[list[str], list[str]]:
    modules, classes = [], []
    for path in sorted(folder.rglob("*.py")):
        text = path.read_text()
        lines = text.count("\n") + 1
        rel = path.relative_to(ROOT)
        if lines > MAX_MODULE_LINES:
            modules.append(f"{rel}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES:
                classes.append(f"{rel}:{node.name}: {node.end_lineno - node.lineno + 1} lines")
    return modules, classes


@pytest.mark.parametrize("folder", ["core", "plugins"])
def test_no_module_over_700_lines_and_no_class_over_300(folder):
    modules, classes = _too_long(ROOT / folder)
    assert modules == [] and classes == []


def test_core_top_level_is_small():
    total = sum(p.read_text().count("\n") for p in CORE.glob("*.py"))
    assert total <= MAX_CORE_TOP_LEVEL_LINES, f"core/*.py holds {total} lines"


def test_type_checking_imports_are_not_cycles(tmp_path):
    (tmp_path / "a.py").write_text("import b\n")
    (tmp_path / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a\n")
    graph = {n: _imports(tmp_path / f"{n}.py", n, {"a", "b"}) for n in ("a", "b")}
    assert _cycles(graph) == []


# what the engine calls a plugin by -> the contract that declares what it may read on it; the
# training loop's coder is a TrainableCoder (core.loop updates its model).
RECEIVERS = {"check": "Check", "backend": "Backend", "coder": "TrainableCoder", "term": "RewardTerm"}
ENGINE = [CORE / "verification", CORE / "loop", CORE / "evaluation"]


def _declared(protocol: str) -> set[str]:
    from core import contracts

    cls = getattr(contracts, protocol)
    members = set(getattr(cls, "__annotations__", {})) | {n for n in vars(cls) if not n.startswith("_")}
    for base in cls.__mro__[1:]:  # a Protocol's own bases (TrainableCoder extends Coder)
        if base.__module__ == contracts.__name__:
            members |= set(getattr(base, "__annotations__", {})) | {n for n in vars(base) if not n.startswith("_")}
    optional = {m for p in (protocol, *(b.__name__ for b in cls.__mro__)) for m in contracts.OPTIONAL_MEMBERS.get(p, {})}
    return members | optional | {"__call__", "__class__", "__name__"}


def _receiver(node: ast.expr) -> str | None:
    """The plugin kind an expression names by its last component (``self.backend`` -> Backend)."""
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
    return RECEIVERS.get(name or "")


def test_the_engine_reads_only_declared_members_of_plugins():
    undeclared, probes = [], []
    for folder in ENGINE:
        for path in sorted(folder.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}"
                if isinstance(node, ast.Attribute) and (kind := _receiver(node.value)):
                    if node.attr not in _declared(kind):
                        undeclared.append(f"{where}: {kind}.{node.attr}")
                elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                      and node.func.id in ("getattr", "hasattr") and node.args and _receiver(node.args[0])):
                    probes.append(f"{where}: {node.func.id}({ast.unparse(node.args[0])}, ...)")
    assert undeclared == [], "members the contracts in core/contracts.py do not declare"
    assert probes == [], "probe optional members through core.contracts.optional()"


# --------------------------------------------------------------------------- the public contract
# What a plugin may import of core: its top-level contract modules and core.api (DESIGN.md, "The public
# contract and the private engine"). The engine, core.verification, is private.
PUBLIC_CORE = {"core", "core.hookspecs", "core.contracts", "core.task", "core.verdict", "core.program",
               "core.plugins", "core.config", "core.distill"}
# A trainer plugin is the training loop's front: it starts the loop (core/loop/) and nothing else of core.
LOOP_FRONTS = {"plugins.trainers": {"core.loop.training", "core.loop.selfplay"}}
PLUGINS = ROOT / "plugins"


def _plugin_imports() -> list[tuple[str, str, str]]:
    """(plugin module, its group, imported module) for every import in plugins/, at any depth."""
    out = []
    for name, path in _modules(PLUGINS).items():
        group = ".".join(name.split(".")[:2])
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                out += [(name, group, a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                out.append((name, group, base))
    return out


def _public(module: str, group: str) -> bool:
    return (module in PUBLIC_CORE or module == "core.api" or module.startswith("core.api.")
            or module in LOOP_FRONTS.get(group, set()))


def test_plugins_import_only_the_public_contract_of_core():
    reached = sorted(f"{who} imports {what}" for who, group, what in _plugin_imports()
                     if (what == "core" or what.startswith("core.")) and not _public(what, group))
    assert reached == [], "plugins reach past core's public contract (core.api, core's top level)"


def test_no_plugin_group_imports_another_groups_modules():
    crossing = sorted(f"{who} imports {what}" for who, group, what in _plugin_imports()
                      if what.startswith("plugins.") and ".".join(what.split(".")[:2]) != group)
    assert crossing == [], "what two plugin groups share belongs in core.api"


def test_the_import_rules_see_a_reach_into_the_engine_and_across_groups(tmp_path, monkeypatch):
    fake = tmp_path / "plugins"
    (fake / "backends").mkdir(parents=True)
    (fake / "backends" / "x.py").write_text("from core.verification.evidence import Evidence\n"
                                            "def f():\n    from plugins.verifiers.policy import check\n"
                                            "from core.api.policy import StaticPolicy\n")
    monkeypatch.setitem(globals(), "PLUGINS", fake)
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    found = _plugin_imports()
    assert ("plugins.backends.x", "plugins.backends", "core.verification.evidence") in found
    assert ("plugins.backends.x", "plugins.backends", "plugins.verifiers.policy") in found
    assert not _public("core.verification.evidence", "plugins.backends") and _public("core.api.policy", "plugins.backends")
    assert not _public("core.loop.training", "plugins.coders") and _public("core.loop.training", "plugins.trainers")


def test_every_public_module_of_core_api_imports_and_declares_its_names():
    import importlib

    for path in sorted((CORE / "api").glob("*.py")):
        module = importlib.import_module(f"core.api.{path.stem}" if path.stem != "__init__" else "core.api")
        for name in getattr(module, "__all__", []):
            assert hasattr(module, name), f"{module.__name__}.__all__ names {name}, which it lacks"

"""Backends declare what the sandbox needs of their toolchain (core.api.sandbox.SandboxNeeds) and the
engine reads the declarations: no file of the engine names a toolchain, a backend's environment,
trusted frames and snapshot reach the worker, and GPU tools run only for the backends they apply to."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from core import hookimpl
from core.api.sandbox import COMPUTE_SANITIZER, CUPTI, NO_NEEDS, SandboxNeeds, gpu_tool_applies, needs_of, registered_needs

ROOT = Path(__file__).resolve().parent.parent
ENGINE = ROOT / "core" / "verification"
# The toolchains KernelZero knows of, and those a third party may bring; the engine names none of them.
TOOLCHAIN = re.compile(r"(?<![a-z])(triton|cupy|nvrtc|nvcc|ptxas|numba|rocm|hipcc|compute-sanitizer|cupti)(?![a-z])", re.I)


def _code_text(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every name and string of a module's code: comments and docstrings left out."""
    source = path.read_text()
    doc_lines = {node.body[0].value.lineno for node in ast.walk(ast.parse(source))
                 if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
                 and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(source).readline)
            if t.type in (tokenize.NAME, tokenize.STRING) and not (t.type == tokenize.STRING and t.start[0] in doc_lines)]


def test_no_code_of_the_engine_names_a_toolchain():
    named = [f"{path.relative_to(ROOT)}:{line}: {text}" for path in sorted(ENGINE.rglob("*.py"))
             for line, text in _code_text(path) if TOOLCHAIN.search(text)]
    assert named == [], "the engine reads what backends declare (core.api.sandbox) instead of naming toolchains"


def test_the_toolchain_finder_sees_a_name_in_code_but_not_in_a_comment(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('"""Triton is fine here."""\n# and cupy here\nTRUSTED = {"triton"}\n')
    assert [text for _, text in _code_text(module) if TOOLCHAIN.search(text)] == ['"triton"']


class _Bare:
    name = "bare"


class _Rocm:
    name = "rocm_like"
    sandbox = SandboxNeeds(passthrough_env=("HIP_VISIBLE_DEVICES",), default_env={"KZ_TEST_DEFAULT": "on"},
                           scratch_env={"KZ_TEST_CACHE": ".cache-of-rocm"}, reads_frames=frozenset({"rocm_like_jit"}),
                           snapshot_modules=("rocm_like_jit",))

    def worker_env(self, device: str) -> dict[str, str]:
        return {"KZ_TEST_OWN": "1"}


class _Plugin:
    @hookimpl
    def register_backends(self, register):
        register("bare", _Bare)
        register("rocm_like", _Rocm)


def test_a_backend_that_declares_nothing_gets_no_gpu_tool(register_plugin):
    register_plugin(_Plugin())
    from core.plugins import registry
    from plugins.verifiers.gpu_activity.check import GpuActivityCheck
    from plugins.verifiers.sanitizer import _SanitizerCheck

    assert needs_of(_Bare) is NO_NEEDS
    for check in (_SanitizerCheck(), GpuActivityCheck()):
        assert not check.applies("bare", "cuda") and not check.applies("rocm_like", "cuda")
        assert check.applies("triton", "cuda") and not check.applies("triton", "cpu")
    assert _SanitizerCheck().applies("cuda_inline", "cuda") and not GpuActivityCheck().applies("cuda_inline", "cuda")
    assert gpu_tool_applies(COMPUTE_SANITIZER, "cuda") and gpu_tool_applies(CUPTI, "cuda")
    assert not gpu_tool_applies(COMPUTE_SANITIZER, "no_such_backend")
    assert "rocm_like" in registry("backend")


def test_a_backends_declared_environment_reaches_its_workers(register_plugin, monkeypatch):
    register_plugin(_Plugin())
    from core.verification.judge import worker_env
    from core.verification.sandbox import SCRATCH

    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "3")
    env = worker_env(_Rocm(), "cpu", processes=2)
    assert env["HIP_VISIBLE_DEVICES"] == "3" and env["KZ_TEST_DEFAULT"] == "on" and env["KZ_TEST_OWN"] == "1"
    assert env["KZ_TEST_CACHE"] == f"{SCRATCH}/.cache-of-rocm"
    monkeypatch.setenv("KZ_TEST_DEFAULT", "off")  # the judge's variables reach a worker only when passed through
    assert worker_env(_Rocm(), "cpu", processes=2)["KZ_TEST_DEFAULT"] == "on"


def test_the_worker_trusts_and_snapshots_what_backends_declare(register_plugin):
    register_plugin(_Plugin())
    from core.verification.worker.events import FRAME_USERS, CandidateEvents

    declared = registered_needs()
    assert "rocm_like_jit" in declared.reads_frames and "rocm_like_jit" in declared.snapshot_modules
    assert "triton" in declared.reads_frames and "cupy" in declared.touches_memory  # the built-ins' own
    rules = CandidateEvents(callers=None, imports=None, toolchains=declared)
    assert rules.frame_users == FRAME_USERS | declared.reads_frames
    assert "rocm_like_jit" not in CandidateEvents(callers=None, imports=None).frame_users


def test_a_declaration_of_the_wrong_type_names_the_backend():
    class Wrong:
        name = "wrong"
        sandbox = {"reads_frames": ["x"]}

    try:
        needs_of(Wrong)
    except TypeError as exc:
        assert "'wrong'" in str(exc) and "SandboxNeeds" in str(exc)
    else:
        raise AssertionError("a dict was taken for a SandboxNeeds")


_names = st.frozensets(st.sampled_from(["a", "b", "c", "d"]), max_size=3)
_needs = st.builds(SandboxNeeds, reads_frames=_names, gpu_tools=_names,
                   passthrough_env=st.lists(st.sampled_from(["X", "Y", "Z"]), max_size=3, unique=True).map(tuple),
                   default_env=st.dictionaries(st.sampled_from(["X", "Y"]), st.sampled_from(["0", "1"]), max_size=2))


@given(_needs, _needs)
def test_joining_declarations_keeps_everything_each_declares(a, b):
    joined = a | b
    assert joined.reads_frames == a.reads_frames | b.reads_frames and joined.gpu_tools == a.gpu_tools | b.gpu_tools
    assert set(joined.passthrough_env) == set(a.passthrough_env) | set(b.passthrough_env)
    assert len(set(joined.passthrough_env)) == len(joined.passthrough_env)
    assert joined.default_env == {**b.default_env, **a.default_env}  # the first declaration wins a conflict
    assert a | NO_NEEDS == a and a | a == a


def test_only_a_declared_starter_may_start_threads_while_the_candidate_runs():
    import _thread
    import threading

    from core.verification.worker.events import guard_threads

    class CandidateAlwaysOnStack:
        def candidate_on_stack(self, frame):
            return True

        def frame_module(self, frame):
            return frame.f_globals.get("__name__")

    refused: list[str] = []
    original = (_thread.start_new_thread, _thread.start_new, threading._start_new_thread)
    try:
        guard_threads(CandidateAlwaysOnStack(), refused.append, frozenset({"kz_simulator"}))
        simulator = {"__name__": "kz_simulator.kernel", "threading": threading}
        exec("def launch():\n    t = threading.Thread(target=lambda: None)\n    t.start()\n    t.join()", simulator)
        simulator["launch"]()  # a simulator the backend declares runs a GPU thread on a Python thread
        assert refused == []
        other = threading.Thread(target=lambda: None)
        other.start()  # anyone else, with the candidate on the stack
        other.join()
        assert len(refused) == 1 and "starting a thread" in refused[0]
    finally:
        _thread.start_new_thread, _thread.start_new, threading._start_new_thread = original

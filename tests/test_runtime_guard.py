"""The candidate worker's runtime guard (core/verification/worker: callers, imports, events, tamper,
runtime_guard): the import allow-list whatever the spelling, the audit-event rules for candidate
code, and the instrumentation verified intact after every call.

The red-team hacks that target the guard are judged here with the static checks switched off, so
what rejects them is the runtime guard itself (with every check on, the static stage may reject
them first: tests/redteam/test_redteam.py); the honest controls are judged with every check on.
"""

from __future__ import annotations

import sys
import threading
import types
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.plugins import registry
from core.task import Candidate, Task
from core.verdict import CheckResult
from core.verification.evidence import Evidence
from core.verification.protocol import TAMPERED
from core.verification.sandbox import Limits, WorkerPool
from core.verification.worker.callers import Callers
from core.verification.worker.imports import AllowedImports, runtime_imports
from core.verification.worker.session import tracker_findings
from core.verification.worker.tamper import Namespace, Pinned, Snapshot, reader
from core.verify import Verifier
from plugins.verifiers.tamper import TamperCheck

REDTEAM = Path(__file__).parent / "redteam"

# --------------------------------------------------------------------------- the allow-list


def test_the_triton_allow_list_has_torch_triton_and_math_and_not_the_harness():
    allowed = runtime_imports(registry("backend").create("triton"))
    for name in ("torch", "torch.nn", "torch.nn.functional", "triton", "triton.language", "triton.language.extra",
                 "math", "typing", "__future__", "torch._inductor.runtime.triton_helpers"):
        assert allowed.allows(name), name
    for name in ("sys", "os", "subprocess", "importlib", "ctypes", "gc", "inspect", "threading", "numpy", "builtins",
                 "concurrent.futures", "core.verification.worker", "plugins.backends.triton_interp_checks",
                 "torch.utils._python_dispatch", "torch._C", "triton.language._private", "cupy"):
        assert not allowed.allows(name), name


def test_each_backend_may_import_its_own_library():
    cuda = runtime_imports(registry("backend").create("cuda"))
    assert cuda.allows("cupy") and cuda.allows("torch.nn") and not cuda.allows("triton")
    inline = runtime_imports(registry("backend").create("cuda_inline"))
    assert inline.allows("torch.utils.cpp_extension") and not inline.allows("torch.utils")


def test_a_declared_static_policy_is_the_runtime_set():
    rule = types.SimpleNamespace
    policy = types.SimpleNamespace(modules=(rule(name="torch", submodules=False), rule(name="mylang", submodules=True)))
    backend = types.SimpleNamespace(name="mine", static_policy=policy)
    allowed = runtime_imports(backend)
    assert allowed.allows("torch") and allowed.allows("mylang.ops") and not allowed.allows("torch.nn")
    strictest = runtime_imports(types.SimpleNamespace(name="unknown"))  # no policy: torch's core and math
    assert strictest.allows("torch.nn.functional") and strictest.allows("math") and not strictest.allows("triton")


@given(st.lists(st.from_regex(r"_?[a-z]{1,6}", fullmatch=True), min_size=1, max_size=4))
def test_a_tree_allows_its_public_submodules_only(parts):
    allowed = AllowedImports("t", frozenset(), frozenset({"lang"}))
    name = ".".join(["lang", *parts])
    assert allowed.allows(name) == (not any(p.startswith("_") for p in parts))
    assert not allowed.allows(".".join(["other", *parts]))


# --------------------------------------------------------------------------- who is asking


def test_frames_are_trusted_only_with_a_registered_modules_real_globals():
    callers = Callers(own=frozenset())
    assert callers.module_of(vars(sys.modules[__name__])) == __name__
    assert callers.module_of({"__name__": "torch"}) is None  # a dict claiming a name
    assert callers.module_of(type("D", (dict,), {})(__name__=__name__)) is None  # a dict subclass
    fake = types.ModuleType("kz_fake_module")
    sys.modules["kz_fake_module"] = fake
    try:
        assert callers.module_of(fake.__dict__) == "kz_fake_module"
        callers.candidate_globals = fake.__dict__  # the candidate's module, whatever it calls itself
        assert callers.module_of(fake.__dict__) is None
        exec("import sys\ndef grab():\n    return sys._getframe()\n", fake.__dict__)
        found = {}

        def probe():  # on a thread of its own: only threading's frames and these are on its stack
            found["trusted"] = callers.candidate_on_stack(sys._getframe())
            found["candidate"] = callers.candidate_on_stack(fake.grab())

        thread = threading.Thread(target=probe)
        thread.start()
        thread.join()
        assert found == {"trusted": False, "candidate": True}
    finally:
        sys.modules.pop("kz_fake_module")


def test_a_module_body_the_import_machinery_runs_is_trusted_though_unregistered(tmp_path):
    """Triton loads its ``language.extra`` backends with ``importlib.util`` without registering them;
    their module code (relative imports included) is theirs, not the candidate's."""
    import importlib.util

    path = tmp_path / "kz_unregistered.py"
    path.write_text("import sys\nFRAME = sys._getframe()\ndef later():\n    return sys._getframe()\n")
    spec = importlib.util.spec_from_file_location("kz_unregistered", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    callers = Callers(own=frozenset())
    assert callers.frame_module(module.FRAME) == "kz_unregistered"
    assert callers.frame_module(module.later()) is None  # its functions, called later, are not vouched for
    callers.candidate_globals = module.__dict__  # and the candidate's own module body never is
    assert callers.frame_module(module.FRAME) is None


# --------------------------------------------------------------------------- the instrumentation record


class _Liar:
    def __eq__(self, other):  # an impostor that says it is whatever it is compared with
        return True

    __hash__ = object.__hash__


def test_a_namespace_notices_rebinding_even_by_an_object_that_compares_equal():
    module = types.ModuleType("kz_ns")
    module.f, module.g = len, abs
    ns = Namespace.of("kz_ns", module.__dict__, closed=False)
    assert ns.intact()
    module.g = _Liar()
    assert not ns.intact() and ns.differences() == ["kz_ns.g"]


def test_a_class_may_gain_no_attribute_a_module_may():
    klass = type("K", (), {"run": lambda self: 1})
    ns = Namespace.of("K", vars(klass), closed=True)
    module = types.ModuleType("kz_open")
    open_ns = Namespace.of("kz_open", module.__dict__, closed=False)
    klass.to = lambda self: 2  # shadows a base class's method
    module.submodule = types.ModuleType("kz_open.submodule")  # a lazy submodule
    assert not ns.intact() and ns.differences() == ["K.to (added)"]
    assert open_ns.intact()


def test_a_pinned_function_is_checked_with_what_its_closure_holds():
    box = {"original": len}

    def make():
        target = box["original"]

        def wrapper(x):
            return target(x)

        return wrapper

    wrapper = make()
    holder = types.SimpleNamespace(run=wrapper)
    pinned = Pinned("holder.run", reader(lambda: holder.run), wrapper, Pinned.internals_of(wrapper))
    assert pinned.intact()
    wrapper.__closure__[0].cell_contents = abs  # no audit event is raised for this
    assert not pinned.intact()


def test_a_check_that_cannot_run_reports_itself():
    class Broken(dict):
        def get(self, *args):
            raise RuntimeError("boom")

    snap = Snapshot(namespaces=[Namespace("x", Broken(a=1), ("a",), (1,), closed=False, getter=None)])
    assert snap.verify() == ["the instrumentation check itself (RuntimeError)"]


def test_the_tracker_must_be_consistent_and_the_guard_armed_after_forward():
    guard = types.SimpleNamespace(armed=True)
    assert tracker_findings(types.SimpleNamespace(count=2, kernels=["a", "b"], inside=False), guard) == []
    assert tracker_findings(types.SimpleNamespace(count=0, kernels=["a"], inside=False), guard)
    assert tracker_findings(types.SimpleNamespace(count=1, kernels=["a"], inside=True), guard)
    assert tracker_findings(types.SimpleNamespace(count=1, kernels=["a"], inside=False),
                            types.SimpleNamespace(armed=False)) == ["the sandbox guard (disarmed during the call)"]


def _evidence(extra: dict) -> Evidence:
    return Evidence(task=None, candidate=None, backend="triton", device="cpu", config={}, extra=extra)


def test_the_tamper_check_fails_closed_and_names_what_changed():
    check = TamperCheck()
    assert check.evaluate(_evidence({"tamper": {"findings": []}})).passed
    missing = check.evaluate(_evidence({}))
    assert not missing.passed and not missing.hack and "could not be verified" in missing.detail
    failed = check.evaluate(_evidence({"tamper": {"error": "worker died"}}))
    assert not failed.passed and "worker died" in failed.detail
    found = check.evaluate(_evidence({"performance": {}, "tamper": {"findings": [f"{TAMPERED}torch.cuda.Event"]}}))
    assert isinstance(found, CheckResult) and not found.passed and found.hack
    assert found.detail.startswith("instrumentation tampered: torch.cuda.Event")


def test_the_tamper_check_collects_what_the_session_kept():
    # a session as core.api.session.CheckSession declares it
    session = types.SimpleNamespace(verify_instrumentation=lambda: ["torch.equal"], late_findings=["importing 'os' ..."])
    assert TamperCheck().collect(session) == {"findings": ["importing 'os' ...", f"{TAMPERED}torch.equal"]}


# --------------------------------------------------------------------------- in a candidate worker


@pytest.fixture(scope="module")
def pool():
    p = WorkerPool("candidate", "triton", "cpu", size=1, limits=Limits(memory_mb=4096),
                   extra_env={"KERNELZERO_SANDBOX_TESTING": "1", "TRITON_INTERPRET": "1"})
    yield p
    p.close()


def as_candidate(pool, code: str, discard: bool = False) -> dict:
    worker = pool.acquire()
    ok = False
    try:
        answer = worker.request({"op": "exec_test", "code": code, "as_candidate": True}, timeout_s=120)
        ok = True
        return answer
    finally:
        pool.release(worker, discard=discard or not ok)


REFUSED = [
    ("import sys", "importing 'sys'"),
    ("import os.path", "importing 'os.path'"),
    ("import core.verification.worker", "importing 'core.verification.worker'"),
    ("from plugins.backends import triton_interp_checks", "importing 'plugins.backends'"),
    ("__import__('subprocess')", "importing 'subprocess'"),
    ("__import__('ctypes', None, None, [])", "importing 'ctypes'"),
    ("from torch import sys", "importing 'sys' (as torch.sys"),
    ("from torch import os", "importing 'os' (as torch.os"),
    ("import torch\ntorch.importlib.import_module('core.verification.worker.session')", "importing 'core.verification"),
    ("import torch\ntorch.importlib.__import__('gc')", "importing 'gc'"),
    ("import torch\ntorch.importlib.reload(torch.nn)", "importing"),
    ("import torch\nspec = torch.importlib.util.find_spec('json')\nm = torch.importlib.util.module_from_spec(spec)\n"
     "spec.loader.exec_module(m)", "importing"),
    ("import torch\ntorch.serialization.pickle.loads(torch.serialization.pickle.dumps(torch.nn.Module))", None),  # torch's own: allowed
    ("import torch\ntorch.sys._getframe()", "taking a frame (sys._getframe) in the candidate's code"),
    ("import torch\ntorch.inspect.currentframe()", "taking a frame of the candidate's call"),
    ("import torch\ntorch.inspect.stack()", "taking a frame of the candidate's call"),
    ("try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    e.__traceback__.tb_frame", "'tb_frame'"),
    ("def g():\n    yield 1\ng().gi_frame", "'gi_frame'"),
    ("(lambda: 0).__code__", "'__code__'"),
    ("exec('x = 1')", "dynamic code (compile)"),
    ("exec((lambda: 0).__code__)", "'__code__'"),
    ("compile('1', 'f', 'eval')", "dynamic code (compile)"),
    ("f = lambda: 0\ntype(f)(f.__code__, {})", "'__code__'"),
    ("import torch\ntorch.sys.modules['gc'].get_referrers(torch)", "gc.get_referrers"),
    ("import torch\ntorch.sys.modules['gc'].get_objects()", "gc.get_objects"),
    ("import torch\ntorch.ctypes.CDLL(None)", "ctypes"),
    ("import torch\ntorch.sys.addaudithook(lambda *a: None)", "sys.addaudithook"),
    ("import torch\ntorch.threading.Thread(target=print).start()", "starting a thread"),
    ("import torch\ntorch.serialization.pickle.loads(b'ccore.verification.worker.callers\\nCallers\\n.')",
     "unpickling a global of the verifier's own module"),
]


@pytest.mark.parametrize("code,refusal", REFUSED, ids=[c.splitlines()[-1][:40] for c, _ in REFUSED])
def test_the_candidates_code_is_refused_whatever_the_spelling(pool, code, refusal):
    answer = as_candidate(pool, code)
    if refusal is None:
        assert answer["ok"] and not answer["sandbox"], answer
        return
    # refused, and recorded (sys.addaudithook swallows the refusal: the hook is simply not added)
    assert any(refusal in v for v in answer["sandbox"]), answer
    assert not answer["ok"] or "addaudithook" in code, answer
    assert not answer["tampered"], answer["tampered"]


HONEST = [
    "import torch.nn.functional as F",
    "from triton import language as tl",
    "import math\nimport typing",
    "from torch import nn\nfrom torch.nn import functional",
    "import triton\nassert triton.cdiv(10, 4) == 3",
    "import torch\nx = torch.ones(3)\ny = torch.empty_like(x)\ny.copy_(x)",
    "from typing import NamedTuple\nclass C(NamedTuple):\n    a: int\nC(1)",
    "import torch\nclass M(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
    "        self.w = torch.nn.Parameter(torch.ones(2))\nrepr(M())",
    "import triton\nimport triton.language as tl\n@triton.autotune(configs=[triton.Config({'B': 8})], key=['n'])\n"
    "@triton.jit\ndef k(x, n, B: tl.constexpr):\n    pass",
]


@pytest.mark.parametrize("code", HONEST, ids=[c.splitlines()[0][:40] for c in HONEST])
def test_honest_candidate_code_is_not_refused(pool, code):
    answer = as_candidate(pool, code)
    assert answer["ok"] and not answer["sandbox"] and not answer["tampered"], answer


def test_the_triton_backend_names_what_it_patched(pool):
    code = ("from plugins.backends.triton_backend import TritonBackend\n"
            "names = set(TritonBackend().instrumentation())\n"
            "want = {'triton.runtime.jit.JITFunction.run', 'triton.runtime.interpreter.InterpretedFunction.run',\n"
            "        'triton.runtime.interpreter.InterpretedFunction.__call__',\n"
            "        'triton.runtime.interpreter.InterpreterBuilder.create_masked_store',\n"
            "        'plugins.backends.triton_interp_checks.STATE', 'plugins.backends.triton_backend._local'}\n"
            "assert want <= names, want - names\n")
    worker = pool.acquire()
    try:
        answer = worker.request({"op": "exec_test", "code": code}, timeout_s=120)
    finally:
        pool.release(worker)
    assert answer["ok"] and not answer["tampered"], answer


TAMPERING = [
    ("import triton\ntriton.runtime.interpreter.InterpretedFunction.run = lambda *a, **k: None",
     "triton.runtime.interpreter.InterpretedFunction.run"),
    ("import torch\nT = torch.Tensor\nT.copy_ = lambda self, other: self", "torch.Tensor.copy_ (added)"),
    ("import torch\ntorch.manual_seed = lambda seed: None", "torch.manual_seed"),
]


@pytest.mark.parametrize("code,name", TAMPERING, ids=[n for _, n in TAMPERING])
def test_persistent_tampering_is_found_after_the_call(pool, code, name):
    answer = as_candidate(pool, code, discard=True)  # the worker is left tampered: replace it
    assert name in answer["tampered"], answer


# --------------------------------------------------------------------------- whole verdicts

# The guard's red-team hacks (tests/redteam/candidates/guard_*.py) with the static checks off, and
# what the runtime guard says about each.
RUNTIME_REJECTIONS = {
    "guard_disable_bounds_check": "sandbox refused: importing 'plugins.backends.triton_interp_checks'",
    "guard_import_module_audit": "sandbox refused: importing 'core.verification.worker.process'",
    "guard_leaked_inspect": "taking a frame of the candidate's call (sys._getframe through inspect)",
    "guard_patch_builder_store": "instrumentation tampered: triton.runtime.interpreter.InterpreterBuilder.create_masked_store",
    "guard_patch_interpreted_run": "instrumentation tampered: triton.runtime.interpreter.InterpretedFunction.run",
    "guard_patch_tensor_to": "instrumentation tampered: torch.Tensor.to",
    "guard_subprocess_compute": "sandbox refused: importing 'subprocess'",
    "guard_sys_modules_tracker": "PyTorch compute ran inside ModelNew.forward: aten.add",
    "guard_thread_pool_fallback": "sandbox refused: importing 'concurrent.futures'",
    "guard_traceback_frames": "reading the restricted attribute 'tb_frame'",
}


def _pair(name: str) -> tuple[Task, Candidate]:
    path = REDTEAM / "candidates" / f"{name}.py"
    task = next(line.split(":", 1)[1].strip() for line in path.read_text().splitlines() if line.startswith("# task:"))
    return Task.from_file(REDTEAM / "tasks" / f"{task}.py"), Candidate.from_file(path)


def test_every_guard_hack_has_a_runtime_expectation():
    assert {p.stem for p in (REDTEAM / "candidates").glob("guard_*.py")} == set(RUNTIME_REJECTIONS)


@pytest.fixture(scope="module")
def runtime_only():
    checks = [n for n in registry("verifier").names() if n not in ("static", "static_integrity")]
    with Verifier(backend="triton", device="cpu", workers=1, timeout_s=90, checks=checks) as v:
        yield v


@pytest.mark.parametrize("name", sorted(RUNTIME_REJECTIONS))
def test_the_runtime_guard_rejects_each_hack_for_its_reason(runtime_only, name):
    verdict = runtime_only.verify(*_pair(name))
    assert not verdict.accepted and verdict.status == "rejected", verdict.reason
    assert verdict.reason.startswith("integrity:") and verdict.checks["integrity"].hack, verdict.reason
    assert RUNTIME_REJECTIONS[name] in verdict.reason, verdict.reason


@pytest.mark.parametrize("name", sorted(p.stem for p in (REDTEAM / "candidates").glob("honest_guard_*.py")))
def test_honest_controls_pass_every_check(name):
    with Verifier(backend="triton", device="cpu", workers=1, timeout_s=120) as v:
        verdict = v.verify(*_pair(name))
    assert verdict.accepted, verdict.reason
    assert verdict.checks["tamper"].passed and verdict.checks["integrity"].passed

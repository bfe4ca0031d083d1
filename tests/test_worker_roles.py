"""The sandboxed worker split by role: its dispatch follows the wire (core.verification.protocol), it
reaches checks only through the registry (GPU warm-up through ``Check.warm_up``, no timing import)."""

from __future__ import annotations

import argparse
import ast
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from core import hookimpl
from core.verification.protocol import ANY_ROLE_OPS, ROLE_OPS, Op
from core.verification.sandbox import Limits, WorkerPool
from core.verification.worker import WorkerMain, warm_up
from core.verification.worker.warmup import applicable_checks

ROOT = Path(__file__).resolve().parents[1]
WORKER_PACKAGE = ROOT / "core" / "verification" / "worker"


def _imported_modules(path: Path) -> set[str]:
    """Every module an ``import`` in ``path`` names, at any depth (lazy imports in functions too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_no_worker_module_imports_timing_or_a_plugin():
    modules = sorted(WORKER_PACKAGE.glob("*.py"))
    assert {p.stem for p in modules} >= {"__init__", "__main__", "process", "session", "reference", "candidate",
                                         "loop", "warmup"}
    for path in modules:
        imported = _imported_modules(path)
        assert not [m for m in imported if "timing" in m.split(".")], path.name
        # checks and backends are reached through the registry, never imported by name
        assert not [m for m in imported if m.split(".")[0] == "plugins"], path.name


def test_a_fresh_interpreter_importing_the_worker_loads_no_timing_module():
    code = ("import sys, core.verification.worker, core.verification.worker.loop; "
            "bad = sorted(m for m in sys.modules if 'timing' in m.split('.') or m.startswith('plugins')); "
            "assert not bad, bad")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env=env, timeout=120)


def _worker(role: str) -> WorkerMain:
    return WorkerMain(argparse.Namespace(role=role, device="cpu", scratch="/nonexistent", backend="triton"))


@pytest.mark.parametrize("role", sorted(ROLE_OPS))
def test_each_role_answers_exactly_what_the_protocol_gives_it(role, monkeypatch):
    monkeypatch.delenv("KERNELZERO_SANDBOX_TESTING", raising=False)
    assert set(_worker(role).handlers) == (ROLE_OPS[role] | ANY_ROLE_OPS) - {Op.EXIT}
    monkeypatch.setenv("KERNELZERO_SANDBOX_TESTING", "1")
    assert set(_worker(role).handlers) == (ROLE_OPS[role] | ANY_ROLE_OPS | {Op.EXEC_TEST}) - {Op.EXIT}


@pytest.fixture(scope="module")
def reference_pool():
    pool = WorkerPool("reference", "triton", "cpu", size=1, limits=Limits(memory_mb=4096),
                      extra_env={"TRITON_INTERPRET": "1"})
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def testing_candidate_pool():
    pool = WorkerPool("candidate", "triton", "cpu", size=1, limits=Limits(memory_mb=4096),
                      extra_env={"KERNELZERO_SANDBOX_TESTING": "1", "TRITON_INTERPRET": "1"})
    yield pool
    pool.close()


def _ask(pool: WorkerPool, message: dict) -> dict:
    worker = pool.acquire()
    try:
        return worker.request(message, timeout_s=60)
    finally:
        pool.release(worker)


def test_a_live_worker_refuses_other_roles_requests_and_names_both(reference_pool, testing_candidate_pool):
    assert _ask(reference_pool, {"op": "load", "source": ""}) == {
        "ok": False, "error": "worker of role 'reference' does not answer 'load'"}
    assert _ask(reference_pool, {"op": "exec_test", "code": "pass"})["error"] == \
        "worker of role 'reference' does not answer 'exec_test'"  # only with KERNELZERO_SANDBOX_TESTING=1
    assert _ask(testing_candidate_pool, {"op": "reference", "source": ""})["error"] == \
        "worker of role 'candidate' does not answer 'reference'"
    assert _ask(testing_candidate_pool, {"op": "no_such_op"})["error"] == \
        "worker of role 'candidate' does not answer 'no_such_op'"
    assert _ask(reference_pool, {"op": "ping"})["ok"] and _ask(testing_candidate_pool, {"op": "unload"})["ok"]


def test_a_live_worker_has_not_imported_timing_after_its_set_up(testing_candidate_pool):
    hello = testing_candidate_pool.acquire()
    try:
        assert hello.wait_ready()["op"] == Op.HELLO and hello.wait_ready()["gpu_warm_up"] is None  # the CPU
        answer = hello.request({"op": "exec_test", "code": (
            "import sys\nbad = sorted(m for m in sys.modules if 'timing' in m.split('.'))\nassert not bad, bad")},
            timeout_s=60)
    finally:
        testing_candidate_pool.release(hello)
    assert answer["ok"], answer


def test_references_use_deterministic_convolutions_and_candidates_and_baselines_pytorchs_default(monkeypatch):
    # the spread of the reference's own rounding is measured by rerunning it; cuDNN's transposed convolutions are not
    # bit-reproducible by default, which left the expert's honest ConvTranspose kernels nothing to be forgiven by
    monkeypatch.setenv("KERNELZERO_SANDBOX_TESTING", "1")
    flag = "import torch\nassert torch.backends.cudnn.deterministic is {}, torch.backends.cudnn.deterministic"
    for role, expected in (("reference", True), ("candidate", False)):
        pool = WorkerPool(role, "triton", "cpu", size=1, limits=Limits(memory_mb=4096),
                          extra_env={"KERNELZERO_SANDBOX_TESTING": "1", "TRITON_INTERPRET": "1"})
        try:
            answer = _ask(pool, {"op": "exec_test", "code": flag.format(expected)})
        finally:
            pool.close()
        assert answer["ok"], (role, answer)
    import torch

    from core.verification.worker.reference import eager_algorithms

    before = torch.backends.cudnn.deterministic
    torch.backends.cudnn.deterministic = True
    try:
        with eager_algorithms():  # the eager and torch.compile baselines: timed as PyTorch runs them
            assert torch.backends.cudnn.deterministic is False
        assert torch.backends.cudnn.deterministic is True
    finally:
        torch.backends.cudnn.deterministic = before
    # around the baseline request's work, and only there: the reference stage's outputs stay deterministic
    tree = ast.parse((Path(__file__).parent.parent / "core/verification/worker/reference.py").read_text())
    role = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ReferenceRole")
    uses = {f.name for f in role.body if isinstance(f, ast.FunctionDef)
            and any(isinstance(c, ast.Call) and getattr(c.func, "id", None) == "eager_algorithms" for c in ast.walk(f))}
    assert uses == {"baseline"}, uses


# --------------------------------------------------------------------------- the warm-up hook


@dataclass
class _Check:
    name: str
    calls: list[str] = field(default_factory=list)
    fail: bool = False

    def applies(self, backend: str, device: str) -> bool:
        return True

    def warm_up(self, device: str) -> None:
        self.calls.append(device)
        if self.fail:
            raise RuntimeError("no filler kernel")


@dataclass
class _CheckWithoutHook:
    name: str = "plain"

    def applies(self, backend: str, device: str) -> bool:
        return True


def test_warm_up_calls_every_checks_hook_and_reports_each_failure():
    warmed, broken = _Check("timer"), _Check("broken", fail=True)
    assert warm_up("cpu", [_CheckWithoutHook()]) is None  # nothing to warm on the CPU
    report = warm_up("cpu", [warmed, _CheckWithoutHook()])
    assert warmed.calls == ["cpu"] and re.search(r" s \(checks: timer \d+\.\d\d s\)$", report), report
    report = warm_up("cpu", [broken, warmed])
    assert warmed.calls == ["cpu", "cpu"] and broken.calls == ["cpu"]  # one failure does not stop the rest
    assert report.startswith("failed after ") and report.endswith("broken: RuntimeError: no filler kernel"), report


def test_a_checks_warm_up_runs_only_in_the_roles_it_names():
    # gpu_activity profiles candidates only: loading CUPTI in a reference worker cost its start-up seconds
    from plugins.verifiers.gpu_activity.check import GpuActivityCheck

    only_candidates = _Check("profile")
    only_candidates.warm_up_roles = frozenset({"candidate"})
    everywhere = _Check("timer")
    warm_up("cpu", [only_candidates, everywhere], role="reference")
    assert only_candidates.calls == [] and everywhere.calls == ["cpu"]
    warm_up("cpu", [only_candidates, everywhere], role="candidate")
    assert only_candidates.calls == ["cpu"] and everywhere.calls == ["cpu", "cpu"]
    assert GpuActivityCheck.warm_up_roles == frozenset({"candidate"})


def test_the_worker_warms_the_checks_that_apply_to_its_backend_and_device(register_plugin):
    class OnlyTritonCpu:
        @hookimpl
        def register_verifiers(self, register):
            @dataclass
            class Probe:
                name: str = "probe_check"

                def applies(self, backend: str, device: str) -> bool:
                    return (backend, device) == ("triton", "cpu")

                def warm_up(self, device: str) -> None:
                    pass

            register("probe_check", Probe)

    register_plugin(OnlyTritonCpu())
    assert "probe_check" in [c.name for c in applicable_checks("triton", "cpu")]
    assert "probe_check" not in [c.name for c in applicable_checks("cuda", "cpu")]
    on_gpu = {c.name: c for c in applicable_checks("triton", "cuda")}
    assert "performance" in on_gpu and callable(on_gpu["performance"].warm_up)  # the timer's part lives there
    assert "performance" not in [c.name for c in applicable_checks("triton", "cpu")]


def test_only_a_baseline_worker_warms_torch_compile_up_and_a_failure_is_reported(monkeypatch):
    # A one-shot verdict waited ~5 s for the baseline's first, cold torch.compile build (H100, 2026-12-06) while
    # the baseline worker had idled since its hello; the warm-up pays torch.compile's one-time costs there.
    from core.verification.worker import warmup

    built = []
    import torch

    monkeypatch.setattr(warmup, "warm_gpu", lambda: None)  # no CUDA here: the generic part is not under test
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(warmup, "warm_compile", lambda: built.append(True))
    monkeypatch.delenv(warmup.WARM_COMPILE_ENV, raising=False)
    assert "torch.compile" not in (warm_up("cuda", [], role="reference") or "") and built == []
    monkeypatch.setenv(warmup.WARM_COMPILE_ENV, "1")
    assert warm_up("cpu", [], role="reference") is None and built == []  # the CPU has no compile baseline
    assert re.search(r" s \(torch\.compile \d+\.\d\d s; checks: timer \d+\.\d\d s\)$",
                     warm_up("cuda", [_Check("timer")], role="reference")) and built == [True]

    def broken() -> None:
        raise RuntimeError("no Triton")

    monkeypatch.setattr(warmup, "warm_compile", broken)
    report = warm_up("cuda", [], role="reference")
    assert report.startswith("failed after ") and report.endswith("torch.compile: RuntimeError: no Triton"), report


def test_the_baseline_pool_and_only_it_starts_its_workers_with_the_compile_warm_up(monkeypatch):
    from core.verification import gpusharing
    from core.verification.worker.warmup import WARM_COMPILE_ENV
    from core.verify import Verifier

    started = []
    monkeypatch.setattr(gpusharing, "WorkerPool", lambda role, *a, extra_env=None, **k: started.append(extra_env))
    judge = Verifier.__new__(Verifier)  # the judge's state only: no worker processes
    judge.device, judge.compile_only, judge.checks, judge.backend_name, judge.workers = "cpu", None, [], "triton", 2
    env = {"OMP_NUM_THREADS": "1"}
    judge._init_baselines(Limits(), env, 8)
    judge._baseline_workers()
    assert started == [{**env, WARM_COMPILE_ENV: "1"}] and WARM_COMPILE_ENV not in env


def test_a_hook_that_says_where_its_seconds_went_has_it_in_the_report():
    # gpu_activity's CUPTI warm-up was the candidate worker's longest start-up part on the H100 (3.8-5.3 s):
    # its hook says how much was the import, the profiler's start and its stop
    @dataclass
    class _Split(_Check):
        def warm_up(self, device: str) -> str:
            self.calls.append(device)
            return "import 0.40 s, start 2.10 s, stop 0.90 s"

    report = warm_up("cpu", [_Split("gpu_activity"), _Check("timer")])
    assert re.search(r"checks: gpu_activity \d+\.\d\d s \(import 0\.40 s, start 2\.10 s, stop 0\.90 s\), "
                     r"timer \d+\.\d\d s\)$", report), report

"""The registry of running `kernelzero serve` processes (core.serve.registry) and how `python -m core.verify` picks
one (core.serve.warm, --server auto|none|URL): a private directory, entries trusted only for a live service of this
user, and a service chosen only when it judges with this call's settings. Its services here are stand-ins (a
process whose command line is `python -m core.serve`); tests/test_warm_verify.py runs real ones."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import ClassVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.serve import registry, warm
from core.serve.app import Activity

ROOT = Path(__file__).resolve().parents[1]
REDTEAM = ROOT / "tests" / "redteam"


@pytest.fixture
def runtime(tmp_path, monkeypatch) -> Path:
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    return xdg / "kernelzero"


@pytest.fixture
def stand_in(tmp_path):
    """A live process whose command line is a service's (`python -m core.serve`); it only sleeps."""
    fake = tmp_path / "stand_in"
    (fake / "core").mkdir(parents=True)
    (fake / "core" / "__init__.py").write_text("")
    (fake / "core" / "serve.py").write_text("import time\ntime.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-m", "core.serve"], cwd=fake, env={**os.environ, "PYTHONPATH": str(fake)})
    try:
        deadline = time.monotonic() + 30
        while not registry.is_service(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        yield proc
    finally:
        proc.kill()
        proc.wait()


def entry(**changes) -> registry.Entry:
    fields = {"url": "http://127.0.0.1:9", "pid": os.getpid(), "backend": "triton", "device": "cpu", "checks": None,
              "trials": 5, "timeout_s": 120.0, "isolate": True, "code": "c0de"}
    return registry.Entry(**{**fields, **changes})


def wanted(**changes) -> warm.Wanted:
    fields = {"backend": "triton", "device": "cpu", "checks": None, "trials": 5, "timeout_s": 120.0, "isolate": True,
              "code": "c0de"}
    return warm.Wanted(**{**fields, **changes})


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# ------------------------------------------------------------------------------------------- the directory


def test_the_directory_is_kernelzero_under_xdg_runtime_dir_made_private(runtime):
    assert registry.runtime_dir() == runtime
    assert stat.S_IMODE(os.lstat(runtime).st_mode) == 0o700 and os.lstat(runtime).st_uid == os.getuid()


@pytest.mark.parametrize("xdg", [None, "relative/dir", "/nonexistent/kz-xdg"])
def test_without_a_usable_xdg_runtime_dir_it_is_a_private_one_in_the_temp_dir(tmp_path, monkeypatch, xdg):
    if xdg is None:
        monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    else:
        monkeypatch.setenv("XDG_RUNTIME_DIR", xdg)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    path = registry.runtime_dir()
    assert path == tmp_path / f"kernelzero-{os.getuid()}"
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o700


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(others=st.integers(0, 0o77))
def test_a_directory_group_or_others_may_write_is_refused(runtime, others):
    runtime.mkdir(mode=0o700, exist_ok=True)
    os.chmod(runtime, 0o700 | others)
    if others & 0o022:
        with pytest.raises(registry.RegistryError, match="writable by group or others"):
            registry.runtime_dir()
    else:
        assert registry.runtime_dir() == runtime


def test_a_symbolic_link_or_another_users_directory_is_refused(runtime, tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    runtime.symlink_to(real)
    with pytest.raises(registry.RegistryError, match="symbolic link"):
        registry.runtime_dir()
    runtime.unlink()
    if os.getuid() != 0:
        pytest.skip("only root can give a directory to another user")
    runtime.mkdir(mode=0o700)
    os.chown(runtime, 65534, -1)
    with pytest.raises(registry.RegistryError, match="belongs to uid 65534"):
        registry.runtime_dir()


# ----------------------------------------------------------------------------------------------- entries


names = st.text(st.characters(whitelist_categories=("Ll", "Nd")), min_size=1, max_size=8)
settings_of = st.fixed_dictionaries({
    "backend": st.sampled_from(["triton", "cuda", "cuda_inline"]), "device": st.sampled_from(["cpu", "cuda"]),
    "checks": st.none() | st.lists(names, min_size=1, max_size=4, unique=True),
    "trials": st.integers(5, 12), "timeout_s": st.sampled_from([60, 120, 120.0, 300.5]), "isolate": st.booleans(),
    "executor": st.sampled_from(["local", "ray"]), "code": st.sampled_from(["c0de", "beef"])})


@given(settings_of, st.integers(1, 2**22), st.booleans(), st.floats(0, 1e4))
def test_an_entry_reads_back_as_written(values, pid, token, idle):
    written = entry(pid=pid, token_required=token, idle_exit_s=idle, **values)
    assert registry.Entry.from_dict(json.loads(written.to_json())) == written


@given(settings_of, settings_of, st.randoms())
def test_differences_name_exactly_the_settings_that_differ(have, want, rng):
    diff = registry.differences(have, want)
    differ = {k for k in registry.MATCHED if (registry.normal_checks(have[k]) != registry.normal_checks(want[k])
                                              if k == "checks" else have[k] != want[k])}
    assert {d.split("=")[0] for d in diff} == differ
    shuffled = {**have, "checks": rng.sample(have["checks"], len(have["checks"])) if have["checks"] else None}
    assert registry.differences(shuffled, have) == []  # the order of the checks does not matter; 120 == 120.0


def test_register_writes_a_private_file_that_unregister_removes(runtime, stand_in):
    path = registry.register(entry(pid=stand_in.pid))
    assert path == runtime / f"{stand_in.pid}.json" and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [e.pid for e in registry.entries()] == [stand_in.pid]
    assert registry.entries()[0].proc_start == registry.process_start(stand_in.pid)
    registry.unregister(stand_in.pid)
    assert not path.exists() and registry.entries() == []


def test_readers_ignore_and_remove_entries_whose_process_is_gone_or_is_no_service(runtime, stand_in):
    gone = registry.register(entry(pid=dead_pid()))
    not_a_service = registry.register(entry(pid=os.getpid()))  # alive, but pytest is no kernelzero serve
    garbage = runtime / f"{dead_pid()}.json"
    garbage.write_text("{not json")
    other = runtime / "notes.txt"
    other.write_text("kept")
    reused = registry.register(entry(pid=stand_in.pid, proc_start=registry.process_start(stand_in.pid) - 1))
    assert registry.entries() == []  # the pid of a service that stopped, now another process's: not it either
    assert not gone.exists() and not not_a_service.exists() and not garbage.exists()
    assert other.read_text() == "kept" and reused.exists()  # the live service of that pid will overwrite it
    stand_in.kill()
    stand_in.wait()
    assert registry.entries() == [] and not reused.exists()


@pytest.mark.skipif(os.getuid() != 0, reason="only root can give a file to another user")
def test_an_entry_file_of_another_user_is_not_trusted(runtime, stand_in):
    path = registry.register(entry(pid=stand_in.pid))
    os.chown(path, 65534, -1)
    assert registry.entries() == []


# ----------------------------------------------------------------------------------------- choosing one


def test_a_service_with_other_settings_is_not_chosen_and_the_reason_names_them(runtime, stand_in):
    registry.register(entry(pid=stand_in.pid, trials=10, checks=["static", "compile"]))
    found, reasons = warm.find(wanted(checks=("compile",)))
    assert found is None
    assert reasons == [f"pid {stand_in.pid} judges with checks=compile,static (asked: compile), trials=10 (asked: 5)"]


def test_a_matching_entry_is_chosen_only_if_its_health_answers(runtime, stand_in):
    with socket.socket() as closed:  # bound, never listening: connecting is refused
        closed.bind(("127.0.0.1", 0))
        registry.register(entry(pid=stand_in.pid, url=f"http://127.0.0.1:{closed.getsockname()[1]}"))
        found, reasons = warm.find(wanted())
    assert found is None and len(reasons) == 1 and "/health did not answer" in reasons[0]


def test_a_service_that_needs_a_token_is_not_chosen_without_one(runtime, stand_in):
    registry.register(entry(pid=stand_in.pid, token_required=True))
    assert warm.find(wanted(), token=None) == (None, [f"pid {stand_in.pid} needs a token (KERNELZERO_SERVE_TOKEN)"])


def test_health_that_says_other_settings_or_another_pid_rules_a_service_out():
    health = {"ready": True, "backend": "triton", "device": "cpu", "pid": os.getpid(), "isolate": True,
              "settings": {"trials": 5, "timeout_s": 120.0, "checks": "all", "device": "cpu"}}
    assert warm.health_problem(health, entry(), wanted()) is None
    assert "pid 1" in warm.health_problem({**health, "pid": 1}, entry(), wanted())
    assert "trials=7" in warm.health_problem({**health, "settings": {**health["settings"], "trials": 7}}, entry(),
                                             wanted())
    assert "isolate=False" in warm.health_problem({**health, "isolate": False}, entry(), wanted())
    assert warm.health_problem({**health, "ready": False}, entry(), wanted()) == "it is stopping"


@pytest.mark.parametrize("flag,env,mode", [(None, None, "auto"), (None, "none", "none"), (None, " AUTO ", "auto"),
                                           ("none", "auto", "none"), (None, "http://h:1", "http://h:1"),
                                           ("http://127.0.0.1:8000", "none", "http://127.0.0.1:8000"),
                                           (None, "", "auto")])
def test_server_mode_is_the_flag_else_kernelzero_server_else_auto(monkeypatch, flag, env, mode):
    if env is None:
        monkeypatch.delenv(warm.ENV, raising=False)
    else:
        monkeypatch.setenv(warm.ENV, env)
    assert warm.server_mode(flag) == mode


def test_a_server_mode_that_is_no_mode_says_which_setting_is_wrong(monkeypatch):
    monkeypatch.setenv(warm.ENV, "localhost:8000")
    with pytest.raises(ValueError, match="KERNELZERO_SERVER='localhost:8000': expected auto, none or"):
        warm.server_mode(None)
    with pytest.raises(ValueError, match="--server='off'"):
        warm.server_mode("off")


def test_the_suggested_service_would_match_the_call():
    from core.serve.cli import config_from, parser

    want = wanted(checks=("compile", "static"), trials=7, timeout_s=30.0, isolate=False)
    config = config_from(parser().parse_args(want.serve_args(workers=1, idle_exit_s=60)))
    assert (config.backend, config.device, config.checks, config.trials, config.timeout_s, config.isolate,
            config.port, config.workers) == ("triton", "cpu", ["compile", "static"], 7, 30.0, False, 0, 1)


def test_activity_is_idle_only_when_no_request_is_open():
    activity = Activity()
    activity.begin()
    time.sleep(0.05)
    assert activity.idle_s() == 0.0
    activity.end()
    time.sleep(0.05)
    assert 0.04 <= activity.idle_s() < 5


# ------------------------------------------------------------------------ core.verify, judged in-process


class _Judge:
    """The in-process verifier, recorded (these tests are about where a pair is judged, not the verdict)."""

    judged: ClassVar[list] = []

    def __init__(self, **kwargs):
        self.isolation = "stub"
        self.warm_up_report = self.pool = self.reference_pool = self.baseline_pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def verify(self, task, candidate):
        from core.verdict import Verdict

        _Judge.judged.append((task, candidate))
        return Verdict(accepted=True, compiled=True, correct=True, status="accepted")


@pytest.fixture
def in_process(monkeypatch, runtime):
    import core.verify

    _Judge.judged = []
    monkeypatch.setattr(core.verify, "Verifier", _Judge)
    monkeypatch.delenv(warm.ENV, raising=False)
    return core.verify.main


PAIR = ["--reference", str(REDTEAM / "tasks" / "vector_add.py"), "--candidate",
        str(REDTEAM / "candidates" / "honest_vector_add.py"), "--device", "cpu", "--json"]


def test_with_no_service_a_call_judges_here_and_says_in_one_line_how_to_be_fast(in_process, capsys):
    assert in_process(PAIR) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("python -m core.verify: judging in this process: no running "), err
    assert "trials 5" in err[0] and "--keep-warm 900" in err[0] and "-m core.serve --port 0" in err[0]
    assert len(_Judge.judged) == 1


def test_with_a_mismatching_service_the_line_says_how_it_differs(in_process, capsys, stand_in):
    registry.register(entry(pid=stand_in.pid, code=registry.code_fingerprint(), trials=10))
    assert in_process(PAIR) == 0
    err = capsys.readouterr().err
    assert "trials=10 (asked: 5)" in err and len(err.strip().splitlines()) == 1 and len(_Judge.judged) == 1


@pytest.mark.parametrize("how", ["--server none", "KERNELZERO_SERVER=none"])
def test_none_judges_here_without_looking_or_a_word(in_process, capsys, monkeypatch, runtime, how):
    if how.startswith("KERNELZERO"):
        monkeypatch.setenv(warm.ENV, "none")
    runtime.mkdir(mode=0o777)  # it is not even read: a refused directory says nothing either
    os.chmod(runtime, 0o777)
    assert in_process(PAIR + (["--server", "none"] if how.startswith("--") else [])) == 0
    assert capsys.readouterr().err == "" and len(_Judge.judged) == 1


def test_a_refused_registry_directory_still_judges_here_and_says_why(in_process, capsys, runtime):
    runtime.mkdir()
    os.chmod(runtime, 0o777)
    assert in_process(PAIR) == 0
    err = capsys.readouterr().err.strip()
    assert "judging in this process" in err and "writable by group or others" in err and len(_Judge.judged) == 1


@pytest.mark.parametrize("extra,says", [(["--keep-warm", "0"], "--keep-warm takes seconds"),
                                        (["--keep-warm", "60", "--server", "none"], "this call has --server none"),
                                        (["--keep-warm", "60", "--server", "http://127.0.0.1:1"], "--server http"),
                                        (["--server", "warm"], "--server='warm': expected auto, none or")])
def test_keep_warm_and_server_usage_errors_exit_2(in_process, capsys, extra, says):
    assert in_process(PAIR + extra) == 2
    assert says in capsys.readouterr().err and _Judge.judged == []

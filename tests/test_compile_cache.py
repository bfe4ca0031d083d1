"""torch.compile's warm-up kept between processes for the baseline workers (core/verification/compilecache.py): the
judge alone writes the store, from a worker's caches at its hello; no candidate can write it."""

from __future__ import annotations

from typing import ClassVar

import pytest

from core.verification.compilecache import WarmCompileStore
from core.verification.sandbox import Limits, Worker, WorkerPool

TESTING = {"KERNELZERO_SANDBOX_TESTING": "1", "TRITON_INTERPRET": "1"}


@pytest.fixture()
def store(tmp_path, monkeypatch):
    monkeypatch.delenv("KERNELZERO_COMPILE_CACHE", raising=False)
    monkeypatch.setenv("KERNELZERO_CACHE", str(tmp_path / "cache"))
    found = WarmCompileStore.for_this_user()
    assert found is not None and found.root.is_relative_to(tmp_path / "cache" / "compile")
    assert not found.usable()  # nothing made until a worker's warm-up is kept
    return found


def test_keep_adds_whole_files_the_store_lacks_and_never_replaces_or_follows_links(store, tmp_path):
    cache = tmp_path / "scratch" / ".inductor"
    (cache / "ab").mkdir(parents=True)
    (cache / "locks").mkdir()
    (cache / "ab" / "kernel.py").write_text("new")
    (cache / "ab" / "kernel.py.123.tmp").write_text("half")
    (cache / "locks" / "kernel.lock").write_text("")
    (cache / "ab" / "linked").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").write_text("not the worker's")
    (store.root / "TORCHINDUCTOR_CACHE_DIR" / "ab").mkdir(parents=True)
    (store.root / "TORCHINDUCTOR_CACHE_DIR" / "ab" / "old.py").write_text("kept before")
    (cache / "ab" / "old.py").write_text("changed since")
    assert store.keep({"TORCHINDUCTOR_CACHE_DIR": cache}) == 1
    kept = sorted(p.relative_to(store.root).as_posix() for p in store.root.rglob("*") if p.is_file())
    assert kept == ["TORCHINDUCTOR_CACHE_DIR/ab/kernel.py", "TORCHINDUCTOR_CACHE_DIR/ab/old.py"]
    assert (store.root / "TORCHINDUCTOR_CACHE_DIR" / "ab" / "old.py").read_text() == "kept before"
    fresh = tmp_path / "next" / ".inductor"
    store.seed({"TORCHINDUCTOR_CACHE_DIR": fresh})
    assert (fresh / "ab" / "kernel.py").read_text() == "new"


def test_the_store_is_used_only_where_it_is_this_users_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELZERO_COMPILE_CACHE", "off")
    assert WarmCompileStore.for_this_user() is None
    cache = tmp_path / "scratch" / ".inductor"
    cache.mkdir(parents=True)
    (cache / "kernel.py").write_text("warm")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # another user could replace what the baseline workers load
    monkeypatch.setenv("KERNELZERO_COMPILE_CACHE", str(shared))
    store = WarmCompileStore.for_this_user()
    assert store.keep({"TORCHINDUCTOR_CACHE_DIR": cache}) == 0 and not store.usable()
    store.seed({"TORCHINDUCTOR_CACHE_DIR": tmp_path / "fresh"})
    assert not (tmp_path / "fresh").exists()
    monkeypatch.setenv("KERNELZERO_COMPILE_CACHE", str(tmp_path / "mine"))
    own = WarmCompileStore.for_this_user()
    assert not (tmp_path / "mine").exists()  # made by the first keep, not before
    assert own.keep({"TORCHINDUCTOR_CACHE_DIR": cache}) == 1 and (tmp_path / "mine").stat().st_mode & 0o777 == 0o700


def test_a_worker_starts_with_the_store_and_only_what_it_held_at_its_hello_is_kept(store):
    class WarmedUp(WarmCompileStore):
        def seed(self, folders):  # and what the engine's warm-up writes before the hello
            super().seed(folders)
            (folders["TORCHINDUCTOR_CACHE_DIR"] / "warm_up.py").write_text("the engine's own")

    (store.root / "TORCHINDUCTOR_CACHE_DIR").mkdir(parents=True)
    (store.root / "TORCHINDUCTOR_CACHE_DIR" / "earlier.py").write_text("kept by an earlier process")
    worker = Worker("reference", "triton", "cpu", Limits(memory_mb=4096), dict(TESTING),
                    compile_store=WarmedUp(store.base, store.root)).start()
    try:
        worker.wait_ready()
        assert (store.root / "TORCHINDUCTOR_CACHE_DIR" / "warm_up.py").exists()
        answer = worker.request({"op": "exec_test", "code": (
            "import os, pathlib\ncache = pathlib.Path(os.environ['TORCHINDUCTOR_CACHE_DIR'])\n"
            "assert (cache / 'earlier.py').read_text() == 'kept by an earlier process'\n"
            "(cache / 'task_graph.py').write_text('a task build')")}, timeout_s=60)
        assert answer["ok"], answer
    finally:
        worker.close()
    assert not (store.root / "TORCHINDUCTOR_CACHE_DIR" / "task_graph.py").exists()  # task code's builds stay its own


def test_a_candidate_cannot_write_the_store(store):
    target = store.root / "TORCHINDUCTOR_CACHE_DIR" / "fxgraph"
    target.parent.mkdir(parents=True)
    pool = WorkerPool("candidate", "triton", "cpu", size=1, limits=Limits(memory_mb=4096), extra_env=dict(TESTING))
    try:
        worker = pool.acquire()
        isolation = worker.isolation
        python = worker.request({"op": "exec_test", "code": f"open({str(target)!r}, 'w').write('poison')"},
                                timeout_s=60)
        assert not python["ok"] and any("outside the scratch directory" in v for v in python["sandbox"]), python
        native = worker.request({"op": "exec_test", "code": (  # a write through C++, past the audit hook
            f"import torch\ntorch.save(torch.ones(1), {str(target)!r})")}, timeout_s=60)
        cache = worker.request({"op": "exec_test", "code": (
            f"import os\nassert {str(store.root)!r} not in str(os.environ)")}, timeout_s=60)
        pool.release(worker)
    finally:
        pool.close()
    assert cache["ok"], cache  # no variable of the candidate's names the store
    if isolation.startswith("namespaces:"):  # the read-only mounts stop what the hook cannot see
        assert not native["ok"] and "Read-only file system" in native["error"], native
    assert not target.exists()


class FakePool:
    made: ClassVar[list[FakePool]] = []

    def __init__(self, role, backend, device, size=1, compile_store=None, extra_env=None, **kwargs):
        self.role, self.compile_store, self.extra_env = role, compile_store, extra_env or {}
        FakePool.made.append(self)

    def close(self):
        pass


def test_on_cuda_the_baseline_pool_alone_is_given_the_store(store, monkeypatch):
    from core.api import devices
    from core.verification import gpusharing, judge

    FakePool.made = []
    monkeypatch.setattr(devices, "cuda_visible", lambda: True)
    monkeypatch.setattr(judge, "WorkerPool", FakePool)
    monkeypatch.setattr(gpusharing, "WorkerPool", FakePool)
    monkeypatch.setattr(judge, "resolve_compare_on_device", lambda wanted, device, compile_only: False)
    verifier = judge.Verifier(device="cuda", workers=1, warm_up=False, checks=["static", "performance"])
    verifier.close()
    pools = {("baseline" if p.extra_env.get("KERNELZERO_WARM_COMPILE") == "1" else p.role): p for p in FakePool.made}
    assert set(pools) == {"candidate", "reference", "baseline"}
    assert pools["baseline"].compile_store is not None and pools["baseline"].compile_store.root == store.root
    assert pools["candidate"].compile_store is None and pools["reference"].compile_store is None
    assert not any(str(store.root) in value for p in FakePool.made for value in p.extra_env.values())


def test_the_store_is_not_made_for_a_cpu_verifier(store, monkeypatch):
    from core.verification import judge

    monkeypatch.setattr(judge, "WorkerPool", FakePool)
    verifier = judge.Verifier(device="cpu", workers=1, warm_up=False, checks=["static"])
    verifier.close()
    assert verifier._compile_store is None
    assert not store.root.exists()

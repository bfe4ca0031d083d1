"""The sandbox: the safe message codec, and worker processes that fail without taking the judge along."""

from __future__ import annotations

import os
import pickle
import struct
import threading
import time
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from core.verification.sandbox import (
    FRAME,
    MAX_FRAME_BUFFERS,
    MAX_FRAME_BYTES,
    Limits,
    ProtocolError,
    WorkerFailure,
    WorkerPool,
    dumps,
    loads,
    read_frame,
    write_frame,
)

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.bool,
          torch.uint8]


@st.composite
def strided_tensors(draw):
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.lists(st.integers(0, 5), min_size=0, max_size=3))
    base = torch.randn(*[s + 2 for s in shape], dtype=torch.float64).mul(100).to(dtype) if shape else \
        torch.tensor(draw(st.floats(-1e3, 1e3))).to(dtype)
    if shape and draw(st.booleans()):  # an offset, strided view into a larger storage
        base = base[tuple(slice(1, 1 + s) for s in shape)]
    if len(shape) >= 2 and draw(st.booleans()):
        base = base.transpose(0, 1)
    return base


def _bits(x):
    """Every element's bytes, in logical order (a fresh standard layout, so any stride views as bytes)."""
    if not x.numel():
        return x
    return torch.empty(x.shape, dtype=x.dtype).copy_(x).reshape(-1).view(torch.uint8)


@settings(max_examples=60, deadline=None)
@given(strided_tensors())
def test_tensors_round_trip_with_layout_and_bits(t):
    back = loads(dumps({"x": t, "nested": [t, (1, 2.5, "s")]}))
    x = back["x"]
    assert x.dtype == t.dtype and x.shape == t.shape and x.stride() == t.stride()
    assert x.storage_offset() == t.storage_offset()
    assert torch.equal(_bits(x), _bits(t))
    assert back["nested"][1] == (1, 2.5, "s")


@settings(max_examples=40, deadline=None)
@given(strided_tensors())
def test_tensors_cross_a_real_pipe_out_of_band_with_layout_and_bits(t):
    r, w = os.pipe()
    try:
        writer = threading.Thread(target=write_frame, args=(w, {"x": t, "again": [t], "n": 3}))
        writer.start()
        back = read_frame(r, time.monotonic() + 30)
        writer.join()
    finally:
        os.close(r)
        os.close(w)
    for x in (back["x"], back["again"][0]):
        assert x.dtype == t.dtype and x.shape == t.shape and x.stride() == t.stride()
        assert x.storage_offset() == t.storage_offset()
        assert torch.equal(_bits(x), _bits(t))
    assert back["n"] == 3
    back["x"].reshape(-1)[:1] = 0  # the judge owns what it read: writable, no copy of the sender's memory


def _frame(payload: bytes, sizes: list[int], buffers: list[bytes]) -> bytes:
    return FRAME.pack(len(payload), len(sizes)) + struct.pack(f"<{len(sizes)}Q", *sizes) + payload + b"".join(buffers)


@pytest.mark.parametrize("case", ["missing buffer", "too many buffers", "oversized", "global"])
def test_malformed_frames_are_protocol_errors(case):
    out_of_band = pickle.dumps(pickle.PickleBuffer(bytearray(b"abcd")), protocol=5, buffer_callback=lambda b: False)
    data = {
        "missing buffer": _frame(out_of_band, [], []),
        "too many buffers": FRAME.pack(4, MAX_FRAME_BUFFERS + 1),
        "oversized": _frame(b"x", [MAX_FRAME_BYTES], []),
        "global": _frame(pickle.dumps(os.system, protocol=5), [], []),
    }[case]
    r, w = os.pipe()
    try:
        os.write(w, data)
        os.close(w)
        with pytest.raises(ProtocolError):
            read_frame(r, time.monotonic() + 10)
    finally:
        os.close(r)


def test_messages_that_name_globals_are_refused():
    evil = pickle.dumps(os.system)  # a worker trying to make the judge call something
    with pytest.raises(ProtocolError, match="refusing to unpickle global"):
        loads(evil)


def test_unsendable_objects_are_named():
    with pytest.raises(TypeError, match="cannot send a object"):
        dumps({"x": object()})


@pytest.fixture(scope="module")
def pool():
    p = WorkerPool("candidate", "triton", "cpu", size=1, limits=Limits(memory_mb=4096),
                   extra_env={"KERNELZERO_SANDBOX_TESTING": "1", "TRITON_INTERPRET": "1"})
    yield p
    p.close()


def run_code(pool, code: str, timeout_s: float = 60) -> dict:
    worker = pool.acquire()
    ok = False
    try:
        answer = worker.request({"op": "exec_test", "code": code}, timeout_s=timeout_s)
        ok = True
        return answer
    finally:
        pool.release(worker, discard=not ok)


def test_worker_reports_its_isolation(pool):
    text = pool.wait_ready()[0]
    assert text.startswith(("namespaces:", "partial:", "fallback:"))


def test_a_worker_says_where_its_start_up_went(pool):
    # a one-shot verify is mostly start-up (24-30 s on the H200): the split is what tells what to cut
    pool.wait_ready()
    (start,) = pool.start_ups()
    assert 0 < start["import_torch"] <= start["total"] < start["ready_s"] < 120
    assert start["warm_up"] is None  # nothing to warm on a CPU


def test_writes_outside_scratch_are_refused_and_recorded(pool, tmp_path):
    target = Path("/tmp") / f"kz_sandbox_probe_{os.getpid()}"
    answer = run_code(pool, f"open({str(target)!r}, 'w').write('x')")
    assert not answer["ok"] and "PermissionError" in answer["error"]
    assert any("outside the scratch directory" in v for v in answer["sandbox"])
    assert not target.exists()


def test_writes_inside_scratch_are_allowed(pool):
    answer = run_code(pool, "open('inside.txt', 'w').write('x'); assert open('inside.txt').read() == 'x'")
    assert answer["ok"], answer


def test_network_and_subprocesses_are_refused(pool):
    answer = run_code(pool, "import socket; socket.create_connection(('1.1.1.1', 80), timeout=2)")
    assert not answer["ok"] and answer["sandbox"]
    answer = run_code(pool, "import subprocess; subprocess.run(['true'])")
    assert not answer["ok"] and "subprocess" in answer["sandbox"][0]


def test_signals_to_other_processes_are_refused(pool):
    answer = run_code(pool, f"import os, signal; os.kill({os.getpid()}, signal.SIGTERM)")
    assert not answer["ok"] and "signal" in answer["sandbox"][0]


@pytest.mark.parametrize("code,status", [
    ("import os; os._exit(7)", "crashed"),
    ("import ctypes; ctypes.string_at(0)", "crashed"),  # segfault
    ("x = bytearray(8 << 30)", "oom"),
], ids=["os_exit", "segfault", "oom"])
def test_dying_workers_cost_one_answer_and_are_replaced(pool, code, status):
    replaced = pool.replaced
    with pytest.raises(WorkerFailure) as info:
        run_code(pool, code)
    assert info.value.status == status, info.value.detail
    assert pool.replaced == replaced + 1
    assert run_code(pool, "y = 1 + 1")["ok"]  # the replacement answers


def test_hanging_worker_times_out(pool):
    with pytest.raises(WorkerFailure) as info:
        run_code(pool, "while True: pass", timeout_s=3)
    assert info.value.status == "timeout"
    assert run_code(pool, "y = 2")["ok"]


def test_the_triton_worker_may_start_the_ptxas_triton_is_pointed_at(tmp_path, monkeypatch):
    import os

    from core.plugins import create
    from core.verification.worker import AuditGuard

    ptxas = tmp_path / "ptxas"
    ptxas.write_text("#!/bin/sh\n")
    monkeypatch.setenv("TRITON_PTXAS_PATH", str(ptxas))
    allowed = create("backend", "triton").compiler_dirs()
    assert os.path.realpath(ptxas) in allowed
    guard = AuditGuard(str(tmp_path / "scratch"), allowed)
    assert any(str(ptxas) == d for d in guard.allowed_exec_dirs)  # the exact program, not its folder
    assert not any(d == str(tmp_path) for d in guard.allowed_exec_dirs)


@settings(max_examples=25, deadline=None)
@given(timeout_s=st.floats(1, 900), threads=st.integers(1, 64))
def test_a_worker_requests_cpu_limit_covers_every_thread_it_may_run(timeout_s, threads):
    # a reference on a 4 GiB input ran past one thread's worth of CPU time on a busy H200 (SIGXCPU,
    # 2026-12-04): the CPU limit is a runaway's, the wall-clock limit times the request
    from core.verification.judge import cpu_seconds

    limit = cpu_seconds(timeout_s, {"OMP_NUM_THREADS": str(threads)})
    assert limit >= (timeout_s + 4) * (threads + 1)  # every thread busy for the whole wall-clock limit
    assert cpu_seconds(timeout_s, {"OMP_NUM_THREADS": "x"}) >= timeout_s  # unreadable: at least one thread's

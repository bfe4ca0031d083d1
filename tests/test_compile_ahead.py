"""Compiling a Triton candidate's kernels before its first turn on a shared GPU (``Backend.compile_ahead``,
plugins/backends/triton_compile_ahead.py): the model is called once on uninitialised inputs, its Triton
launches compile and launch nothing, and an aten op that would compute stops the call before it runs. On
the CPU (the interpreter) a launch under ``compile_only`` runs nothing either, so what is checked here is
that nothing runs and nothing is judged; the GPU's compile is measured by ``scripts/gpu_measure.py kbeval``."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "1")

import triton
import triton.language as tl

from core.plugins import registry
from core.verification.worker.candidate import empty_inputs
from plugins.backends import triton_backend
from plugins.backends.triton_compile_ahead import NO_COMPUTE_OPS, StopAhead, _no_compute_mode, compile_ahead


@triton.jit
def _add_one(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1.0, mask=mask)


class Launches(torch.nn.Module):
    """Allocates, views and launches only (as the expert's forward does); counts its calls."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        y = torch.empty_like(x)
        flat, out = x.view(-1), y.view(-1)
        _add_one[(triton.cdiv(flat.numel(), 64),)](flat, out, flat.numel(), BLOCK=64)
        return y.view(x.shape)


class ComputesFirst(Launches):
    def forward(self, x):
        self.calls += 1
        z = x * 2.0  # aten.mul: computes, so the call stops here
        self.reached = True
        return super().forward(z)


@pytest.fixture(autouse=True)
def _counting_launches():
    backend = registry("backend").create("triton")
    backend.prepare_worker("cpu")  # the launch wrapper the GPU worker has too (the interpreter's here)


def test_a_launch_compiles_and_runs_nothing():
    model, x = Launches(), torch.zeros(1000)
    y_before = torch.full((1000,), 7.0)
    model.forward = lambda x, y=y_before: (_add_one[(16,)](x, y, 1000, BLOCK=64), y)[1]
    out = compile_ahead(model, [x], triton_backend._local, threads=2)
    assert out["compiled"] == 1 and "stopped" not in out, out
    assert torch.equal(y_before, torch.full((1000,), 7.0))  # the kernel did not run: y is untouched
    assert triton_backend._local.compile_only is False  # back to launching
    y = torch.full((1000,), 7.0)
    _add_one[(16,)](x, y, 1000, BLOCK=64)
    assert torch.equal(y, torch.ones(1000))  # a launch after it runs as always


def test_its_compile_threads_are_running_before_the_candidate_is_called():
    # the worker refuses a thread started while the candidate is on the stack (a sandbox finding: a hack flag),
    # and ThreadPoolExecutor starts threads at the first submissions, which Triton makes inside forward
    import threading

    seen = []

    class Counts(torch.nn.Module):
        def forward(self, x):
            seen.append(sum(t.name.startswith("kz-ahead") for t in threading.enumerate()))
            return x

    compile_ahead(Counts(), [torch.zeros(4)], triton_backend._local, threads=3)
    assert seen == [3]
    assert not any(t.name.startswith("kz-ahead") for t in threading.enumerate())  # all gone after


def test_an_op_that_computes_stops_the_call_before_it_runs():
    model = ComputesFirst()
    out = compile_ahead(model, [torch.zeros(8)], triton_backend._local, threads=1)
    assert model.calls == 1 and not hasattr(model, "reached")
    assert out["compiled"] == 0 and "aten.mul" in out["stopped"], out


@pytest.mark.parametrize("op", ["view", "permute", "empty_like", "narrow", "unsqueeze"])
def test_allocations_and_views_pass_the_no_compute_mode(op):
    assert op in NO_COMPUTE_OPS
    x = torch.arange(24.0).reshape(2, 3, 4)
    calls = {"view": lambda: x.view(6, 4), "permute": lambda: x.permute(2, 0, 1),
             "empty_like": lambda: torch.empty_like(x), "narrow": lambda: x.narrow(1, 0, 2),
             "unsqueeze": lambda: x.unsqueeze(0)}
    with _no_compute_mode():
        calls[op]()
        with pytest.raises(StopAhead):
            x.sum()
        with pytest.raises(StopAhead):
            x.clone()


def test_the_inputs_are_the_tasks_shapes_uninitialised_and_nothing_is_drawn():
    import types

    task = types.SimpleNamespace(get_inputs=lambda: [torch.randn(4, 5).t(), torch.randint(0, 9, (3,)), 2.5])
    a, b, c = empty_inputs(task, "cpu")
    assert (a.shape, a.stride(), a.dtype) == ((5, 4), (1, 5), torch.float32)
    assert (b.shape, b.dtype, c) == ((3,), torch.int64, 2.5)
    moved = types.SimpleNamespace(get_inputs=lambda: [torch.randn(4).to("cpu").cuda()])
    with pytest.raises((RuntimeError, NotImplementedError)):  # a get_inputs that moves its tensors: no meta shapes
        empty_inputs(moved, "cpu")


def test_a_candidate_worker_answers_it_and_on_the_cpu_compiles_nothing():
    from core.api.workers import Limits, WorkerPool
    from core.verification.protocol import Op, request

    pool = WorkerPool("candidate", "triton", "cpu", size=1, limits=Limits(memory_mb=4096),
                      extra_env={"TRITON_INTERPRET": "1"})
    try:
        worker = pool.acquire()
        try:
            assert worker.request(request(Op.COMPILE_AHEAD), timeout_s=60) == {"ok": True, "compiled": 0}
        finally:
            pool.release(worker)
    finally:
        pool.close()

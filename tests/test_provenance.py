"""Provenance on the CPU path (issue 17, item 4): every byte a kernel reads was produced by a
kernel, an audited PyTorch op, or was there when the call began; every output element was produced
by a kernel (or a constant fill); outputs are exactly tensors. Host computation laundered through
a copy kernel is rejected, whatever wrote the host memory; honest patterns are not."""

from __future__ import annotations

import os
from contextlib import ExitStack
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from core.verification.evidence import UNPRODUCED
from core.verification.worker.process import make_audit_mode
from core.verification.worker.session import inexact_outputs

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs the Triton interpreter")
HERE = Path(__file__).parent / "redteam"


@pytest.fixture(scope="module")
def backend():
    from plugins.backends.triton_backend import TritonBackend

    b = TritonBackend()
    b.prepare_worker("cpu")
    return b


@pytest.fixture(scope="module")
def kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def copy(src_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, tl.load(src_ptr + offs, mask=offs < n), mask=offs < n)

    @triton.jit
    def add(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(out_ptr + offs, tl.load(a_ptr + offs, mask=m) + tl.load(b_ptr + offs, mask=m), mask=m)

    @triton.jit
    def first(src_ptr, out_ptr, k, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, tl.load(src_ptr + offs, mask=offs < k), mask=offs < k)

    @triton.jit
    def scatter_add(idx_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.atomic_add(out_ptr + tl.load(idx_ptr + offs, mask=m, other=0), 1.0, mask=m)

    return {"copy": copy, "add": add, "first": first, "scatter_add": scatter_add}


def _call(backend, forward, inputs, model=None):
    """Run ``forward`` as the worker does (launch tracker, ledger, ATen audit); its findings."""
    with ExitStack() as stack:
        tracker = stack.enter_context(backend.launch_tracker())
        ledger = stack.enter_context(backend.provenance(inputs, model))
        with torch.no_grad(), make_audit_mode(tracker, None, ledger):
            out = forward(*inputs)
        outputs = list(out) if isinstance(out, (list, tuple)) else [out]
        return inexact_outputs(outputs) or ledger.check_outputs(outputs)


def _host_write(t: torch.Tensor, values) -> None:
    """Write ``t``'s memory behind PyTorch's back, as numpy through the array interface would."""
    t.numpy()[:] = values


def test_an_honest_kernel_has_no_findings(backend, kernels):
    def forward(a, b):
        out = torch.empty_like(a)
        kernels["add"][(4,)](a, b, out, a.numel(), BLOCK=256)
        return out

    assert _call(backend, forward, [torch.randn(1000), torch.randn(1000)]) == []


def test_host_computation_copied_by_a_kernel_is_found(backend, kernels):
    def forward(a, b):
        host = torch.empty_like(a)
        _host_write(host, a.numpy() + b.numpy())
        out = torch.empty_like(a)
        kernels["copy"][(4,)](host, out, a.numel(), BLOCK=256)
        return out

    findings = _call(backend, forward, [torch.randn(1000), torch.randn(1000)])
    assert findings and "bytes changed after the last kernel or audited PyTorch op" in findings[0]


def test_a_kernel_reading_memory_of_unknown_origin_is_found(backend, kernels):
    stash = torch.randn(1000)  # made before the call, held by neither the inputs nor the module

    def forward(a):
        out = torch.empty_like(a)
        kernels["copy"][(4,)](stash, out, a.numel(), BLOCK=256)
        return out

    findings = _call(backend, forward, [torch.randn(1000)])
    assert any("memory of unknown origin" in f for f in findings), findings


def test_an_audited_copy_of_memory_of_unknown_origin_is_found(backend, kernels):
    stash = torch.randn(1000)  # made outside the call and held by nothing the call may start from

    def forward(a):
        staged = torch.empty_like(a)
        staged.copy_(stash)  # an allowed op: but what it copies came from nowhere the judge saw
        out = torch.empty_like(a)
        kernels["copy"][(4,)](staged, out, a.numel(), BLOCK=256)
        return out

    findings = _call(backend, forward, [torch.randn(1000)])
    assert any("torch.copy_ copied memory of unknown origin" in f for f in findings), findings


def test_host_written_memory_copied_by_torch_is_found(backend, kernels):
    def forward(a, b):
        host = torch.empty_like(a)
        _host_write(host, a.numpy() + b.numpy())
        out = torch.empty_like(a)
        kernels["copy"][(4,)](host.clone(), out, a.numel(), BLOCK=256)
        return out

    findings = _call(backend, forward, [torch.randn(1000), torch.randn(1000)])
    assert any("torch.clone copied memory whose bytes changed" in f for f in findings), findings


def test_shifting_a_buffer_within_itself_is_not_a_finding(backend, kernels):
    def forward(a, b):
        out = torch.empty_like(a)
        kernels["add"][(4,)](a, b, out, a.numel(), BLOCK=256)
        out[1:].copy_(out[:-1].clone())  # an audited copy inside one storage
        return out

    assert _call(backend, forward, [torch.randn(1000), torch.randn(1000)]) == []


TABLE = torch.linspace(0, 1, 1000)  # a module-level constant, made at import before any input existed


def test_module_tensors_and_weights_prepared_in_init_may_be_read(backend, kernels):
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(1000))
            self.register_buffer("shift", torch.randn(1000))
            self.prepared = (self.weight * 2).detach().contiguous()  # a plain attribute, transformed once

        def forward(self, a):
            out = torch.empty_like(a)
            tmp = torch.empty_like(a)
            kernels["add"][(4,)](a, self.prepared, tmp, a.numel(), BLOCK=256)
            kernels["add"][(4,)](tmp, self.shift, out, a.numel(), BLOCK=256)
            kernels["add"][(4,)](out, TABLE, out, a.numel(), BLOCK=256)
            return out

    model = Model()
    assert _call(backend, model, [torch.randn(1000)], model) == []


@pytest.mark.parametrize("finish", ["contiguous", "clone", "to_double", "copy_into", "view"])
def test_audited_copies_of_a_kernels_output_are_the_kernels(backend, kernels, finish):
    def forward(a, b):
        out = torch.empty(50, 20)
        kernels["add"][(4,)](a, b, out, a.numel(), BLOCK=256)
        t = out.t()
        if finish == "contiguous":
            return t.contiguous()
        if finish == "clone":
            return t.clone()
        if finish == "to_double":
            return t.to(torch.float64)
        if finish == "copy_into":
            dst = torch.empty(20, 50)
            dst.copy_(t)
            return dst
        return out.view(20, 50)

    assert _call(backend, forward, [torch.randn(1000), torch.randn(1000)]) == []


def test_an_output_copied_from_an_input_is_unproduced(backend, kernels):
    def forward(a, b):
        scratch = torch.empty_like(a)
        kernels["add"][(4,)](a, b, scratch, a.numel(), BLOCK=256)  # a launch, but not the answer
        return a.clone()

    findings = _call(backend, forward, [torch.randn(1000), torch.randn(1000)])
    assert len(findings) == 1 and findings[0].startswith(UNPRODUCED) and "1000 of 1000" in findings[0]


def test_a_zero_filled_output_with_atomic_counts_is_produced(backend, kernels):
    def forward(idx):
        bins = torch.zeros(64)  # most bins are never touched: their zeros are a constant fill
        kernels["scatter_add"][(1,)](idx, bins, idx.numel(), BLOCK=128)
        return bins

    assert _call(backend, forward, [torch.randint(0, 8, (100,), dtype=torch.int32)]) == []


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 300), k=st.integers(0, 300))
def test_exactly_the_elements_no_kernel_wrote_are_reported(backend, kernels, n, k):
    k = min(k, n)

    def forward(a):
        out = torch.empty_like(a)
        kernels["first"][(1,)](a, out, k, BLOCK=512)
        return out

    findings = _call(backend, forward, [torch.randn(n)])
    if k == n:
        assert findings == []
    else:
        assert len(findings) == 1 and f": {n - k} of {n} elements (the first at flat index {k})" in findings[0]


def test_a_tensor_subclass_output_is_named_without_being_touched():
    touched = []

    class Lazy(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            touched.append(func)
            return super().__torch_function__(func, types, args, kwargs or {})

    out = torch.randn(4).as_subclass(Lazy)
    touched.clear()
    assert inexact_outputs([torch.randn(2), out]) == ["output 1 is a Lazy, not a torch.Tensor"]
    assert touched == []
    assert inexact_outputs([torch.nn.Parameter(torch.randn(2))]) == []


def test_the_verifier_rejects_numpy_laundering_with_the_static_policy_off():
    """The red-team case the static policy refuses (``undefined-name``): with that layer off, the
    ledger still rejects it, and for the right reason."""
    from core.contracts import Candidate, Task
    from core.verify import Verifier

    task = Task.from_file(HERE / "tasks" / "vector_add.py")
    hack = Candidate.from_file(HERE / "candidates" / "provenance_leaked_numpy.py")
    honest = Candidate.from_file(HERE / "candidates" / "honest_vector_add.py")
    with Verifier(backend="triton", device="cpu", workers=1, timeout_s=120, checks=["correctness", "integrity"]) as v:
        verdict, control = v.verify(task, hack), v.verify(task, honest)
    assert verdict.checks["correctness"].passed  # the answer is right: only provenance shows the hack
    assert not verdict.accepted and "integrity" in verdict.hack_flags
    assert "provenance:" in verdict.reason and "bytes changed" in verdict.reason, verdict.reason
    assert control.accepted, control.reason

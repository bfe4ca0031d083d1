"""Interpreted Triton kernels are compiled for a GPU target first: a body Triton's compiler rejects
(host Python in a kernel) never runs on CPU, while honest kernels, helpers and autotune-style
constexprs compile and run."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from plugins.backends.triton_gpu_compile import GpuCompileError, compile_for_gpu, install

RAN: list[str] = []


def host_side_effect() -> int:
    RAN.append("host code ran")
    return 1


@triton.jit
def _double(x):
    return x * 2


@triton.jit
def honest_kernel(x_ptr, out_ptr, n, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, _double(tl.load(x_ptr + offs, mask=mask)) * scale, mask=mask)


@triton.jit
def host_call_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    k = host_side_effect()
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * k, mask=offs < n)


@triton.jit
def torch_in_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    import torch as t

    t.ones(1)
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


@pytest.fixture(scope="module", autouse=True)
def installed():
    install()


def test_an_honest_kernel_with_a_helper_compiles_and_runs():
    x = torch.randn(300)
    out = torch.empty_like(x)
    honest_kernel[(triton.cdiv(300, 128),)](x, out, 300, 0.5, BLOCK=128)
    torch.testing.assert_close(out, x)


@pytest.mark.parametrize("kernel, what", [(host_call_kernel, "host_side_effect"), (torch_in_kernel, "Import")])
def test_a_body_the_gpu_compiler_rejects_never_runs(kernel, what):
    RAN.clear()
    x = torch.randn(64)
    out = torch.zeros_like(x)
    for _ in range(2):  # the refusal is remembered: a second launch is refused too
        with pytest.raises(GpuCompileError, match="does not compile for a GPU") as err:
            kernel[(1,)](x, out, 64, BLOCK=64)
        assert what in str(err.value)
    assert RAN == [] and torch.count_nonzero(out) == 0


def test_unsupported_argument_types_are_refused():
    with pytest.raises(GpuCompileError, match="cannot be passed"):
        compile_for_gpu(honest_kernel.fn, (torch.randn(4), torch.randn(4), 4, "two"), {"BLOCK": 4})


def test_signatures_are_compiled_per_dtype():
    for dtype in (torch.float32, torch.float16, torch.int32):
        x = torch.ones(16, dtype=dtype)
        compile_for_gpu(honest_kernel.fn, (x, torch.empty_like(x), 16, 2), {"BLOCK": 16})


@triton.jit
def stdlib_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    y = tl.sigmoid(x) + tl.math.exp(x) * 0 + tl.maximum(x, 0.0) * 0
    total = tl.sum(y, axis=0) * 0 + tl.max(y, axis=0) * 0
    tl.store(out_ptr + offs, y + total + tl.cdiv(n, BLOCK) * 0, mask=mask)


def test_triton_standard_library_calls_compile():
    x = torch.randn(100)
    out = torch.empty_like(x)
    stdlib_kernel[(1,)](x, out, 100, BLOCK=128)
    torch.testing.assert_close(out, torch.sigmoid(x))


def test_a_direct_call_of_a_jit_function_does_not_break_later_compiles():
    from triton.runtime.interpreter import InterpretedFunction

    assert isinstance(_double, InterpretedFunction)
    _double(torch.ones(2))  # a grid-less call: Triton 3.9 left triton.language patched after it
    x = torch.randn(40, dtype=torch.float16)
    out = torch.empty_like(x)
    honest_kernel[(1,)](x, out, 40, 0.5, BLOCK=64)
    torch.testing.assert_close(out, x)


def test_two_kernels_of_one_name_and_shape_with_other_globals_get_their_own_verdicts(tmp_path):
    # the same body and name in two modules: one reads a helper kernel, the other a host function
    import importlib.util

    source = (
        "import triton\nimport triton.language as tl\n\n"
        "@triton.jit\ndef k(x_ptr, out_ptr, n, BLOCK: tl.constexpr):\n"
        "    offs = tl.arange(0, BLOCK)\n"
        "    tl.store(out_ptr + offs, helper(tl.load(x_ptr + offs, mask=offs < n)), mask=offs < n)\n")
    modules = []
    for name in ("kz_same_good", "kz_same_bad"):
        path = tmp_path / f"{name}.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        modules.append(module)
    good, bad = modules
    good.helper, bad.helper = _double, host_side_effect
    x = torch.randn(8)
    compile_for_gpu(good.k.fn, (x, torch.empty_like(x), 8), {"BLOCK": 8})
    with pytest.raises(GpuCompileError, match="Cannot access global variable helper"):
        compile_for_gpu(bad.k.fn, (x, torch.empty_like(x), 8), {"BLOCK": 8})


def test_a_kernel_that_reaches_triton_through_its_closure_compiles_and_runs():
    def make():
        import triton.language as tl  # a local of the enclosing function: a cell, not a global

        @triton.jit
        def row_sum(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
            offs = tl.arange(0, BLOCK)
            tl.store(out_ptr, tl.sum(tl.load(x_ptr + offs, mask=offs < n, other=0.0), axis=0))

        assert "tl" in row_sum.fn.__code__.co_freevars

        return row_sum

    x = torch.randn(50)
    out = torch.zeros(1)
    make()[(1,)](x, out, 50, BLOCK=64)
    torch.testing.assert_close(out, x.sum().reshape(1))


def test_host_code_reached_through_a_closure_is_still_refused():
    def make():
        side_effect = host_side_effect

        @triton.jit
        def closure_host_call(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
            offs = tl.arange(0, BLOCK)
            tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * side_effect(), mask=offs < n)

        return closure_host_call

    RAN.clear()
    x = torch.randn(8)
    out = torch.zeros_like(x)
    with pytest.raises(GpuCompileError, match="does not compile for a GPU"):
        make()[(1,)](x, out, 8, BLOCK=8)
    assert RAN == [] and torch.count_nonzero(out) == 0

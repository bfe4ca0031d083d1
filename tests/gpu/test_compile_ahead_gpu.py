"""Compiling a Triton candidate's kernels before its first trial, on a real GPU (skipped without CUDA): every
autotune config is compiled, nothing is launched, the first real call compiles nothing more, and a verdict
through the verifier records the step (``stage_s["compile_ahead"]``) and is accepted as before."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; none is visible")]

TASK = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x * 2.0 + 1.0


def get_inputs():
    return [torch.randn(4096, 1024)]


def get_init_inputs():
    return []
'''

CANDIDATE = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({"BLOCK": 256}, num_warps=2), triton.Config({"BLOCK": 512}, num_warps=4),
                          triton.Config({"BLOCK": 1024}, num_warps=4)], key=["n"])
@triton.jit
def _affine(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0 + 1.0, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        n = x.numel()
        _affine[lambda META: (triton.cdiv(n, META["BLOCK"]),)](x, y, n)
        return y
'''


def test_every_config_compiles_ahead_nothing_runs_and_the_first_call_compiles_nothing_more():
    from core.plugins import registry
    from plugins.backends import triton_backend
    from plugins.backends.triton_compile_ahead import compile_ahead
    from plugins.coders.expert_lowering.selfcheck import load_module

    registry("backend").create("triton").prepare_worker("cuda")  # the GPU worker's launch wrappers
    module = load_module(CANDIDATE, "compile_ahead_gpu")  # from a real file: triton.jit reads its source
    model = module.ModelNew()
    jit = module._affine.fn  # the autotuner's JITFunction
    x = torch.empty(4096, 1024, device="cuda")
    caches = jit.device_caches[torch.cuda.current_device()][0]
    before = len(caches)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        out = compile_ahead(model, [x], triton_backend._local, threads=4)
        torch.cuda.synchronize()
    assert out["compiled"] == 3 and "stopped" not in out, out
    assert len(caches) == before + 3  # one binary per config
    on_gpu = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert on_gpu == [], on_gpu  # nothing ran on the GPU: no kernel, no fill, no copy
    x = torch.randn(4096, 1024, device="cuda")
    y = model(x)  # the first real call: the autotuner benchmarks the compiled configs, then runs its choice
    torch.cuda.synchronize()
    assert len(caches) == before + 3  # it compiled nothing more
    assert torch.allclose(y, x * 2.0 + 1.0)


def test_a_verdict_compiles_ahead_and_is_accepted():
    from core.task import Candidate, Task
    from core.verify import Verifier

    with Verifier(backend="triton", device="cuda", workers=1, timeout_s=300) as verifier:
        assert verifier.compile_ahead
        verdict = verifier.verify(Task(source=TASK), Candidate(source=CANDIDATE, backend="triton"))
    assert verdict.accepted, verdict.reason
    assert "compile_ahead" in verdict.stage_s

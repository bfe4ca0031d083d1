"""The inductor teacher. On CPU: it declines with a message naming the GPU it needs, and its
assembly (Inductor output module -> self-contained candidate) is checked on a module written in
Inductor's output format, run in the Triton interpreter. On a GPU: the real torch.compile path."""

from __future__ import annotations

import pytest
import torch

from core.program import Node, Program, TensorSpec
from plugins.coders.expert_lowering.selfcheck import compare
from plugins.coders.inductor import (
    NO_GPU, Declined, InductorCoder, build_candidate_source, forbidden_calls, parse_kernels, static_findings,
    wrapper_parts,
)
from plugins.proposers.common import program_to_task

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

# The shape of Inductor's output module (torch 2.6+): kernels as source strings compiled by
# async_compile, a call() that allocates and launches, a benchmark harness. Here on CPU tensors.
INDUCTOR_STYLE = """
from ctypes import c_void_p, c_long, c_int
import torch
import math
import os
import tempfile
from torch._C import _cuda_getCurrentRawStream as get_raw_stream
from torch._inductor.async_compile import AsyncCompile
import triton
import triton.language as tl

empty_strided_cpu = torch._C._dynamo.guards._empty_strided_cpu
reinterpret_tensor = torch._C._dynamo.guards._reinterpret_tensor
async_compile = AsyncCompile()


triton_poi_fused_add_relu_0 = async_compile.triton('triton_poi_fused_add_relu_0', '''
import triton
import triton.language as tl

@triton_heuristics.pointwise(
    size_hints={'x': 256},
    filename=__file__,
)
@triton.jit
def triton_poi_fused_add_relu_0(in_ptr0, in_ptr1, out_ptr0, xnumel, XBLOCK : tl.constexpr):
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    xmask = xindex < xnumel
    x0 = xindex
    tmp0 = tl.load(in_ptr0 + (x0), xmask)
    tmp1 = tl.load(in_ptr1 + (x0), xmask)
    tmp2 = tmp0 + tmp1
    tmp3 = tl.where(tmp2 < 0, 0.0, tmp2)
    tl.store(out_ptr0 + (x0), tmp3, xmask)
''', device_str='cuda')


triton_per_fused_sum_1 = async_compile.triton('triton_per_fused_sum_1', '''
import triton
import triton.language as tl

@triton_heuristics.persistent_reduction(
    size_hints={'x': 16, 'r0_': 32},
    filename=__file__,
)
@triton.jit
def triton_per_fused_sum_1(in_ptr0, out_ptr0, xnumel, r0_numel, XBLOCK : tl.constexpr):
    R0_BLOCK: tl.constexpr = 32
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < xnumel
    r0_index = tl.arange(0, R0_BLOCK)[None, :]
    r0_mask = r0_index < r0_numel
    tmp0 = tl.load(in_ptr0 + (r0_index + r0_numel * xindex), xmask & r0_mask, other=0.0)
    tmp1 = tl.sum(tl.where(xmask & r0_mask, tmp0, 0.0), 1)[:, None]
    tl.store(out_ptr0 + (xindex), tmp1, xmask)
''', device_str='cuda')

async_compile.wait(globals())
del async_compile

def call(args):
    arg0_1, arg1_1 = args
    args.clear()
    stream0 = get_raw_stream(0) if torch.cuda.is_available() else None
    buf0 = empty_strided_cpu((6, 20), (20, 1), torch.float32)
    # Topologically Sorted Source Nodes: [add, relu], Original ATen: [aten.add, aten.relu]
    triton_poi_fused_add_relu_0.run(arg0_1, arg1_1, buf0, 120, stream=stream0)
    del arg0_1
    buf1 = empty_strided_cpu((6, ), (1, ), torch.float32)
    triton_per_fused_sum_1.run(buf0, buf1, 6, 20, stream=0)
    return (buf1, )


def benchmark_compiled_module(times=10, repeat=10):
    return 0.0


if __name__ == "__main__":
    benchmark_compiled_module()
"""


def test_declines_on_cpu_saying_it_needs_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    task = program_to_task(Program([TensorSpec((4, 8))], [Node("relu", (0,))]), _catalog(), seed=0)
    [[cand]] = InductorCoder().generate([task], "triton")
    assert cand.declined == NO_GPU and "GPU" in cand.declined
    [[cand]] = InductorCoder().generate([task], "cuda")
    assert cand.declined and "Triton" in cand.declined


def test_assembly_of_an_inductor_module_runs_and_matches():
    program = Program([TensorSpec((6, 20)), TensorSpec((6, 20))], [Node("add", (0, 1)), Node("relu", (2,)),
                                                                  Node("sum", (3,))])
    task = program_to_task(program, _catalog(), seed=0)
    kernels = parse_kernels(INDUCTOR_STYLE)
    assert [k.axes for k in kernels] == ["x", "x"]
    configs = {"triton_poi_fused_add_relu_0": ({"XBLOCK": 64}, 4, 1), "triton_per_fused_sum_1": ({"XBLOCK": 4}, 4, 1)}
    source = build_candidate_source(task.source, INDUCTOR_STYLE, kernels, configs, ["x0", "x1"], ["x0", "x1"])
    assert "async_compile" not in source and "benchmark_compiled_module" not in source
    assert source.count("@triton.jit") == 2 and "triton_heuristics" not in source
    # Inductor's header imports (os, tempfile, ctypes, torch._C) are gone: the static stages pass
    assert static_findings(source) == "", static_findings(source)
    assert "import os" not in source and "torch._C import" not in source and "def get_raw_stream" in source
    result = compare(task.source, source)
    assert result.ok, result.detail + "\n" + source


def test_only_real_aten_and_extern_calls_count_not_inductor_comments():
    # Inductor names the ATen ops each Triton kernel replaced in a comment; those are not calls.
    assert forbidden_calls(INDUCTOR_STYLE) == []
    with_extern = INDUCTOR_STYLE.replace("    del arg0_1\n", "    extern_kernels.mm(arg0_1, arg1_1, out=buf0)\n"
                                                            "    buf2 = torch.ops.aten.gelu.default(buf0)  # aten.x\n")
    assert forbidden_calls(with_extern) == ["extern_kernels.mm", "torch.ops.aten"]
    assert forbidden_calls(INDUCTOR_STYLE.replace("args.clear()", "args.clear(); 'aten.relu'")) == []


def test_templates_and_missing_call_are_declined():
    with pytest.raises(Declined, match="template"):
        parse_kernels(INDUCTOR_STYLE.replace("@triton_heuristics.pointwise(", "@triton_heuristics.template("))
    with pytest.raises(Declined, match="call"):
        wrapper_parts(INDUCTOR_STYLE.replace("def call(args):", "def not_call(args):"))
    with pytest.raises(Declined, match="grid"):
        parse_kernels(INDUCTOR_STYLE.replace("xoffset = tl.program_id(0) * XBLOCK", "xoffset = 0"))


@pytest.mark.gpu
def test_inductor_teacher_on_gpu_is_accepted_by_the_verifier():
    from core.verify import Verifier

    task = program_to_task(Program([TensorSpec((64, 256))], [Node("gelu", (0,), {"approximate": "tanh"}),
                                                             Node("softmax", (1,))]), _catalog(), seed=0)
    [[cand]] = InductorCoder().generate([task], "triton")
    assert cand.declined is None, cand.declined
    with Verifier(backend="triton", device="cuda", workers=1) as v:
        verdict = v.verify(task, cand)
    assert verdict.accepted, verdict.to_dict()


def _catalog():
    from core.plugins import registry

    ops = registry("op")
    return {n: ops.get(n) for n in ops.names()}

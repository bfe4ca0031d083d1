"""The static policy (plugins/verifiers/policy): every rule refuses its family and names itself and
the line; honest candidates of every source we have (the expert teacher, the backends' guides and
warm-up candidates, KernelBench-style Triton and CuPy solutions, the red-team's honest controls)
pass; each backend declares its policy, and a backend that declares none gets the strictest."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.contracts import optional
from core.task import Candidate, Task
from core.verification.evidence import Evidence
from plugins.backends.cuda_backend import GUIDE_EXAMPLE
from plugins.backends.cuda_backend import STATIC_POLICY as CUDA
from plugins.backends.triton_backend import STATIC_POLICY as TRITON
from plugins.backends.triton_backend import WARM_UP_CANDIDATE
from plugins.verifiers.policy import STRICTEST, check
from plugins.verifiers.static import StaticIntegrityCheck

REDTEAM = Path(__file__).parent / "redteam" / "candidates"

HEADER = """\
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)
"""
HEADER_LINES = HEADER.count("\n")


def findings(source: str, policy=TRITON) -> list:
    return check(ast.parse(textwrap.dedent(source)), policy)


def rules(source: str, policy=TRITON) -> set[str]:
    return {f.rule for f in findings(source, policy)}


def body(code: str) -> str:
    """A candidate: HEADER, then ``code`` (dedented) from line HEADER_LINES + 1."""
    return HEADER + textwrap.dedent(code)


# (rule, code after HEADER, the line of HEADER + code the finding must name)
CASES = [
    ("undefined-name", "def f(x):\n    return np.asarray(x)\n", 2),  # the interpreter's leaked numpy
    ("import", "import numpy as np\n", 1),
    ("import", "import os.path\n", 1),
    ("import", "from torch.utils import dlpack\n", 1),
    ("import", "from core.verification import worker\n", 1),
    ("import", "import importlib\n", 1),
    ("import", "from triton.runtime import driver\n", 1),
    ("import", "import torch\ntorch = None\ntorch = 3\n", 3),
    ("import-star", "from math import *\n", 1),
    ("import-relative", "from . import helpers\n", 1),
    ("module-member", "x = torch.multiprocessing.Pool\n", 1),
    ("module-member", "f = torch.jit.fork\n", 1),
    ("module-member", "t = torch.from_numpy\n", 1),
    ("module-member", "t = torch.utils.dlpack.from_dlpack\n", 1),
    ("module-member", "t = torch.os.system\n", 1),
    ("module-member", "t = torch.compile\n", 1),
    ("module-member", "t = torch.cuda.graphs\n", 1),
    ("module-member", "t = tl.core.builtins\n", 1),
    ("module-member", "t = triton.testing.do_bench\n", 1),
    ("module-member", "t = torch.nn.parallel.parallel_apply\n", 1),
    ("module-member", "t = torch.no_such_member_anywhere\n", 1),
    ("module-value", "m = torch.nn\n", 1),
    ("module-value", "mods = [torch]\n", 1),
    ("module-value", "def f():\n    return triton\n", 2),
    ("private-attribute", "t = torch._C\n", 1),
    ("private-attribute", "t = torch._C._nn.linear\n", 1),
    ("private-attribute", "t = torch.Tensor._make_subclass\n", 1),
    ("private-attribute", "def f(x):\n    return x.__class__\n", 2),
    ("private-attribute", "def f(x):\n    return x._base\n", 2),
    ("private-attribute", "def f(fn):\n    return fn.__globals__\n", 2),
    ("private-attribute", "def f():\n    return object.__subclasses__()\n", 2),
    ("private-attribute", "class A(nn.Module):\n    def f(self):\n        return self.__dict__\n", 3),
    ("private-attribute", "class A(nn.Module):\n    def f(self):\n        s = self\n        return s._p\n", 4),
    ("private-attribute", "class A(nn.Module):\n    def f(self, other):\n        self = other\n        return self._p\n", 4),
    ("private-attribute", "class A(nn.Module):\n    def f(self):\n        g = lambda self: self._p\n        return g\n", 3),
    ("private-attribute", "def f(x):\n    return getattr(x, '_cdata')\n", 2),
    ("introspection", "def f(g):\n    return g.gi_frame.f_back\n", 2),
    ("introspection", "def f(e):\n    return e.tb_frame\n", 2),
    ("barred-attribute", "def f(x):\n    return x.numpy()\n", 2),
    ("barred-attribute", "def f(x):\n    return x.tolist()\n", 2),
    ("barred-attribute", "def f(x):\n    x.apply_(abs)\n", 2),
    ("barred-attribute", "def f(x):\n    return x.as_subclass(torch.Tensor)\n", 2),
    ("barred-attribute", "def f(x):\n    x.sum().backward()\n", 2),
    ("barred-attribute", "def f(x):\n    return x.data_ptr()\n", 2),
    ("barred-attribute", "kernel.add_pre_run_hook(print)\n", 1),
    ("barred-attribute", "def f(x):\n    return getattr(x, 'numpy')()\n", 2),
    ("barred-attribute", "t = torch.from_file\n", 1),
    ("barred-attribute", "def f(x):\n    return x.untyped_storage()[0]\n", 2),
    ("barred-attribute", "cfg = triton.Config({'BLOCK': 64})\ncfg.pre_hook = print\n", 2),
    ("builtin", "g = getattr\n", 1),
    ("builtin", "names = list(map(getattr, [torch], ['jit']))\n", 1),
    ("builtin", "e = eval\n", 1),
    ("builtin", "exec('1')\n", 1),
    ("builtin", "c = compile('1', 'x', 'eval')\n", 1),
    ("builtin", "m = __import__('os')\n", 1),
    ("builtin", "g = globals()\n", 1),
    ("builtin", "v = vars(torch)\n", 1),
    ("builtin", "f = open('/etc/passwd')\n", 1),
    ("builtin", "b = __builtins__\n", 1),
    ("builtin", "breakpoint()\n", 1),
    ("builtin", "Lazy = type('Lazy', (torch.Tensor,), {})\n", 1),
    ("builtin", "class A:\n    @property\n    def shape(self):\n        return 1\n", 2),
    ("dynamic-attribute", "def f(x, name):\n    return getattr(x, name)\n", 2),
    ("dynamic-attribute", "def f(x):\n    return getattr(x, 'nu' + 'mpy')\n", 2),
    ("dynamic-attribute", "class A(nn.Module):\n    def f(self, i):\n        setattr(self, f'w{i}', 1)\n", 3),
    ("patch", "torch.allclose = lambda *a, **k: True\n", 1),
    ("patch", "nn.Module.__call__ = print\n", 1),
    ("patch", "T = torch.Tensor\nT.add = print\n", 2),
    ("patch", "del torch.add\n", 1),
    ("patch", "torch.cuda.Event.elapsed_time = print\n", 1),
    ("patch", "setattr(torch, 'allclose', print)\n", 1),
    ("patch", "print.x = 1\n", 1),
    ("patch", "kernel.run = print\n", 1),
    ("patch", "T, = (torch.Tensor,)\nT.add = print\n", 2),
    ("patch", "T = torch.Tensor\nT = T\nT.add = print\n", 3),
    ("patch", "for T in [torch.Tensor]:\n    T.add = print\n", 2),
    ("patch", "k2 = kernel\nk2.fn = print\n", 2),
    ("class-base", "class Lazy(torch.Tensor):\n    pass\n", 1),
    ("class-base", "class P(nn.Parameter):\n    pass\n", 1),
    ("class-base", "from torch import Tensor\nclass Lazy(Tensor):\n    pass\n", 2),
    ("class-base", "class A(nn.Module, metaclass=type):\n    pass\n", 1),
    ("class-base", "class A(dict):\n    pass\n", 1),
    ("class-base", "def f(x):\n    class Lazy(type(x)):\n        pass\n", 2),
    ("protocol-hook", "class A:\n    def __torch_function__(self, *a):\n        pass\n", 2),
    ("protocol-hook", "class A:\n    def __array_interface__(self):\n        pass\n", 2),
    ("protocol-hook", "class A:\n    __cuda_array_interface__ = {}\n", 2),
    ("protocol-hook", "class A:\n    def __dlpack__(self):\n        pass\n", 2),
    ("protocol-hook", "def __torch_function__(*a):\n    pass\n", 1),
    ("dunder-def", "class A:\n    def __index__(self):\n        return 1\n", 2),
    ("dunder-def", "class A:\n    def __getattr__(self, name):\n        return 1\n", 2),
    ("dunder-def", "class A:\n    def __del__(self):\n        pass\n", 2),
    ("dunder-def", "def __getattr__(name):\n    return 1\n", 1),
    ("dunder-def", "__builtins__ = {}\n", 1),
    ("async", "async def f():\n    pass\n", 1),
    ("async", "def f(xs):\n    return [x async for x in xs]\n", 2),
    ("launch-grid", "def f(x, y):\n    kernel[lambda m: (torch.add(x, x, out=y), 1)[1:]](x, y, 4, BLOCK=4)\n", 2),
    ("launch-grid", "def f(x, y):\n    kernel[(x.sum().item(),)](x, y, 4, BLOCK=4)\n", 2),
    ("launch-grid", "def f(x, y, g):\n    kernel[g](x, y, 4, BLOCK=4)\n", 2),
    ("launch-grid", "def f(x, y):\n    grid = lambda m: (y.copy_(x).numel(),)\n    kernel[grid](x, y, 4, BLOCK=4)\n", 2),
    ("launch-grid", "def f(x, y):\n    max = lambda *a: y.copy_(x)\n    kernel[(max(1, 2),)](x, y, 4, BLOCK=4)\n", 3),
    ("launch-grid", "class A(nn.Module):\n    def forward(self, x, y):\n        kernel[self.grid](x, y, 4)\n", 3),
    ("launch-grid", "def f(x, y):\n    g = [1]\n    kernel[(g.pop(),)](x, y, 4, BLOCK=4)\n", 3),
    ("launch-grid", "def numel():\n    pass\ndef f(x, y):\n    kernel[(x.numel(),)](x, y, 4, BLOCK=4)\n", 4),
    ("launch-grid", "def f(k, x):\n    k[lambda m: (x.add_(1), 1)](x)\n", 2),
    ("launch-grid", "def f(k, x):\n    k.run(x, grid=lambda m: (x.add_(1),), warmup=False)\n", 2),
    ("launch-hook", "@triton.heuristics({'B': lambda args: args['x_ptr'].add_(1)})\n@triton.jit\ndef k2(x_ptr, B: tl.constexpr):\n    pass\n", 1),
    ("launch-grid", "def f(x):\n    for g in [lambda m: (x.add_(1), 1)[1:]]:\n        [kernel][0][g](x, x, 4)\n", 3),
    ("launch-grid", "tuned = triton.heuristics({})(kernel)\ndef f(x):\n    for g in [lambda m: (x.add_(1),)]:\n"
                    "        tuned[g](x, x, 4)\n", 4),
    ("launch-grid", "box = {'k': kernel}\ndef f(x, g):\n    box['k'][g](x, x, 4)\n", 3),
    ("launch-grid", "def f(x, g):\n    kernel.run(x, x, 4, grid=g, warmup=False)\n", 2),
    ("launch-hook", "for h in [print]:\n    @triton.heuristics({'B': h})\n    @triton.jit\n    def k2(x_ptr, B: tl.constexpr):\n"
                    "        pass\n", 2),
    ("launch-hook", "@triton.heuristics({'B': 3 if True else 4})\n@triton.jit\ndef k2(x_ptr, B: tl.constexpr):\n    pass\n", 1),
    ("launch-hook", "cfg = triton.Config({'BLOCK': 64}, pre_hook=print)\n", 1),
    ("launch-hook", "@triton.autotune(configs=[], key=['n'], prune_configs_by={'early_config_prune': print})\n"
                    "@triton.jit\ndef k2(x_ptr, n):\n    pass\n", 1),
    ("device-code", "@triton.jit\ndef k2(x_ptr):\n    torch.add(x_ptr, x_ptr)\n", 3),
    ("device-code", "_BOX = []\n@triton.jit\ndef k2(x_ptr):\n    _BOX.append(x_ptr)\n", 4),
    ("device-code", "def helper(x):\n    return x\n@triton.jit\ndef k2(x_ptr):\n    helper(x_ptr)\n", 5),
    ("device-code", "@triton.jit\ndef k2(x_ptr):\n    v = tl.load(x_ptr)\n    v.handle.data.sum()\n", 4),
    ("device-code", "@triton.jit\ndef k2(x_ptr):\n    open('x')\n", 3),
    ("device-code", "SCALE = 0.5\n@triton.jit\ndef k2(x_ptr):\n    tl.store(x_ptr, SCALE)\n", 4),
    ("device-code", "def body(x_ptr):\n    torch.add(x_ptr, x_ptr)\nk2 = triton.jit(body)\n", 2),
    ("device-code", "k2 = triton.jit(lambda x_ptr: torch.add(x_ptr, x_ptr))\n", 1),
    ("device-code", "J = [triton.jit][0]\n", 1),
    ("device-code", "jit = triton.jit\nJ = [jit]\n", 2),
    ("device-code", "class K:\n    @triton.jit\n    def k2(x_ptr):\n        torch.add(x_ptr, x_ptr)\n", 4),
    ("device-code", "def f(x):\n    @triton.jit\n    def k2(x_ptr):\n        x.add_(1)\n    return k2\n", 4),
]


@pytest.mark.parametrize("rule, code, line", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_each_rule_refuses_its_family_and_names_the_line(rule, code, line):
    found = findings(body(code))
    assert any(f.rule == rule and f.line == HEADER_LINES + line for f in found), (rule, [str(f) for f in found])
    for f in found:
        assert str(f).startswith(f"rule {f.rule} at line {f.line}: ") and len(f.message) > 10


def test_grids_from_range_loops_and_reassigned_parameters_are_arithmetic():
    source = body('''
        def launch(x, y, grid=None):
            grid = (triton.cdiv(x.numel(), 64),)
            kernel[grid](x, y, x.numel(), BLOCK=64)
            for i in range(3):
                kernel[(i + 1,)](x, y, x.numel(), BLOCK=64)
            layers = {}
            for name in ["a", "b"]:
                layers[name](x)  # no kernel escapes into containers here: an ordinary call
        ''')
    assert findings(source) == []


def test_the_rejection_names_the_rule_and_the_line():
    source = body("import numpy as np\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return x.numpy()\n")
    evidence = Evidence(task=Task(source=""), candidate=Candidate(source=source), backend="triton", device="cpu",
                        tree=ast.parse(source))
    result = StaticIntegrityCheck().evaluate(evidence)
    assert not result.passed and result.hack
    assert f"rule import at line {HEADER_LINES + 1}: imports numpy" in result.detail
    assert f"rule barred-attribute at line {HEADER_LINES + 6}: .numpy" in result.detail
    assert result.data["rules"] == ["barred-attribute", "import"]


# ---------------------------------------------------------------------------------- honest code

KERNELBENCH_STYLE = [
    # autotune, a launcher function, a grid lambda of meta, nn.Parameter and nn.init in __init__,
    # an own private attribute, typing and __future__
    '''
    from __future__ import annotations
    import math
    from typing import Optional, Tuple
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import triton
    import triton.language as tl


    @triton.autotune(configs=[triton.Config({"BLOCK_SIZE": 128}, num_warps=4),
                              triton.Config({"BLOCK_SIZE": 1024}, num_warps=8)], key=["n_elements"])
    @triton.jit
    def gelu_kernel(x_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
        pid = tl.program_id(axis=0)
        offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        mask = offsets < n_elements
        x = tl.load(x_ptr + offsets, mask=mask)
        y = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
        tl.store(out_ptr + offsets, y, mask=mask)


    def triton_gelu(x: torch.Tensor) -> torch.Tensor:
        assert x.is_cuda or not torch.cuda.is_available()
        x = x.contiguous()
        out = torch.empty_like(x)
        n_elements = x.numel()
        grid = lambda meta: (triton.cdiv(n_elements, meta["BLOCK_SIZE"]),)
        gelu_kernel[grid](x, out, n_elements)
        return out


    class ModelNew(nn.Module):
        def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
            super(ModelNew, self).__init__()
            self.weight = nn.Parameter(torch.empty(out_features, in_features))
            self.bias: Optional[nn.Parameter] = nn.Parameter(torch.zeros(out_features)) if bias else None
            nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
            self._cache: Tuple[int, ...] = ()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.dtype != torch.float32:
                raise TypeError(f"expected float32, got {x.dtype}")
            self._cache = tuple(x.shape)
            return triton_gelu(x.view(-1, x.size(-1)))
    ''',
    # a 2-D launch grid from shapes and strides, a helper kernel called from a kernel, atomics,
    # tl.static_range, a module constant, integer dtypes, torch.no_grad, a named grid function
    '''
    import torch
    import torch.nn as nn
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice

    ROWS_PER_PROGRAM = tl.constexpr(4)


    @triton.jit
    def _square(x):
        return x * x


    @triton.jit
    def row_norm_kernel(x_ptr, out_ptr, count_ptr, M, N, stride_m, BLOCK_N: tl.constexpr):
        pid = tl.program_id(0)
        for r in tl.static_range(ROWS_PER_PROGRAM):
            row = pid * ROWS_PER_PROGRAM + r
            cols = tl.arange(0, BLOCK_N)
            mask = (cols < N) & (row < M)
            x = tl.load(x_ptr + row * stride_m + cols, mask=mask, other=0.0)
            total = tl.sum(_square(x), axis=0)
            tl.store(out_ptr + row, libdevice.sqrt(total), mask=row < M)
            tl.atomic_add(count_ptr, 1, mask=row < M)


    def grid_for(meta):
        return (triton.cdiv(meta["M"], ROWS_PER_PROGRAM.value),)


    class ModelNew(nn.Module):
        def forward(self, x):
            with torch.no_grad():
                M, N = x.shape
                out = torch.empty(M, device=x.device, dtype=x.dtype)
                count = torch.zeros(1, device=x.device, dtype=torch.int32)
                row_norm_kernel[grid_for](x, out, count, M, N, x.stride(0), BLOCK_N=triton.next_power_of_2(N))
                row_norm_kernel[(max(1, triton.cdiv(M, 4)), 1, 1)](
                    x, out, count, M, N, x.stride(0), BLOCK_N=triton.next_power_of_2(N), num_warps=4)
                return out
    ''',
    # torch.autograd.Function with staticmethods, heuristics of the arguments, self._x of its own
    # module, nn.Module.__init__ called directly, a classmethod, isinstance checks
    '''
    import torch
    from torch import nn
    import triton
    import triton.language as tl


    @triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0,
                        "BLOCK": lambda args: min(1024, triton.next_power_of_2(args["n"]))})
    @triton.jit
    def scale_kernel(x_ptr, y_ptr, n, s, BLOCK: tl.constexpr, EVEN: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        if EVEN:
            tl.store(y_ptr + offs, tl.load(x_ptr + offs) * s)
        else:
            tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * s, mask=offs < n)


    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, s):
            y = torch.empty_like(x)
            scale_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), s)
            return y

        @staticmethod
        def backward(ctx, grad):
            return grad, None


    class ModelNew(nn.Module):
        def __init__(self, s: float = 2.0):
            nn.Module.__init__(self)
            self._s = float(s)

        @classmethod
        def build(cls, s):
            return cls(s)

        def forward(self, x):
            assert isinstance(x, torch.Tensor)
            return Scale.apply(x, self._s)
    ''',
]

CUDA_STYLE = [
    GUIDE_EXAMPLE,
    # RawKernel, a kernel fetched once in __init__, templates through name_expressions, shared
    # memory and the stream keyword, cupy scalar types, a side stream (timed, not refused)
    '''
    import math
    import cupy as cp
    import torch
    import torch.nn as nn

    SRC = r"""
    template<typename T> __global__ void twice(const T* x, T* y, long long n) {
        long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) y[i] = x[i] + x[i];
    }
    """
    _module = cp.RawModule(code=SRC, options=("-std=c++17",), name_expressions=["twice<float>"])
    _relu = cp.RawKernel(r'extern "C" __global__ void relu(const float* x, float* y, int n) {'
                         r' int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = fmaxf(x[i], 0.f); }', "relu")


    class ModelNew(nn.Module):
        def __init__(self):
            super().__init__()
            self.twice = _module.get_function("twice<float>")
            self.side = cp.cuda.Stream(non_blocking=True)

        def forward(self, x):
            x = x.contiguous()
            y = torch.empty_like(x)
            z = torch.empty_like(x)
            n = x.numel()
            threads = 256
            blocks = math.ceil(n / threads)
            with cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
                self.twice((blocks,), (threads,), (x.data_ptr(), y.data_ptr(), cp.int64(n)), shared_mem=0)
                _relu((max(1, (n + threads - 1) // threads),), (threads,), (y.data_ptr(), z.data_ptr(), cp.int32(n)))
            return z
    ''',
]


@pytest.mark.parametrize("source", KERNELBENCH_STYLE, ids=["autotune_launcher", "grid_function_atomics", "autograd_function"])
def test_kernelbench_style_triton_solutions_pass(source):
    assert findings(source) == []


@pytest.mark.parametrize("source", CUDA_STYLE, ids=["guide_example", "rawkernel_templates_streams"])
def test_cupy_solutions_pass_the_cuda_policy(source):
    assert findings(source, CUDA) == []


@pytest.mark.parametrize("path", sorted(REDTEAM.glob("honest_*.py")) +
                         [Path(__file__).parent / "fixtures/kernelbench/level1/19_ReLU_solution.py"],
                         ids=lambda p: p.stem)
def test_honest_files_pass(path):
    assert findings(path.read_text()) == []


def test_warm_up_candidates_pass_their_backends_policy():
    assert findings(WARM_UP_CANDIDATE) == []
    assert findings(GUIDE_EXAMPLE, CUDA) == []


def test_the_expert_teachers_kernels_pass():
    """60 proposer tasks (benchmarks/expert_acceptance.py draws 500 the same way; all 500 pass)."""
    from core.contracts import CurriculumState
    from core.plugins import registry

    tasks = registry("proposer").create("random", seed=3).propose(60, CurriculumState(max_tier=3))
    answers = registry("coder").create("expert").generate(tasks, "triton")
    sources = [c.source for [c] in answers if not c.declined]
    assert len(sources) >= 50
    refused = {i: [str(f) for f in findings(s)] for i, s in enumerate(sources) if findings(s)}
    assert refused == {}


def test_the_inductor_teachers_wrapper_shape_passes():
    source = body('''
        from torch._inductor.runtime import triton_helpers, triton_heuristics
        from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
        from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties

        empty_strided_cuda = torch._C._dynamo.guards._empty_strided_cuda
        reinterpret_tensor = torch._C._dynamo.guards._reinterpret_tensor


        @triton.jit
        def _jit_k(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
            xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:]
            tmp0 = tl.load(in_ptr0 + xindex, xindex < xnumel)
            tl.store(out_ptr0 + xindex, triton_helpers.maximum(tl_math.exp(tmp0), libdevice.sqrt(tmp0)), xindex < xnumel)


        class _InductorLaunch:
            def __init__(self, fn, axes, meta):
                self.fn, self.axes, self.meta = fn, axes, meta

            def run(self, *args, stream=None, grid=None, **unused):
                named = dict(zip(self.fn.arg_names, args))
                dims = [triton.cdiv(named[a + "numel"], self.meta[a.upper() + "BLOCK"]) for a in self.axes]
                grid = tuple(max(1, d) for d in dims)
                self.fn[grid](*args, **self.meta)
        ''')
    assert findings(source) == []
    assert {f.rule for f in findings(source.replace("_reinterpret_tensor", "_reinterpret_tensor.__self__"))} \
        == {"private-attribute"}
    assert "private-attribute" in rules(source.replace("_dynamo.guards._empty_strided_cuda", "_dynamo.eval_frame"))


# ---------------------------------------------------------------------------------- per backend

def test_each_backend_declares_its_policy_and_a_backend_without_one_gets_the_strictest(register_plugin):
    from core import hookimpl
    from core.plugins import registry

    assert optional(registry("backend").create("triton"), "Backend", "static_policy") is TRITON
    assert optional(registry("backend").create("cuda"), "Backend", "static_policy") is CUDA
    assert optional(object(), "Backend", "static_policy") is None

    class Bare:
        name, language, guide = "bare", "none", ""

    class Plugin:
        @hookimpl
        def register_backends(self, register):
            register("bare", Bare)

    register_plugin(Plugin())
    assert StaticIntegrityCheck().policy("bare") is STRICTEST
    assert "import" in rules(WARM_UP_CANDIDATE, StaticIntegrityCheck().policy("bare"))  # triton is not in it
    assert rules("import torch\nimport math\nx = torch.zeros(int(math.sqrt(4)))\n", STRICTEST) == set()
    widened = StaticIntegrityCheck(extra_allowed_modules=["triton", "triton.language"]).policy("bare")
    assert "import" not in rules("import triton\nimport triton.language as tl\n", widened)


def test_cupy_is_the_cuda_backends_alone_to_build_and_launch_kernels_and_bridge_arrays():
    from tests.gpu.gpu_helpers import CUPY_COMPUTE_HACKS, CUPY_IDIOM, CUPY_IDIOM_DLPACK

    assert rules("import cupy as cp\n", TRITON) == {"import"}
    # the tutorial idiom: views of torch memory to launch on, handed back to torch (the worker's
    # bridge refuses compute on them: plugins/backends/cupy_bridge.py)
    assert rules(CUPY_IDIOM, CUDA) == set()
    assert rules(CUPY_IDIOM_DLPACK, CUDA) == set()
    assert all(rules(hack, CUDA) == set() for hack in CUPY_COMPUTE_HACKS.values())  # the bridge's to refuse
    # CuPy's own compute, copies from the host and raw memory stay refused by name
    for code in ("y = cp.matmul(x, x)", "y = cp.maximum(x, 0)", "y = cp.sum(x)", "y = cp.ones(3)",
                 "y = cp.array([1.0])", "y = cp.ascontiguousarray(x)", "y = cp.asnumpy(x)", "y = cp.ndarray((3,))",
                 "k = cp.ElementwiseKernel('', '', '')", "cp.cuda.runtime.deviceSynchronize()",
                 "m = cp.cuda.MemoryPointer"):
        assert "module-member" in rules(f"import cupy as cp\nx = 1\n{code}\n", CUDA), code
    assert rules("import cupy as cp\nimport torch\ndef f(x):\n    return x.data_ptr(), cp.int64(3)\n", CUDA) == set()
    # a host callback the driver runs on a thread of its own (unaudited host compute)
    for code in ("s.launch_host_func(print, 1)", "s.add_callback(print, 1)"):
        assert "barred-attribute" in rules(f"import cupy as cp\ns = cp.cuda.Stream()\n{code}\n", CUDA), code
    # DLPack back into torch is the CUDA backend's alone; the DLPack module itself stays refused
    assert rules("import torch\ndef f(x):\n    return torch.from_dlpack(x)\n", CUDA) == set()
    assert rules("import torch\ndef f(x):\n    return torch.from_dlpack(x)\n", TRITON) != set()
    assert "module-member" in rules("import torch\nf = torch.utils.dlpack.from_dlpack\n", CUDA)


def test_cuda_launch_grids_and_blocks_are_launch_arithmetic():
    src = GUIDE_EXAMPLE.replace("kernel((blocks,), (threads,),", "kernel((x.sum().item(),), (threads,),")
    assert "launch-grid" in rules(src, CUDA)
    src = GUIDE_EXAMPLE.replace("kernel((blocks,), (threads,),", "kernel((blocks,), (y.copy_(x).numel(),),")
    assert "launch-grid" in rules(src, CUDA)


# ---------------------------------------------------------------------------------- hypothesis

_NAMES = ["n", "M", "N", "rows", "BLOCK"]
_LEAVES = st.one_of(
    st.integers(0, 4096).map(str), st.sampled_from(_NAMES),
    st.sampled_from(['meta["BLOCK"]', "x.shape[0]", "x.numel()", "x.stride(0)", "x.size(1)", "len(x.shape)"]))
_OPS = ["+", "-", "*", "//", "%"]


def _arith(leaves):
    return st.recursive(leaves, lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(_OPS), inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(inner, inner).map(lambda t: f"triton.cdiv({t[0]}, {t[1]})"),
        st.tuples(st.sampled_from(["max", "min"]), inner, inner).map(lambda t: f"{t[0]}({t[1]}, {t[2]})"),
        inner.map(lambda e: f"triton.next_power_of_2({e})"),
        st.tuples(inner, inner, inner).map(lambda t: f"({t[0]} if {t[1]} > {t[2]} else {t[2]})"),
    ), max_leaves=8)


_CALLS = ["torch.add(x, x, out=y).numel()", "y.copy_(x).numel()", "x.sum().item()", "helper(x)",
          "int(x.max())", "len(torch.nonzero(x))", "(y.add_(1), 1)[1]", "x.cumsum(0)[0]"]


def _grid_candidate(expression: str, as_lambda: bool) -> str:
    grid = f"lambda meta: ({expression}, 1)" if as_lambda else f"({expression}, 1)"
    return body(f'''
        def helper(t):
            return t


        class ModelNew(nn.Module):
            def forward(self, x):
                y = torch.empty_like(x)
                n = M = N = rows = BLOCK = x.numel()
                meta = {{"BLOCK": 1024}}  # what a grid lambda is passed; bound here for a plain grid
                kernel[{grid}](x, y, n, BLOCK=1024)
                return y
        ''')


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_arith(_LEAVES), st.booleans())
def test_arithmetic_launch_grids_are_accepted(expression, as_lambda):
    assert findings(_grid_candidate(expression, as_lambda)) == []


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_arith(st.one_of(_LEAVES, st.sampled_from(["CALL"]))), st.sampled_from(_CALLS), st.booleans())
def test_a_grid_that_calls_anything_else_is_refused(expression, call, as_lambda):
    expression = expression.replace("CALL", call) if "CALL" in expression else f"({expression} + {call})"
    found = findings(_grid_candidate(expression, as_lambda))
    assert [f.rule for f in found] == ["launch-grid"], [str(f) for f in found]
    assert found[0].line == HEADER_LINES + 11


_IDENT = st.from_regex(r"[a-z][a-z0-9]{0,8}", fullmatch=True)


@settings(max_examples=40, deadline=None)
@given(_IDENT)
def test_private_names_are_the_candidates_own_only(name):
    own = body(f"class A(nn.Module):\n    def f(self):\n        self._{name} = 1\n        return self._{name}, A._{name}\n")
    assert findings(own) == []
    foreign = body(f"def f(x):\n    return torch._{name}, x._{name}, torch.Tensor._{name}\n")
    found = findings(foreign)
    assert {f.rule for f in found} == {"private-attribute"} and len(found) == 3, [str(f) for f in found]


# The shape of Inductor's output module on a GPU (torch 2.13's header, a guarded call on cuda:0).
INDUCTOR_GPU = """
from ctypes import c_void_p, c_long, c_int
import torch
import math
import random
import os
import tempfile
from math import inf, nan
from cmath import nanj
from torch._inductor.hooks import run_intermediate_hooks
from torch._inductor.utils import maybe_profile
from torch._inductor.codegen.memory_planning import _align as align
from torch import device, empty_strided
from torch._inductor.async_compile import AsyncCompile
from torch._inductor.select_algorithm import extern_kernels
import triton
import triton.language as tl
from torch._inductor.runtime.triton_heuristics import start_graph, end_graph
from torch._C import _cuda_getCurrentRawStream as get_raw_stream

aten = torch.ops.aten
inductor_ops = torch.ops.inductor
_quantized = torch.ops._quantized
assert_size_stride = torch._C._dynamo.guards.assert_size_stride
assert_alignment = torch._C._dynamo.guards.assert_alignment
empty_strided_cpu = torch._C._dynamo.guards._empty_strided_cpu
empty_strided_cpu_pinned = torch._C._dynamo.guards._empty_strided_cpu_pinned
empty_strided_cuda = torch._C._dynamo.guards._empty_strided_cuda
empty_strided_xpu = torch._C._dynamo.guards._empty_strided_xpu
empty_strided_mtia = torch._C._dynamo.guards._empty_strided_mtia
reinterpret_tensor = torch._C._dynamo.guards._reinterpret_tensor
alloc_from_pool = torch.ops.inductor._alloc_from_pool
async_compile = AsyncCompile()
empty_strided_p2p = torch._C._distributed_c10d._SymmetricMemory.empty_strided_p2p


triton_poi_fused_relu_0 = async_compile.triton('triton_poi_fused_relu_0', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.pointwise(
    size_hints={'x': 1024},
    filename=__file__,
)
@triton.jit
def triton_poi_fused_relu_0(in_ptr0, out_ptr0, xnumel, XBLOCK : tl.constexpr):
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    xmask = xindex < xnumel
    x0 = xindex
    tmp0 = tl.load(in_ptr0 + (x0), xmask)
    tmp1 = tl.full([1], 0, tl.int32)
    tmp2 = triton_helpers.maximum(tmp1, tmp0)
    tl.store(out_ptr0 + (x0), tmp2, xmask)
''', device_str='cuda')

async_compile.wait(globals())
del async_compile

def call(args):
    arg0_1, = args
    args.clear()
    assert_size_stride(arg0_1, (32, 32), (32, 1))
    with torch.cuda._DeviceGuard(0):
        torch.cuda.set_device(0)
        buf0 = empty_strided_cuda((32, 32), (32, 1), torch.float32)
        # Topologically Sorted Source Nodes: [relu], Original ATen: [aten.relu]
        stream0 = get_raw_stream(0)
        triton_poi_fused_relu_0.run(arg0_1, buf0, 1024, stream=stream0)
        del arg0_1
    return (buf0, )

"""

RELU_TASK = """
import torch
import torch.nn as nn
class Model(nn.Module):
    def __init__(self):
        super().__init__()
    def forward(self, x):
        return torch.relu(x)
def get_inputs():
    return [torch.randn(32, 32)]
def get_init_inputs():
    return []
"""


def test_the_inductor_teachers_gpu_candidate_passes_the_policy():
    """What the inductor teacher assembles from a GPU output module: the header's unused imports and
    torch.ops bindings are pruned; what call() uses (the allocators, the device guard) is allowed."""
    from plugins.coders.inductor import build_candidate_source, parse_kernels, static_findings

    kernels = parse_kernels(INDUCTOR_GPU)
    source = build_candidate_source(RELU_TASK, INDUCTOR_GPU, kernels, {"triton_poi_fused_relu_0": ({"XBLOCK": 256}, 4, 1)},
                                    ["x0"], ["x0"])
    assert "torch.ops" not in source and "_distributed_c10d" not in source and "import os" not in source
    assert "empty_strided_cuda = torch._C._dynamo.guards._empty_strided_cuda" in source
    assert static_findings(source) == "", static_findings(source)

"""What a Numba candidate may name (its static policy): torch for the host side, ``numba.cuda`` and
``math`` inside kernels, and nothing of Numba's that compiles or runs Python for the host."""

from __future__ import annotations

from core.api.policy import TORCH_MODULES, TYPING, StaticPolicy, module

# numba.cuda's kernel language: thread indexing, synchronisation, shared and local arrays, atomics and
# the types a kernel declares arrays with. Left out: host-side helpers that move data or compile
# (to_device, device_array, compile_ptx, declare_device ...), so the kernels do the work.
CUDA_MEMBERS = frozenset({
    "jit", "grid", "gridsize", "threadIdx", "blockIdx", "blockDim", "gridDim", "laneid", "warpsize",
    "syncthreads", "syncwarp", "threadfence", "threadfence_block", "shared", "local", "const", "atomic",
    "fma", "selp", "float32", "float64", "float16", "int32", "int64", "uint32", "boolean",
})

STATIC_POLICY = StaticPolicy(
    backend="numba",
    modules=TORCH_MODULES + (
        TYPING,
        module("numba", members={"cuda"}),
        module("numba.cuda", members=CUDA_MEMBERS, device=True),
    ),
    kernel_decorators=frozenset({"numba.cuda.jit"}),
)

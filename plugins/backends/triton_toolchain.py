"""What the sandbox must know of Triton (``TritonBackend.sandbox``): the engine names no toolchain."""

from __future__ import annotations

from core.api.sandbox import COMPUTE_SANITIZER, CUPTI, SandboxNeeds

SANDBOX = SandboxNeeds(
    # the JIT reads its caller's globals, the interpreter rewrites kernels from their source, and its
    # launcher reaches the driver through ctypes, all while a candidate's forward is on the stack
    reads_frames=frozenset({"triton"}),
    makes_code=frozenset({"triton"}),
    touches_memory=frozenset({"triton"}),
    # the launch path a candidate could rebind: the JIT, the interpreter and their classes
    snapshot_modules=("triton", "triton.runtime.jit", "triton.runtime.interpreter"),
    snapshot_classes=("triton.runtime.jit.JITFunction", "triton.runtime.jit.KernelInterface",
                      "triton.runtime.interpreter.InterpretedFunction", "triton.runtime.interpreter.InterpreterBuilder",
                      "triton.runtime.interpreter.GridExecutor"),
    passthrough_env=("TRITON_DEFAULT_FP_FUSION", "TRITON_PTXAS_PATH", "CUDA_HOME"),
    default_env={"TRITON_DEFAULT_FP_FUSION": "1"},
    scratch_env={"TRITON_CACHE_DIR": ".triton"},
    gpu_tools=frozenset({COMPUTE_SANITIZER, CUPTI}),
)

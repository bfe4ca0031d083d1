"""What a backend declares the sandbox needs of its toolchain, so the engine names no toolchain.

A backend sets ``sandbox = SandboxNeeds(...)`` (optional; ``core.contracts.OPTIONAL_MEMBERS["Backend"]``,
default: none of these). The worker reads the declarations of every registered backend: whose frames it
trusts, which toolchain state it snapshots to catch tampering, which environment a worker keeps, which
GPU tools apply to the backend's candidates. Toolchain versions are the backend's ``toolchain()``.

A ROCm backend, for example, declares ``passthrough_env=("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")``
and no ``"compute-sanitizer"`` in ``gpu_tools``, so NVIDIA's sanitizer is not run on its candidates.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

# GPU tools the built-in checks run, by the name a backend lists in ``gpu_tools``.
COMPUTE_SANITIZER = "compute-sanitizer"  # NVIDIA's memcheck/racecheck (the sanitizer checks)
CUPTI = "cupti"  # the CUDA profiler's activity records (the gpu_activity check)


@dataclass(frozen=True)
class SandboxNeeds:
    """A backend's toolchain as the sandbox must know it. Every field defaults to nothing.

    :param reads_frames: top-level packages that read Python frames for a candidate and never hand
        them out (Triton's JIT reads its caller's globals).
    :param makes_code: packages that compile or exec Python for a candidate (Triton's interpreter
        rewrites kernels).
    :param touches_memory: packages that may use ctypes, the collector or memory introspection while
        a candidate runs (CuPy's driver bindings).
    :param starts_threads: packages that may start a Python thread while a candidate runs (a simulator
        that runs each GPU thread on one). Work on such threads is outside the ATen audit, which is
        per thread, so a backend that declares this keeps torch out of its kernels in its static policy.
    :param snapshot_modules: toolchain modules whose every name the worker records after set-up and
        checks after each candidate call (a candidate that rebinds ``triton.jit`` is caught).
    :param snapshot_classes: dotted classes whose attributes it records likewise (launchers, JIT functions).
    :param passthrough_env: environment variables a worker keeps from the judge's (toolchain paths, the
        visible devices of a non-CUDA runtime); every other variable is dropped.
    :param default_env: variables set in a worker when the judge's environment does not set them.
    :param scratch_env: variable -> folder under the worker's scratch directory (a toolchain's cache).
    :param gpu_tools: the GPU tools that apply to this backend's candidates (:data:`COMPUTE_SANITIZER`,
        :data:`CUPTI`); a check that runs a tool runs only for backends that list it.
    """

    reads_frames: frozenset[str] = frozenset()
    makes_code: frozenset[str] = frozenset()
    touches_memory: frozenset[str] = frozenset()
    starts_threads: frozenset[str] = frozenset()
    snapshot_modules: tuple[str, ...] = ()
    snapshot_classes: tuple[str, ...] = ()
    passthrough_env: tuple[str, ...] = ()
    default_env: dict[str, str] = field(default_factory=dict)
    scratch_env: dict[str, str] = field(default_factory=dict)
    gpu_tools: frozenset[str] = frozenset()

    def __or__(self, other: SandboxNeeds) -> SandboxNeeds:
        """Both declarations at once (sets joined, sequences concatenated without repeats, ours first)."""
        merged = {}
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, frozenset):
                merged[f.name] = mine | theirs
            elif isinstance(mine, tuple):
                merged[f.name] = tuple(dict.fromkeys(mine + theirs))
            else:
                merged[f.name] = {**theirs, **mine}
        return SandboxNeeds(**merged)


NO_NEEDS = SandboxNeeds()


def needs_of(backend: object) -> SandboxNeeds:
    """A backend's declaration (a backend object, or the factory it was registered with)."""
    from core.contracts import optional

    declared = optional(backend, "Backend", "sandbox") or NO_NEEDS
    if not isinstance(declared, SandboxNeeds):
        raise TypeError(f"{getattr(backend, 'name', backend)!r} declares sandbox={declared!r}; expected a "
                        "core.api.sandbox.SandboxNeeds")
    return declared


def registered_needs() -> SandboxNeeds:
    """The declarations of every registered backend, joined: what a worker trusts and snapshots (its
    toolchain and any other backend's harness code it may load, as the GPU timer's Triton filler)."""
    from core.plugins import registry

    backends = registry("backend")
    out = NO_NEEDS
    for name in backends.names():
        factory = backends.get(name)
        out = out | needs_of(factory if isinstance(factory, type) else backends.create(name))
    return out


def gpu_tool_applies(tool: str, backend: str) -> bool:
    """Whether the backend registered as ``backend`` lists ``tool`` in its ``gpu_tools``."""
    from core.plugins import registry

    backends = registry("backend")
    if backend not in backends:
        return False
    factory = backends.get(backend)
    return tool in needs_of(factory if isinstance(factory, type) else backends.create(backend)).gpu_tools

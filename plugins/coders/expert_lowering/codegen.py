"""Source text helpers shared by the kernel emitters."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Lines:
    """An indented block of source lines."""

    lines: list[str] = field(default_factory=list)
    indent: int = 0

    def __call__(self, *texts: str) -> "Lines":
        for text in texts:
            self.lines.append("    " * self.indent + text if text else "")
        return self

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


@dataclass
class Kernel:
    """One emitted Triton kernel and how ``forward`` launches it."""

    name: str
    source: str  # the @triton.jit function
    launch: list[str]  # forward lines (allocation done elsewhere) that launch it
    helpers: set[str] = field(default_factory=set)


# A kernel's first lines when each program owns BLOCK consecutive elements of ``numel``: 64-bit offsets when
# IDX64 (an offset may pass 2**31 - 1), and the mask of the last program's tail.
FLAT_BLOCK_LINES = (
    "pid = tl.program_id(0)",
    "if IDX64:",
    "    pid = pid.to(tl.int64)",
    "offs = pid * BLOCK + tl.arange(0, BLOCK)",
    "mask = offs < numel",
)


def value_name(value: int, n_inputs: int) -> str:
    """Name of a value's tensor in ``forward`` (``x0`` .. for inputs, ``v<k>`` for node values)."""
    return f"x{value}" if value < n_inputs else f"v{value}"


def offsets(index_names: list[str], stride_names: list[str]) -> str:
    """``i0 * s0 + i1 * s1 ...`` (``0`` for a 0-d tensor)."""
    terms = [f"{i} * {s}" for i, s in zip(index_names, stride_names)]
    return " + ".join(terms) if terms else "0"


# Module tensors a fused op reads: op -> (kernel parameter suffix, attribute of its nn.Module).
MODULE_TENSORS: dict[str, tuple[tuple[str, str], ...]] = {
    "batch_norm": (("w", "weight"), ("b", "bias"), ("rm", "running_mean"), ("rv", "running_var")),
    "layer_norm": (("w", "weight"), ("b", "bias")),
    "rms_norm": (("w", "weight"),),
}


def module_tensors(plan, nodes: list[int]) -> list[tuple[str, str]]:
    """(kernel parameter, forward expression) of every weight tensor the given nodes read.

    A weight the op does not have (``plan.tensor`` is None: no affine weights) is not passed; the
    node's kernel lines use the identity value in its place."""
    out = []
    for v in nodes:
        for suffix, attr in MODULE_TENSORS.get(plan.node(v).op, ()):
            expr = plan.tensor(v, attr)
            if expr is not None:
                out.append((f"p{v}_{suffix}", expr))
    return out

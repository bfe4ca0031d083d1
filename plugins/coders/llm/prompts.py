"""Prompts for the LLM coder and the extraction of code from what a model writes back.

The prompt is the task's KernelBench source, the backend's guide (optional) and optional few-shot
examples, and it ends by opening a fenced ``python`` block, so a completion is the ``ModelNew``
module followed by a closing fence. :func:`extract_code` accepts that shape and the shapes chat
models produce (prose around a fenced block, or raw code).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Sequence

from core.task import Candidate, Task

CODE_OPEN = "```python\n"
CODE_CLOSE = "```"

# Used only when the backend plugin offers no guide of its own (attribute ``guide``/``prompt_guide``).
FALLBACK_GUIDES: dict[str, str] = {
    "triton": (
        "Write a Python module defining `class ModelNew(nn.Module)` with the same __init__ and forward "
        "signature as `Model`. Do the computation in `@triton.jit` kernels (import triton, "
        "triton.language as tl) launched from forward; allocate outputs with torch.empty_like/torch.empty; "
        "mask loads and stores; no torch compute ops inside forward."
    ),
    "cuda": (
        "Write a Python module defining `class ModelNew(nn.Module)` with the same __init__ and forward "
        "signature as `Model`. Do the computation in CUDA C `__global__` kernels compiled with "
        "cupy.RawModule and launched on the torch tensors' memory; no torch compute ops inside forward."
    ),
}

_FENCED = re.compile(r"```[ \t]*(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


@dataclass(frozen=True)
class Example:
    """One few-shot example: a task source and a solution source."""

    task_source: str
    solution_source: str


def backend_guide(backend: object | None, backend_name: str) -> str:
    """The prompt guide a backend plugin offers, or a short built-in one for known backends."""
    for attr in ("guide", "prompt_guide"):
        value = getattr(backend, attr, None) if backend is not None else None
        if callable(value):
            value = value()
        if isinstance(value, str) and value.strip():
            return value.strip()
    return FALLBACK_GUIDES.get(backend_name, f"Write `class ModelNew` using {backend_name} kernels.")


def compact_task_source(source: str) -> str:
    """What a coder needs of a KernelBench task: its docstring, ``class Model`` and the input builders.

    Imports and private helpers (names starting with ``_``, e.g. an adversarial task's value planter)
    are dropped; the docstring (the op chain), ``Model``, ``get_inputs`` and ``get_init_inputs`` are
    kept verbatim. Source that does not parse is returned unchanged.
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return source
    lines = source.splitlines()
    kept: list[str] = []
    for index, node in enumerate(tree.body):
        is_docstring = index == 0 and isinstance(node, ast.Expr) and isinstance(getattr(node, "value", None), ast.Constant) \
            and isinstance(node.value.value, str)
        is_public_def = isinstance(node, (ast.ClassDef, ast.FunctionDef)) and not node.name.startswith("_")
        if is_docstring or is_public_def:
            start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            kept.append("\n".join(lines[start - 1:node.end_lineno]))
    return "\n".join(kept) + "\n" if kept else source


def render_prompt(task_source: str, backend_name: str, guide: str = "", examples: Sequence[Example] = (),
                  compact: bool = False) -> str:
    """The full prompt; it ends with an open ```python fence the completion continues.

    ``compact`` keeps only what :func:`compact_task_source` keeps of each task (short prompts for
    small models).
    """
    if compact:
        task_source = compact_task_source(task_source)
        examples = [Example(compact_task_source(e.task_source), e.solution_source) for e in examples]
    parts: list[str] = []
    if guide:
        parts.append(f"# Backend: {backend_name}\n{guide.strip()}\n")
    for ex in examples:
        parts.append(
            "# Reference\n" + CODE_OPEN + ex.task_source.rstrip() + "\n" + CODE_CLOSE + "\n"
            "# ModelNew\n" + CODE_OPEN + ex.solution_source.rstrip() + "\n" + CODE_CLOSE + "\n"
        )
    parts.append("# Reference\n" + CODE_OPEN + task_source.rstrip() + "\n" + CODE_CLOSE + "\n# ModelNew\n" + CODE_OPEN)
    return "\n".join(parts)


def render_completion(solution_source: str) -> str:
    """What a perfect completion of :func:`render_prompt` looks like (the SFT target)."""
    return solution_source.rstrip() + "\n" + CODE_CLOSE


def extract_code(completion: str) -> str:
    """The code in a completion.

    - a completion of our prompt: everything before the first closing fence;
    - a chat-style answer: the last fenced block that defines ``ModelNew`` (else the last block);
    - otherwise the raw text.
    """
    text = completion.replace("\r\n", "\n")
    blocks = _FENCED.findall(text)
    if blocks:
        with_model = [b for b in blocks if "ModelNew" in b]
        # The completion may start inside our open fence: then its first "block" is the code itself.
        head, sep, _ = text.partition(CODE_CLOSE)
        if sep and "ModelNew" in head and _parses(head):
            return head.strip("\n") + "\n"
        return (with_model or blocks)[-1].strip("\n") + "\n"
    head, sep, _ = text.partition(CODE_CLOSE)
    return (head if sep else text).strip("\n") + "\n"


def _parses(text: str) -> bool:
    try:
        ast.parse(text)
    except (SyntaxError, ValueError):
        return False
    return True


def to_candidate(task: Task, completion: str, backend_name: str, coder: str = "llm") -> Candidate:
    """Wrap a model completion as a candidate (the raw completion is kept beside the code)."""
    source = extract_code(completion)
    declined = None if source.strip() else "empty completion"
    return Candidate(
        source=source, backend=backend_name, task_id=task.id, coder=coder, completion=completion, declined=declined
    )

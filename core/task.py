"""Tasks (KernelBench-format reference programs) and candidates (KernelBench ``ModelNew`` solutions)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


def content_hash(text: str) -> str:
    """Stable id of a source text: the first 16 hex digits of its SHA-256."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


class TaskIdMismatch(ValueError):
    """A task's given ``id`` is not the content hash of its ``source`` (the source was edited after the id
    was written). Loaders that know the file and line re-raise it with them."""

    def __init__(self, given: str, expected: str):
        self.given, self.expected = given, expected
        super().__init__(f"task id {given!r} does not match its source (content hash {expected!r}): the source "
                         f"was edited after the id was written; delete the \"id\" key (it is recomputed from the "
                         f"source) or set it to {expected!r}")


@dataclass
class Task:
    """A KernelBench-format module (``Model``, ``get_inputs``, ``get_init_inputs``) plus metadata.

    ``id`` is the content hash of ``source``; it is filled in when omitted and checked when given,
    so a task's id always names exactly its text.
    """

    source: str
    ops: list[str] = field(default_factory=list)
    shapes: list[list[int]] = field(default_factory=list)  # input shapes, in get_inputs() order
    dtypes: list[str] = field(default_factory=list)
    flops: int | None = None
    min_bytes: int | None = None  # each input read once + each output written once
    difficulty: dict[str, float] = field(default_factory=dict)
    tier: int = 0
    adversarial: list[str] | None = None  # edge-case tags, or None for an ordinary task
    seed: int | None = None
    program: dict[str, Any] | None = None  # the proposer IR (core.program.Program.to_dict), if any
    name: str | None = None  # e.g. KernelBench's "19_ReLU"
    level: str | None = None
    resized: dict[str, Any] | None = None  # sizes scaled to a CPU budget (core.evaluation.resize.FitResult)
    id: str = ""

    def __post_init__(self) -> None:
        expected = content_hash(self.source)
        if not self.id:
            self.id = expected
        elif self.id != expected:
            raise TaskIdMismatch(self.id, expected)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Task":
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def from_json(cls, text: str) -> "Task":
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_file(cls, path: str | Path, **meta: Any) -> "Task":
        """Load a KernelBench problem file (e.g. ``level1/19_ReLU.py``) as a task."""
        path = Path(path)
        meta.setdefault("name", path.stem)
        meta.setdefault("level", path.parent.name or None)
        return cls(source=path.read_text(), **meta)


# The backend a candidate is written for when nothing says otherwise (config: conf/backend/).
DEFAULT_BACKEND = "triton"


@dataclass
class Candidate:
    """A KernelBench-format solution: a module defining ``ModelNew`` whose work runs in kernels."""

    source: str
    backend: str = DEFAULT_BACKEND
    task_id: str | None = None
    coder: str | None = None
    completion: str | None = None  # raw model text the source was extracted from, if any
    declined: str | None = None  # set (to the reason) when the coder could not answer the task
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return content_hash(self.source)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Candidate":
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def from_json(cls, text: str) -> "Candidate":
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_file(cls, path: str | Path, **meta: Any) -> "Candidate":
        return cls(source=Path(path).read_text(), **meta)

"""Verdicts cached by (task, candidate, hardware, software), so an evaluation rerun verifies only what changed.

The key of a verdict is the SHA-256 of:

* the task id and the candidate id (content hashes of their sources) and the candidate's backend;
* the **hardware** the verdict was reached on (GPU model, or the CPU model for the interpreter);
* the **software**: Python, torch (every reference runs in it), KernelZero's version, the toolchain
  the candidate's backend declares (``Backend.toolchain()``: triton; CuPy and NVRTC), and a digest of
  every source file that can change a verdict, derived from the engine and the registered backends,
  checks and devices (:mod:`core.evaluation.digest`), so editing a check, GPU timing or a GPU's peak
  numbers invalidates what they judged;
* the verifier settings that change a verdict (checks, trials, device ...).

Failures that say nothing about the candidate (``timeout`` under load, an internal ``error``) are
not cached. Storage is one SQLite file; concurrent readers and writers are safe.
"""

from __future__ import annotations

import functools
import hashlib
import json
import platform
import sqlite3
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from core.evaluation.digest import code_digest
from core.task import Candidate, Task
from core.verdict import Verdict

UNCACHED_STATUSES = frozenset({"timeout", "error"})


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def _engine_versions() -> dict[str, str | None]:
    from core import __version__

    return {
        "python": platform.python_version(),
        "torch": _version("torch"),  # not a backend's: the reference and the comparisons run in torch
        "kernelzero": __version__,
        "verifier_code": code_digest(),
    }


def _toolchain(backend: str) -> dict[str, str | None]:
    from core.contracts import optional
    from core.plugins import create

    return dict(optional(create("backend", backend), "Backend", "toolchain")())


def software_versions(backend: str | None = None) -> dict[str, Any]:
    """Versions that change a verdict, the digest of the code that reaches it, and (given the
    ``backend`` name) the toolchain that backend declares."""
    versions: dict[str, Any] = dict(_engine_versions())
    if backend is not None:
        versions["toolchain"] = dict(_toolchain(backend))
    return versions


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.cache
def hardware(device: str) -> str:
    """A name for the hardware verdicts on ``device`` are reached on (``cuda``: the GPU model)."""
    if device == "cuda":
        import torch

        if torch.cuda.is_available():
            return f"cuda:{torch.cuda.get_device_name(0)}"
        return "cuda:unavailable"
    return f"cpu:{_cpu_model()}"


@dataclass
class CacheKey:
    """Everything a verdict depends on besides the sources' contents."""

    device: str
    settings: Mapping[str, Any] = field(default_factory=dict)
    hardware_name: str = ""
    software: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.hardware_name = self.hardware_name or hardware(self.device)
        self.software = dict(self.software or software_versions(self.settings.get("backend")))
        self._context = json.dumps({"device": self.device, "settings": dict(self.settings),
                                    "hardware": self.hardware_name, "software": self.software},
                                   sort_keys=True, default=str)

    def of(self, task: Task, candidate: Candidate) -> str:
        h = hashlib.sha256()
        for part in (task.id, candidate.id, candidate.backend, self._context):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()


class EvalCache:
    """A SQLite table of verdicts by key. ``path=None`` keeps it in memory (nothing survives)."""

    def __init__(self, path: str | Path | None):
        self.path = Path(path).expanduser() if path else None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path) if self.path else ":memory:", check_same_thread=False,
                                   timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL" if self.path else "PRAGMA journal_mode=MEMORY")
        self._db.execute("CREATE TABLE IF NOT EXISTS verdicts (key TEXT PRIMARY KEY, task_id TEXT, "
                         "candidate_id TEXT, verdict TEXT NOT NULL, created REAL NOT NULL)")
        self._db.commit()
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> Verdict | None:
        with self._lock:
            row = self._db.execute("SELECT verdict FROM verdicts WHERE key = ?", (key,)).fetchone()
        if row is None:
            self.misses += 1
            return None
        self.hits += 1
        return Verdict.from_json(row[0])

    def put(self, key: str, verdict: Verdict) -> bool:
        """Store ``verdict`` unless its status says nothing about the candidate; return whether stored."""
        if verdict.status in UNCACHED_STATUSES:
            return False
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO verdicts VALUES (?, ?, ?, ?, ?)",
                             (key, verdict.task_id, verdict.candidate_id, verdict.to_json(), time.time()))
            self._db.commit()
        return True

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM verdicts").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> EvalCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def split_cached(cache: EvalCache, key: CacheKey, pairs: list[tuple[Task, Candidate]]
                 ) -> tuple[dict[int, Verdict], list[int]]:
    """(verdicts found in the cache by pair index, indices of the pairs still to verify)."""
    found: dict[int, Verdict] = {}
    missing: list[int] = []
    for i, (task, cand) in enumerate(pairs):
        verdict = cache.get(key.of(task, cand))
        if verdict is None:
            missing.append(i)
        else:
            found[i] = verdict
    return found, missing


__all__ = [
    "UNCACHED_STATUSES",
    "CacheKey",
    "EvalCache",
    "code_digest",
    "hardware",
    "software_versions",
    "split_cached",
]

"""Test doubles for training tests: a verifier that judges statically, and a teacher coder.

The fake verifier accepts a candidate whose source parses, defines ``ModelNew`` and holds a
``@triton.jit`` kernel; it never runs code. It exists so training plumbing can be tested in
seconds; the end-to-end test uses the real ``core.verify.Verifier``.
"""

from __future__ import annotations

import ast
import os
import threading
import time
from dataclasses import dataclass, field

from core import hookimpl
from core.task import Candidate
from core.verdict import Verdict

KERNEL = '''import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _copy(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


class ModelNew(nn.Module):
    def forward(self, x0):
        y = torch.empty_like(x0)
        _copy[(1,)](x0, y, x0.numel(), BLOCK=1024)
        return y
'''


@dataclass
class StaticVerifier:
    """Judges by reading the source; records every batch it was asked to verify."""

    batches: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def verify(self, task, candidate):
        return self.verify_many([(task, candidate)])[0]

    def verify_many(self, pairs):
        delay = float(os.environ.get("KZ_FAKE_VERIFY_DELAY", "0"))
        if delay:
            time.sleep(delay)
        with self.lock:
            self.batches.append(len(pairs))
        out = []
        for task, cand in pairs:
            v = Verdict(task_id=task.id, candidate_id=cand.id, backend=cand.backend)
            try:
                tree = ast.parse(cand.source)
                parsed = True
            except (SyntaxError, ValueError):
                parsed, tree = False, None
            has_model = parsed and any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in ast.walk(tree))
            has_kernel = "@triton.jit" in cand.source
            v.add_check("static", parsed and has_model and has_kernel, "fake static check")
            v.compiled = parsed and has_kernel
            v.correct = v.compiled and has_model
            v.accuracy = 1.0 if v.correct else 0.0
            v.accepted = v.correct
            v.status = "accepted" if v.accepted else "rejected"
            out.append(v)
        return out


@dataclass
class CopyTeacher:
    """A teacher that answers every task with the same (statically valid) kernel."""

    name: str = "copy_teacher"

    def generate(self, tasks, backend, num_samples=1):
        return [[Candidate(source=KERNEL, backend=backend, task_id=t.id, coder=self.name)
                 for _ in range(num_samples)] for t in tasks]


@dataclass
class CatalogProposer:
    """A small deterministic proposer over the op catalog, with state (for resume tests)."""

    seed: int = 0
    name: str = "catalog_fake"
    drawn: int = 0
    feedbacks: int = 0

    def propose(self, n, curriculum=None):
        from plugins.coders.llm.corpus import catalog_tasks

        max_tier = 1 if curriculum is None else max(0, min(1, curriculum.max_tier))
        tasks = catalog_tasks(n, seed=self.seed * 100_003 + self.drawn, max_tier=max_tier, max_ops=2)
        self.drawn += 1
        return tasks

    def feedback(self, solve_rates):
        self.feedbacks += 1

    def state_dict(self):
        return {"drawn": self.drawn, "feedbacks": self.feedbacks}

    def load_state_dict(self, state):
        self.drawn, self.feedbacks = int(state["drawn"]), int(state["feedbacks"])


class FakesPlugin:
    @hookimpl
    def register_coders(self, register):
        register("copy_teacher", CopyTeacher)

    @hookimpl
    def register_proposers(self, register):
        register("catalog_fake", CatalogProposer)

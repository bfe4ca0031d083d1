"""The embedded tokenizer's training text: task sources and teacher kernels of our own making.

:func:`corpus_from_plugins` asks the configured proposer for tasks and a teacher coder (``expert``
by default) for kernels, both through the registries. When no proposer is available it draws
programs from the op catalog itself, so the coder can always build its tokenizer.
"""

from __future__ import annotations

import logging
import random
from typing import Any, Sequence

from core.program import Node, Program, ProgramError, TensorSpec, render_task_source
from core.task import Task
from plugins.coders.llm.prompts import FALLBACK_GUIDES, render_completion, render_prompt

log = logging.getLogger(__name__)


def catalog_tasks(n: int, seed: int = 0, max_tier: int = 1, max_ops: int = 3) -> list[Task]:
    """``n`` small tasks drawn from the registered op catalog (a fallback when no proposer exists)."""
    from core.plugins import registry

    ops_reg = registry("op")
    catalog = {name: ops_reg.get(name) for name in ops_reg.names()}
    usable = sorted(name for name, spec in catalog.items() if spec.tier <= max_tier and spec.arity in (1, 2))
    if not usable:
        return []
    rng = random.Random(seed)
    tasks: list[Task] = []
    attempts = 0
    while len(tasks) < n and attempts < n * 20:
        attempts += 1
        shape = (rng.choice([4, 8, 16, 33]), rng.choice([16, 32, 64, 100]))
        chosen = [rng.choice(usable) for _ in range(rng.randint(1, max_ops))]
        n_inputs = 1 + sum(catalog[name].arity == 2 for name in chosen)
        inputs = [TensorSpec(shape) for _ in range(n_inputs)]
        nodes: list[Node] = []
        current, next_input = 0, 1
        for index, name in enumerate(chosen):
            spec = catalog[name]
            if spec.arity == 2:
                args: tuple[int, ...] = (current, next_input)
                next_input += 1
            else:
                args = (current,)
            params = {k: rng.choice(list(v)) for k, v in spec.params.items()}
            nodes.append(Node(name, args, params))
            current = n_inputs + index
        program = Program(inputs, nodes)
        try:
            source = render_task_source(program, catalog)
            program.value_shapes(catalog)
        except (ProgramError, KeyError, TypeError, ValueError):
            continue
        tasks.append(Task(source=source, ops=program.ops, shapes=[list(t.shape) for t in inputs],
                          dtypes=[t.dtype for t in inputs], tier=max(catalog[o].tier for o in program.ops),
                          program=program.to_dict(), seed=seed, flops=program.flops(catalog),
                          min_bytes=program.min_bytes(catalog)))
    return tasks


def teacher_texts(tasks: Sequence[Task], teacher: Any, backend: str) -> list[str]:
    """Solutions the teacher writes for ``tasks`` (declined ones skipped)."""
    if teacher is None or not tasks:
        return []
    try:
        answers = teacher.generate(list(tasks), backend, 1)
    except Exception as exc:  # a teacher that fails on one exotic task must not stop the tokenizer build
        log.warning("teacher failed while building the tokenizer corpus: %s", exc)
        return []
    return [c.source for cands in answers for c in cands if not c.declined and c.source.strip()]


def build_corpus(tasks: Sequence[Task], solutions: Sequence[str], backend: str, guide: str = "",
                 compact: bool = False) -> list[str]:
    """The texts a model sees: rendered prompts of ``tasks`` and completions of ``solutions``."""
    texts = [render_prompt(t.source, backend, guide, compact=compact) for t in tasks]
    texts += [render_completion(s) for s in solutions]
    texts.append(guide or FALLBACK_GUIDES.get(backend, ""))
    return [t for t in texts if t]


def corpus_from_plugins(backend: str = "triton", n_tasks: int = 200, seed: int = 0, guide: str = "",
                        proposer: Any = None, teacher: Any = None, teacher_name: str | None = "expert") -> list[str]:
    """Corpus from a proposer (else the op catalog) and a teacher coder (``expert`` if registered)."""
    from core.contracts import CurriculumState
    from core.plugins import registry

    tasks: list[Task] = []
    if proposer is None and "random" in registry("proposer"):
        try:
            proposer = registry("proposer").create("random", seed=seed)
        except Exception as exc:
            log.warning("could not build the random proposer for the tokenizer corpus: %s", exc)
    if proposer is not None:
        tasks = list(proposer.propose(n_tasks, CurriculumState(max_tier=1)))
    if not tasks:
        tasks = catalog_tasks(n_tasks, seed=seed)
    if teacher is None and teacher_name and teacher_name in registry("coder"):
        try:
            teacher = registry("coder").create(teacher_name)
        except Exception as exc:
            log.warning("could not build teacher %r for the tokenizer corpus: %s", teacher_name, exc)
    return build_corpus(tasks, teacher_texts(tasks, teacher, backend), backend, guide)

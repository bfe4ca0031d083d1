"""The expert coder: lowers a task's program IR to a fused Triton candidate, or declines.

Registered as ``expert``, for the ``triton`` backend. A task that carries a ``program`` (the
proposer IR) is lowered from it; any other task (a KernelBench problem file) is first captured
from its own ``Model.forward`` (:mod:`plugins.coders.expert_capture`: ``torch.export`` on the meta
device, ATen translated into catalog ops). The lowering lives in
:mod:`plugins.coders.expert_lowering`. A task with an op the expert cannot lower is declined with
that op's name. It is deterministic: every sample of a task is the same candidate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from core import hookimpl
from core.program import OpSpec, Program, ProgramError
from core.task import Candidate, Task
from plugins.coders.expert_capture import capture
from plugins.coders.expert_lowering import Unsupported, lower_program

SUPPORTED_BACKENDS = ("triton",)


@dataclass
class ExpertCoder:
    """IR -> fused Triton. ``catalog`` defaults to the registered op catalog."""

    name: str = "expert"
    catalog: Mapping[str, OpSpec] | None = None

    def _catalog(self) -> Mapping[str, OpSpec]:
        if self.catalog is None:
            from core.plugins import registry

            ops = registry("op")
            self.catalog = {n: ops.get(n) for n in ops.names()}
        return self.catalog

    def lower(self, task: Task, backend: str) -> Candidate:
        """One candidate for ``task``: the lowered module, or ``declined`` with the reason."""
        if backend not in SUPPORTED_BACKENDS:
            return self._declined(task, backend, f"the expert lowers to {SUPPORTED_BACKENDS}, not {backend!r}")
        if not task.program:
            return self._captured(task, backend)
        try:
            program = Program.from_dict(task.program)
            source = lower_program(program, self._catalog())
        except Unsupported as exc:
            return self._declined(task, backend, str(exc))
        except (ProgramError, KeyError, TypeError, ValueError) as exc:
            return self._declined(task, backend, f"malformed program: {exc}")
        return Candidate(source=source, backend=backend, task_id=task.id, coder=self.name, completion=source,
                         meta={"ops": list(program.ops)})

    def _captured(self, task: Task, backend: str) -> Candidate:
        """A task without IR: its forward captured from the source, then lowered like any program."""
        try:
            captured = capture(task, self._catalog())
            source = lower_program(captured.program, self._catalog(), captured.binding)
        except Unsupported as exc:
            return self._declined(task, backend, str(exc))
        except ProgramError as exc:
            return self._declined(task, backend, f"the captured program is malformed: {exc}")
        return Candidate(source=source, backend=backend, task_id=task.id, coder=self.name, completion=source,
                         meta={"ops": list(captured.program.ops), "captured": captured.aten_ops})

    def _declined(self, task: Task, backend: str, reason: str) -> Candidate:
        return Candidate(source="", backend=backend, task_id=task.id, coder=self.name, declined=reason)

    def generate(self, tasks: Sequence[Task], backend: str, num_samples: int = 1) -> list[list[Candidate]]:
        out = []
        for task in tasks:
            cand = self.lower(task, backend)
            out.append([cand] + [Candidate.from_dict(cand.to_dict()) for _ in range(num_samples - 1)])
        return out


def make_expert(**config: Any) -> ExpertCoder:
    return ExpertCoder(**config)


@hookimpl
def register_coders(register):
    register("expert", make_expert)

"""The attempts loop, written once: propose -> code -> verify -> keep the accepted.

Every place that asks a coder for kernels and has them judged goes through :func:`attempt`:
self-play rounds (:mod:`core.loop.selfplay`), distillation datasets (:mod:`core.loop.distillation`,
``python -m core.distill``), the SFT phase's teacher pairs (:mod:`core.loop.sft`) and the held-out
evaluation of a training run (:meth:`core.loop.training.Training.evaluate`). Proposing stays with
the caller (:func:`propose` for the common case), because each draws its tasks its own way: under
the curriculum's live state, from a copy of it with held-out tasks left out, or behind a progress bar.

A declined answer (``Candidate.declined``) is counted and never verified. Verification is one
``verify_many`` batch over every other answer, so the executor spreads it over all its workers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Collection, Iterator, Sequence

from core.contracts import CurriculumState
from core.loop.metrics import Attempt, solve_rates
from core.plugins import notify
from core.task import Candidate, Task
from core.verdict import Verdict

Pair = tuple[Task, Candidate]
OnVerdicts = Callable[[list[int], list[Verdict]], None]


@dataclass
class Attempts:
    """One pass of the loop over a batch of tasks.

    :ivar tasks: the tasks, in the order they were asked.
    :ivar answers: what the coder answered, one list of samples per task.
    :ivar pairs: every answer that was not declined, with its task, in order.
    :ivar verdicts: one verdict per pair.
    :ivar declined: answers the coder declined (never verified).
    """

    tasks: list[Task]
    answers: list[list[Candidate]]
    pairs: list[Pair]
    verdicts: list[Verdict]
    declined: int

    @property
    def candidates(self) -> list[Candidate]:
        return [cand for _, cand in self.pairs]

    def accepted(self) -> list[tuple[Task, Candidate, Verdict]]:
        """The verified answers the verifier accepted (what is kept), in order."""
        return [(task, cand, v) for (task, cand), v in zip(self.pairs, self.verdicts) if v.accepted]

    def outcomes(self) -> Iterator[tuple[Task, Candidate, Verdict | None]]:
        """Every answer in task order with its verdict (``None``: declined, never verified)."""
        verdicts = iter(self.verdicts)
        for task, samples in zip(self.tasks, self.answers):
            for cand in samples:
                yield task, cand, (None if cand.declined else next(verdicts))

    def rejected(self) -> list[tuple[Task, Candidate, Verdict]]:
        """The verified answers the verifier did not accept, in order."""
        return [(task, cand, v) for (task, cand), v in zip(self.pairs, self.verdicts) if not v.accepted]

    def solve_rates(self) -> dict[str, float]:
        """Share of accepted samples per task id (what ``Proposer.feedback`` receives)."""
        return solve_rates([Attempt(task_id=task.id, group=0, accepted=bool(v.accepted), rewards={}, total=0.0)
                            for (task, _), v in zip(self.pairs, self.verdicts)])


def propose(proposer: Any, n: int, state: CurriculumState, exclude: Collection[str] = ()) -> list[Task]:
    """``n`` tasks from ``proposer`` under ``state``, without the ids in ``exclude`` (held-out tasks)."""
    return [task for task in proposer.propose(n, state) if task.id not in exclude]


def copy_state(state: CurriculumState) -> CurriculumState:
    """A copy of a curriculum state, for proposing side tasks (teacher pairs, held-out tasks)."""
    return CurriculumState(**state.to_dict())


def pair_up(tasks: Sequence[Task], answers: Sequence[Sequence[Candidate]]) -> tuple[list[Pair], int]:
    """Pair every non-declined answer with its task; count the declined ones."""
    pairs: list[Pair] = []
    declined = 0
    for task, samples in zip(tasks, answers, strict=True):
        for cand in samples:
            if cand.declined:
                declined += 1
            else:
                pairs.append((task, cand))
    return pairs, declined


def reports_progress(verifier: Any) -> bool:
    """Whether ``verifier.verify_many`` takes an ``on_verdicts`` callback (an executor's does; a verifier
    need only have ``verify_many(pairs)``)."""
    import inspect

    try:
        return "on_verdicts" in inspect.signature(verifier.verify_many).parameters
    except (TypeError, ValueError, AttributeError):
        return False


def verify_pairs(verifier: Any, pairs: Sequence[Pair], on_verdicts: OnVerdicts | None = None) -> list[Verdict]:
    """One verdict per pair, from one ``verify_many`` batch (none asked for when there is nothing to judge).

    ``on_verdicts(indices, verdicts)`` reports verdicts as they land (an executor's progress callback,
    :mod:`core.verification.executor`); without it any object with ``verify_many(pairs)`` will do.
    """
    if not pairs:
        return []
    if on_verdicts is None:
        return list(verifier.verify_many(list(pairs)))
    return list(verifier.verify_many(list(pairs), on_verdicts=on_verdicts))


def attempt(coder: Any, tasks: Sequence[Task], verifier: Any, backend: str, samples: int = 1, *,
            on_answers: Callable[[list[Pair]], None] | None = None, on_verdicts: OnVerdicts | None = None,
            hooks: bool = False) -> Attempts:
    """Ask ``coder`` for ``samples`` answers to every task, verify the answers it did not decline.

    :param on_answers: called with the pairs about to be verified (progress displays).
    :param on_verdicts: passed to the executor's ``verify_many`` (progress as verdicts land).
    :param hooks: fire ``on_verdict`` for every verdict (self-play does; training fires it where it
        verifies completions, in :mod:`core.loop.shared_verification`).
    """
    tasks = list(tasks)
    answers = [list(samples_of) for samples_of in coder.generate(tasks, backend, samples)]
    pairs, declined = pair_up(tasks, answers)
    if on_answers is not None:
        on_answers(pairs)
    verdicts = verify_pairs(verifier, pairs, on_verdicts)
    if hooks:
        for (task, cand), verdict in zip(pairs, verdicts):
            notify("on_verdict", task=task, candidate=cand, verdict=verdict)
    return Attempts(tasks, answers, pairs, verdicts, declined)

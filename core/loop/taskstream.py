"""The task stream: proposer + curriculum -> prompt rows for TRL, as a generator-backed IterableDataset.

TRL cannot take a new ``train_dataset`` mid-training (replacing it from a callback has no effect),
so the stream is lazy instead: every time the trainer's data loader needs rows, the generator asks
the proposer for tasks under the curriculum's *current* state. A curriculum update made at the end
of step ``s`` therefore shapes the tasks of step ``s + 2`` (the loader prefetches one batch).
Iterable datasets need ``max_steps`` and ``shuffle_dataset=False`` (see docs/training.md).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from core.task import Task


class TaskStreamError(RuntimeError):
    """The proposer keeps producing tasks the stream cannot use."""


@dataclass
class TaskStream:
    """Rows ``{"prompt", "task_id", "tier"}`` drawn from ``proposer`` under ``curriculum.state``.

    :param proposer: a :class:`core.contracts.Proposer`.
    :param curriculum: a :class:`core.contracts.Curriculum`; its ``state`` is read at every draw.
    :param prompt: ``task -> prompt text``.
    :param fits: optional ``prompt -> bool``; prompts that do not fit the model are skipped
        (TRL does not truncate prompts) and counted in ``skipped``.
    :param batch: tasks asked from the proposer per draw.
    :param exclude: task ids never streamed (held-out evaluation tasks).
    :param keep: how many recent tasks to remember for :meth:`task` lookups.
    """

    proposer: Any
    curriculum: Any
    prompt: Callable[[Task], str]
    fits: Callable[[str], bool] | None = None
    batch: int = 8
    exclude: set[str] = field(default_factory=set)
    keep: int = 4096
    max_skips: int = 256
    streamed: int = 0
    skipped: int = 0
    _tasks: "OrderedDict[str, Task]" = field(default_factory=OrderedDict, init=False, repr=False)
    _streamed_ids: set[str] = field(default_factory=set, init=False, repr=False)

    @property
    def distinct(self) -> int:
        """How many different tasks were streamed (a replaying proposer serves some more than once)."""
        return len(self._streamed_ids)

    def rows(self) -> Iterator[dict[str, Any]]:
        """An endless stream of rows; the proposer is called lazily, one batch at a time."""
        consecutive_skips = 0
        while True:
            tasks = self.proposer.propose(self.batch, self.curriculum.state)
            if not tasks:
                raise TaskStreamError(f"proposer {getattr(self.proposer, 'name', '?')!r} returned no tasks "
                                      f"for curriculum state {self.curriculum.state}")
            for task in tasks:
                text = self.prompt(task)
                if task.id in self.exclude or (self.fits is not None and not self.fits(text)):
                    self.skipped += 1
                    consecutive_skips += 1
                    if consecutive_skips > self.max_skips:
                        raise TaskStreamError(
                            f"{consecutive_skips} proposed tasks in a row were held out or too long for the "
                            f"model's prompt budget; raise coder.max_prompt_tokens or lower the proposer's sizes")
                    continue
                consecutive_skips = 0
                self.remember(task)
                self.streamed += 1
                self._streamed_ids.add(task.id)
                yield {"prompt": text, "task_id": task.id, "tier": int(task.tier)}

    def remember(self, task: Task) -> None:
        self._tasks[task.id] = task
        self._tasks.move_to_end(task.id)
        while len(self._tasks) > self.keep:
            self._tasks.popitem(last=False)

    def task(self, task_id: str) -> Task:
        try:
            return self._tasks[task_id]
        except KeyError:
            raise KeyError(f"task {task_id!r} is not among the {len(self._tasks)} most recent streamed tasks") from None

    def dataset(self):
        """The stream as a ``datasets.IterableDataset`` (what ``GRPOTrainer`` accepts).

        ``datasets`` fingerprints a generator and its arguments by pickling them; the stream holds a
        proposer and a model, so the dataset names the stream by a key into a process-local table.
        """
        from datasets import Features, IterableDataset, Value

        key = f"stream-{id(self):x}"
        _LIVE_STREAMS[key] = self
        features = Features({"prompt": Value("string"), "task_id": Value("string"), "tier": Value("int64")})
        return IterableDataset.from_generator(_stream_rows, features=features, gen_kwargs={"stream_key": key})


_LIVE_STREAMS: dict[str, TaskStream] = {}


def _stream_rows(stream_key: str) -> Iterator[dict[str, Any]]:
    yield from _LIVE_STREAMS[stream_key].rows()

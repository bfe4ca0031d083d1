"""One verification of each completion per GRPO step, shared by every TRL reward function.

TRL calls the reward functions one after another on the same batch; each reward term is its own
function (named after the term, so TRL logs ``rewards/<term>/mean``). :class:`SharedVerification`
verifies the batch on the first call and lets the others read the same verdicts.

With ``overlap=True`` the completions can be handed over as soon as they are generated
(:meth:`SharedVerification.submit`, called by :mod:`core.loop.overlap` after each step's share of a
generation round): one background thread runs the verifier's ``verify_many`` on them (the work itself
happens in the verifier's pools) while the trainer generates the next share. The reward call then
only waits for what is still in flight. Which pairs are verified, and so every verdict and reward, is
the same as without the overlap: a pair already verified or in flight is not verified again, and the
verdicts are filed, and ``on_verdict`` heard, on the trainer's thread in submission order.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from core.loop.metrics import Attempt, latency_ratio, step_metrics
from core.loop.rewards import RewardMix, trl_reward_function
from core.loop.taskstream import TaskStream
from core.loop.training_config import TrainingError
from core.plugins import notify
from core.task import Candidate, Task
from core.verdict import Verdict


@dataclass
class ScoredBatch:
    tasks: list[Task]
    candidates: list[Candidate]
    verdicts: list[Verdict]
    per_term: dict[str, list[float]]
    totals: list[float]


def verify_once(verifier: Any, tasks: Sequence[Task], candidates: Sequence[Candidate],
                known: "OrderedDict[tuple[str, str], Verdict] | None" = None, keep: int = 0) -> tuple[list[Verdict], int]:
    """The verdicts of a batch, in order, and how many were fresh: each distinct (task id, candidate id)
    pair is verified once, all in one ``verifier.verify_many``; a declined candidate never reaches the
    verifier; ``on_verdict`` hears of every fresh verdict. ``known``: verdicts of earlier batches, read
    and filled, the oldest dropped beyond ``keep``."""
    verdicts: list[Verdict | None] = [None] * len(candidates)
    todo: dict[tuple[str, str], list[int]] = {}
    for i, (task, cand) in enumerate(zip(tasks, candidates)):
        if cand.declined:
            verdicts[i] = Verdict.failure("declined", cand.declined, task_id=task.id, candidate_id=cand.id)
            continue
        k = (task.id, cand.id)
        if known is not None and k in known:
            verdicts[i] = known[k]
        else:
            todo.setdefault(k, []).append(i)
    if todo:
        firsts = [idx[0] for idx in todo.values()]
        fresh = verifier.verify_many([(tasks[i], candidates[i]) for i in firsts])
        for (k, idx), verdict in zip(todo.items(), fresh):
            if known is not None:
                known[k] = verdict
            notify("on_verdict", task=tasks[idx[0]], candidate=candidates[idx[0]], verdict=verdict)
            for i in idx:
                verdicts[i] = verdict
    while known is not None and len(known) > keep:  # also when every verdict was known (filed by an overlap)
        known.popitem(last=False)
    return [v for v in verdicts if v is not None], len(todo)


class SharedVerification:
    """Verifies each completion once per step; every TRL reward function reads the same verdicts.

    TRL calls the reward functions one after another on the same batch. The first call verifies
    the batch (concurrently, through ``verifier.verify_many``) and scores every term; the others
    read the cached result. Verdicts are also cached by (task id, candidate id) across steps, so a
    model repeating itself is not re-verified.
    """

    def __init__(self, *, verifier: Any, stream: TaskStream, to_candidate: Callable[[Task, str], Candidate],
                 mix: RewardMix, num_generations: int, keep: int = 4096, clock: Any = None, overlap: bool = False):
        """``clock``: a :class:`core.loop.step_clock.StepClock` told the verifier's seconds (``verify``), the
        seconds the trainer waited for verdicts (``wait``) and the fresh verdicts (``verdicts``).
        ``overlap``: :meth:`submit` starts verifying in the background (else it does nothing)."""
        self.verifier, self.stream, self.to_candidate = verifier, stream, to_candidate
        self.mix, self.num_generations, self.keep = mix, num_generations, keep
        self.clock = clock
        self._batch_key: tuple | None = None
        self._batch: ScoredBatch | None = None
        self._verdicts: "OrderedDict[tuple[str, str], Verdict]" = OrderedDict()
        self.pending: list[Attempt] = []
        self.pending_tasks: list[Task] = []
        self._groups = 0
        self.verifications = 0
        self.verified_in_reward_call = 0  # fresh verdicts computed inside TRL's reward call (none when all overlapped)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kz-verify") if overlap else None
        self._in_flight: list[tuple[list[tuple[str, str]], list[tuple[Task, Candidate]], Future]] = []
        self._in_flight_keys: set[tuple[str, str]] = set()

    @property
    def overlap(self) -> bool:
        return self._pool is not None

    def _tell(self, key: str, amount: float) -> None:
        if self.clock is not None:
            self.clock.add(key, amount)

    def _timed_verify_many(self, pairs: list[tuple[Task, Candidate]]) -> list[Verdict]:
        t0 = time.perf_counter()
        try:
            return self.verifier.verify_many(pairs)
        finally:
            self._tell("verify", time.perf_counter() - t0)

    def submit(self, task_ids: Sequence[str], completions: Sequence[Any]) -> int:
        """Start verifying these completions in the background (with ``overlap``); returns how many pairs were
        sent. Pairs already verified, in flight or declined are not sent; the reward call files the verdicts."""
        if self._pool is None:
            return 0
        fresh: dict[tuple[str, str], tuple[Task, Candidate]] = {}
        for tid, completion in zip(task_ids, completions, strict=True):
            task = self.stream.task(tid)
            cand = self.to_candidate(task, completion_text(completion))
            key = (task.id, cand.id)
            if cand.declined or key in self._verdicts or key in self._in_flight_keys or key in fresh:
                continue
            fresh[key] = (task, cand)
        if fresh:
            pairs = list(fresh.values())
            self._in_flight.append((list(fresh), pairs, self._pool.submit(self._timed_verify_many, pairs)))
            self._in_flight_keys.update(fresh)
        return len(fresh)

    def _collect(self) -> None:
        """Wait for every verification in flight; file its verdicts, in submission order, on this thread."""
        if not self._in_flight:
            return
        t0 = time.perf_counter()
        try:
            results = [(keys, pairs, future.result()) for keys, pairs, future in self._in_flight]
        finally:
            self._tell("wait", time.perf_counter() - t0)
            self._in_flight, self._in_flight_keys = [], set()
        for keys, pairs, verdicts in results:
            if len(verdicts) != len(pairs):
                raise TrainingError(f"the verifier returned {len(verdicts)} verdicts for {len(pairs)} candidates")
            for key, (task, cand), verdict in zip(keys, pairs, verdicts):
                self._verdicts[key] = verdict
                notify("on_verdict", task=task, candidate=cand, verdict=verdict)
            self.verifications += len(keys)
            self._tell("verdicts", len(keys))

    def close(self) -> None:
        """Stop the background thread (after what is in flight)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def score(self, completions: Sequence[Any], task_ids: Sequence[str], log_metric: Callable | None = None) -> ScoredBatch:
        texts = [completion_text(c) for c in completions]
        key = tuple(zip(task_ids, texts))
        if key == self._batch_key and self._batch is not None:
            return self._batch
        tasks = [self.stream.task(tid) for tid in task_ids]
        candidates = [self.to_candidate(t, text) for t, text in zip(tasks, texts)]
        verdicts = self._verify(tasks, candidates)
        per_term = self.mix.per_term(verdicts, tasks, candidates)
        totals = self.mix.combine(per_term)
        batch = ScoredBatch(tasks, candidates, verdicts, per_term, totals)
        self._record(batch)
        self._batch_key, self._batch = key, batch
        if log_metric is not None:
            m = step_metrics(self.pending, self.mix.terms)
            for name in ("pass_rate", "information_density", "hack_flag_rate"):
                log_metric(f"kernelzero/{name}", m[name])
        return batch

    def _verify(self, tasks: list[Task], candidates: list[Candidate]) -> list[Verdict]:
        self._collect()
        t0 = time.perf_counter()
        verdicts, fresh = verify_once(self.verifier, tasks, candidates, known=self._verdicts, keep=self.keep)
        if fresh:  # verified here, on the trainer's thread: all of it was waited for
            seconds = time.perf_counter() - t0
            self._tell("verify", seconds)
            self._tell("wait", seconds)
            self._tell("verdicts", fresh)
        self.verifications += fresh
        self.verified_in_reward_call += fresh
        return verdicts

    def _record(self, batch: ScoredBatch) -> None:
        g = max(1, self.num_generations)
        for i, (task, verdict) in enumerate(zip(batch.tasks, batch.verdicts)):
            self.pending.append(Attempt(
                task_id=task.id, group=self._groups + i // g, accepted=bool(verdict.accepted),
                rewards={name: values[i] for name, values in batch.per_term.items()}, total=batch.totals[i],
                tier=int(task.tier), compiled=bool(verdict.compiled), hack_flags=list(verdict.hack_flags),
                latency_ratio=latency_ratio(verdict)))
        self._groups += (len(batch.tasks) + g - 1) // g
        self.pending_tasks.extend(batch.tasks)

    def last_accepted(self) -> list[bool]:
        """The verifier's acceptance of each completion of the last scored batch, in its order."""
        return [bool(v.accepted) for v in self._batch.verdicts] if self._batch is not None else []

    def take(self) -> list[Attempt]:
        """The attempts since the last call (one step's worth), forgetting them."""
        out, self.pending, self.pending_tasks = self.pending, [], []
        return out

    def reward_functions(self) -> list[Callable[..., list[float]]]:
        """One TRL reward function per term, named after the term, in the mix's order."""

        def term_fn(term: str) -> Callable[[list[Any], dict[str, Any]], list[float]]:
            def fn(completions: list[Any], kwargs: dict[str, Any]) -> list[float]:
                task_ids = kwargs.get("task_id")
                if task_ids is None:
                    raise TrainingError("reward functions need the dataset's 'task_id' column; "
                                        "keep GRPOConfig.remove_unused_columns=False")
                return self.score(completions, task_ids, kwargs.get("log_metric")).per_term[term]

            return fn

        return [trl_reward_function(term, term_fn(term)) for term in self.mix.terms]


def completion_text(completion: Any) -> str:
    """TRL passes strings for plain prompts and message lists for conversational ones."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)

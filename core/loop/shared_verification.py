"""One verification of each completion per GRPO step, shared by every TRL reward function.

TRL calls the reward functions one after another on the same batch; each reward term is its own
function (named after the term, so TRL logs ``rewards/<term>/mean``). :class:`SharedVerification`
verifies the batch on the first call and lets the others read the same verdicts.

With ``overlap=True`` the completions can be handed over as soon as they are generated
(:meth:`SharedVerification.submit`, called by :mod:`core.loop.overlap` after each step's share of a
generation round), and each one even as soon as it ends, while the rest of its batch is still generated
(:meth:`SharedVerification.submit_early`): one background thread hands them to the verifier's
``verify_stream`` (an executor's one continuous queue: each pair starts as soon as a worker is free), or, for a
verifier without one, runs its ``verify_many`` on whatever is queued, all of it at once (each such call waits
for its slowest verdict), while the trainer generates. The reward call then only waits for what is still in flight. Which pairs are
verified, and so every verdict and reward, is the same as without the overlap: a pair already verified
or in flight is not verified again; an early pair counts only once its batch's :meth:`submit` names it
(one it never names is dropped); and the verdicts are filed, and ``on_verdict`` heard, on the trainer's
thread in the batches' order.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from core.loop.metrics import Attempt, latency_ratio, step_metrics
from core.loop.rewards import RewardMix, trl_reward_function
from core.loop.taskstream import TaskStream
from core.loop.training_config import TrainingError
from core.plugins import notify
from core.task import Candidate, Task
from core.verdict import Verdict

log = logging.getLogger(__name__)
Key = tuple[str, str]  # (task id, candidate id)


@dataclass
class ScoredBatch:
    tasks: list[Task]
    candidates: list[Candidate]
    verdicts: list[Verdict]
    per_term: dict[str, list[float]]
    totals: list[float]


def verify_once(verifier: Any, tasks: Sequence[Task], candidates: Sequence[Candidate],
                known: "OrderedDict[tuple[str, str], Verdict] | None" = None, keep: int = 0
                ) -> tuple[list[Verdict], list[Verdict]]:
    """The verdicts of a batch, in order, and the fresh ones (one per pair verified now): each distinct
    (task id, candidate id) pair is verified once, all in one ``verifier.verify_many``; a declined candidate
    never reaches the verifier; ``on_verdict`` hears of every fresh verdict. ``known``: verdicts of earlier
    batches, read and filled, the oldest dropped beyond ``keep``."""
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
    fresh: list[Verdict] = []
    if todo:
        firsts = [idx[0] for idx in todo.values()]
        fresh = list(verifier.verify_many([(tasks[i], candidates[i]) for i in firsts]))
        for (k, idx), verdict in zip(todo.items(), fresh):
            if known is not None:
                known[k] = verdict
            notify("on_verdict", task=tasks[idx[0]], candidate=candidates[idx[0]], verdict=verdict)
            for i in idx:
                verdicts[i] = verdict
    while known is not None and len(known) > keep:  # also when every verdict was known (filed by an overlap)
        known.popitem(last=False)
    return [v for v in verdicts if v is not None], fresh


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
        self.early_dropped = 0  # early pairs no batch named (their text differed from the batch's decoding)
        # the background verification (overlap): pairs queued, verdicts computed and not yet filed, the pairs the
        # batches named in order (adopted), everything queued, running or computed (so nothing runs twice)
        self._cv = threading.Condition()
        self._queue: list[tuple[Key, Task, Candidate]] = []
        self._results: dict[Key, Verdict | BaseException] = {}
        self._adopted: dict[Key, tuple[Task, Candidate]] = {}
        self._known: set[Key] = set()
        self._closing = False
        # with a verifier that streams (core.verification.executor.BaseExecutor.verify_stream): the feed, its pairs
        # in order (a verdict's index -> its key), the pairs not yet judged and since when any were (verify seconds)
        self._feed: Any = None
        self._fed: list[Key] = []
        self._in_flight, self._busy_since = 0, 0.0
        self._stream_error: BaseException | None = None
        target = self._verify_queued
        if overlap and callable(getattr(verifier, "verify_stream", None)):
            from core.verification.scheduling import PairFeed

            self._feed, target = PairFeed(), self._stream
        self._thread = threading.Thread(target=target, name="kz-verify", daemon=True) if overlap else None
        if self._thread is not None:
            self._thread.start()

    @property
    def overlap(self) -> bool:
        return self._thread is not None

    def _tell(self, key: str, amount: float) -> None:
        if self.clock is not None:
            self.clock.add(key, amount)

    def _verify_queued(self) -> None:
        """The background thread: verify everything queued in one ``verify_many``, again and again."""
        while True:
            with self._cv:
                while not self._queue and not self._closing:
                    self._cv.wait()
                if not self._queue:
                    return
                batch, self._queue = self._queue, []
            t0 = time.perf_counter()
            try:
                verdicts: list[Verdict | BaseException] = list(self.verifier.verify_many([(t, c) for _, t, c in batch]))
                if len(verdicts) != len(batch):
                    error = TrainingError(f"the verifier returned {len(verdicts)} verdicts for {len(batch)} candidates")
                    verdicts = [error] * len(batch)
            except BaseException as exc:  # filed as the pairs' result: the reward call raises it
                verdicts = [exc] * len(batch)
            finally:
                self._tell("verify", time.perf_counter() - t0)
            with self._cv:
                self._results.update((key, v) for (key, _, _), v in zip(batch, verdicts))
                self._cv.notify_all()

    def _stream(self) -> None:
        """The background thread with a streaming verifier: one ``verify_stream`` for the trainer's whole life."""
        try:
            self.verifier.verify_stream(self._feed, self._landed)
        except BaseException as exc:  # filed as the pending pairs' result (and any later one's): the reward call raises
            with self._cv:
                self._stream_error = exc
                self._results.update((key, exc) for key in self._fed if key not in self._results)
                self._cv.notify_all()

    def _landed(self, indices: Sequence[int], verdicts: Sequence[Verdict]) -> None:
        with self._cv:
            for i, verdict in zip(indices, verdicts):
                self._results[self._fed[i]] = verdict
            self._in_flight -= len(indices)
            if self._in_flight <= 0:
                self._in_flight = 0
                self._tell("verify", time.perf_counter() - self._busy_since)
            self._cv.notify_all()

    def _enqueue(self, items: list[tuple[Key, Task, Candidate]]) -> None:
        """Hand pairs to the background thread (with ``self._cv`` held)."""
        if self._feed is None:
            self._queue.extend(items)
        elif self._stream_error is not None:
            self._results.update((key, self._stream_error) for key, _, _ in items)
        elif items:
            if self._in_flight == 0:
                self._busy_since = time.perf_counter()
            self._in_flight += len(items)
            self._fed.extend(key for key, _, _ in items)
            self._feed.put([(task, cand) for _, task, cand in items])

    def _candidates(self, task_ids: Sequence[str], completions: Sequence[Any]) -> dict[Key, tuple[Task, Candidate]]:
        """The not declined, not yet verified pairs of these rows, first occurrence of each, in order."""
        pairs: dict[Key, tuple[Task, Candidate]] = {}
        for tid, completion in zip(task_ids, completions, strict=True):
            task = self.stream.task(tid)
            cand = self.to_candidate(task, completion_text(completion))
            key = (task.id, cand.id)
            if not cand.declined and key not in self._verdicts and key not in pairs:
                pairs[key] = (task, cand)
        return pairs

    def submit(self, task_ids: Sequence[str], completions: Sequence[Any]) -> int:
        """Start verifying a generated batch in the background (with ``overlap``): its pairs count, in its order;
        returns how many pairs were sent now (not those already verified, in flight, sent early, or declined)."""
        if self._thread is None:
            return 0
        sent = 0
        with self._cv:
            for key, (task, cand) in self._candidates(task_ids, completions).items():
                if key in self._adopted:
                    continue
                self._adopted[key] = (task, cand)
                if key not in self._known:
                    self._known.add(key)
                    self._enqueue([(key, task, cand)])
                    sent += 1
            self._cv.notify_all()
        return sent

    def submit_early(self, task_ids: Sequence[str], completions: Sequence[Any]) -> int:
        """Start verifying rows that ended while the rest of their batch is still generated (with ``overlap``); they
        count only once :meth:`submit` names them. Returns how many pairs were sent."""
        if self._thread is None:
            return 0
        with self._cv:
            fresh = [(key, t, c) for key, (t, c) in self._candidates(task_ids, completions).items()
                     if key not in self._known]
            self._known.update(key for key, _, _ in fresh)
            self._enqueue(fresh)
            self._cv.notify_all()
        return len(fresh)

    def _collect(self) -> None:
        """Wait for the verdicts of every pair the batches named; file them, in the batches' order, on this thread.
        Early pairs no batch named are dropped."""
        if self._thread is None:
            return
        t0 = time.perf_counter()
        with self._cv:
            if not self._adopted:
                return
            try:
                while not all(key in self._results for key in self._adopted):
                    self._cv.wait()
            finally:
                self._tell("wait", time.perf_counter() - t0)
            adopted, self._adopted = self._adopted, {}
            results = {key: self._results.pop(key) for key in adopted}
            dropped = [key for key in self._results if key not in adopted]
            for key in dropped:
                del self._results[key]
            self._known -= set(adopted) | set(dropped)
        if dropped:
            self.early_dropped += len(dropped)
            log.warning("%d early completion(s) matched no generated row and were dropped", len(dropped))
        failed = next((v for v in results.values() if isinstance(v, BaseException)), None)
        if failed is not None:
            raise failed
        for key, (task, cand) in adopted.items():
            verdict = results[key]
            self._verdicts[key] = verdict
            notify("on_verdict", task=task, candidate=cand, verdict=verdict)
        self.verifications += len(adopted)
        self._tell("verdicts", len(adopted))
        if self.clock is not None:
            self.clock.add_stages(results[key] for key in adopted)

    def close(self) -> None:
        """Stop the background thread (after the ``verify_many`` it runs, if any)."""
        if self._thread is not None:
            with self._cv:
                self._closing = True
                self._queue.clear()  # what has not started is not needed any more
                self._cv.notify_all()
            if self._feed is not None:
                self._feed.close(cancel=True)
            self._thread.join()

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
        if fresh and self.clock is not None:  # verified here, on the trainer's thread: all of it was waited for
            self.clock.add_verified(time.perf_counter() - t0, fresh)
        self.verifications += len(fresh)
        self.verified_in_reward_call += len(fresh)
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

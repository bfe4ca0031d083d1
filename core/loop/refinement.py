"""Multi-turn refinement: after a rejected attempt the coder sees the verdict and tries again.

:class:`RefinementEnv` is a ``rollout_func`` for TRL's ``GRPOTrainer`` (TRL 1.16; experimental there):
TRL hands it a batch of prompts (each already repeated ``num_generations`` times) and the trainer;
for every prompt it plays one *episode* of up to ``turns`` turns:

1. the model completes the context (turn 1: the prompt) with the trainer's generation config;
2. the completion becomes a candidate and is judged by the verifier (one ``verify_many`` per turn,
   so untrusted code only ever runs in the verifier's sandboxed workers);
3. accepted, or out of turns: the episode ends. Rejected: the verdict's reason and failing check's
   detail, trimmed to ``feedback_tokens`` tokens (:func:`core.loop.turns.verdict_feedback`), are
   appended (:func:`core.loop.turns.render_feedback_turn`) and the model completes again.

An episode is one sequence for TRL: ``completion_ids`` are the turns' tokens with the feedback
between them, and ``env_mask`` (TRL's name for it) is 0 on the feedback tokens, so the loss only
covers what the model wrote. TRL 1.16's GRPO gives a sequence one reward and one advantage, so an
episode's reward is the return of its first turn, ``G_1 = sum_t gamma^(t-1) r_t`` (Kevin-32B's
discounted sum; ``r_t`` is the reward mix's total for turn ``t``, ``gamma`` is ``discount``).
Each reward term is its own TRL reward function (``rewards/<term>/mean``), returning that term's
discounted return; their weighted sum is the discounted return of the totals.

TRL's other multi-turn hook, ``environment_factory``, runs *tools the model calls* through a
tool-calling chat template; here the environment speaks after every attempt without being called,
and the embedded model has no chat template, so this is a ``rollout_func``.

Standalone use with any causal LM (a plain-text prompt whose completion is the module's code)::

    env = RefinementEnv(verifier=verifier, tokenizer=tokenizer, mix=RewardMix({"correctness": 1.0}), turns=3)
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=GRPOConfig(...),
                          train_dataset=env.dataset(tasks, prompt=my_prompt),
                          reward_funcs=env.reward_functions(), rollout_func=env)

The same episodes, played greedily with :meth:`RefinementEnv.play`, measure refinement
(``benchmarks/refinement.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from core.contracts import optional
from core.loop.metrics import Attempt, latency_ratio
from core.loop.rewards import RewardMix, trl_reward_function
from core.loop.shared_verification import verify_once
from core.loop.turns import discounted_returns, render_feedback_turn, verdict_feedback
from core.task import Candidate, Task
from core.verdict import Verdict

Generate = Callable[[list[list[int]]], list[list[int]]]


@dataclass
class Turn:
    """One attempt of an episode: what the model wrote, its verdict and rewards, the feedback shown after it."""

    completion_ids: list[int]
    candidate: Candidate
    verdict: Verdict
    rewards: dict[str, float]  # unweighted, per reward term
    total: float  # the mix's weighted sum
    feedback_ids: list[int] = field(default_factory=list)  # empty when no turn followed


@dataclass
class Episode:
    task: Task
    prompt_ids: list[int]
    turns: list[Turn] = field(default_factory=list)
    id: int = 0

    @property
    def accepted_turn(self) -> int | None:
        """The 1-based turn whose attempt was accepted (episodes end there), or None."""
        return next((i + 1 for i, t in enumerate(self.turns) if t.verdict.accepted), None)

    def passed_by(self, turn: int) -> bool:
        """Whether an attempt at or before ``turn`` was accepted (pass@1 after ``turn`` turns)."""
        accepted = self.accepted_turn
        return accepted is not None and accepted <= turn

    def context(self) -> list[int]:
        """The tokens the next turn continues: prompt, then every turn with its feedback."""
        out = list(self.prompt_ids)
        for turn in self.turns:
            out += turn.completion_ids + turn.feedback_ids
        return out

    def completion(self) -> tuple[list[int], list[int]]:
        """``(completion_ids, env_mask)`` of the whole episode (mask 0 on feedback tokens)."""
        ids: list[int] = []
        mask: list[int] = []
        for turn in self.turns:
            ids += turn.completion_ids + turn.feedback_ids
            mask += [1] * len(turn.completion_ids) + [0] * len(turn.feedback_ids)
        return ids, mask

    def returns(self, gamma: float) -> dict[str, float]:
        """Each reward term's return of the first turn, ``sum_t gamma^(t-1) r_t``."""
        terms = self.turns[0].rewards if self.turns else {}
        return {name: discounted_returns([t.rewards[name] for t in self.turns], gamma)[0] for name in terms}

    def total_return(self, gamma: float) -> float:
        return discounted_returns([t.total for t in self.turns], gamma)[0] if self.turns else 0.0


def fenced_code(completion: str) -> str:
    """The code of a completion that continues an open code fence: the text before its closing fence."""
    return completion.split("```", 1)[0].strip("\n") + "\n"


class RefinementEnv:
    """Multi-turn refinement episodes judged by the verifier; a ``rollout_func`` for ``GRPOTrainer``.

    :param verifier: anything with ``verify_many([(task, candidate), ...]) -> [Verdict]``: the
        sandboxed :class:`core.verify.Verifier` or an executor (candidate code runs only there).
    :param tokenizer: the model's tokenizer (tokenises prompts and feedback, counts feedback tokens).
    :param mix: the :class:`core.loop.rewards.RewardMix` that scores every turn.
    :param turns: at most this many attempts per episode (1: a single attempt, no feedback).
    :param discount: ``gamma`` of the discounted return, in [0, 1].
    :param feedback_tokens: token budget of the verdict's feedback (reason + failing check's detail).
    :param to_candidate: ``(task, completion text) -> Candidate``; default: the code before the
        completion's closing fence, for ``backend``.
    :param render_turn: ``feedback -> text`` appended after a rejected completion.
    :param tasks: ``prompt -> Task`` for prompts not registered through :meth:`register` or :meth:`dataset`.
    :param clock: a :class:`core.loop.step_clock.StepClock` told each turn's verification (the trainer waits for it).
    """

    def __init__(self, *, verifier: Any, tokenizer: Any, mix: RewardMix, turns: int = 2, discount: float = 0.4,
                 feedback_tokens: int = 96, backend: str = "triton",
                 to_candidate: Callable[[Task, str], Candidate] | None = None,
                 render_turn: Callable[[str], str] = render_feedback_turn,
                 tasks: Callable[[str], Task] | None = None, keep: int = 4096, clock: Any = None):
        if turns < 1:
            raise ValueError(f"turns must be >= 1, got {turns}")
        if not 0.0 <= discount <= 1.0:
            raise ValueError(f"the turn discount must be in [0, 1], got {discount}")
        self.verifier, self.tokenizer, self.mix = verifier, tokenizer, mix
        self.turns, self.discount, self.feedback_tokens = int(turns), float(discount), int(feedback_tokens)
        self.backend, self.render_turn, self.lookup, self.keep = backend, render_turn, tasks, keep
        self.clock = clock
        self.to_candidate = to_candidate or self._fenced_candidate
        self._by_prompt: dict[str, Task] = {}
        self._episodes: dict[int, Episode] = {}
        self._next_id = 0
        self.pending: list[Attempt] = []
        self._groups = 0
        self.verifications = 0

    # ------------------------------------------------------------------ tasks

    def register(self, task: Task, prompt: str) -> str:
        """Make ``prompt`` resolve to ``task`` in later rollouts; returns ``prompt``."""
        self._by_prompt[prompt] = task
        return prompt

    def registering(self, prompt: Callable[[Task], str]) -> Callable[[Task], str]:
        """``prompt`` that also registers every prompt it renders (for a task stream)."""
        return lambda task: self.register(task, prompt(task))

    def dataset(self, tasks: Sequence[Task], prompt: Callable[[Task], str]):
        """A ``datasets.Dataset`` of ``{"prompt", "task_id"}`` rows for ``GRPOTrainer``, every prompt registered."""
        from datasets import Dataset

        return Dataset.from_list([{"prompt": self.register(t, prompt(t)), "task_id": t.id} for t in tasks])

    def task_for(self, prompt: str) -> Task:
        if prompt in self._by_prompt:
            return self._by_prompt[prompt]
        if self.lookup is not None:
            return self.lookup(prompt)
        raise KeyError("a prompt the refinement environment does not know; build the dataset with "
                       "RefinementEnv.dataset(...) or register(task, prompt), or pass tasks=prompt->Task")

    # ------------------------------------------------------------------ episodes

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def feedback_ids(self, verdict: Verdict) -> list[int]:
        """The tokens shown after a rejected attempt: its verdict's feedback, trimmed and rendered."""
        return self.encode(self.render_turn(verdict_feedback(verdict, self.feedback_tokens, self._count)))

    def play(self, tasks: Sequence[Task], prompts: Sequence[str], generate: Generate,
             max_length: int | None = None, room: int = 0) -> list[Episode]:
        """One episode per (task, prompt): generate, verify, feed back, until accepted or out of turns.

        :param generate: ``contexts -> new token ids`` (one list per context, ending at EOS or cut).
        :param max_length: the model's context length; an episode whose next context would not leave
            ``room`` tokens for another completion ends early.
        """
        episodes = [self._new_episode(t, self.encode(p)) for t, p in zip(tasks, prompts, strict=True)]
        live = list(episodes)
        for turn in range(1, self.turns + 1):
            if not live:
                break
            completions = generate([e.context() for e in live])
            texts = [self.tokenizer.decode(ids, skip_special_tokens=True) for ids in completions]
            candidates = [self.to_candidate(e.task, text) for e, text in zip(live, texts)]
            verdicts = self._verify([e.task for e in live], candidates)
            per_term = self.mix.per_term(verdicts, [e.task for e in live], candidates)
            totals = self.mix.combine(per_term)
            still: list[Episode] = []
            for i, episode in enumerate(live):
                step = Turn(list(completions[i]), candidates[i], verdicts[i],
                            {name: values[i] for name, values in per_term.items()}, totals[i])
                episode.turns.append(step)
                if verdicts[i].accepted or turn == self.turns:
                    continue
                step.feedback_ids = self.feedback_ids(verdicts[i])
                if max_length is not None and len(episode.context()) + max(1, room) > max_length:
                    step.feedback_ids = []
                    continue
                still.append(episode)
            live = still
        return episodes

    def __call__(self, prompts: list[str], trainer: Any) -> dict[str, Any]:
        """TRL's ``rollout_func(prompts, trainer)``: one episode per prompt, sampled with the trainer's model."""
        if getattr(trainer, "use_vllm", False):
            raise NotImplementedError("RefinementEnv generates with the trainer's transformers model; "
                                      "set GRPOConfig(use_vllm=False)")
        model = trainer.accelerator.unwrap_model(trainer.model)
        config = trainer.generation_config

        def generate(contexts: list[list[int]]) -> list[list[int]]:
            return generate_ids(model, contexts, pad_token_id=self.tokenizer.pad_token_id,
                                eos_token_ids=config.eos_token_id, generation_config=config)

        episodes = self.play([self.task_for(p) for p in prompts], prompts, generate,
                             getattr(model.config, "max_position_embeddings", None), int(config.max_new_tokens or 0))
        self._record(episodes, int(getattr(trainer, "num_generations", 1)))
        ids_and_masks = [e.completion() for e in episodes]
        return {"prompt_ids": [e.prompt_ids for e in episodes], "completion_ids": [c for c, _ in ids_and_masks],
                "env_mask": [m for _, m in ids_and_masks], "logprobs": None,
                "refine_episode": [e.id for e in episodes], "refine_task_id": [e.task.id for e in episodes]}

    # ------------------------------------------------------------------ rewards and metrics

    def reward_functions(self) -> list[Callable[..., list[float | None]]]:
        """One TRL reward function per term of the mix (named after it): the term's discounted return.

        A row whose dataset ``task_id`` differs from the task its prompt resolved to (two tasks with
        one prompt text) is scored ``None``: TRL leaves it out of the group's baseline and gives it
        no advantage.
        """

        def term_fn(term: str, first: bool) -> Callable[[list[Any], dict[str, Any]], list[float | None]]:
            def fn(completions: list[Any], kwargs: dict[str, Any]) -> list[float | None]:
                if "refine_episode" not in kwargs:
                    raise ValueError("the refinement reward functions score episodes the environment played: pass "
                                     "the same RefinementEnv to GRPOTrainer as rollout_func=env")
                episodes = [self._episodes[int(i)] for i in kwargs["refine_episode"]]
                row_ids = kwargs.get("task_id") or [e.task.id for e in episodes]
                if first and kwargs.get("log_metric") is not None:
                    for turn in range(1, self.turns + 1):
                        kwargs["log_metric"](f"kernelzero/pass_after_turn_{turn}",
                                             sum(e.passed_by(turn) for e in episodes) / max(1, len(episodes)))
                return [e.returns(self.discount)[term] if e.task.id == rid else None
                        for e, rid in zip(episodes, row_ids)]

            return fn

        return [trl_reward_function(term, term_fn(term, i == 0)) for i, term in enumerate(self.mix.terms)]

    def take(self) -> list[Attempt]:
        """The episodes since the last call as attempts (one per episode: its last verdict, its returns)."""
        out, self.pending = self.pending, []
        return out

    # ------------------------------------------------------------------ internals

    def _fenced_candidate(self, task: Task, text: str) -> Candidate:
        code = fenced_code(text)
        return Candidate(source=code, backend=self.backend, task_id=task.id, completion=text,
                         declined=None if code.strip() else "empty completion")

    def _new_episode(self, task: Task, prompt_ids: list[int]) -> Episode:
        episode = Episode(task=task, prompt_ids=prompt_ids, id=self._next_id)
        self._next_id += 1
        self._episodes[episode.id] = episode
        while len(self._episodes) > self.keep:
            self._episodes.pop(next(iter(self._episodes)))
        return episode

    def _count(self, text: str) -> int:
        return len(self.encode(text))

    def _verify(self, tasks: list[Task], candidates: list[Candidate]) -> list[Verdict]:
        t0 = time.perf_counter()
        verdicts, fresh = verify_once(self.verifier, tasks, candidates)  # within a batch only: no cache across steps
        if self.clock is not None and fresh:  # each turn's verdicts decide the next turn: all of it is waited for
            self.clock.add_verified(time.perf_counter() - t0, fresh)
        self.verifications += len(fresh)
        return verdicts

    def _record(self, episodes: list[Episode], num_generations: int) -> None:
        g = max(1, num_generations)
        for i, e in enumerate(episodes):
            last = e.turns[-1].verdict
            self.pending.append(Attempt(
                task_id=e.task.id, group=self._groups + i // g, accepted=e.accepted_turn is not None,
                rewards=e.returns(self.discount), total=e.total_return(self.discount), tier=int(e.task.tier),
                compiled=bool(last.compiled), hack_flags=sorted({f for t in e.turns for f in t.verdict.hack_flags}),
                latency_ratio=latency_ratio(last)))
        self._groups += (len(episodes) + g - 1) // g


def training_env(training: Any, mix: RewardMix) -> RefinementEnv | None:
    """The environment of a training run's GRPO phase when its coder plays ``turns > 1``, else None."""
    coder = training.coder
    turns = int(optional(coder, "Coder", "turns"))
    if turns <= 1:
        return None
    return RefinementEnv(verifier=training.verifier, tokenizer=coder.hf_tokenizer, mix=mix, turns=turns,
                         discount=training.settings.turn_discount, backend=training.backend,
                         feedback_tokens=int(optional(coder, "Coder", "feedback_tokens")),
                         to_candidate=lambda task, text: coder.to_candidate(task, text, training.backend))


def generate_ids(model: Any, contexts: list[list[int]], *, pad_token_id: int, eos_token_ids: Any = None,
                 generation_config: Any = None, **kwargs: Any) -> list[list[int]]:
    """New tokens for each context (left-padded into one batch), cut after the first EOS (kept)."""
    import torch

    width = max(len(c) for c in contexts)
    ids = torch.full((len(contexts), width), int(pad_token_id), dtype=torch.long)
    mask = torch.zeros((len(contexts), width), dtype=torch.long)
    for row, context in enumerate(contexts):
        ids[row, width - len(context):] = torch.tensor(context, dtype=torch.long)
        mask[row, width - len(context):] = 1
    with torch.no_grad():
        out = model.generate(input_ids=ids.to(model.device), attention_mask=mask.to(model.device),
                             generation_config=generation_config, **kwargs)
    eos = set(eos_token_ids if isinstance(eos_token_ids, (list, tuple)) else [eos_token_ids]) - {None}
    result: list[list[int]] = []
    for row in out[:, width:].tolist():
        cut = next((i + 1 for i, tok in enumerate(row) if tok in eos), len(row))
        result.append(row[:cut])
    return result

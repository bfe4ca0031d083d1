"""Verification off the critical path of a GRPO step, and the step's time breakdown.

TRL 1.16 generates a whole *generation round* at once (``steps_per_generation`` optimisation steps'
worth of completions, all with the same policy; the steps after the first are importance-weighted
against it), then calls the reward functions on all of it, then optimises step by step. Its async
reward functions run side by side with each other, but still inside that reward call, after all
generation. :func:`timed_trainer_class` changes two things:

1. With ``steps_per_generation = S > 1`` a round is generated one optimisation step's batch at a
   time (S calls of TRL's own ``_generate``, each the size of one step: the batch a run without
   ``steps_per_generation`` generates), and each batch is handed to ``on_batch``.
   :meth:`core.loop.shared_verification.SharedVerification.submit` starts verifying it in the
   verifier's pools at once, so batch ``k`` is verified while batch ``k + 1`` is generated, and the
   last one while TRL computes the old policy's log-probabilities. TRL's reward call then waits
   only for what is still in flight; the rewards, advantages and loss are TRL's, on the same
   completions and verdicts as without the overlap (``trainer.overlap_verification=false``).
2. With ``on_rows`` as well, each completion is handed over as soon as it ends (its first EOS), while the
   rest of its batch is still generated (:class:`EarlyRows`, a stopping criterion that never stops a row):
   a batch runs until its longest completion, and on the H100 (1.3B model, 2026-12-06) the last batch's
   verification, begun only when the whole batch was done, was 18% of the step time.
3. It times the step's parts for :class:`core.loop.step_clock.StepClock` (generation, the batch
   being ready, completion tokens).

What it does not do: verify a round while the *previous* round is optimised (that would need the
rewards after the first step's update, which TRL computes before it), or overlap multi-turn
episodes (``coder.turns > 1``: each turn's verdict decides the next turn, inside the rollout).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

from core.loop.training_config import TrainingError

OnBatch = Callable[[Sequence[str], Sequence[Any]], Any]  # (task ids, completions) of one generated batch


class EarlyRows:
    """A ``generate`` stopping criterion that stops nothing: at each new token it hands the rows that just ended
    (their first EOS) to ``on_rows`` as (task ids, completion texts), decoded as TRL decodes a completion (its ids
    through that EOS, special tokens skipped)."""

    def __init__(self, prompt_length: int, eos_ids: Sequence[int], task_ids: Sequence[str],
                 decode: Callable[[list[int]], str], on_rows: OnBatch):
        self.prompt_length, self.eos_ids, self.task_ids = prompt_length, list(eos_ids), list(task_ids)
        self.decode, self.on_rows = decode, on_rows
        self.ended: Any = None  # per row: its EOS seen (a finished row is padded on, maybe with the EOS id)
        self.eos: Any = None  # eos_ids on the generating device, made at the first token

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        last = input_ids[:, -1]
        if self.eos is None:
            self.eos = torch.tensor(self.eos_ids, device=last.device)
        ended = torch.isin(last, self.eos)
        if self.ended is None:
            self.ended = torch.zeros_like(ended)
        new = ended & ~self.ended
        if input_ids.shape[1] > self.prompt_length and bool(new.any()):
            self.ended |= new
            rows = new.nonzero().reshape(-1).tolist()
            self.on_rows([self.task_ids[r] for r in rows],
                         [self.decode(input_ids[r, self.prompt_length:].tolist()) for r in rows])
        return torch.zeros_like(ended)  # criteria are or-ed: this one never ends a row


def merge_generations(parts: Sequence[tuple]) -> tuple:
    """TRL's ``_generate`` outputs of consecutive batches as one output of all their rows, in order.

    ``_generate`` returns ``(prompt_ids, completion_ids, tool_mask, completions, logprobs, extra_fields,
    images, tool_images)``: lists with one entry per row (``tool_mask``, ``logprobs``, ``images``: or
    None), and ``extra_fields`` a dict of such lists (a rollout function's extra columns).
    """
    if len(parts) == 1:
        return parts[0]

    def rows(index: int):
        values = [p[index] for p in parts]
        if all(v is None for v in values):
            return None
        if any(v is None for v in values):
            raise TrainingError(f"generation output {index} is missing in some batches of one round")
        return [row for v in values for row in v]

    extra: dict[str, Any] = {}
    for key in parts[0][5]:
        values = [p[5][key] for p in parts]
        extra[key] = [row for v in values for row in v] if isinstance(values[0], list) else values[-1]
    return (rows(0), rows(1), rows(2), rows(3), rows(4), extra, rows(6), rows(7) or [])


def timed_trainer_class(base: type, clock: Any, on_batch: OnBatch | None = None,
                        on_rows: OnBatch | None = None,
                        on_loss_inputs: Callable[[dict[str, Any]], None] | None = None) -> type:
    """``base`` (TRL's ``GRPOTrainer`` or a subclass) generating per step's batch, telling ``clock`` the step's
    parts, handing each generated batch to ``on_batch`` and each completion as it ends to ``on_rows`` (see the
    module docstring), and each training micro-batch's loss inputs, summarised, to ``on_loss_inputs``
    (:func:`core.loop.phase_common.loss_input_summary`: what ``FiniteGuard`` reports for a non-finite step)."""

    class TimedGRPOTrainer(base):
        _kz_task_ids: list[Any] | None = None

        def _prepare_inputs(self, generation_batch):
            inputs = super()._prepare_inputs(generation_batch)
            if self.model.training:
                clock.batch_ready()
            return inputs

        def _compute_loss(self, model, inputs):
            if on_loss_inputs is not None and model.training:
                from core.loop.phase_common import loss_input_summary

                on_loss_inputs(loss_input_summary(inputs))
            return super()._compute_loss(model, inputs)

        def _generate_and_score_completions(self, inputs):
            self._kz_task_ids = [row.get("task_id") for row in inputs]
            try:
                return super()._generate_and_score_completions(inputs)
            finally:
                self._kz_task_ids = None

        def _generate(self, prompts):
            training = self.model.training
            batches = int(self.args.steps_per_generation or 1) if training else 1
            if len(prompts) % batches:
                batches = 1
            task_ids = self._kz_task_ids
            if task_ids is None or len(task_ids) != len(prompts) or None in task_ids:
                task_ids = None  # nothing to hand over; the reward call says what is missing
            size = max(1, len(prompts) // batches)
            parts = []
            for start in range(0, len(prompts), size):
                waited = clock.value("wait")  # a multi-turn rollout verifies inside generation: not generation time
                t0 = time.perf_counter()
                with self._early_rows(task_ids[start:start + size] if task_ids is not None and training else None):
                    part = super()._generate(prompts[start:start + size])
                if training:
                    clock.add("generate", time.perf_counter() - t0 - (clock.value("wait") - waited))
                    mask = part[2]  # a rollout's env mask: 0 on feedback tokens the model did not write
                    clock.add("completion_tokens", sum(map(sum, mask)) if mask is not None else sum(map(len, part[1])))
                if on_batch is not None and task_ids is not None and training:
                    on_batch(task_ids[start:start + size], part[3])
                parts.append(part)
            return merge_generations(parts)

        @contextlib.contextmanager
        def _early_rows(self, task_ids):
            """While one batch generates, the model's ``generate`` also gets an :class:`EarlyRows` criterion."""
            model = self.accelerator.unwrap_model(self.model_wrapped) if on_rows is not None and task_ids else None
            if model is None or "generate" in vars(model):
                yield
                return
            generate = model.generate
            tokenizer = getattr(self.processing_class, "tokenizer", self.processing_class)

            def watched(*args, **kwargs):
                from transformers import StoppingCriteriaList

                ids = kwargs.get("input_ids", args[0] if args else None)
                if ids is None or ids.shape[0] != len(task_ids):
                    return generate(*args, **kwargs)
                criteria = StoppingCriteriaList(kwargs.pop("stopping_criteria", None) or [])
                criteria.append(EarlyRows(ids.shape[1], self.eos_token_ids, task_ids,
                                          lambda row: tokenizer.decode(row, skip_special_tokens=True), on_rows))
                return generate(*args, stopping_criteria=criteria, **kwargs)

            model.generate = watched
            try:
                yield
            finally:
                del model.generate

    return TimedGRPOTrainer

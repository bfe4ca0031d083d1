"""A phase never applies a non-finite update: a step whose gradients are not finite is skipped (up to
``trainer.max_skipped_updates`` in a row), and otherwise the phase stops with a clear error at the first
non-finite loss, gradient norm or weight, before it is saved."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from transformers import TrainerControl, TrainerState, TrainingArguments

from core.loop.phase_common import FiniteGuard
from core.loop.training_config import Phase, TrainingError


def _log(logs, step=7):
    state = TrainerState()
    state.global_step = step
    FiniteGuard(Phase(name="correctness", kind="grpo", steps=16)).on_log(
        TrainingArguments(output_dir="/tmp/unused", use_cpu=True), state, TrainerControl(), logs=logs)


@pytest.mark.parametrize("key", ["loss", "grad_norm"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_non_finite_loss_or_gradient_stops_the_phase_by_name(key, value):
    with pytest.raises(TrainingError, match=rf"phase 'correctness': {key} was {value} at step 7, so the phase stopped"):
        _log({key: value, "learning_rate": 1e-4})


@given(st.dictionaries(st.sampled_from(["loss", "grad_norm", "reward", "learning_rate"]),
                       st.floats(allow_nan=False, allow_infinity=False)))
def test_finite_logs_pass(logs):
    _log(logs)


def test_other_keys_are_not_watched():
    _log({"reward": math.nan, "kl": math.inf})  # a reward of nan is TRL's to report, not a broken model


def test_non_finite_weights_stop_the_phase_and_finite_ones_do_not():
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    state = TrainerState()
    state.global_step = 3
    guard = FiniteGuard(Phase(name="distill", kind="sft", steps=4))
    args = TrainingArguments(output_dir="/tmp/unused", use_cpu=True)
    guard.on_step_end(args, state, TrainerControl(), model=model)
    with torch.no_grad():
        model[1].weight[0, 2] = math.inf
    with pytest.raises(TrainingError, match=r"phase 'distill': the update left weights that are not finite "
                                            r"\(1.weight, among others\) at step 3"):
        guard.on_step_end(args, state, TrainerControl(), model=model)


def _grads(model, bad: bool):
    import torch

    for p in model.parameters():
        p.grad = torch.ones_like(p)
    if bad:
        model[0].weight.grad[1, 1] = math.nan


@given(pattern=st.lists(st.booleans(), min_size=1, max_size=12), max_skipped=st.integers(0, 3))
def test_a_step_whose_gradients_are_not_finite_is_skipped_up_to_the_limit_in_a_row(pattern, max_skipped):
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    said = []
    guard = FiniteGuard(Phase(name="correctness", kind="grpo", steps=16), max_skipped=max_skipped, say=said.append)
    args, state = TrainingArguments(output_dir="/tmp/unused", use_cpu=True), TrainerState()
    in_a_row = 0
    for step, bad in enumerate(pattern, start=1):
        before = [p.detach().clone() for p in model.parameters()]
        _grads(model, bad)
        in_a_row = in_a_row + 1 if bad else 0
        if in_a_row > max_skipped:  # one more than allowed in a row: the phase stops, naming the parameter
            with pytest.raises(TrainingError, match=rf"gradients were not finite \(0.weight, among others; 1 of 4 "
                                                    rf"tensors, first 0.weight, last 0.weight\) "
                                                    rf"{in_a_row} step\(s\) in a row at step {step}"):
                guard.on_pre_optimizer_step(args, state, TrainerControl(), model=model)
            return
        guard.on_pre_optimizer_step(args, state, TrainerControl(), model=model)
        optimizer.step()
        state.global_step = step
        guard.on_step_end(args, state, TrainerControl(), model=model)
        # the skipped step's NaN gradient norm is what TRL logs for it; it does not stop the phase
        guard.on_log(args, state, TrainerControl(), logs={"grad_norm": math.nan if bad else 1.0, "loss": 0.5})
        moved = any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
        assert moved != bad  # a skipped update leaves every weight as it was; an applied one moves them
        assert all(torch.isfinite(p).all() for p in model.parameters())
    assert guard.skipped == [step for step, bad in enumerate(pattern, start=1) if bad]
    assert len(said) == len(guard.skipped) and all("update skipped" in line for line in said)
    assert set(guard.where) == set(guard.skipped)


class _TinyLM:
    """A causal LM's shape for the guard: embedding, a body, an output embedding (its logits)."""

    def __new__(cls, body):
        import torch

        class Tiny(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = torch.nn.Embedding(11, 4)
                self.body = torch.nn.Linear(4, 4)
                self.head = torch.nn.Linear(4, 11, bias=False)

            def get_output_embeddings(self):
                return self.head

            def forward(self, ids):
                return self.head(body(self.body(self.embed(ids))))

        return Tiny()


@pytest.mark.parametrize("origin", ["loss", "model"])
def test_a_skipped_step_says_whether_its_non_finite_gradients_came_from_the_loss_or_the_models_backward(origin):
    # H100, 2026-12-06: a 1.3B model's GRPO steps had a finite loss and NaN gradients in every tensor; the guard
    # now tells the two places apart by the gradient at the logits
    import torch

    # the loss's case: exp overflows where a mask then discards it (GRPO's importance ratio at a masked token):
    # the loss is finite, its gradient at the logits is 0 * inf. The model's: sqrt at 0 inside the body
    body = (lambda h: h) if origin == "loss" else (lambda h: torch.sqrt(h - h) + h)
    model = _TinyLM(body)
    said = []
    guard = FiniteGuard(Phase(name="correctness", kind="grpo", steps=4), max_skipped=2, say=said.append)
    args, state = TrainingArguments(output_dir="/tmp/unused", use_cpu=True), TrainerState()
    guard.on_train_begin(args, state, TrainerControl(), model=model)
    logits = model(torch.tensor([[1, 2, 3]]))
    if origin == "loss":
        loss = torch.where(torch.zeros_like(logits, dtype=torch.bool), torch.exp(1000 * logits), 0.0).sum()
    else:
        loss = logits.sum()
    assert torch.isfinite(loss)
    loss.backward()
    guard.on_pre_optimizer_step(args, state, TrainerControl(), model=model)
    assert guard.skipped == [1] and all(p.grad is None for p in model.parameters())
    expected = ("the gradient at the logits was already not finite: the loss made them" if origin == "loss" else
                "the gradient at the logits was finite: they arose inside the model's backward")
    assert expected in said[0] and guard.where[1].endswith(expected)
    # a finite step after it reads only its own backward's gradients at the logits
    if origin == "loss":  # (the model's sqrt makes every step's gradients NaN)
        model(torch.tensor([[4, 5]])).sum().backward()
        guard.on_pre_optimizer_step(args, state, TrainerControl(), model=model)
        assert guard.in_a_row == 0 and guard._logit_grad_norms == []
    guard.on_train_end(args, state, TrainerControl())
    model(torch.tensor([[1]]))
    assert guard._logit_grad_norms == []  # the hook is gone with the phase


def test_a_non_finite_log_of_a_step_that_was_applied_still_stops_the_phase():
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(3, 3))
    guard = FiniteGuard(Phase(name="correctness", kind="grpo", steps=16), max_skipped=3, say=lambda _: None)
    args, state = TrainingArguments(output_dir="/tmp/unused", use_cpu=True), TrainerState()
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    guard.on_pre_optimizer_step(args, state, TrainerControl(), model=model)
    state.global_step = 1
    with pytest.raises(TrainingError, match="loss was nan at step 1"):
        guard.on_log(args, state, TrainerControl(), logs={"loss": math.nan})


TINY_SFT = ["trainer=embedded", "coder=llm", "coder.embedded.vocab_size=512", "coder.embedded.hidden_size=32",
            "coder.embedded.num_layers=1", "coder.embedded.num_heads=2", "coder.embedded.num_kv_heads=1",
            "coder.embedded.intermediate_size=64", "coder.corpus_tasks=8", "coder.max_new_tokens=24",
            "trainer.eval_tasks=0", "trainer.phases.distill.steps=3", "trainer.phases.distill.tasks=3",
            "trainer.phases.distill.batch_size=2", "trainer.phases.distill.max_length=2048", "trainer.save_steps=1",
            "trainer.phases.correctness.steps=0", "trainer.phases.more_sft.steps=0"]


def test_a_run_whose_update_overflows_stops_with_the_phase_and_step(tmp_path):
    """End to end: a learning rate beyond float32 makes the first update infinite. Without the guard SFT
    trained on and saved a model of NaNs (and GRPO's sampling then raises inside generate)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "run"
    env = {**os.environ, "KERNELZERO_CACHE": str(tmp_path / "cache"), "TRITON_INTERPRET": "1"}
    cmd = [sys.executable, "-m", "core.run", *TINY_SFT, "trainer.phases.distill.learning_rate=1e39",
           f"hydra.run.dir={out}"]
    proc = subprocess.run(cmd, check=False, cwd=Path(__file__).resolve().parent.parent, env=env, capture_output=True,
                          text=True, timeout=600)
    screen = proc.stdout + proc.stderr
    assert proc.returncode != 0, screen[-3000:]
    assert "phase 'distill': the update left weights that are not finite" in screen and "at step 1" in screen
    checkpoints = out / "checkpoints" / "distill"
    assert not list(checkpoints.glob("checkpoint-*")), "the non-finite step was saved"
    assert not (out / "models" / "distill").exists()


def test_the_loss_log_holds_every_logged_loss_once_in_order_a_resumed_history_included(tmp_path):
    import json

    from core.loop.phase_common import LossLog

    path, state = tmp_path / "correctness_loss.jsonl", TrainerState()
    state.log_history = [{"loss": 0.9, "step": 1}, {"eval_x": 1.0, "step": 1}]  # what a checkpoint brought back
    log, args = LossLog(path), TrainingArguments(output_dir="/tmp/unused", use_cpu=True)
    for step, row in enumerate([{"loss": 0.8, "grad_norm": 1.0}, {"train_runtime": 3.0}, {"loss": 0.7}], start=2):
        state.log_history.append({**row, "step": step})
        log.on_log(args, state, TrainerControl(), logs=row)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["step"], r["loss"]) for r in rows] == [(1, 0.9), (2, 0.8), (4, 0.7)]


def test_a_skipped_step_names_its_loss_inputs_over_its_micro_batches():
    import torch

    from core.loop.phase_common import loss_input_summary

    model = torch.nn.Sequential(torch.nn.Linear(3, 3))
    said = []
    guard = FiniteGuard(Phase(name="correctness", kind="grpo", steps=4), max_skipped=1, say=said.append)
    args, state = TrainingArguments(output_dir="/tmp/unused", use_cpu=True), TrainerState()
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    old = torch.tensor([[-2.0, -math.inf, -math.inf], [math.nan, -1.0, -1.0]])  # -inf masked out at [0, 2]
    guard.note_inputs(loss_input_summary({"completion_mask": mask, "advantages": torch.tensor([0.5, -1.5]),
                                          "old_per_token_logps": old}))
    guard.note_inputs(loss_input_summary({"completion_mask": torch.ones(1, 3, dtype=torch.long),
                                          "advantages": torch.tensor([0.25])}))  # no old log-probs kept
    for p in model.parameters():
        p.grad = torch.full_like(p, math.nan)
    guard.on_pre_optimizer_step(args, state, TrainerControl(), model=model)
    assert ("loss inputs: longest completion (tokens) 3, rows without a completion token 1, largest |advantage| 1.5, "
            "lowest old log-prob -inf, non-finite old log-probs 1") in said[0]
    for p in model.parameters():  # the next step's own inputs only
        p.grad = torch.ones_like(p)
    guard.on_pre_optimizer_step(args, state, TrainerControl(), model=model)
    assert guard._inputs == [] and guard.in_a_row == 0

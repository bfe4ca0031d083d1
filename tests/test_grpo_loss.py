"""core.loop.grpo_loss: negative-advantage scaling and replay of verified SFT pairs in the GRPO loss."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.loop.grpo_loss import grpo_trainer_class, replay_loss, replay_pairs, tokenized_replay
from core.loop.training_config import TrainingError
from plugins.coders.llm.embedded import EmbeddedSpec, build_embedded

TINY = {"vocab_size": 320, "hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1,
        "intermediate_size": 64}
PAIRS = [{"prompt": f"# task {i}\n```python\n", "completion": f"x = {i}\nclass ModelNew: pass\n```"} for i in range(6)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    corpus = [p["prompt"] + p["completion"] for p in PAIRS] * 4
    path = build_embedded(corpus, EmbeddedSpec(**TINY), tmp_path_factory.mktemp("emb"))
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def test_plain_grpo_is_trls_trainer():
    from trl import GRPOTrainer

    assert grpo_trainer_class() is GRPOTrainer
    assert grpo_trainer_class(negative_advantage_scale=0.5) is not GRPOTrainer


def test_bad_settings_are_refused_before_training():
    with pytest.raises(TrainingError, match="negative_advantage_scale"):
        grpo_trainer_class(negative_advantage_scale=1.5)
    with pytest.raises(TrainingError, match="replay_weight"):
        grpo_trainer_class(replay_weight=-1.0)
    with pytest.raises(TrainingError, match="needs verified SFT pairs"):
        grpo_trainer_class(replay_weight=1.0, replay=[])


def test_replay_pairs_come_from_the_named_sft_phases_only(tmp_path):
    (tmp_path / "distill_pairs.jsonl").write_text("".join(json.dumps({**p, "task_id": "t"}) + "\n" for p in PAIRS[:3]))
    (tmp_path / "more_sft_pairs.jsonl").write_text(json.dumps(PAIRS[5]) + "\n")
    assert replay_pairs(tmp_path, ["distill"]) == PAIRS[:3]
    assert replay_pairs(tmp_path, ["distill", "absent"]) == PAIRS[:3]
    assert replay_pairs(tmp_path, []) == []
    other = tmp_path / "other_run_pairs.jsonl"
    other.write_text(json.dumps(PAIRS[4]) + "\n")
    assert replay_pairs(tmp_path, ["distill"], dataset=other) == [PAIRS[4]]  # instead of the run's own
    with pytest.raises(TrainingError, match="does not exist"):
        replay_pairs(tmp_path, ["distill"], dataset=tmp_path / "absent.jsonl")


def test_replay_loss_is_the_completion_only_nll(tiny):
    model, tokenizer = tiny
    rows = tokenized_replay(tokenizer, PAIRS[:3])
    assert all(c[-1] == tokenizer.eos_token_id for _, c in rows)
    loss = replay_loss(model, rows, pad_id=tokenizer.pad_token_id or 0)
    # by hand: each row alone, next-token cross entropy over the completion tokens, pooled over all of them
    total, count = 0.0, 0
    for prompt, completion in rows:
        ids = torch.tensor([prompt + completion])
        logits = model(input_ids=ids).logits[0, :-1]
        targets = ids[0, 1:]
        nll = torch.nn.functional.cross_entropy(logits, targets, reduction="none")[len(prompt) - 1:]
        total, count = total + float(nll.detach().sum()), count + len(completion)
    assert float(loss) == pytest.approx(total / count, rel=1e-4)


def test_replay_loss_trains_the_pairs(tiny):
    model, tokenizer = tiny
    rows = tokenized_replay(tokenizer, PAIRS)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = float(replay_loss(model, rows, 0))
    for _ in range(20):
        opt.zero_grad()
        replay_loss(model, rows, 0).backward()
        opt.step()
    assert float(replay_loss(model, rows, 0)) < 0.5 * first


def _bare(cls, tokenizer):
    trainer = object.__new__(cls)  # compute_loss only needs processing_class; no TRL set-up
    trainer.processing_class = tokenizer
    return trainer


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.floats(-2, 2, allow_nan=False), min_size=1, max_size=12), st.floats(0, 1))
def test_negative_advantages_are_scaled_and_positive_ones_kept(monkeypatch_advantages, values, scale):
    seen, cls = monkeypatch_advantages(negative_advantage_scale=scale)
    adv = torch.tensor(values)
    _bare(cls, None).compute_loss(None, {"advantages": adv})
    expected = torch.where(adv < 0, adv * scale, adv)
    assert torch.allclose(seen[-1], expected)


def test_replay_is_added_to_every_step(monkeypatch_advantages, tiny):
    model, tokenizer = tiny
    rows = tokenized_replay(tokenizer, PAIRS)
    _, plain = monkeypatch_advantages()  # TRL's loss as it is
    _, mixed = monkeypatch_advantages(replay=rows, replay_weight=2.0, replay_batch=len(rows))
    inputs = {"advantages": torch.tensor([1.0, -1.0])}
    base = float(_bare(plain, tokenizer).compute_loss(model, inputs))
    with_replay = float(_bare(mixed, tokenizer).compute_loss(model, inputs))
    assert with_replay == pytest.approx(base + 2.0 * float(replay_loss(model, rows, 0)), rel=1e-4)


@pytest.fixture
def monkeypatch_advantages():
    """TRL's own loss replaced by the sum of the advantages it is given (recorded), for the subclass to wrap."""
    from trl import GRPOTrainer

    seen: list[torch.Tensor] = []
    original = GRPOTrainer.compute_loss

    def fake(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        seen.append(inputs["advantages"].clone())
        return inputs["advantages"].sum()

    GRPOTrainer.compute_loss = fake
    try:
        yield lambda **kw: (seen, grpo_trainer_class(**kw))
    finally:
        GRPOTrainer.compute_loss = original

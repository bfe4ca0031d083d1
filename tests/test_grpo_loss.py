"""core.loop.grpo_loss: negative-advantage scaling, replay of verified SFT pairs and self-imitation in the GRPO loss."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.loop.grpo_loss import accepted_rows, grpo_trainer_class, replay_loss, replay_pairs, tokenized_replay
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


def _generation_batch(rows: list[tuple[list[int], list[int]]], pad: int = 0) -> dict[str, torch.Tensor]:
    """TRL's generation output for ``rows``: prompts left-padded, completions right-padded, with masks."""
    p_len, c_len = max(len(p) for p, _ in rows), max(len(c) for _, c in rows)
    out = {k: torch.full((len(rows), n), pad) for k, n in
           (("prompt_ids", p_len), ("prompt_mask", p_len), ("completion_ids", c_len), ("completion_mask", c_len))}
    for i, (prompt, completion) in enumerate(rows):
        out["prompt_ids"][i, p_len - len(prompt):] = torch.tensor(prompt)
        out["prompt_mask"][i, p_len - len(prompt):] = 1
        out["completion_ids"][i, :len(completion)] = torch.tensor(completion)
        out["completion_mask"][i, :len(completion)] = 1
    return out


token_rows = st.lists(st.tuples(st.lists(st.integers(1, 50), min_size=1, max_size=6),
                                st.lists(st.integers(1, 50), min_size=1, max_size=6)), min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(token_rows, st.data())
def test_accepted_rows_are_the_accepted_sequences_without_padding(rows, data):
    accepted = data.draw(st.lists(st.booleans(), min_size=len(rows), max_size=len(rows)))
    got = accepted_rows(_generation_batch(rows), accepted)
    assert got == [(p, c) for (p, c), ok in zip(rows, accepted) if ok]


def test_self_imitation_needs_a_replay_weight():
    with pytest.raises(TrainingError, match="self_imitation"):
        grpo_trainer_class(accepted=list, replay_weight=0.0)
    grpo_trainer_class(accepted=list, replay_weight=1.0)  # no teacher pairs needed: the pool fills itself


@pytest.fixture
def fake_generation():
    """TRL's generation step replaced by one that returns the batches queued in ``batches``."""
    from trl import GRPOTrainer

    batches: list[dict[str, torch.Tensor]] = []
    original = GRPOTrainer._generate_and_score_completions
    GRPOTrainer._generate_and_score_completions = lambda self, inputs: batches.pop(0)
    try:
        yield batches
    finally:
        GRPOTrainer._generate_and_score_completions = original


def test_accepted_completions_join_the_replay_pool_once(fake_generation, monkeypatch_advantages, tiny):
    model, tokenizer = tiny
    teacher = tokenized_replay(tokenizer, PAIRS[:2])
    own = tokenized_replay(tokenizer, PAIRS[2:5])
    verdicts: list[list[bool]] = []
    _, cls = monkeypatch_advantages(replay=teacher, replay_weight=1.0, replay_batch=64,
                                    accepted=lambda: verdicts[-1])
    trainer = _bare(cls, tokenizer)
    pad = tokenizer.pad_token_id or 0
    for batch, ok in (([own[0], own[1], own[0]], [True, False, True]),  # own[0] twice: added once
                      ([own[0], own[2]], [True, True])):               # own[0] again: still once
        fake_generation.append(_generation_batch(batch, pad))
        verdicts.append(ok)
        trainer._generate_and_score_completions([])
    assert cls.self_imitated() == 2
    inputs = {"advantages": torch.tensor([0.0])}
    # replay_batch covers the whole pool: the replay term is the loss of the teacher pairs + own[0] + own[2]
    expected = replay_loss(model, [*teacher, own[0], own[2]], pad)
    assert float(trainer.compute_loss(model, inputs)) == pytest.approx(float(expected), rel=1e-4)


def test_a_verdict_count_that_does_not_match_the_batch_fails_loudly(fake_generation, monkeypatch_advantages, tiny):
    _, tokenizer = tiny
    _, cls = monkeypatch_advantages(replay_weight=1.0, accepted=lambda: [True])
    fake_generation.append(_generation_batch(tokenized_replay(tokenizer, PAIRS[:2])))
    with pytest.raises(TrainingError, match="1 verdicts for a batch of 2"):
        _bare(cls, tokenizer)._generate_and_score_completions([])


@pytest.fixture
def no_trl_checkpointing():
    """TRL's own checkpoint save and optimiser load as no-ops, so only our replay state is written and read."""
    from trl import GRPOTrainer

    saved = GRPOTrainer._save_checkpoint, GRPOTrainer._load_optimizer_and_scheduler
    GRPOTrainer._save_checkpoint = lambda self, model, trial: None
    GRPOTrainer._load_optimizer_and_scheduler = lambda self, checkpoint: None
    try:
        yield
    finally:
        GRPOTrainer._save_checkpoint, GRPOTrainer._load_optimizer_and_scheduler = saved


def test_a_resumed_phase_replays_what_an_uninterrupted_one_would(
        tmp_path, monkeypatch, fake_generation, monkeypatch_advantages, no_trl_checkpointing, tiny):
    from types import SimpleNamespace

    from core.loop import grpo_loss

    _, tokenizer = tiny
    teacher, own = tokenized_replay(tokenizer, PAIRS[:3]), tokenized_replay(tokenizer, PAIRS[3:])
    drawn: list[list] = []
    monkeypatch.setattr(grpo_loss, "replay_loss", lambda model, batch, pad: drawn.append(batch) or torch.tensor(0.0))

    def trainer(with_pool: bool):
        _, cls = monkeypatch_advantages(replay=teacher, replay_weight=1.0, replay_batch=2, seed=7,
                                        accepted=lambda: [True] * len(own))
        t = _bare(cls, tokenizer)
        t.args, t.state = SimpleNamespace(should_save=True), SimpleNamespace(global_step=3)
        t._get_output_dir = lambda trial: str(tmp_path)
        if with_pool:
            fake_generation.append(_generation_batch(own, tokenizer.pad_token_id or 0))
            t._generate_and_score_completions([])
        return t, cls

    def draws(t, n):
        del drawn[:]
        for _ in range(n):
            t.compute_loss(None, {"advantages": torch.tensor([0.0])})
        return [sorted(map(str, batch)) for batch in drawn]

    first, _ = trainer(with_pool=True)
    draws(first, 2)
    (tmp_path / "checkpoint-3").mkdir()
    first._save_checkpoint(None, None)
    uninterrupted = draws(first, 5)

    resumed, cls = trainer(with_pool=False)
    resumed._load_optimizer_and_scheduler(str(tmp_path / "checkpoint-3"))
    assert cls.self_imitated() == len(own)
    assert draws(resumed, 5) == uninterrupted

"""Multi-turn refinement (core.loop.turns, core.loop.refinement): feedback, discounted returns, episodes, TRL."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.loop.refinement import RefinementEnv, fenced_code, training_env
from core.loop.rewards import RewardMix
from core.loop.turns import (
    TRIM_MARK,
    discounted_returns,
    feedback_text,
    render_feedback_turn,
    trim_to_budget,
    verdict_feedback,
)
from core.task import Candidate, Task
from core.verdict import Verdict

HERE = Path(__file__).resolve().parent
REDTEAM = HERE / "redteam"
sys.path.insert(0, str(HERE))

from train_fakes import KERNEL, StaticVerifier

rewards = st.lists(st.floats(min_value=-10, max_value=10, allow_nan=False), max_size=8)
gammas = st.floats(min_value=0.0, max_value=1.0)


# ---------------------------------------------------------------- discounted returns


@settings(deadline=None)
@given(rewards, gammas)
def test_each_return_is_its_reward_plus_the_discounted_next_return(rs, gamma):
    g = discounted_returns(rs, gamma)
    assert len(g) == len(rs)
    for t in range(len(rs)):
        nxt = g[t + 1] if t + 1 < len(rs) else 0.0
        assert g[t] == pytest.approx(rs[t] + gamma * nxt, abs=1e-9)


@settings(deadline=None)
@given(rewards)
def test_no_discount_gives_the_turns_own_rewards_and_full_discount_their_suffix_sums(rs):
    assert discounted_returns(rs, 0.0) == pytest.approx(rs)
    assert discounted_returns(rs, 1.0) == pytest.approx([sum(rs[t:]) for t in range(len(rs))])


@pytest.mark.parametrize("gamma", [-0.1, 1.5])
def test_a_discount_outside_zero_one_is_refused(gamma):
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        discounted_returns([1.0], gamma)


# ---------------------------------------------------------------- feedback and its budget

counters = st.sampled_from([len, lambda s: len(s.split()), lambda s: len(s.encode()) // 3 + s.count("#")])


@settings(deadline=None)
@given(st.text(max_size=300), st.integers(min_value=0, max_value=80), counters)
def test_trimmed_feedback_fits_the_budget_and_is_a_prefix(text, budget, count):
    out = trim_to_budget(text, budget, count)
    assert count(out) <= budget or out == ""
    if count(text) <= budget:
        assert out == text
    elif out:
        assert out.endswith(TRIM_MARK)
        assert text.startswith(out[: -len(TRIM_MARK)])


def test_trimming_keeps_as_much_as_fits():
    text = "correctness: max abs error 3.2 at index 17 of output 0 " * 5
    out = trim_to_budget(text, 40, len)
    assert len(out) == 40 and out.endswith(TRIM_MARK)


def _rejected() -> Verdict:
    v = Verdict(reason="correctness: 0/5 trials matched (max abs err 2.0)", status="rejected", compiled=True)
    v.add_check("static", True, "ok")
    v.add_check("compile", True, "built 1 kernel")
    v.add_check("correctness", False, "trial 0: output 0 differs at 3001 of 3001 elements; max abs err 2.0")
    return v


def test_feedback_holds_the_reason_and_the_failing_checks_detail():
    text = feedback_text(_rejected())
    assert "Verdict: rejected: correctness: 0/5 trials matched" in text
    assert "# correctness: trial 0: output 0 differs at 3001 of 3001 elements" in text
    assert "built 1 kernel" not in text  # checks that passed are not feedback
    assert verdict_feedback(_rejected(), 12, lambda s: len(s.split())).endswith(TRIM_MARK)


# ---------------------------------------------------------------- episodes (test doubles)


class CharTokenizer:
    """One token per character (EOS = 0): enough for the environment, which encodes, decodes and counts."""

    pad_token_id = 0
    eos_token_id = 0

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids if not (skip_special_tokens and i == 0))


@dataclass
class Script:
    """A generator that answers the n-th call with ``answers[n]`` (a completion text) and keeps every context."""

    answers: list[str]
    contexts: list[list[list[int]]] = field(default_factory=list)

    def __call__(self, contexts):
        self.contexts.append(contexts)
        text = self.answers[len(self.contexts) - 1]
        return [[ord(c) for c in text] + [0] for _ in contexts]


def _task() -> Task:
    return Task.from_file(REDTEAM / "tasks" / "vector_add.py")


def _env(verifier, turns=3, discount=0.5, **kw) -> RefinementEnv:
    mix = RewardMix(weights={"correctness": 1.0, "format": 0.1})
    return RefinementEnv(verifier=verifier, tokenizer=CharTokenizer(), mix=mix, turns=turns, discount=discount, **kw)


def test_a_rejected_turn_is_followed_by_feedback_and_the_next_turn_is_judged():
    env = _env(StaticVerifier())
    script = Script(["not python at all\n```", KERNEL + "```", "never asked"])
    [episode] = env.play([_task()], ["PROMPT\n```python\n"], script)
    assert [t.verdict.accepted for t in episode.turns] == [False, True]
    assert episode.accepted_turn == 2 and not episode.passed_by(1) and episode.passed_by(2)
    assert len(script.contexts) == 2  # accepted at turn 2: no third generation
    second = CharTokenizer().decode(script.contexts[1][0])
    assert second.startswith("PROMPT\n```python\nnot python at all\n```")
    assert "# Verdict: rejected" in second and second.endswith(render_feedback_turn("x")[-len("```python\n"):])
    ids, mask = episode.completion()
    first, fb = episode.turns[0].completion_ids, episode.turns[0].feedback_ids
    assert fb and mask == [1] * len(first) + [0] * len(fb) + [1] * len(episode.turns[1].completion_ids)
    assert ids == first + fb + episode.turns[1].completion_ids
    r = [t.total for t in episode.turns]
    assert episode.total_return(0.5) == pytest.approx(r[0] + 0.5 * r[1])


def test_one_turn_is_a_single_attempt_without_feedback():
    env = _env(StaticVerifier(), turns=1)
    [episode] = env.play([_task()], ["P"], Script(["nope```"]))
    assert len(episode.turns) == 1 and episode.turns[0].feedback_ids == []


def test_an_episode_that_would_outgrow_the_context_ends_early():
    env = _env(StaticVerifier(), turns=3)
    script = Script(["nope```", "nope```", "nope```"])
    [episode] = env.play([_task()], ["P"], script, max_length=40, room=10)
    assert len(episode.turns) == 1 and len(script.contexts) == 1


def test_feedback_budget_bounds_the_feedback_tokens():
    env = _env(StaticVerifier(), turns=2, feedback_tokens=20)
    [episode] = env.play([_task()], ["P"], Script(["nope```", "nope```"]))
    overhead = len(render_feedback_turn(""))
    assert 0 < len(episode.turns[0].feedback_ids) - overhead <= 20


# ---------------------------------------------------------------- TRL's rollout_func contract


def test_the_environment_is_a_rollout_func_for_trl_grpo(tmp_path, monkeypatch):
    """Two GRPO steps of a tiny model through TRL 1.16 with the environment as rollout_func."""
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    from trl import GRPOConfig, GRPOTrainer

    from plugins.coders.llm.embedded import EmbeddedSpec, build_embedded, load_tokenizer
    from plugins.coders.llm.prompts import render_completion, render_prompt

    task = _task()
    corpus = [render_prompt(task.source, "triton"), render_completion(KERNEL), feedback_text(_rejected())]
    spec = EmbeddedSpec(vocab_size=400, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                        intermediate_size=64)
    path = build_embedded(corpus, spec, tmp_path / "cache")
    from transformers import AutoModelForCausalLM

    tok = load_tokenizer(str(path), str(path))
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(str(path))
    verifier = StaticVerifier()
    env = RefinementEnv(verifier=verifier, tokenizer=tok, mix=RewardMix(weights={"correctness": 1.0, "format": 0.1}),
                        turns=2, discount=0.4, feedback_tokens=16)
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=12, max_steps=2, learning_rate=1e-3, report_to=[], logging_steps=1,
                      save_strategy="no", use_cpu=True, beta=0.0)
    sizes = []

    def rollout(prompts, trainer):
        sizes.append(len(prompts))
        return env(prompts, trainer)

    trainer = GRPOTrainer(model=model, processing_class=tok, args=args, reward_funcs=env.reward_functions(),
                          rollout_func=rollout, train_dataset=env.dataset([task] * 4, prompt=lambda t: render_prompt(
                              t.source, "triton")))
    trainer.train()
    attempts = env.take()
    assert sizes == [4, 4]  # TRL 1.16 hands rollout_func one prompt per row: already repeated num_generations times
    assert len(attempts) == 8  # 2 steps x 4 rows, one attempt per episode
    logged = {k for row in trainer.state.log_history for k in row}
    assert {"rewards/correctness/mean", "rewards/format/mean", "kernelzero/pass_after_turn_2"} <= logged
    # 12 new tokens never close the fence: every first turn is rejected, so every episode got a second turn
    assert verifier.batches and all(len(e.turns) == 2 for e in env._episodes.values())


def test_a_row_whose_task_differs_from_its_prompts_task_scores_none():
    env = _env(StaticVerifier(), turns=1)
    [episode] = env.play([_task()], ["P"], Script([KERNEL + "```"]))
    fns = env.reward_functions()
    out = fns[0](prompts=["P", "P"], completions=["", ""], refine_episode=[episode.id, episode.id],
                 task_id=[episode.task.id, "another-task"])
    assert out[0] == pytest.approx(1.0) and out[1] is None


@pytest.mark.parametrize("kw, match", [({"turns": 0}, "turns"), ({"discount": 1.2}, r"\[0, 1\]")])
def test_the_environment_refuses_no_turns_and_a_discount_outside_zero_one(kw, match):
    with pytest.raises(ValueError, match=match):
        _env(StaticVerifier(), **kw)


def test_the_default_candidate_is_the_code_before_the_closing_fence_and_empty_code_is_declined():
    env = _env(StaticVerifier(), turns=1)
    [episode] = env.play([_task()], ["P"], Script(["```"]))
    assert episode.turns[0].candidate.declined == "empty completion"
    assert episode.turns[0].verdict.status == "declined"
    assert "# Verdict: declined: empty completion" in feedback_text(episode.turns[0].verdict)


def test_its_reward_functions_need_its_rollouts():
    with pytest.raises(ValueError, match="rollout_func=env"):
        _env(StaticVerifier()).reward_functions()[0](prompts=["P"], completions=["x"], task_id=["t"])


def test_fenced_code_is_the_text_before_the_closing_fence():
    assert fenced_code("x = 1\n```\ntrailing prose") == "x = 1\n"
    assert fenced_code("no fence") == "no fence\n"


# ---------------------------------------------------------------- the real verifier (Triton interpreter)


def test_real_verifier_rejects_turn_one_with_feedback_and_accepts_the_fix():
    from core.verify import Verifier

    good = (REDTEAM / "candidates" / "honest_vector_add.py").read_text()
    wrong = good.replace("a + b, mask=mask", "a - b, mask=mask")
    assert wrong != good
    script = Script([wrong + "```", good + "```"])
    with Verifier(backend="triton", device="cpu", workers=1, timeout_s=120) as verifier:
        env = _env(verifier, turns=3, feedback_tokens=200)
        [episode] = env.play([_task()], ["PROMPT\n```python\n"], script)
    first, second = episode.turns
    assert not first.verdict.accepted and first.verdict.reason
    shown = CharTokenizer().decode(first.feedback_ids)
    assert first.verdict.reason.split(":")[0] in shown and "# Verdict: rejected" in shown
    assert CharTokenizer().decode(script.contexts[1][0]).endswith(shown)  # turn 2 saw the feedback
    assert second.verdict.accepted, second.verdict.reason
    assert episode.accepted_turn == 2
    assert second.rewards["correctness"] == 1.0 and first.rewards["correctness"] < 1.0
    assert isinstance(second.candidate, Candidate) and second.candidate.source.strip() == good.strip()


# ---------------------------------------------------------------- the training run (Hydra: coder.turns, trainer.turn_discount)


def test_a_training_run_with_two_turns_plays_episodes_through_trl(tmp_path, monkeypatch):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    from fake_training_run import run

    from core import plugins
    from core.loop import grpo

    made = []

    def keep(training, mix):
        env = training_env(training, mix)
        made.append(env)
        return env

    monkeypatch.setattr(grpo, "training_env", keep)
    old = plugins._pm
    try:
        run(str(tmp_path), ["coder.turns=2", "trainer.turn_discount=0.5", "trainer.phases.correctness.steps=2"])
    finally:
        plugins.set_plugin_manager(old)
    [env] = made
    assert env.turns == 2 and env.discount == 0.5
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1] and all(r["samples"] == 4 for r in rows)
    episodes = list(env._episodes.values())
    assert len(episodes) == 8
    # 16 new tokens cannot hold a kernel: every first turn is rejected and its episode gets a second, judged turn
    assert all(len(e.turns) == 2 and e.turns[0].feedback_ids and e.turns[1].verdict.task_id == e.task.id
               for e in episodes)


# ---------------------------------------------------------------- feedback SFT (core.loop.feedback_sft)


def test_feedback_rows_pair_a_rejected_attempt_and_its_feedback_with_the_teachers_fix(tmp_path):
    from train_fakes import CopyTeacher

    from core.loop.feedback_sft import feedback_rows, replay_rows

    env = _env(StaticVerifier(), turns=2)
    tasks = [_task(), Task(source=_task().source + "\n# another task\n")]
    script = Script(["not a kernel```"])  # every turn-1 attempt rejected
    rows, counts = feedback_rows(env, tasks, ["P1\n", "P2\n"], script, CopyTeacher(), lambda src: src + "```")
    assert counts == {"tasks": 2, "failed_turn_1": 2, "teacher_fixes": 2, "pairs": 2}
    tok = CharTokenizer()
    for r, prompt in zip(rows, ["P1\n", "P2\n"]):
        cut = r["completion_mask"].index(1)
        assert set(r["completion_mask"][cut:]) == {1} and len(r["completion_mask"]) == len(r["input_ids"])
        context, target = tok.decode(r["input_ids"][:cut]), r["input_ids"][cut:]
        assert context.startswith(prompt + "not a kernel```") and "# Verdict: rejected" in context
        assert context.endswith("```python\n") and tok.decode(target) == KERNEL + "```" and target[-1] == 0
    pairs = tmp_path / "distill_pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"p{i}", "completion": "c"}) + "\n" for i in range(5)))
    replayed = replay_rows(pairs, tok, 2)
    assert [tok.decode(r["input_ids"]) for r in replayed] == ["p0c", "p1c"]
    assert all(r["completion_mask"] == [0, 0, 1, 1] for r in replayed)


def test_a_feedback_phase_trains_on_the_models_failures_between_distill_and_grpo(tmp_path):
    from fake_training_run import run

    from core import plugins

    old = plugins._pm
    try:
        training, _ = run(str(tmp_path), ["trainer.phases.refine.steps=2", "trainer.phases.refine.tasks=4",
                                          "trainer.phases.refine.teacher=copy_teacher",
                                          "trainer.phases.correctness.steps=1"])
    finally:
        plugins.set_plugin_manager(old)
    rows = [json.loads(line) for line in (tmp_path / "refine_pairs.jsonl").read_text().splitlines()]
    distilled = len((tmp_path / "distill_pairs.jsonl").read_text().splitlines())
    tok = training.coder.hf_tokenizer
    contexts = [tok.decode(r["input_ids"][:r["completion_mask"].index(1)]) for r in rows]
    feedback = [c for c in contexts if "# Verdict: " in c]  # prompt + the model's attempt + the feedback
    assert feedback and all(c.endswith("# ModelNew\n```python\n") for c in feedback)
    assert len(rows) == len(feedback) + min(len(feedback), distilled)  # + as many replayed distill pairs
    assert all(r["completion_mask"][0] == 0 and r["completion_mask"][-1] == 1 for r in rows)
    assert (tmp_path / "models" / "refine").is_dir()
    assert training.progress["done"] == ["distill", "refine", "correctness", "performance", "more_sft"]

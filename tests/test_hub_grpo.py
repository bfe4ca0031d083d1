"""experiment=hub_grpo on a CPU with a tiny model: the step-time breakdown is logged and printed, and
verification overlapped with generation gives the very rewards of verification inside TRL's reward call.

The preset runs as it is, with a tiny architecture file in place of Qwen2.5-Coder-1.5B's and a handful of
steps; the verifier is a test double whose verdict depends on the completion's text (half of them pass),
so that a verdict given to the wrong completion would change the rewards.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import math
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from train_fakes import StaticVerifier

from core import hookimpl
from core.contracts import CurriculumState
from core.loop.rewards import RewardMix
from core.loop.step_clock import StepClock, breakdown, breakdown_line
from core.loop.taskstream import TaskStream
from core.loop.training import SharedVerification

TINY_ARCHITECTURE = {"model_type": "qwen2", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                     "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 4096,
                     "rope_theta": 1000000.0, "tie_word_embeddings": True}
STEPS, STEPS_PER_GENERATION, TASKS, SAMPLES = 4, 2, 2, 4
TIME_KEYS = ("time/step_s", "time/generate_s", "time/verify_s", "time/wait_s", "time/optimize_s", "time/other_s")


def tiny_overrides(tmp: Path) -> list[str]:
    arch = tmp / "tiny-qwen2.json"
    arch.write_text(json.dumps(TINY_ARCHITECTURE))
    return ["experiment=hub_grpo", "coder.model=embedded", f"coder.embedded.architecture={arch}", "device=cpu",
            "trainer.precision=fp32", "coder.embedded.vocab_size=400", "coder.corpus_tasks=8", "coder.max_new_tokens=16",
            "coder.include_guide=false", "coder.compact_prompt=true", "trainer.eval_tasks=2", "trainer.report_to=[]",
            "trainer.torch_threads=1", "trainer.phases.distill.steps=2", "trainer.phases.distill.tasks=3",
            "trainer.phases.distill.batch_size=2", "trainer.phases.distill.max_length=2048",
            "trainer.phases.distill.teacher=copy_teacher", f"trainer.phases.correctness.steps={STEPS}",
            f"trainer.tasks_per_step={TASKS}", f"trainer.num_generations={SAMPLES}",
            f"trainer.grpo_kwargs.steps_per_generation={STEPS_PER_GENERATION}", "trainer.save_steps=100"]


class ParityVerifier(StaticVerifier):
    """Accepts the model's candidate when its source's digest is even: about half of any model's completions,
    decided by their text only (the teacher's are judged as StaticVerifier does). Each ``verify_many`` takes
    ``delay`` seconds, as the verifier's pools do."""

    delay = 0.05

    def verify_many(self, pairs):
        time.sleep(self.delay)
        verdicts = super().verify_many(pairs)
        for (task, cand), v in zip(pairs, verdicts):
            if cand.coder == "copy_teacher":
                continue
            v.accepted = v.correct = hashlib.sha256(cand.source.encode()).digest()[-1] % 2 == 0
            v.accuracy = 1.0 if v.accepted else 0.0
            v.status = "accepted" if v.accepted else "rejected"
        return verdicts


class VerdictLog:
    def __init__(self):
        self.seen: list[tuple[str, str, bool]] = []

    @hookimpl
    def on_verdict(self, task, candidate, verdict):
        self.seen.append((task.id, candidate.source, bool(verdict.accepted)))


def run_preset(out: Path, overlap: bool):
    from fake_training_run import install_fakes
    from hydra import compose, initialize_config_dir
    from rich.console import Console

    from core import plugins
    from core.loop.training import Training

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose("config", overrides=[f"out_dir={out}", f"coder.cache_dir={out.parent / 'cache'}",
                                           *tiny_overrides(out.parent), f"trainer.overlap_verification={overlap}"])
    from core.loop.phase_common import FiniteGuard

    log, verifier, screen = VerdictLog(), ParityVerifier(), io.StringIO()
    old, note_inputs, loss_inputs = plugins._pm, FiniteGuard.note_inputs, []

    def noted(guard, summary):  # what the guard is told of each micro-batch's loss inputs
        loss_inputs.append({k: float(v) for k, v in summary.items()})
        note_inputs(guard, summary)

    try:
        install_fakes(log)
        FiniteGuard.note_inputs = noted
        summary = Training(cfg, verifier, console=Console(file=screen, width=200)).run()
    finally:
        plugins.set_plugin_manager(old)
        FiniteGuard.note_inputs = note_inputs
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {"rows": rows, "summary": summary, "verdicts": log.seen, "batches": verifier.batches,
            "screen": screen.getvalue(), "out": out, "loss_inputs": loss_inputs}


def test_the_finite_guard_hears_each_training_micro_batchs_loss_inputs(runs):
    # FiniteGuard names them for a step whose gradients are not finite (H100, 2026-12-06: finite loss, NaN
    # gradients); through TRL's own _compute_loss, so the hook breaks loudly if TRL renames it
    for run in runs.values():
        seen = run["loss_inputs"]
        assert len(seen) >= STEPS  # one per micro-batch of each optimisation step
        for summary in seen:
            assert set(summary) == {"longest", "empty_rows", "advantage", "old_logp_min", "old_logp_bad"}
            assert 1 <= summary["longest"] <= 16 and summary["empty_rows"] == 0  # coder.max_new_tokens=16
            assert summary["old_logp_min"] <= 0 and summary["old_logp_bad"] == 0 and summary["advantage"] >= 0


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub_grpo")
    return {overlap: run_preset(root / ("overlap" if overlap else "sync"), overlap) for overlap in (True, False)}


def _learning(row):
    return {k: v for k, v in row.items() if not k.startswith(("time/", "memory/", "throughput/"))}


def test_overlapped_verification_gives_the_synchronous_rewards(runs):
    overlapped, sync = runs[True], runs[False]
    # the same completions were judged in the same order with the same verdicts...
    assert overlapped["verdicts"] == sync["verdicts"]
    accepted = [ok for *_, ok in overlapped["verdicts"]]
    assert any(accepted) and not all(accepted)  # mixed verdicts: a verdict given to the wrong completion would show
    # ...so every step's rewards, pass rates and group statistics are equal
    assert [_learning(r) for r in overlapped["rows"]] == [_learning(r) for r in sync["rows"]]
    assert len(overlapped["rows"]) == STEPS
    assert all(r["samples"] == TASKS * SAMPLES for r in overlapped["rows"])  # each step reports its own share
    # how they were verified differs: each step's share of a round as soon as it was generated, against the
    # whole round inside TRL's reward call (the held-out evaluations and SFT pairs verify alike in both)
    # (each share as soon as it was generated, its completions that ended early before it was; never one twice)
    assert len(overlapped["batches"]) > len(sync["batches"])
    assert sum(overlapped["batches"]) == sum(sync["batches"])


def test_every_step_logs_its_time_breakdown_and_peak_memory(runs):
    for overlap, run in runs.items():
        rows = run["rows"]
        for i, row in enumerate(rows):
            assert all(row[k] >= 0 for k in TIME_KEYS) and row["memory/peak_rss_gib"] > 0
            parts = row["time/generate_s"] + row["time/wait_s"] + row["time/optimize_s"] + row["time/other_s"]
            assert parts == pytest.approx(row["time/step_s"], rel=1e-6)
            first_of_round = i % STEPS_PER_GENERATION == 0  # a round is generated and verified in its first step
            assert (row["time/generate_s"] > 0) == first_of_round and (row["time/verify_s"] > 0) == first_of_round
            assert (row["throughput/completion_tokens"] > 0) == first_of_round
            assert row["time/optimize_s"] > 0
        verified = [r["time/verify_s"] for r in rows if r["time/verify_s"] > 0]
        assert all(v >= ParityVerifier.delay for v in verified)
        if not overlap:  # inside the reward call, verification is all waited for
            assert all(r["time/wait_s"] >= r["time/verify_s"] for r in rows)
        step_time = run["summary"]["step_time"]["correctness"]
        assert step_time["steps"] == STEPS and step_time["overlap_verification"] == float(overlap)
        assert step_time["step_s"] == pytest.approx(sum(r["time/step_s"] for r in rows) / STEPS)
        assert step_time["tokens_per_s"] > 0 and step_time["verdicts_per_s"] > 0
        assert run["screen"].count("correctness step time: 4 steps, mean step") == 2  # at the phase's end and in the summary


def _shared(verifier, overlap, clock):
    from train_fakes import CatalogProposer

    from plugins.coders.llm.prompts import to_candidate

    class Curriculum:
        state = CurriculumState(max_tier=1)

    proposer = CatalogProposer(seed=3)
    stream = TaskStream(proposer, Curriculum(), prompt=lambda t: t.source)
    tasks = proposer.propose(2)
    for t in tasks:
        stream.remember(t)
    shared = SharedVerification(verifier=verifier, stream=stream, mix=RewardMix({"correctness": 1.0, "format": 0.1}),
                                num_generations=2, clock=clock, overlap=overlap,
                                to_candidate=lambda t, text: to_candidate(t, text, "triton"))
    return shared, tasks


def test_a_share_is_verified_while_the_next_is_generated_and_only_the_rest_is_waited_for():
    from train_fakes import KERNEL

    ParityVerifier.delay = 0.6  # per share; wide margins, so a loaded machine's scheduling cannot decide the test
    try:
        completions = [KERNEL + f"# variant {i}\n```" for i in range(8)]
        verifier, clock = ParityVerifier(), StepClock()
        shared, tasks = _shared(verifier, True, clock)
        task_ids = [tasks[i // 4].id for i in range(8)]
        assert shared.submit(task_ids[:4], completions[:4]) == 4
        time.sleep(1.0)  # the trainer generates the next share meanwhile
        assert shared.submit(task_ids[4:], completions[4:]) == 4
        assert shared.submit(task_ids[4:], completions[4:]) == 0  # in flight already: not sent twice
        overlapped = shared.score(completions, task_ids)
        sync_verifier = ParityVerifier()
        sync, _ = _shared(sync_verifier, False, StepClock())
        assert sync.submit(task_ids, completions) == 0  # without the overlap, submit does nothing
        expected = sync.score(completions, task_ids)
    finally:
        ParityVerifier.delay = 0.05
    assert overlapped.totals == expected.totals and overlapped.per_term == expected.per_term
    assert [v.accepted for v in overlapped.verdicts] == [v.accepted for v in expected.verdicts]
    assert verifier.batches == [4, 4] and sync_verifier.batches == [8]
    assert shared.verified_in_reward_call == 0 and shared.verifications == 8
    verify, wait = clock.value("verify"), clock.value("wait")
    # the first share's 0.6 s were hidden behind the "generation" of the next; the second share's were waited for
    # (without the overlap the wait would be all of verify)
    assert verify >= 1.2 and 0.5 <= wait <= verify - 0.3
    shared.close()


def test_completions_handed_over_as_they_end_are_verified_early_and_count_once_their_batch_names_them():
    from train_fakes import KERNEL

    ParityVerifier.delay = 0.3
    try:
        completions = [KERNEL + f"# variant {i}\n```" for i in range(8)]
        verifier, clock = ParityVerifier(), StepClock()
        shared, tasks = _shared(verifier, True, clock)
        task_ids = [tasks[i // 4].id for i in range(8)]
        # rows 1 and 6 ended while their batch generated; a third text matches no row of it (decoded otherwise)
        assert shared.submit_early([task_ids[1], task_ids[6], task_ids[0]],
                                   [completions[1], completions[6], KERNEL + "# never generated\n```"]) == 3
        assert shared.submit_early([task_ids[1]], [completions[1]]) == 0  # already sent
        time.sleep(0.6)  # verified while the rest of the batch generates
        assert shared.submit(task_ids, completions) == 6  # the batch: only what was not sent early
        overlapped = shared.score(completions, task_ids)
        sync_verifier = ParityVerifier()
        sync, _ = _shared(sync_verifier, False, StepClock())
        expected = sync.score(completions, task_ids)
    finally:
        ParityVerifier.delay = 0.05
    assert overlapped.totals == expected.totals and [v.accepted for v in overlapped.verdicts] == \
        [v.accepted for v in expected.verdicts]
    assert verifier.batches == [3, 6]  # each pair once, the stray one too, and the stray one's verdict dropped
    assert shared.verifications == 8 and shared.early_dropped == 1 and shared.verified_in_reward_call == 0
    assert clock.value("verdicts") == 8
    shared.close()


def test_a_row_is_handed_over_at_its_first_end_of_sequence_and_no_row_is_stopped():
    import torch

    from core.loop.overlap import EarlyRows

    eos, pad = 9, 9  # a finished row is padded on with the EOS id itself (Qwen's pad token)
    handed = []
    rows = EarlyRows(prompt_length=2, eos_ids=[eos], task_ids=["a", "b", "c"],
                     decode=lambda ids: " ".join(str(i) for i in ids if i != eos),
                     on_rows=lambda tids, texts: handed.append(list(zip(tids, texts))))
    ids = torch.tensor([[1, 1], [eos, 1], [1, 1]])  # the prompts (one holds the EOS id: not a completion's end)
    new_tokens = [[4, 5, eos], [5, 6, 7], [eos, pad, pad]]  # a ends at its 3rd token, c at its 1st, b never
    for step in range(3):
        ids = torch.cat([ids, torch.tensor([[r[step]] for r in new_tokens])], dim=1)
        stop = rows(ids, scores=None)
        assert stop.dtype == torch.bool and not bool(stop.any())
    assert handed == [[("c", "")], [("a", "4 5")]]


def test_transformers_generate_hands_over_each_row_as_it_ends_with_the_text_trl_decodes():
    import torch
    from transformers import AutoModelForCausalLM, LogitsProcessor, LogitsProcessorList, Qwen2Config

    from core.loop.overlap import EarlyRows

    eos = 3
    config = Qwen2Config(**{k: v for k, v in TINY_ARCHITECTURE.items() if k != "model_type"}, vocab_size=50,
                         eos_token_id=eos, pad_token_id=eos, bos_token_id=1)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()

    class EndAt(LogitsProcessor):  # row r emits EOS at its new token ends[r] (None: never), any token before
        def __init__(self, prompt_length, ends):
            self.prompt_length, self.ends = prompt_length, ends

        def __call__(self, input_ids, scores):
            step = input_ids.shape[1] - self.prompt_length
            for r, end in enumerate(self.ends):
                if end == step:
                    scores[r] = -math.inf
                    scores[r, eos] = 0.0
                else:
                    scores[r, eos] = -math.inf
            return scores

    prompts = torch.tensor([[5, 6, 7], [8, 9, 10], [11, 12, 13]])
    handed = []
    decode = lambda ids: " ".join(str(i) for i in ids if i != eos)  # as batch_decode(skip_special_tokens) does
    out = model.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=8,
                         do_sample=True, logits_processor=LogitsProcessorList([EndAt(3, [4, None, 1])]),
                         stopping_criteria=[EarlyRows(3, [eos], ["a", "b", "c"], decode,
                                                      lambda tids, texts: handed.append(list(zip(tids, texts))))])
    completions = out[:, 3:].tolist()
    expected = {tid: decode(ids[:ids.index(eos) + 1]) for tid, ids in zip("abc", completions) if eos in ids}
    assert handed == [[("c", expected["c"])], [("a", expected["a"])]]  # in the order they ended, mid-generation
    assert len(completions[1]) == 8 and eos not in completions[1]  # the criterion stopped no row


def test_the_qwen_coder_architecture_has_its_published_size():
    import torch
    from transformers import AutoModelForCausalLM

    from plugins.coders.llm.embedded import architecture_config, train_tokenizer

    tokenizer = train_tokenizer(["import torch\n", "def f(x):\n    return x\n"], 300)
    config = architecture_config("qwen2.5-coder-1.5b", tokenizer)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    embedding = model.get_input_embeddings().weight.numel()
    non_embedding = sum(p.numel() for p in model.parameters()) - embedding
    # the model card: 1.54B parameters, 1.31B of them non-embedding (vocabulary 151,936 tied to the output)
    assert round(non_embedding / 1e9, 2) == 1.31
    assert round((non_embedding + 151_936 * config.hidden_size) / 1e9, 2) == 1.54
    assert model.config.tie_word_embeddings and config.vocab_size == len(tokenizer)
    assert config.eos_token_id == tokenizer.eos_token_id and config.rope_parameters["rope_theta"] == 1e6


def _gpu_measure():
    spec = importlib.util.spec_from_file_location("gpu_measure", ROOT / "scripts" / "gpu_measure.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_measure"] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["gpu_measure"]
    return module


def test_the_gpu_step_runs_the_preset_at_the_issues_size_and_reads_its_breakdown(runs):
    gm = _gpu_measure()
    step = gm.STEPS["hub_grpo"]
    assert step.limit_s < 560
    command, summary = step.commands(gm.Context("python3", Path("/w"), 1, Path(".kb"), "", listing=True))
    argv = command.argv
    # a run cut by the limit, or stopped by a failed step, still gets its breakdown from what it wrote
    assert summary.after_timeout and "benchmarks.step_time" in summary.argv
    for override in ("experiment=hub_grpo", "coder.embedded.architecture=qwen2.5-coder-1.5b", "device=cuda",
                     "trainer.phases.correctness.steps=20", "trainer.tasks_per_step=8", "trainer.num_generations=8",
                     "coder.max_new_tokens=512"):
        assert override in argv, override
    assert any(a.startswith("coder.model=embedded") for a in argv)
    line = breakdown_line("correctness step time", breakdown(runs[True]["rows"]))
    figure = step.figure(f"noise\n{line}\nmore noise\n")
    assert "tokens/s" in figure and "verdicts/s" in figure and "verify" in figure


def test_the_preset_stops_at_once_without_a_model_named():
    from hydra import compose, initialize_config_dir

    from core.config import build

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose("config", overrides=["experiment=hub_grpo"])
    assert cfg.trainer.overlap_verification and cfg.trainer.grpo_kwargs.steps_per_generation > 1
    assert cfg.trainer.precision == "bf16" and cfg.trainer.grpo_kwargs.gradient_checkpointing
    assert cfg.trainer.grpo_kwargs.use_vllm is False  # vLLM's options are there, switched off (not run here)
    with pytest.raises(ValueError, match="coder.model is not set"):
        build("coder", cfg.coder).load()


def test_the_preset_trains_with_eager_attention_and_more_verifications_beside_the_trainer():
    from hydra import compose, initialize_config_dir

    from plugins.executors.local import auto_workers_per_gpu

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose("config", overrides=["experiment=hub_grpo", "coder.model=x"])
        ray = compose("config", overrides=["experiment=hub_grpo", "coder.model=x", "executor=ray"])
    # sdpa's backward gave NaN gradients on the H100 (2026-12-06); eager trained 20 steps finite
    assert cfg.coder.attn_implementation == "eager"
    assert cfg.executor.name == "local" and cfg.executor.workers_per_gpu == "auto"
    h100 = 79.2 * 2**30  # 16 cores: 8 verifications at the preset's 4 GiB each, 3 at KernelBench's 20
    assert auto_workers_per_gpu(int(h100), 16, 1, cfg.executor.gib_per_worker) == 8
    assert auto_workers_per_gpu(int(h100), 16, 1) == 3
    assert ray.executor.name == "ray" and "gib_per_worker" not in ray.executor  # another executor replaces it whole


def test_the_breakdown_is_read_back_from_what_a_run_wrote_even_cut_short(runs, tmp_path, capsys):
    from benchmarks import step_time

    run = runs[True]
    printed = breakdown_line("correctness step time", breakdown(run["rows"]))
    assert step_time.main([str(run["out"])]) == 0
    assert capsys.readouterr().out.splitlines()[0] == printed  # the line the run printed at the phase's end
    # cut: two steps, a half-written row, and a step whose gradient norm TRL logged as NaN
    cut = tmp_path / "cut"
    cut.mkdir()
    lines = (run["out"] / "metrics.jsonl").read_text().splitlines()
    (cut / "metrics.jsonl").write_text("\n".join(lines[:2]) + "\n" + lines[2][:40])
    (cut / "correctness_loss.jsonl").write_text(
        '{"loss": 0.1, "grad_norm": 0.5, "step": 1}\n{"loss": 0.2, "grad_norm": NaN, "step": 2}\n')
    report = step_time.report(cut)
    assert report[0] == breakdown_line("correctness step time", breakdown([json.loads(x) for x in lines[:2]]))
    assert report[1] == "correctness: loss or gradient norm not finite at step(s) 2"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert step_time.main([str(empty)]) == 1

"""verl: ``kernelzero.envs.verl`` loaded and called by verl 0.9.1 itself gives the native verifier's rewards on
honest, wrong and hacked completions.

Runs where verl is installed: its own venv (``make test-envs``; verl 0.9.1 pins transformers<5.11, below what TRL
needs here, so KernelZero goes in with ``--no-deps`` beside verl's pins); skipped elsewhere.

What verl does here, all of it verl's own code: its Hydra config (``ppo_trainer``, composed with the overrides a
user passes) names ``reward.custom_reward_function.path=pkg://kernelzero.envs.verl``; its ``RLHFDataset`` reads the
parquet file ``kernelzero.envs.tasks`` exports; the trainer's ``RewardLoopManager`` starts its reward workers as Ray
actors, each loads the function with ``load_reward_manager`` -> ``get_custom_reward_fn`` -> ``load_extern_object``
and awaits it from ``NaiveRewardManager.run_single`` (``compute_score(data_source=, solution_str=, ground_truth=,
extra_info=)``, the response decoded from token ids), and the scores land in ``rm_scores`` and
``reward_extra_info``. The batch form goes through verl's ``BatchRewardManager`` with the local verifier.
The only stand-ins are the model's outputs (the three completions, tokenized as the rollout would return them) and
a small byte-level tokenizer trained here (no hub access).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

verl = pytest.importorskip("verl")

import ray
import torch
from hydra import compose, initialize_config_dir
from kernel_cases import COMPLETIONS, TASK, native_rewards
from verl import DataProto
from verl.experimental.reward_loop import RewardLoopManager
from verl.experimental.reward_loop.reward_manager import NaiveRewardManager
from verl.trainer.ppo.reward import get_custom_reward_fn, load_reward_manager
from verl.utils import hf_tokenizer
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn
from verl.workers.reward_manager.batch import BatchRewardManager

from core.serve.client import VerifierClient
from core.serve.service import ServiceConfig, running_service
from core.task import Task
from kernelzero.envs.tasks import export
from kernelzero.envs.verl import compute_score_batch

CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.fixture(scope="module")
def native():
    return native_rewards()


@pytest.fixture(scope="module")
def service():
    with running_service(ServiceConfig(device="cpu", workers=2, port=0, timeout_s=90)) as running:
        yield running


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    """A byte-level BPE tokenizer (exact round trip of any text), saved as a Hugging Face tokenizer folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([TASK, *COMPLETIONS.values()], trainers.BpeTrainer(
        vocab_size=512, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<|endoftext|>"]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    out = tmp_path_factory.mktemp("tokenizer")
    fast.save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def train_parquet(tmp_path_factory) -> Path:
    return export([Task(TASK)], tmp_path_factory.mktemp("data") / "train.parquet")


def verl_config(tokenizer_dir: Path, train_parquet: Path, name: str, reward_kwargs: dict):
    """verl's own trainer config (``ppo_trainer``) with the overrides docs/environments.md gives a user."""
    config_dir = os.path.dirname(__import__("verl.trainer.config", fromlist=["_"]).__file__)
    overrides = [f"data.train_files={train_parquet}", "data.prompt_key=prompt", "data.max_prompt_length=16384",
                 "reward.custom_reward_function.path=pkg://kernelzero.envs.verl",
                 f"reward.custom_reward_function.name={name}", "reward.num_workers=1",
                 f"actor_rollout_ref.model.path={tokenizer_dir}"]
    overrides += [f"+reward.custom_reward_function.reward_kwargs.{k}={v}" for k, v in reward_kwargs.items()]
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose("ppo_trainer", overrides=overrides)


def rollout_batch(config, tokenizer) -> tuple[DataProto, torch.Tensor]:
    """The batch verl's trainer holds after generation: the exported row read by verl's RLHFDataset and collated,
    repeated once per completion, joined with the completions as right-padded response ids (what the rollout
    returns). Also the response lengths."""
    dataset = RLHFDataset(data_files=[str(config.data.train_files)], tokenizer=tokenizer, config=config.data)
    assert len(dataset) == 1  # the prompt was not filtered out
    n = len(COMPLETIONS)
    batch = DataProto.from_single_dict(collate_fn([dataset[0]])).repeat(repeat_times=n, interleave=True)
    assert batch.non_tensor_batch["data_source"][0] == "kernelzero"
    prompt_text = tokenizer.apply_chat_template(list(batch.non_tensor_batch["raw_prompt"][0]),
                                                add_generation_prompt=True, tokenize=False)
    prompt = torch.tensor(tokenizer.encode(prompt_text, add_special_tokens=False)).repeat(n, 1)
    responses = [tokenizer.encode(c, add_special_tokens=False) for c in COMPLETIONS.values()]
    for ids, text in zip(responses, COMPLETIONS.values()):
        assert tokenizer.decode(ids, skip_special_tokens=True) == text  # the reward sees the completion as written
    lengths = torch.tensor([len(r) for r in responses])
    width = int(lengths.max()) + 7
    response_ids = torch.full((n, width), tokenizer.pad_token_id)
    response_mask = torch.zeros((n, width), dtype=torch.long)
    for i, ids in enumerate(responses):
        response_ids[i, : len(ids)] = torch.tensor(ids)
        response_mask[i, : len(ids)] = 1
    generated = DataProto.from_dict(tensors={
        "prompts": prompt, "responses": response_ids, "input_ids": torch.cat([prompt, response_ids], 1),
        "attention_mask": torch.cat([torch.ones_like(prompt), response_mask], 1)})
    return batch.union(generated), lengths


def last_token_scores(reward_tensor: torch.Tensor, lengths: torch.Tensor) -> list[float]:
    """verl puts a sequence's reward on its last response token, zeros elsewhere."""
    assert reward_tensor.sum(dim=1).tolist() == pytest.approx(
        [reward_tensor[i, lengths[i] - 1].item() for i in range(len(lengths))])
    return [reward_tensor[i, lengths[i] - 1].item() for i in range(len(lengths))]


def test_verls_reward_loop_loads_compute_score_and_gets_the_native_rewards(native, service, tokenizer_dir,
                                                                          train_parquet):
    config = verl_config(tokenizer_dir, train_parquet, "compute_score", {"service_url": service.url})
    tokenizer = hf_tokenizer(str(tokenizer_dir))
    manager = load_reward_manager(config, tokenizer)  # what each reward worker builds
    assert type(manager) is NaiveRewardManager and manager.is_async_reward_score  # awaited, not run in a thread
    data, lengths = rollout_batch(config, tokenizer)

    with VerifierClient(service.url) as client:
        before = client.metrics()["verdicts_total"]
        ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
        try:
            scored = RewardLoopManager(config).compute_rm_score(data)  # the trainer's reward step, on a Ray actor
        finally:
            ray.shutdown()
        assert client.metrics()["verdicts_total"] == before + len(COMPLETIONS)  # judged by the service
    assert last_token_scores(scored.batch["rm_scores"], lengths) == pytest.approx([native[c][0] for c in COMPLETIONS])
    extra = {k: scored.non_tensor_batch[k].tolist() for k in scored.meta_info["reward_extra_keys"]}
    assert extra["accepted"] == [1.0, 0.0, 0.0]
    assert extra["hack"] == [0.0, 0.0, 1.0]  # the decoy is a hack, not an honest mistake
    assert extra["correct"] == [1.0, 0.0, 1.0]  # its output is right: only the verifier's hack checks catch it


def test_verls_batch_reward_manager_with_compute_score_batch_and_the_local_verifier(native, tokenizer_dir,
                                                                                   train_parquet):
    config = verl_config(tokenizer_dir, train_parquet, "compute_score_batch", {})  # no service: a local verifier
    tokenizer = hf_tokenizer(str(tokenizer_dir))
    compute_score = get_custom_reward_fn(config)
    assert compute_score.args[0] is compute_score_batch  # loaded by name from the pkg:// path
    data, lengths = rollout_batch(config, tokenizer)
    out = BatchRewardManager(tokenizer, num_examine=0, compute_score=compute_score)(data, return_dict=True)
    assert last_token_scores(out["reward_tensor"], lengths) == pytest.approx([native[c][0] for c in COMPLETIONS])
    assert out["reward_extra_info"]["hack"] == [0.0, 0.0, 1.0]
    assert data.batch["acc"].tolist() == pytest.approx([native[c][0] for c in COMPLETIONS])

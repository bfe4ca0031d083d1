"""The llm coder: prompts, code extraction, the embedded model build, batch generation."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from core.task import Task
from plugins.coders.llm.corpus import catalog_tasks
from plugins.coders.llm.embedded import EmbeddedSpec, build_embedded, train_tokenizer
from plugins.coders.llm.prompts import CODE_OPEN, extract_code, render_completion, render_prompt

SOLUTION = "import triton\n\nclass ModelNew:\n    def forward(self, x):\n        return x\n"
TINY = {"vocab_size": 320, "hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1,
        "intermediate_size": 64}

code_lines = st.lists(
    st.from_regex(r"[a-z_][a-z0-9_]{0,8} = [a-z0-9_+* ]{1,12}", fullmatch=True), min_size=1, max_size=6
)


@given(code_lines)
def test_extract_code_inverts_render_completion(lines):
    source = "\n".join(lines + ["class ModelNew:", "    pass"]) + "\n"
    assert extract_code(render_completion(source)) == source


@given(code_lines, st.text(alphabet="abc .,:\n", max_size=40))
def test_extract_code_from_chat_style_answer(lines, prose):
    source = "\n".join(lines + ["class ModelNew:", "    pass"]) + "\n"
    answer = f"Here is the kernel{prose.replace('`', '')}\n```python\n{source}```\nHope this helps."
    assert extract_code(answer) == source


def test_extract_code_ignores_text_after_closing_fence():
    completion = SOLUTION + "```\n# Reference\n```python\nclass Model: pass\n```"
    assert extract_code(completion) == SOLUTION


def test_extract_code_raw_text_is_kept():
    assert extract_code(SOLUTION) == SOLUTION


def test_prompt_ends_in_open_fence_and_holds_task_and_guide():
    prompt = render_prompt("class Model: pass\n", "triton", guide="use tl.load")
    assert prompt.endswith(CODE_OPEN)
    assert "class Model: pass" in prompt and "use tl.load" in prompt and "triton" in prompt
    assert "use tl.load" not in render_prompt("class Model: pass\n", "triton", guide="")


def test_catalog_tasks_are_valid_python_and_deterministic():
    tasks = catalog_tasks(6, seed=3)
    assert len(tasks) == 6
    assert [t.id for t in tasks] == [t.id for t in catalog_tasks(6, seed=3)]
    for t in tasks:
        assert "class Model" in t.source and t.ops


def test_tokenizer_round_trips_code():
    tok = train_tokenizer([SOLUTION * 3, "def get_inputs():\n    return []\n"], 300)
    text = SOLUTION + "  tl.store(ptr + offs, v, mask=mask)\n"
    assert tok.decode(tok(text)["input_ids"]) == text
    assert tok.eos_token == "<|endoftext|>" and tok.pad_token_id != tok.eos_token_id


def test_embedded_spec_rejects_bad_shapes():
    with pytest.raises(ValueError, match="num_heads"):
        EmbeddedSpec(hidden_size=30, num_heads=4)


def test_embedded_build_is_cached(tmp_path):
    corpus = [render_prompt(t.source, "triton") for t in catalog_tasks(8)] + [render_completion(SOLUTION)]
    first = build_embedded(corpus, EmbeddedSpec(**TINY), tmp_path)
    assert (first / "kernelzero_embedded.json").exists() and (first / "config.json").exists()
    mtime = (first / "config.json").stat().st_mtime
    assert build_embedded(corpus, EmbeddedSpec(**TINY), tmp_path) == first
    assert (first / "config.json").stat().st_mtime == mtime
    assert build_embedded(corpus, EmbeddedSpec(**{**TINY, "seed": 1}), tmp_path) != first


@pytest.fixture(scope="module")
def coder(tmp_path_factory):
    from plugins.coders.llm import LLMCoder

    c = LLMCoder(embedded=TINY, cache_dir=str(tmp_path_factory.mktemp("emb")), max_new_tokens=8,
                 include_guide=False, batch_size=3, greedy=True)
    corpus = [render_prompt(t.source, "triton") for t in catalog_tasks(8)] + [render_completion(SOLUTION)]
    return c.load(corpus)


def test_generate_returns_num_samples_candidates_per_task(coder):
    tasks = catalog_tasks(4, seed=1)
    out = coder.generate(tasks, "triton", num_samples=2)
    assert len(out) == 4 and all(len(c) == 2 for c in out)
    for task, cands in zip(tasks, out):
        for c in cands:
            assert c.task_id == task.id and c.backend == "triton" and c.coder == "llm"
            assert c.completion is not None and (c.declined or c.source == extract_code(c.completion))
    # greedy first sample: deterministic
    again = coder.generate(tasks, "triton", num_samples=1)
    assert [c[0].completion for c in again] == [c[0].completion for c in out]


def test_prompt_over_budget_is_declined(coder):
    task = Task(source="class Model:\n    pass\n" + "# filler\n" * 2000)
    coder_budget, coder.max_prompt_tokens = coder.max_prompt_tokens, 64
    try:
        (cand,), = coder.generate([task], "triton", 1)
    finally:
        coder.max_prompt_tokens = coder_budget
    assert cand.declined and "max_prompt_tokens" in cand.declined


def test_llm_is_registered_and_composes_from_config():
    from core.plugins import registry

    assert "llm" in registry("coder")
    c = registry("coder").create("llm", model="some/hub-model", lora={"r": 4})
    assert c.model_path() == "some/hub-model"


def test_lora_wraps_the_model(tmp_path):
    from plugins.coders.llm import LLMCoder

    corpus = [render_completion(SOLUTION)] * 4
    c = LLMCoder(embedded=TINY, cache_dir=str(tmp_path), lora={"r": 2, "lora_alpha": 4,
                 "target_modules": ["q_proj", "v_proj"]}).load(corpus)
    trainable = sum(p.numel() for p in c.hf_model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in c.hf_model.parameters())
    assert 0 < trainable < total


def test_the_attention_kernels_are_a_config_key(tmp_path):
    # coder.attn_implementation: transformers' default (sdpa) unless set; a run whose GRPO gradients go non-finite
    # inside the model's backward (H100, 2026-12-06) can retry with eager attention without code changes
    import torch

    from plugins.coders.llm import LLMCoder

    corpus = [render_completion(SOLUTION)] * 4
    default = LLMCoder(embedded=TINY, cache_dir=str(tmp_path)).load(corpus).hf_model
    eager = LLMCoder(embedded=TINY, cache_dir=str(tmp_path), attn_implementation="eager").load(corpus).hf_model
    assert default.config._attn_implementation == "sdpa" and eager.config._attn_implementation == "eager"
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():  # the same weights, the same function
        torch.testing.assert_close(default(ids).logits, eager(ids).logits, rtol=1e-4, atol=1e-5)
    from hydra import compose, initialize_config_dir

    from core.config import build

    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parent.parent / "conf"), version_base=None):
        cfg = compose("config", overrides=["coder=llm", "coder.attn_implementation=eager"])
    assert build("coder", cfg.coder).attn_implementation == "eager"


def test_candidate_source_parses_when_completion_is_code(coder):
    cand = coder.to_candidate(catalog_tasks(1)[0], render_completion(SOLUTION), "triton")
    ast.parse(cand.source)
    assert cand.declined is None


@given(code_lines)
@settings(max_examples=20, deadline=None)
def test_line_tokenizer_round_trips_any_code(lines):
    tok = train_tokenizer([SOLUTION * 3, "def get_inputs():\n    return []\n"], 320, "lines")
    text = "\n".join(lines) + "\n"
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text


def test_lines_numbers_tokenizer_keeps_numbers_apart_but_not_digits_of_names():
    line = "    v1 = tl.minimum(v0, -0.5)\n"
    tok = train_tokenizer([line * 50 + "    return [torch.randn(8, 16, dtype=torch.float32)]\n" * 20] * 4, 400, "lines_numbers")
    assert tok.tokenize(line) == ["ĠĠĠĠv1Ġ=Ġtl.minimum(v0,Ġ-", "0.5", ")Ċ"]
    pieces = tok.tokenize("    return [torch.randn(8, 16, dtype=torch.float32)]\n")
    assert pieces[1:4] == ["8", ",Ġ", "16"] and "float32" in pieces[-1]


def test_line_tokenizer_merges_a_repeated_line_into_one_token_and_never_across_lines():
    line = "    offs = pid * BLOCK + tl.arange(0, BLOCK)\n"
    tok = train_tokenizer([line * 50 + "x = 1\n"] * 4, 400, "lines")
    assert len(tok(line, add_special_tokens=False)["input_ids"]) == 1
    words = train_tokenizer([line * 50 + "x = 1\n"] * 4, 400, "words")
    assert len(words(line, add_special_tokens=False)["input_ids"]) > 5
    for piece in tok.convert_ids_to_tokens(tok(line * 3, add_special_tokens=False)["input_ids"]):
        assert piece.count("Ċ") <= 1 and (piece.endswith("Ċ") or "Ċ" not in piece)  # Ċ: the byte-level newline


def test_embedded_tokenizer_loads_as_saved_after_a_model_save(tmp_path):
    """transformers maps a Qwen2 model's tokenizer to Qwen2Tokenizer, whose regex would undo our
    line pre-tokenizer; the embedded model's tokenizer must come back exactly as trained."""
    from transformers import AutoModelForCausalLM

    from plugins.coders.llm.embedded import load_tokenizer

    line = "    offs = pid * BLOCK + tl.arange(start, BLOCK)\n"  # no literal number: one token with either line split
    corpus = [line * 20 + render_completion(SOLUTION)] * 4
    path = build_embedded(corpus, EmbeddedSpec(**TINY), tmp_path / "cache")
    tok = load_tokenizer(str(path))
    assert len(tok(line, add_special_tokens=False)["input_ids"]) == 1
    # a phase model saved by the trainer (model + tokenizer) keeps the behaviour
    saved = tmp_path / "phase"
    AutoModelForCausalLM.from_pretrained(path).save_pretrained(saved)
    tok.save_pretrained(saved)
    again = load_tokenizer(str(saved))
    assert again(line * 3, add_special_tokens=False)["input_ids"] == tok(line * 3, add_special_tokens=False)["input_ids"]


def test_compact_prompt_keeps_model_and_inputs_and_drops_imports_and_helpers():
    from plugins.coders.llm.prompts import compact_task_source

    source = ('"""relu  [adversarial: nan_inf]"""\nimport torch\nimport torch.nn as nn\n\n\n'
              "class Model(nn.Module):\n    def forward(self, x0):\n        return torch.relu(x0)\n\n\n"
              "def get_inputs():\n    return [_with_specials(torch.randn(4, 8))]\n\n\n"
              "def get_init_inputs():\n    return []\n\n\ndef _with_specials(t):\n    t[0] = float('nan')\n    return t\n")
    compact = compact_task_source(source)
    ast.parse(compact)
    for kept in ('"""relu', "class Model", "torch.relu(x0)", "def get_inputs", "torch.randn(4, 8)", "def get_init_inputs"):
        assert kept in compact
    assert "import torch" not in compact and "def _with_specials" not in compact
    assert compact_task_source("not python (") == "not python ("
    prompt = render_prompt(source, "triton", compact=True)
    assert prompt.endswith(CODE_OPEN) and "import torch" not in prompt and "class Model" in prompt

"""The embedded model: a tiny Qwen2 causal LM and a byte-level BPE tokenizer, built locally.

No weights are downloaded. The tokenizer is trained with ``tokenizers`` on our own corpus (task
sources and teacher kernels). By default (``pretokenizer="lines_numbers"``) BPE may merge across
spaces within a line, and literal numbers stay apart, so a line the corpus repeats (the kernel
template: loads, masks, launches) becomes a single token and a shape or constant is a few tokens of
its own: a teacher kernel is ~74 tokens instead of ~570 with word-level merges (measured), which is
what lets a tiny model learn it on a CPU. ``"lines"`` merges numbers into lines too; ``"words"`` is
the usual GPT-2 split. The model is initialised from a small config, and both are saved
with ``save_pretrained`` under a cache directory keyed by the spec and the corpus, so the second
build is a load.

``architecture`` swaps the small config for a published model's numbers (a JSON file of
``plugins/coders/llm/architectures/``, or a path to a ``config.json``): a model of that architecture,
randomly initialised, whose vocabulary is the embedded tokenizer's (``qwen2.5-coder-1.5b``: 28 layers,
1536 wide; ~1.3B parameters with a 4096-token vocabulary). No weights are downloaded; such a model is
saved in bfloat16 (half the disk; loading casts to ``coder.dtype``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Sequence

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
ENV_CACHE = "KERNELZERO_CACHE"
# Set in the embedded model's config.json (kept by every save_pretrained of the model): its tokenizer
# must load exactly as written in tokenizer.json. AutoTokenizer would rebuild a Qwen2 model's
# tokenizer as Qwen2Tokenizer, replacing our pre-tokenizer with Qwen2's regex (transformers 5).
TOKENIZER_AS_SAVED = "kernelzero_tokenizer_as_saved"
PRETOKENIZERS = ("lines", "lines_numbers", "words")
BUILD_FORMAT = 2  # part of the cache key: raise it when the build recipe changes
LINE_PATTERN = r"[^\n]*\n?"  # one pre-token per line, its newline included
NUMBER_PATTERN = r"(?<![A-Za-z_0-9.])[0-9]+(?:\.[0-9]+)?(?:e[-+]?[0-9]+)?"  # a literal number (not a digit of a name): its own pre-token


@dataclass(frozen=True)
class EmbeddedSpec:
    """Size of the embedded model and tokenizer (defaults: ~1.3M parameters, builds in seconds)."""

    vocab_size: int = 2048
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 384
    max_positions: int = 4096
    pretokenizer: str = "lines_numbers"  # lines: merges may span a line | lines_numbers: also numbers apart | words: GPT-2
    seed: int = 0
    architecture: str | None = None  # a published architecture (architecture_config) instead of the sizes above

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"embedded model: hidden_size ({self.hidden_size}) must divide by num_heads ({self.num_heads}) "
                f"and num_heads by num_kv_heads ({self.num_kv_heads})"
            )
        if self.pretokenizer not in PRETOKENIZERS:
            raise ValueError(f"embedded tokenizer: pretokenizer must be one of {PRETOKENIZERS}, got {self.pretokenizer!r}")
        if self.vocab_size < 300:
            raise ValueError(f"embedded tokenizer: vocab_size {self.vocab_size} < 300 cannot hold the 256 bytes")


ARCHITECTURES = Path(__file__).resolve().parent / "architectures"
# What the tokenizer decides, not the architecture file (the embedded tokenizer has its own vocabulary and tokens).
TOKENIZER_KEYS = ("vocab_size", "bos_token_id", "eos_token_id", "pad_token_id")


def architecture_path(name: str) -> Path:
    """The JSON file of architecture ``name``: a file of ``ARCHITECTURES``, a ``config.json`` or a directory holding one."""
    for path in (ARCHITECTURES / f"{name}.json", Path(name), Path(name) / "config.json"):
        if path.is_file():
            return path
    known = sorted(p.stem for p in ARCHITECTURES.glob("*.json"))
    raise ValueError(f"embedded model: unknown architecture {name!r}; known: {known}, or a path to a config.json")


def architecture_config(name: str, tokenizer):
    """A transformers config of architecture ``name`` for ``tokenizer`` (its vocabulary and special tokens)."""
    from transformers import AutoConfig

    numbers = {k: v for k, v in json.loads(architecture_path(name).read_text()).items()
               if not k.startswith("_") and k not in TOKENIZER_KEYS and k != "architectures"}
    model_type = numbers.pop("model_type")
    return AutoConfig.for_model(model_type, vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id,
                                pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
                                **{TOKENIZER_AS_SAVED: True}, **numbers)


def default_cache_dir() -> Path:
    return Path(os.environ.get(ENV_CACHE) or Path.home() / ".cache" / "kernelzero") / "embedded"


def corpus_hash(texts: Iterable[str]) -> str:
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()[:16]


def train_tokenizer(corpus: Sequence[str], vocab_size: int, pretokenizer: str = "lines_numbers"):
    """A byte-level BPE tokenizer trained on ``corpus``, as a ``PreTrainedTokenizerFast``.

    ``pretokenizer="lines"`` lets merges span a whole line (never a newline boundary);
    ``"words"`` splits at words and punctuation first (GPT-2). Every byte stays encodable either way.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if not corpus:
        raise ValueError("embedded tokenizer: the corpus is empty; pass task sources and kernels to train on")
    if pretokenizer not in PRETOKENIZERS:
        raise ValueError(f"embedded tokenizer: pretokenizer must be one of {PRETOKENIZERS}, got {pretokenizer!r}")
    tok = Tokenizer(models.BPE())
    if pretokenizer.startswith("lines"):
        splits = [pre_tokenizers.Split(Regex(LINE_PATTERN), behavior="isolated")]
        if pretokenizer == "lines_numbers":
            splits.append(pre_tokenizers.Split(Regex(NUMBER_PATTERN), behavior="isolated"))
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            *splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(corpus), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN)


def build_model(spec: EmbeddedSpec, tokenizer):
    """A freshly initialised tiny Qwen2 for ``tokenizer`` (or a model of ``spec.architecture``)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

    if spec.architecture:
        torch.manual_seed(spec.seed)
        model = AutoModelForCausalLM.from_config(architecture_config(spec.architecture, tokenizer))
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.generation_config.bos_token_id = None
        return model
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_positions,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        **{TOKENIZER_AS_SAVED: True},
    )
    torch.manual_seed(spec.seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    return model


def load_tokenizer(tokenizer_path: str, model_path: str | None = None):
    """The tokenizer at ``tokenizer_path``: as saved for an embedded model, else through ``AutoTokenizer``."""
    from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerFast

    as_saved = False
    config_dir = Path(model_path or tokenizer_path)
    if (config_dir / "config.json").exists():
        as_saved = bool(getattr(AutoConfig.from_pretrained(str(config_dir)), TOKENIZER_AS_SAVED, False))
    if as_saved and (Path(tokenizer_path) / "tokenizer.json").exists():
        return PreTrainedTokenizerFast.from_pretrained(tokenizer_path)
    return AutoTokenizer.from_pretrained(tokenizer_path)


def build_embedded(corpus: Sequence[str], spec: EmbeddedSpec = EmbeddedSpec(), cache_dir: str | Path | None = None) -> Path:
    """Build (or find in the cache) the embedded model for ``corpus``; return its directory.

    The directory holds a ``save_pretrained`` model and tokenizer, loadable by any
    ``AutoModelForCausalLM`` user (the tokenizer through :func:`load_tokenizer`), and
    ``kernelzero_embedded.json`` (spec, corpus).
    """
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    recipe = {**asdict(spec), "build_format": BUILD_FORMAT}
    if spec.architecture:  # the file's numbers, so that an edited file builds anew
        recipe["architecture"] = json.loads(architecture_path(spec.architecture).read_text())
    else:
        del recipe["architecture"]  # the small models' cache keys stay what they were
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode() + corpus_hash(corpus).encode()).hexdigest()[:16]
    target = root / key
    if (target / "kernelzero_embedded.json").exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(corpus, spec.vocab_size, spec.pretokenizer)
    model = build_model(spec, tokenizer)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=root))
    try:
        if spec.architecture:
            import torch

            model.to(torch.bfloat16)  # a hub-sized model: half the disk and the load time
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        meta = {"spec": asdict(spec), "corpus_texts": len(corpus), "corpus_hash": corpus_hash(corpus),
                "parameters": sum(p.numel() for p in model.parameters())}
        (tmp / "kernelzero_embedded.json").write_text(json.dumps(meta, indent=2))
        try:
            tmp.rename(target)
        except OSError:  # another process built the same model first
            if not (target / "kernelzero_embedded.json").exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target

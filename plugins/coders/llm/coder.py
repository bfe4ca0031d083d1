"""The ``llm`` coder: a ``transformers`` causal LM that writes ``ModelNew`` modules.

``model`` names the weights: ``"embedded"`` (a tiny model built locally, see
:mod:`plugins.coders.llm.embedded`), a local directory, or a hub name. ``lora`` wraps the model
in a peft LoRA adapter (trainers then train only the adapter); ``adapter`` loads a trained one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from core.config import resolve_device
from core.distill import PromptFormat
from core.task import Candidate, Task
from plugins.coders.llm.prompts import (
    Example,
    backend_guide,
    extract_code,
    render_completion,
    render_prompt,
    to_candidate,
)

log = logging.getLogger(__name__)


def _resolve_device(device: str) -> str:
    """``auto`` as everywhere (core.config); any other torch device string (``cuda:1``) as given."""
    return resolve_device(device) if device == "auto" else device


@dataclass
class LLMCoder:
    """A causal LM coder. Every field is a config key of ``conf/coder/llm.yaml``."""

    model: str | None = "embedded"
    tokenizer: str | None = None  # defaults to ``model``
    embedded: dict[str, Any] = field(default_factory=dict)  # EmbeddedSpec fields
    corpus_tasks: int = 200  # tasks (and teacher kernels) the embedded tokenizer is trained on
    cache_dir: str | None = None
    include_guide: bool = True
    compact_prompt: bool = False  # prompt holds only the task's docstring, Model and input builders
    few_shot: list[dict[str, str]] = field(default_factory=list)  # [{task_source, solution_source}]
    max_prompt_tokens: int = 1024
    max_new_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    greedy: bool = False  # first sample greedy (deterministic evaluation); others sampled
    turns: int = 1  # attempts per GRPO episode; > 1: a rejected attempt is followed by the verdict's feedback
    feedback_tokens: int = 96  # token budget of that feedback
    batch_size: int = 8
    lora: dict[str, Any] | None = None
    adapter: str | None = None
    dtype: str = "float32"
    # transformers' attention kernels (``sdpa``, ``eager``, ``flash_attention_2``...); None: its default (sdpa)
    attn_implementation: str | None = None
    device: str = "auto"
    seed: int = 0
    name: str = "llm"
    _model: Any = field(default=None, init=False, repr=False)
    _tokenizer: Any = field(default=None, init=False, repr=False)
    _guides: dict[str, str] = field(default_factory=dict, init=False, repr=False)

    # ------------------------------------------------------------------ loading

    def model_path(self, corpus: Sequence[str] | None = None) -> str:
        """The directory or hub name weights load from; builds the embedded model when asked."""
        if not self.model:  # experiment=hub_grpo leaves it to the command line
            raise ValueError("coder.model is not set: give a hub name or a local directory, e.g. "
                             "coder.model=Qwen/Qwen2.5-Coder-1.5B (or coder.model=embedded)")
        if self.model != "embedded":
            return self.model
        from plugins.coders.llm.corpus import corpus_from_plugins
        from plugins.coders.llm.embedded import EmbeddedSpec, build_embedded

        spec = EmbeddedSpec(**{"seed": self.seed, **dict(self.embedded)})
        if corpus is None:
            corpus = corpus_from_plugins(n_tasks=self.corpus_tasks, seed=self.seed)
        return str(build_embedded(corpus, spec, self.cache_dir))

    def load(self, corpus: Sequence[str] | None = None) -> "LLMCoder":
        """Load model and tokenizer (idempotent). ``corpus`` feeds the embedded tokenizer."""
        if self._model is not None:
            return self
        import torch
        from transformers import AutoModelForCausalLM

        from plugins.coders.llm.embedded import load_tokenizer

        path = self.model_path(corpus)
        tok = load_tokenizer(self.tokenizer or path, path)
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        tok.padding_side = "left"
        dtype = getattr(torch, self.dtype)
        extra = {"attn_implementation": self.attn_implementation} if self.attn_implementation else {}
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **extra)
        if self.adapter:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, self.adapter, is_trainable=bool(self.lora))
        elif self.lora:
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **dict(self.lora)))
        model.to(_resolve_device(self.device))
        self._model, self._tokenizer = model, tok
        log.info("llm coder: loaded %s (%d parameters)", path, sum(p.numel() for p in model.parameters()))
        return self

    @property
    def hf_model(self):
        return self.load()._model

    @property
    def hf_tokenizer(self):
        return self.load()._tokenizer

    def set_model(self, model: Any) -> None:
        """Use ``model`` (e.g. the one a trainer just updated) for generation from now on."""
        self._model = model

    # ------------------------------------------------------------------ prompts

    def guide(self, backend: str) -> str:
        if not self.include_guide:
            return ""
        if backend not in self._guides:
            obj = None
            try:
                from core.plugins import registry

                if backend in registry("backend"):
                    obj = registry("backend").create(backend)
            except Exception as exc:  # a backend that cannot be built here still has a fallback guide
                log.debug("no guide from backend %r: %s", backend, exc)
            self._guides[backend] = backend_guide(obj, backend)
        return self._guides[backend]

    @property
    def prompt_format(self) -> PromptFormat:
        """This coder's prompt and completion format (what ``core.distill`` writes datasets in)."""
        examples = [Example(e["task_source"], e["solution_source"]) for e in self.few_shot]
        include_guide, compact = self.include_guide, self.compact_prompt
        return PromptFormat(
            guide=lambda backend_obj, name: backend_guide(backend_obj, name) if include_guide else "",
            prompt=lambda source, name, guide: render_prompt(source, name, guide, examples, compact=compact),
            completion=render_completion,
        )

    def prompt(self, task: Task, backend: str) -> str:
        return self.prompt_format.prompt(task.source, backend, self.guide(backend))

    def prompt_tokens(self, prompt: str) -> int:
        return len(self.hf_tokenizer(prompt, add_special_tokens=False)["input_ids"])

    def fits(self, prompt: str) -> bool:
        """Whether ``prompt`` is within ``max_prompt_tokens`` (TRL does not truncate prompts)."""
        return self.prompt_tokens(prompt) <= self.max_prompt_tokens

    def completion_for(self, solution_source: str) -> str:
        """The completion that answers one of our prompts with ``solution_source`` (an SFT target)."""
        return self.prompt_format.completion(solution_source)

    def extract(self, completion: str) -> str:
        """The code inside a completion (fenced block, or raw)."""
        return extract_code(completion)

    def corpus(self, tasks: Sequence[Task], solutions: Sequence[str], backend: str) -> list[str]:
        """Texts the embedded tokenizer is trained on: prompts of ``tasks`` and completions of ``solutions``."""
        from plugins.coders.llm.corpus import build_corpus

        return build_corpus(tasks, solutions, backend, self.guide(backend), compact=self.compact_prompt)

    def to_candidate(self, task: Task, completion: str, backend: str) -> Candidate:
        return to_candidate(task, completion, backend, coder=self.name)

    # ------------------------------------------------------------------ generation

    def complete(self, prompts: Sequence[str], *, greedy: bool | None = None, max_new_tokens: int | None = None) -> list[str]:
        """Raw completions, one per prompt, generated in batches of ``batch_size``."""
        import torch

        model, tok = self.hf_model, self.hf_tokenizer
        greedy = self.greedy if greedy is None else greedy
        out: list[str] = []
        was_training = model.training
        model.eval()
        try:
            for start in range(0, len(prompts), self.batch_size):
                chunk = list(prompts[start:start + self.batch_size])
                enc = tok(chunk, return_tensors="pt", padding=True, add_special_tokens=False,
                          truncation=True, max_length=self.max_prompt_tokens).to(model.device)
                kwargs: dict[str, Any] = {"max_new_tokens": max_new_tokens or self.max_new_tokens,
                                          "pad_token_id": tok.pad_token_id, "eos_token_id": tok.eos_token_id}
                if greedy:
                    kwargs["do_sample"] = False
                else:
                    kwargs.update(do_sample=True, temperature=self.temperature, top_p=self.top_p)
                with torch.no_grad():
                    ids = model.generate(**enc, **kwargs)
                new = ids[:, enc["input_ids"].shape[1]:]
                out += tok.batch_decode(new, skip_special_tokens=True)
        finally:
            model.train(was_training)
        return out

    def generate(self, tasks: Sequence[Task], backend: str, num_samples: int = 1) -> list[list[Candidate]]:
        import torch

        torch.manual_seed(self.seed)
        prompts = [self.prompt(t, backend) for t in tasks]
        result: list[list[Candidate]] = [[] for _ in tasks]
        for sample in range(num_samples):
            greedy = self.greedy and sample == 0
            fitting = [i for i, p in enumerate(prompts) if self.fits(p)]
            completions = self.complete([prompts[i] for i in fitting], greedy=greedy)
            done = dict(zip(fitting, completions))
            for i, task in enumerate(tasks):
                if i in done:
                    result[i].append(self.to_candidate(task, done[i], backend))
                else:
                    result[i].append(Candidate(source="", backend=backend, task_id=task.id, coder=self.name,
                                               declined=f"prompt longer than max_prompt_tokens={self.max_prompt_tokens}"))
        return result

    def save(self, directory: str | Path) -> None:
        self.hf_model.save_pretrained(directory)
        self.hf_tokenizer.save_pretrained(directory)

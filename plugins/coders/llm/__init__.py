"""The ``llm`` coder: a transformers causal LM (any local path or hub name, or the embedded model)."""

from __future__ import annotations

from core import hookimpl
from plugins.coders.llm.coder import LLMCoder
from plugins.coders.llm.prompts import extract_code, render_completion, render_prompt

__all__ = ["LLMCoder", "extract_code", "render_completion", "render_prompt"]


@hookimpl
def register_coders(register):
    register("llm", LLMCoder)

"""What one refinement turn hands the next: the verdict's feedback, and the discounted return of each turn.

A multi-turn episode (:mod:`core.loop.refinement`) shows the coder, after a rejected attempt, what the
verifier said: the verdict's reason and the detail of the check that failed, trimmed to a token budget
(:func:`verdict_feedback`), rendered after the attempt so the next completion is a fixed module
(:func:`render_feedback_turn`). Each turn earns the reward mix's total; the turns' rewards combine by
the discounted sum Kevin-32B trained with (:func:`discounted_returns`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from core.verdict import Verdict

TRIM_MARK = " ..."
CODE_FENCE = "```python\n"


def discounted_returns(rewards: Sequence[float], gamma: float) -> list[float]:
    """The return of every turn: ``G_t = sum over j >= t of gamma ** (j - t) * r_j``.

    An episode's own reward is ``G_1``, the return of its first turn.

    >>> discounted_returns([0.0, 0.5, 1.0], 0.5)
    [0.5, 1.0, 1.0]
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"the turn discount must be in [0, 1], got {gamma}")
    out = [0.0] * len(rewards)
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = float(rewards[t]) + gamma * running
        out[t] = running
    return out


def failing_check(verdict: Verdict) -> tuple[str, str] | None:
    """``(name, detail)`` of the first check that did not pass (checks run, and are kept, cheapest first)."""
    for name, result in verdict.checks.items():
        if not result.passed:
            return name, result.detail
    return None


def feedback_text(verdict: Verdict) -> str:
    """The verdict's reason and its failing check's detail, in full (one comment line each)."""
    lines = [f"# Verdict: {verdict.status}: {(verdict.reason or 'no reason given').strip()}"]
    failed = failing_check(verdict)
    if failed is not None and failed[1].strip() and failed[1].strip() not in (verdict.reason or ""):
        lines.append(f"# {failed[0]}: {failed[1].strip()}")
    return "\n".join(" ".join(line.split()) for line in lines)


def trim_to_budget(text: str, budget: int, count_tokens: Callable[[str], int]) -> str:
    """The longest prefix of ``text`` (marked with :data:`TRIM_MARK` when cut) of at most ``budget`` tokens.

    ``text`` itself when it fits. Token counts of prefixes need not grow with their length (BPE), so
    the search keeps the longest prefix it saw that fits and checks the answer it returns; the empty
    string when nothing fits.
    """
    if count_tokens(text) <= budget:
        return text
    lo, hi, best = 0, len(text), ""
    while lo <= hi:
        mid = (lo + hi) // 2
        candidate = text[:mid].rstrip() + TRIM_MARK
        if count_tokens(candidate) <= budget:
            best, lo = candidate, mid + 1
        else:
            hi = mid - 1
    return best if best and count_tokens(best) <= budget else ""


def verdict_feedback(verdict: Verdict, budget: int, count_tokens: Callable[[str], int]) -> str:
    """:func:`feedback_text` of ``verdict`` trimmed to ``budget`` tokens of ``count_tokens``."""
    return trim_to_budget(feedback_text(verdict), budget, count_tokens)


def render_feedback_turn(feedback: str) -> str:
    """What follows a rejected completion: the feedback, then an open code fence for the fixed ``ModelNew``.

    Completions of the ``llm`` coder's prompts end with a closing fence, so the next turn reads like
    the first one did: comment lines, then ``# ModelNew`` and an open ``python`` fence.
    """
    return "\n" + feedback.rstrip() + "\n# Fix it.\n# ModelNew\n" + CODE_FENCE

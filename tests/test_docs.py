"""The docs stay a set of guides: small enough to read, and docs/architecture.md true to the code.

- tracked files under docs/ total at most 2 MB, and no page is over 40 KB;
- every number docs/architecture.md quotes is checked here against the code (or it quotes none);
- no doc, README or script points into docs/results/ (raw run outputs are not kept in the repository).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS_MAX_BYTES = 2_000_000
PAGE_MAX_BYTES = 40_000


def _tracked(*paths: str) -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z", *paths], cwd=ROOT, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / p for p in out.stdout.decode().split("\0") if p and (ROOT / p).is_file()]


def test_tracked_docs_total_at_most_2_mb_and_no_page_over_40_kb():
    files = _tracked("docs")
    assert files, "no tracked file under docs/"
    total = sum(f.stat().st_size for f in files)
    assert total <= DOCS_MAX_BYTES, f"docs/ holds {total:,} bytes of tracked files (at most {DOCS_MAX_BYTES:,})"
    big = {str(f.relative_to(ROOT)): f.stat().st_size for f in files if f.stat().st_size > PAGE_MAX_BYTES}
    assert not big, f"pages over {PAGE_MAX_BYTES:,} bytes: {big}"


def test_nothing_points_into_the_removed_results_folder():
    files = [ROOT / "README.md", *_tracked("docs", "scripts", "benchmarks")]
    stale = [str(f.relative_to(ROOT)) for f in files if f.suffix in (".md", ".py", ".sh") and "docs/results/" in f.read_text()]
    assert not stale, f"references to docs/results/ (removed): {stale}"


# every number docs/architecture.md quotes outside code spans, with the check that keeps it true
def _architecture_limits() -> dict[str, int]:
    import tests.test_architecture as arch

    return {
        "700": arch.MAX_MODULE_LINES,
        "300": arch.MAX_CLASS_LINES,
        "2,500": arch.MAX_CORE_TOP_LEVEL_LINES,
    }


def _numbers_outside_code(text: str) -> list[str]:
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # code blocks: paths and names, no figures
    text = re.sub(r"`[^`]*`", "", text)  # code spans: checked below where they hold formulas
    text = re.sub(r"\b[\w./-]*\.md\b", "", text)  # file names such as DESIGN.md
    return re.findall(r"(?<![\w./-])\d[\d,.]*\d(?![\w])|(?<![\w./-])\d(?![\w])", text)


def test_every_number_architecture_md_quotes_is_checked():
    text = (ROOT / "docs" / "architecture.md").read_text()
    limits = _architecture_limits()
    numbers = _numbers_outside_code(text)
    unchecked = sorted(set(numbers) - set(limits))
    assert not unchecked, f"docs/architecture.md quotes numbers no test checks: {unchecked}"
    for quoted, actual in limits.items():
        if quoted in numbers:
            assert int(quoted.replace(",", "")) == actual, f"docs/architecture.md says {quoted}, the code's limit is {actual}"


def test_the_reward_formulas_architecture_md_quotes_match_the_code():
    from plugins.rewards.builtin import correctness_reward, roofline_reward

    text = (ROOT / "docs" / "architecture.md").read_text()
    assert "`correctness` = `1 - (1 - accuracy)^2`" in text
    for a in (0.0, 0.3, 0.5, 1.0):
        assert correctness_reward(a) == pytest.approx(1 - (1 - a) ** 2)
    assert "`0.7 * flops_utilisation + 0.3 * bandwidth_efficiency`" in text
    for f, b in ((1.0, 0.0), (0.0, 1.0), (0.4, 0.6)):
        assert roofline_reward(f, b) == pytest.approx(0.7 * f + 0.3 * b)

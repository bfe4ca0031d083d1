"""benchmarks/stream_overlap.py runs end to end on the real verifier (a small setting) and reports both modes."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.e2e  # real sandboxed workers, two modes: make test-e2e


def test_the_benchmark_reports_both_modes_side_by_side(capsys):
    from benchmarks import stream_overlap

    assert stream_overlap.main(["--copies", "1", "--gap-s", "0.05", "--repeats", "1", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "8 pairs (1 x 8 red-team pairs), one every 0.05 s, 1 CPU worker(s), 1 run(s) each" in out
    for mode in ("verify_many per arrival batch", "verify_stream"):
        assert re.search(rf"{mode}\s+last verdict\s+[\d.]+ s after the first arrival,\s+[\d.]+ s after the last", out)
    assert re.search(r"stream / batches: [\d.]+x the time to the last verdict", out)

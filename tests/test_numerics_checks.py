"""The checks' judge-side rules of issue 18 on synthetic evidence: zero-size calls need no launch
(integrity), race findings fail the races check and not the memory check, and atomics make the
determinism repeat a comparison with the reference instead of a bitwise one."""

from __future__ import annotations

import torch

from core.task import Candidate, Task
from core.verification.evidence import RACE_FINDING, RACE_SUMMARY, Evidence, RunObservation, Trial, parse_python
from plugins.verifiers.runtime import DeterminismCheck, IntegrityCheck, MemoryCheck, RaceCheck, atomics_used

ATOMIC_SOURCE = """
import triton
import triton.language as tl

@triton.jit
def k(x_ptr, out_ptr):
    tl.atomic_add(out_ptr, tl.load(x_ptr))
"""
PLAIN_SOURCE = ATOMIC_SOURCE.replace("tl.atomic_add(out_ptr, tl.load(x_ptr))", "tl.store(out_ptr, tl.load(x_ptr))")


def _evidence(source: str = PLAIN_SOURCE) -> Evidence:
    return Evidence(task=Task(source="class Model: pass\n"), candidate=Candidate(source=source), backend="triton",
                    device="cpu", tree=parse_python(source))


def _trial(expected: list, output: list | None, launches: int = 1, oob: list[str] | None = None) -> Trial:
    obs = RunObservation(name="t", output=output, launches=launches, oob=list(oob or []))
    return Trial(seed=0, inputs=[], expected=expected, observed=obs)


def test_a_call_with_only_empty_outputs_needs_no_launch():
    ev = _evidence()
    empty = torch.empty(0, 64)
    ev.trials = [_trial([empty], [empty.clone()], launches=0) for _ in range(5)]
    result = IntegrityCheck().evaluate(ev)
    assert result.passed, result.detail
    assert "5 call(s) with only empty outputs needed no launch" in result.detail


def test_a_non_empty_output_without_a_launch_is_still_rejected():
    ev = _evidence()
    zeros = torch.zeros(64)
    ev.trials = [_trial([zeros], [zeros.clone()], launches=0) for _ in range(5)]
    result = IntegrityCheck().evaluate(ev)
    assert not result.passed and result.hack and "launched no triton kernel" in result.detail
    # an empty reference but a candidate output with elements (or a plain value) is not "no work"
    ev.trials = [_trial([torch.empty(0)], [torch.zeros(3)], launches=0), _trial([torch.empty(0)], [7], launches=0)]
    assert not IntegrityCheck().evaluate(ev).passed


def test_race_findings_fail_the_races_check_and_not_the_memory_check():
    ev = _evidence()
    ref = torch.ones(4)
    ev.trials = [_trial([ref], [ref.clone()])]
    race = f"{RACE_FINDING}k: 1 address(es) shared between programs outside atomics, e.g. byte 0 of argument storage 1"
    ev.shuffled = [_trial([ref], [ref.clone()], oob=[race, f"{RACE_SUMMARY}1 launch(es), 10 accesses by program"])]
    assert MemoryCheck().evaluate(ev).passed
    result = RaceCheck().evaluate(ev)
    assert not result.passed and "a data race between programs: k: 1 address(es)" in result.detail
    assert result.data["races"] and result.data["analysis"]


def test_the_races_check_says_what_it_analysed():
    ev = _evidence()
    ref = torch.ones(4)
    ev.shuffled = [_trial([ref], [ref.clone()], oob=[f"{RACE_SUMMARY}2 launch(es), 10 accesses by program"])]
    assert "no address shared between programs outside atomics" in RaceCheck().evaluate(ev).detail
    ev.shuffled = [_trial([ref], [ref.clone()], oob=[f"{RACE_SUMMARY}1 launch(es), 9 accesses by program; cut short "
                                                      "after 16777216 addresses in 1 launch(es)"])]
    assert "cut short" in RaceCheck().evaluate(ev).detail
    ev.shuffled = [_trial([ref], [ref.clone()])]
    assert "no address analysis" in RaceCheck().evaluate(ev).detail
    ev.shuffled = [_trial([ref], [torch.zeros(4)])]  # the second signal: the values under a shuffled order
    assert not RaceCheck().evaluate(ev).passed


def test_atomics_are_found_in_the_source():
    assert atomics_used(parse_python(ATOMIC_SOURCE)) == ["atomic_add"]
    assert atomics_used(parse_python(PLAIN_SOURCE)) == []
    assert atomics_used(parse_python("from triton.language import atomic_cas\natomic_cas(a, 0, 1)\n")) == ["atomic_cas"]


def _repeat(source: str, again: torch.Tensor) -> Evidence:
    ev = _evidence(source)
    ref = torch.arange(1.0, 101.0)
    ev.trials = [_trial([ref], [ref.clone()])]
    ev.repeat = [_trial([ref], [again])]
    return ev


def test_reordered_atomic_sums_are_reported_not_failed():
    ref = torch.arange(1.0, 101.0)
    reordered = ref + 1e-6 * torch.randn(100, generator=torch.Generator().manual_seed(0))  # other bits, in tolerance
    result = DeterminismCheck().evaluate(_repeat(ATOMIC_SOURCE, reordered))
    assert result.passed and result.data["bitwise"] is False and "not bitwise reproducible" in result.detail
    assert not DeterminismCheck().evaluate(_repeat(PLAIN_SOURCE, reordered)).passed  # no atomics: bits must agree
    wrong = DeterminismCheck().evaluate(_repeat(ATOMIC_SOURCE, ref * 1.01))  # atomics excuse bits, not errors
    assert not wrong.passed and "misses the reference" in wrong.detail
    same = DeterminismCheck().evaluate(_repeat(ATOMIC_SOURCE, ref.clone()))
    assert same.passed and same.data["bitwise"] is True


def test_a_repeat_on_another_autotune_config_is_compared_with_the_reference():
    ref = torch.arange(1.0, 101.0)
    other_bits = ref + 1e-6
    ev = _repeat(PLAIN_SOURCE, other_bits)
    ev.trials[0].observed.kernels = ["add[BLOCK=256]"]
    ev.repeat[0].observed.kernels = ["add[BLOCK=1024]"]
    result = DeterminismCheck().evaluate(ev)
    assert result.passed and result.data["bitwise"] is False
    assert "add[BLOCK=256] then add[BLOCK=1024]" in result.detail
    ev.repeat[0].observed.kernels = ["other[BLOCK=1024]"]  # another kernel is not another config
    assert not DeterminismCheck().evaluate(ev).passed

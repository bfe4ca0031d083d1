"""Inputs drawn from the seed in the candidate worker: only digests cross the process boundary.

The reference worker checks that the task's get_inputs is reproducible under a seed; then the
candidate worker draws the same inputs itself, and the judge compares digests (the inputs were the
reference's, and forward left them unchanged). A task that is not reproducible falls back to
sending the tensors.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from core.task import Candidate, Task
from core.verification.evidence import RunObservation, Trial, input_digests, inputs_intact
from core.verification.judge import _Budget

RED = Path(__file__).resolve().parent / "redteam"
VECTOR_ADD = (RED / "tasks" / "vector_add.py").read_text()
HONEST = (RED / "candidates" / "honest_vector_add.py").read_text()
MUTATES = (RED / "candidates" / "input_mutation.py").read_text()
# get_inputs that draws from the OS, not from torch's seeded generator: one of 2**20 offsets (the sum of 8 random
# bytes it drew before repeated itself about once in 700 pairs of draws, which the judge took for reproducible)
UNREPRODUCIBLE = VECTOR_ADD.replace(
    "def get_inputs():\n    return [torch.randn(3001), torch.randn(3001)]",
    "def get_inputs():\n    import os\n    noise = (int.from_bytes(os.urandom(4), 'little') % 2**20) / 2**10\n"
    "    return [torch.randn(3001) + noise, torch.randn(3001)]",
)
# a constant drawn once per process, at import, from the OS: two draws in the reference's process agree (so the
# judge takes get_inputs for reproducible under a seed), and the candidate's process draws other inputs
PER_PROCESS = VECTOR_ADD.replace(
    "def get_inputs():\n    return [torch.randn(3001), torch.randn(3001)]",
    "import os\nSHIFT = 1.0 + int.from_bytes(os.urandom(4), 'little') % 2**20\n\n\n"
    "def get_inputs():\n    return [torch.randn(3001) + SHIFT, torch.randn(3001)]",
)
CHECKS = ["static", "static_integrity", "correctness", "integrity"]


@pytest.fixture(scope="module", params=[True, False], ids=["by_seed", "tensors"])
def verifier(request):
    from core.verify import Verifier

    with Verifier(backend="triton", device="cpu", workers=1, checks=CHECKS, inputs_by_seed=request.param) as v:
        yield v


def _reference(verifier, source: str, mode: str) -> dict:
    return verifier._request(verifier.reference_pool, {
        "op": "reference", "source": source, "init_seed": 1, "seeds": [11, 12], "scales": [1.0, 1e3],
        "float64_max_elements": 0, "inputs_mode": mode}, _Budget(120))


def test_a_reproducible_task_sends_digests_not_tensors(verifier):
    ref = _reference(verifier, VECTOR_ADD, "digest")
    assert ref["ok"] and ref["inputs_by_seed"] is True
    for trial in ref["trials"]:
        assert "inputs" not in trial and len(trial["inputs_digest"]) == 2
    assert ref["trials"][0]["inputs_digest"] != ref["trials"][1]["inputs_digest"]  # other seed, other scale


def test_an_unreproducible_task_falls_back_to_tensors(verifier):
    ref = _reference(verifier, UNREPRODUCIBLE, "digest")
    assert ref["ok"] and ref["inputs_by_seed"] is False
    assert all("inputs" in t for t in ref["trials"])


def test_honest_kernel_accepted_either_way(verifier):
    for task in (VECTOR_ADD, UNREPRODUCIBLE):
        verdict = verifier.verify(Task(source=task), Candidate(source=HONEST))
        assert verdict.accepted, verdict.reason


def test_a_task_drawn_otherwise_in_each_process_is_judged_with_its_inputs_sent(verifier):
    # before, the digests' mismatch rejected every honest kernel for this task and flagged it as tampering
    assert _reference(verifier, PER_PROCESS, "digest")["inputs_by_seed"] is True  # two draws there agree
    verdict = verifier.verify(Task(source=PER_PROCESS), Candidate(source=HONEST))
    assert verdict.accepted and not verdict.hack_flags, verdict.reason
    if verifier.inputs_by_seed:
        assert "differ from the reference's" in verdict.inputs_sent and "sent as tensors" in verdict.inputs_sent
    else:
        assert verdict.inputs_sent is None
    # a kernel that mutates its inputs is still caught on the tensors sent
    verdict = verifier.verify(Task(source=PER_PROCESS), Candidate(source=MUTATES))
    assert not verdict.accepted and "modified by forward" in verdict.reason and verdict.checks["correctness"].hack


def test_input_mutation_is_caught_either_way(verifier):
    verdict = verifier.verify(Task(source=VECTOR_ADD), Candidate(source=MUTATES))
    assert not verdict.accepted
    assert verdict.reason.startswith("correctness:") and "modified by forward" in verdict.reason
    assert verdict.checks["correctness"].hack


def _trial(expected_digest, before, after) -> Trial:
    obs = RunObservation(name="trial0", output=[], inputs_digest_before=before, inputs_digest_after=after)
    return Trial(seed=1, inputs=None, expected=[], observed=obs, inputs_digest=expected_digest)


def test_inputs_drawn_differently_in_the_candidates_process_are_a_finding():
    ok, why = inputs_intact(_trial(["a", "b"], ["a", "zeros"], ["a", "zeros"]))
    assert not ok and "tampered" in why
    ok, why = inputs_intact(_trial(["a", "b"], ["a", "b"], ["a", "changed"]))
    assert not ok and "input 1 was modified" in why
    assert inputs_intact(_trial(["a", "b"], ["a", "b"], ["a", "b"])) == (True, "")
    ok, why = inputs_intact(_trial(["a", "b"], None, None))  # a harness patched to report nothing
    assert not ok and "no digests" in why


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=3), st.sampled_from([torch.float32, torch.bfloat16,
                                                                              torch.int64, torch.bool]),
       st.integers(0, 10_000), st.booleans())
def test_digests_see_every_element_and_the_layout(shape, dtype, position, fingerprint):
    # fingerprint: the GPU's digest (core.verification.evidence.device_fingerprint), here computed on the CPU
    def digests(values):
        return input_digests(values, fingerprint=fingerprint)

    x = (torch.randn(shape) * 3).to(dtype)
    assert digests([x]) == digests([x.clone()])
    y = x.clone().reshape(-1)
    i = position % y.numel()
    y[i] = (~y[i]) if dtype == torch.bool else y[i] + 1
    assert digests([y.reshape(shape)]) != digests([x])
    if x.dim() >= 2 and x.shape[0] > 1 and x.shape[-1] > 1:  # same values, other strides
        assert digests([x.transpose(0, -1).contiguous().transpose(0, -1)]) != digests([x])
    assert digests([3, 0.5]) == ["py:int:3", "py:float:0.5"]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5000), st.integers(0, 2**31), st.integers(0, 7))
def test_the_fingerprint_sees_every_bit_of_every_byte(nbytes, position, bit):
    from core.verification.evidence import device_fingerprint

    x = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(nbytes))
    y = x.clone()
    y[position % nbytes] ^= 1 << bit
    assert device_fingerprint(x) == device_fingerprint(x.clone())
    assert device_fingerprint(y) != device_fingerprint(x)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([torch.float32, torch.float16, torch.int8, torch.float64]), st.integers(1, 7),
       st.integers(1, 300))
def test_the_fingerprint_takes_a_view_that_starts_mid_word(dtype, offset, numel):
    # The adversarial offset probe hands the reference ``randn(n + 1)[1:]``: its bytes start mid 64-bit
    # word. On the H200 every such task's reference failed ("storage_offset() must be divisible by 8 to
    # view Byte as Long") and the expert's honest answers were rejected, 4-8 in 256 (2026-12-04).
    from core.verification.evidence import device_fingerprint

    base = (torch.randn(numel + offset) * 3).to(dtype)
    view = base[offset:]
    assert device_fingerprint(view) == device_fingerprint(view.clone())
    assert input_digests([view], fingerprint=True) != input_digests([view.clone()], fingerprint=True)  # the layout
    changed = view.clone()
    changed[numel // 2] += 1
    assert device_fingerprint(changed) != device_fingerprint(view)


def test_digests_and_bitwise_equality_take_any_layout():
    from core.verification.evidence import bitwise_equal

    odd = torch.tensor([[29.24]]).as_strided((1, 1), (1, 3))  # contiguous() keeps the stride 3
    assert bitwise_equal(odd, odd.clone()) and not bitwise_equal(odd, odd + 1)
    assert len(input_digests([odd])) == 1
    assert input_digests([torch.tensor(2.0)]) != input_digests([torch.tensor(3.0)])  # 0-d



def test_inputs_are_drawn_on_the_workers_device_unless_get_inputs_cannot_be():
    import types

    from core.verification.worker import draw_inputs

    task = types.ModuleType("kz_task_draw")
    exec("import torch\ndef get_inputs():\n    return [torch.randn(4, 3), torch.randint(0, 5, (7,))]\n", task.__dict__)
    # "meta" stands in for "cuda" here: any device other than the CPU takes the device-default path
    on_device = draw_inputs(task, 11, 1.0, "meta")
    assert [x.device.type for x in on_device] == ["meta", "meta"]
    pinned = types.ModuleType("kz_task_pinned")
    exec("import torch\ndef get_inputs():\n    return [torch.from_numpy(torch.randn(4, 3).numpy() * 2)]\n",
         pinned.__dict__)
    [x] = draw_inputs(pinned, 11, 1.0, "meta")  # goes through numpy, so it cannot draw elsewhere: the CPU
    assert x.device.type == "cpu"
    assert torch.equal(x, draw_inputs(pinned, 11, 1.0, "cpu")[0])
    a, b = draw_inputs(task, 5, 2.0, "cpu"), draw_inputs(task, 5, 2.0, "cpu")
    assert torch.equal(a[0], b[0]) and a[1].dtype == torch.int64


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3000), st.integers(0, 2**31), st.integers(0, 7), st.sampled_from([1, 2, 5, 64]))
def test_the_fingerprint_sees_every_byte_in_every_chunk(nbytes, position, bit, chunk_words):
    # large inputs are fingerprinted a chunk at a time (bounded GPU memory): every chunk, the last
    # partial one included, still sees every bit, and a chunk's words are weighted unlike another's
    from unittest import mock

    import core.verification.digests as digests
    from core.verification.evidence import device_fingerprint

    x = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(nbytes))
    y = x.clone()
    y[position % nbytes] ^= 1 << bit
    with mock.patch.object(digests, "FINGERPRINT_CHUNK_WORDS", chunk_words):
        assert device_fingerprint(x) == device_fingerprint(x.clone())
        assert device_fingerprint(y) != device_fingerprint(x)
        if nbytes >= 16 * chunk_words and nbytes % 8 == 0:  # two chunks' words swapped: another fingerprint
            w = x.view(torch.int64).clone()
            swapped = torch.cat([w[chunk_words:2 * chunk_words], w[:chunk_words], w[2 * chunk_words:]])
            if not torch.equal(swapped, w):
                assert device_fingerprint(swapped.view(torch.uint8)) != device_fingerprint(x)

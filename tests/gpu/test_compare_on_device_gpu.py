"""compare_on_device on a GPU: outputs cross processes as CUDA IPC handles (core.verification.devicemem)."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import pytest
import torch

from core.task import Candidate, Task
from core.verification.devicemem import Exports, TransportError, cuda_ipc_available, import_tensor
from core.verification.evidence import bitwise_equal, input_digests

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; none is visible")]

REDTEAM = Path(__file__).parent.parent / "redteam"


def _exporter(conn, scratch: str) -> None:
    # another process, as a candidate worker is: a handle cannot be opened by its own process
    torch.manual_seed(0)
    values = [torch.randn(1000, 37, device="cuda"), torch.arange(5, device="cuda", dtype=torch.int64)[1:],
              torch.randn(64, 64, device="cuda").to(torch.bfloat16).t(), torch.empty(0, 3, device="cuda"), 7]
    exports = Exports("cuda", scratch)
    fingerprint = input_digests([values[0]])[0]  # computed in this process, on the GPU
    conn.send((exports.export(values), [v.cpu() if isinstance(v, torch.Tensor) else v for v in values],
               fingerprint))
    conn.recv()  # keep the memory alive until the importer is done


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()
    proc = ctx.Process(target=_exporter, args=(theirs, str(tmp_path_factory.mktemp("scratch"))))
    proc.start()
    entries, originals, fingerprint = ours.recv()
    yield entries, originals, fingerprint
    ours.send("done")
    proc.join(30)


def test_cuda_ipc_is_available_here():
    assert cuda_ipc_available() == ""


def test_outputs_cross_processes_bit_for_bit(exported):
    entries, originals, _ = exported
    assert entries[-1] == {"value": 7}
    for entry, original in zip(entries[:-1], originals[:-1]):
        desc = entry["tensor"]
        assert desc["via"] in ("cuda_ipc", "empty")
        back = import_tensor(desc, "cuda", None)
        assert back.is_cuda and back.shape == original.shape and back.dtype == original.dtype
        assert bitwise_equal(back.cpu(), original)


@pytest.mark.parametrize("forgery", [{"offset": 1 << 40}, {"shape": [1 << 30], "nbytes": 4 << 30},
                                     {"handle": b"\x00" * 64}, {"device": 7}])
def test_a_forged_handle_is_refused_and_the_importer_keeps_working(exported, forgery):
    entries, originals, _ = exported
    with pytest.raises(TransportError):
        import_tensor({**entries[0]["tensor"], **forgery}, "cuda", None)
    back = import_tensor(entries[0]["tensor"], "cuda", None)  # the context is not poisoned
    assert torch.equal(back.cpu(), originals[0])


def test_inputs_on_the_gpu_are_digested_there_and_agree_across_processes(exported):
    _, originals, theirs = exported
    x = originals[0].cuda()
    assert theirs.split("|")[-1].startswith("fp:")  # the device fingerprint, not a host sha256
    assert input_digests([x]) == [theirs]
    y = x.clone()
    y.view(-1)[12345] = torch.nextafter(y.view(-1)[12345], torch.tensor(float("inf"), device="cuda"))
    assert input_digests([y]) != [theirs]  # one ulp of one element


def _pair(task: str, candidate: str) -> tuple[Task, Candidate]:
    cand = Candidate.from_file(REDTEAM / "candidates" / f"{candidate}.py")
    return Task.from_file(REDTEAM / "tasks" / f"{task}.py"), cand


def test_verdicts_on_the_gpu_agree_between_the_two_ways_of_comparing():
    from core.verify import Verifier

    pairs = [_pair("vector_add", "honest_vector_add"), _pair("vector_add", "partial_write"),
             _pair("softmax", "unstable_softmax"), _pair("layernorm", "honest_layernorm")]
    verdicts = {}
    for mode in (False, True):
        with Verifier(backend="triton", device="cuda", workers=2, timeout_s=300, compare_on_device=mode,
                      checks=["static", "static_integrity", "correctness", "integrity", "stability",
                              "determinism"]) as v:
            assert v.compare_on_device is mode
            verdicts[mode] = v.verify_many(pairs)
    for judge, keeper in zip(verdicts[False], verdicts[True]):
        assert (judge.status, judge.accepted) == (keeper.status, keeper.accepted), (judge.reason, keeper.reason)
    assert [v.accepted for v in verdicts[True]] == [True, False, False, True], [v.reason for v in verdicts[True]]

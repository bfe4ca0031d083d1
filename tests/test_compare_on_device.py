"""compare_on_device (core.verification.devicemem): outputs handed to the verification's keeper and compared
there. On CPU the hand-over goes through files in the candidate's scratch directory; the CUDA IPC
path is exercised by tests/gpu. The verdicts themselves are covered by the red-team suite and the
float64-truth tests, which run in both modes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from core.task import Candidate, Task
from core.verification.devicemem import EXPORT_DIR, Exports, TransportError, Vault, import_tensor
from core.verification.evidence import HeldTensor, bitwise_equal, compare_outputs
from core.verify import Verifier

HERE = Path(__file__).parent / "redteam"
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int8,
          torch.uint8, torch.bool]


def _random(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        x = torch.randn(shape, generator=g).to(dtype)
        if x.numel():
            x.view(-1)[0] = float("nan")  # NaN and -0.0 must survive bit for bit
            x.view(-1)[-1] = -0.0
        return x
    return torch.randint(-100 if dtype != torch.uint8 else 0, 100, shape, generator=g).to(dtype)


@settings(max_examples=40, deadline=None)
@given(dtype=st.sampled_from(DTYPES), shape=st.lists(st.integers(0, 7), min_size=0, max_size=4),
       seed=st.integers(0, 2**16), transpose=st.booleans())
def test_an_exported_output_comes_back_bit_for_bit(tmp_path_factory, dtype, shape, seed, transpose):
    scratch = tmp_path_factory.mktemp("scratch")
    value = _random(dtype, tuple(shape), seed)
    if transpose and value.dim() >= 2:
        value = value.transpose(0, 1)  # not contiguous: the export takes a contiguous copy
    exports = Exports("cpu", str(scratch))
    entry, plain = exports.export([value, 3.5])
    assert plain == {"value": 3.5}
    back = import_tensor(entry["tensor"], "cpu", str(scratch / EXPORT_DIR))
    assert back.shape == value.shape and back.dtype == value.dtype
    assert bitwise_equal(back, value)
    exports.drop()
    assert not list((scratch / EXPORT_DIR).glob("*")) if (scratch / EXPORT_DIR).exists() else True


@pytest.fixture
def exported(tmp_path):
    exports = Exports("cpu", str(tmp_path))
    (entry,) = exports.export([torch.arange(12, dtype=torch.float32)])
    return tmp_path, entry["tensor"]


@pytest.mark.parametrize("forgery, message", [
    ({"path": "/etc/hostname"}, "not in the exporting worker's export directory"),
    ({"nbytes": 4 * 13}, "bytes claimed"),
    ({"shape": [13], "nbytes": 4 * 13}, "holds 48 bytes"),
    ({"dtype": "object"}, "unknown dtype"),
    ({"shape": [-1, -12]}, "malformed shape"),
    ({"via": "cuda_ipc"}, "not accepted on cpu"),
])
def test_a_forged_descriptor_is_refused_in_the_keeper(exported, forgery, message):
    scratch, desc = exported
    with pytest.raises(TransportError, match=message):
        import_tensor({**desc, **forgery}, "cpu", str(scratch / EXPORT_DIR))


def test_a_symlink_out_of_the_export_directory_is_refused(exported, tmp_path_factory):
    scratch, desc = exported
    secret = tmp_path_factory.mktemp("judge") / "secret.bin"
    secret.write_bytes(b"\0" * 48)
    link = scratch / EXPORT_DIR / "link.bin"
    os.symlink(secret, link)
    with pytest.raises(TransportError):
        import_tensor({**desc, "path": str(link)}, "cpu", str(scratch / EXPORT_DIR))


def test_outputs_of_the_wrong_shape_are_described_not_read(tmp_path):
    # a candidate claiming a huge output of the wrong shape costs the keeper nothing
    vault = Vault(None, None, "cpu", None, [1], [1.0], None, 1)
    vault.keep_reference(0, [torch.zeros(4)])
    forged = {"tensor": {"via": "file", "path": str(tmp_path / "missing.bin"), "dtype": "float32",
                         "shape": [1 << 40], "nbytes": 4 << 40}}
    (described,) = vault.adopt([forged], expect=0, allowed_dir=str(tmp_path))
    assert described["held"] is None and described["shape"] == [1 << 40]
    class NoKeeper:
        def compare(self, *args, **kwargs):
            raise AssertionError("the keeper was asked")

    held = HeldTensor(described["held"], described["shape"], described["dtype"], True, store=NoKeeper())
    expected = HeldTensor("r0.0", [4], "float32", True, store=NoKeeper())
    cmp = compare_outputs([expected], [held])
    assert not cmp.ok and "has shape" in cmp.detail  # decided here, before asking the keeper


def _pair(task: str, candidate: str) -> tuple[Task, Candidate]:
    return Task.from_file(HERE / "tasks" / f"{task}.py"), Candidate.from_file(HERE / "candidates" / f"{candidate}.py")


FORGING_CANDIDATE = '''
import core.verification.devicemem as transport

_describe = transport.Exports._describe


def _forged(self, t):
    d = _describe(self, t)
    d["path"] = "/proc/self/environ"  # the keeper's own environment, were it read
    return d


transport.Exports._describe = _forged
'''


def test_a_candidate_that_forges_its_hand_over_is_rejected_and_the_keeper_survives():
    # Two layers stand in the way: the runtime import guard refuses the judge's transport module to
    # a candidate, and were it reached anyway, the keeper refuses the forged descriptor
    # (test_a_forged_descriptor_is_refused_in_the_keeper); the verdict must name one of them.
    task, honest = _pair("vector_add", "honest_vector_add")
    source = honest.source + "\n" + FORGING_CANDIDATE  # the honest kernel, its outputs misreported
    forged = Candidate(source=source, backend=honest.backend)
    with Verifier(backend="triton", device="cpu", workers=1, timeout_s=90, compare_on_device=True,
                  checks=["correctness", "integrity"]) as v:
        verdict = v.verify(task, forged)
        after = v.verify(task, honest)
        replaced = v.reference_pool.replaced
    assert not verdict.accepted and verdict.status == "rejected", verdict.reason
    detail = verdict.checks["integrity"].detail
    assert "integrity" in verdict.hack_flags
    assert "handed over forged" in detail or "refused: importing 'core.verification.devicemem'" in detail, detail
    assert after.accepted, after.reason
    assert replaced == 0  # the keeper refused the forgery; nothing had to be restarted


def test_verdicts_and_details_agree_with_the_judge_side_comparison(monkeypatch):
    # the keeper's verdicts, whether a request's runs are handed over together or one per request (runs
    # of large outputs: core.verification.gpumemory.runs_per_request), are the judge-side comparison's
    import core.verification.pipeline as pipeline

    pairs = [_pair("vector_add", "honest_vector_add"), _pair("vector_add", "partial_write"),
             _pair("softmax", "unstable_softmax"), _pair("num_row_sumsq", "num_lost_update"),
             _pair("num_row_sumsq", "honest_num_atomic_sum"), _pair("num_exp_softplus", "num_domain_clamped_exp"),
             _pair("num_row_sum", "honest_num_autotune_many")]
    verdicts = {}
    for mode in (False, True, "one run per request"):
        if mode == "one run per request":
            monkeypatch.setattr(pipeline, "runs_per_request", lambda output_bytes: 1)
        with Verifier(backend="triton", device="cpu", workers=1, timeout_s=90, compare_on_device=bool(mode)) as v:
            verdicts[mode] = [v.verify(t, c) for t, c in pairs]
    for mode in (True, "one run per request"):
        for judge, keeper in zip(verdicts[False], verdicts[mode]):
            assert (judge.status, judge.accepted) == (keeper.status, keeper.accepted), (judge.reason, keeper.reason)
            assert judge.reason.split(":")[0] == keeper.reason.split(":")[0] if judge.reason else not keeper.reason
            assert judge.checks.keys() == keeper.checks.keys()


def test_each_verification_gets_a_keeper_and_the_cores_are_shared_with_them(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 24)
    with Verifier(backend="triton", device="cpu", workers=3, reference_workers=1, compare_on_device=True) as v:
        assert len(v.reference_pool._all) == 3  # verify_many's three verdicts at once hold one each
        assert v.pool.extra_env["OMP_NUM_THREADS"] == "4"  # 24 cores over 3 candidate workers + 3 keepers


def test_a_keeper_that_dies_while_comparing_gives_an_error_verdict_and_is_replaced(monkeypatch):
    from core.verification import judge as verify

    task, honest = _pair("vector_add", "honest_vector_add")
    compare = verify._Keeper.compare
    killed = []

    def dying(self, *args, **kwargs):
        if not killed:  # the first comparison of the run: its keeper is gone (OOM-killed, a driver fault ...)
            killed.append(self.worker.proc.pid)
            self.worker.kill()
        return compare(self, *args, **kwargs)

    monkeypatch.setattr(verify._Keeper, "compare", dying)
    with Verifier(backend="triton", device="cpu", workers=1, timeout_s=90, compare_on_device=True) as v:
        lost = v.verify(task, honest)
        after = v.verify(task, honest)
        replaced = v.reference_pool.replaced
    assert killed
    assert lost.status == "error" and not lost.accepted, lost.reason  # not the candidate's fault
    assert "keeping the outputs failed" in lost.reason
    assert after.accepted, after.reason
    assert replaced == 1


def test_a_host_tensor_from_a_gpu_worker_travels_inline_and_lands_beside_the_reference(tmp_path):
    # a task whose GPU model returns .cpu() tensors: the GPU worker cannot hand them over as IPC
    # handles; they travel as bytes and are compared where the reference's output is
    exports = Exports("cuda", str(tmp_path))
    value = torch.arange(6, dtype=torch.float32)
    (entry,) = exports.export([value])
    assert set(entry) == {"inline"} and torch.equal(entry["inline"], value)
    vault = Vault(None, None, "cpu", None, [1], [1.0], None, 1)
    vault.keep_reference(0, [value.clone()])
    (described,) = vault.adopt([entry], expect=0, allowed_dir=None)
    assert described["held"] == "c0.0"
    assert bitwise_equal(vault.tensors["c0.0"], value) and vault.tensors["c0.0"].device == value.device


@settings(max_examples=15, deadline=None)
@given(runs=st.integers(1, 7), budget_runs=st.integers(0, 3), uses=st.lists(st.integers(0, 6), max_size=12))
def test_reference_outputs_beyond_the_budget_are_computed_again_from_their_seed_bit_for_bit(runs, budget_runs, uses):
    # at real sizes a keeper holds only the most recently used reference outputs (a 141-GiB GPU cannot hold
    # 9 runs of 8-GiB outputs beside the candidate's); a dropped run comes back from its seed, unchanged
    from core.verification.inputs import draw_inputs
    from core.verification.worker.session import Float64Truth, load_module

    module = load_module(HERE / "tasks" / "softmax.py", "kz_vault_softmax")
    torch.manual_seed(0)
    model = module.Model(*module.get_init_inputs()).eval()
    seeds = list(range(100, 100 + runs))
    per_run = sum(x.numel() * x.element_size() for x in [model(*draw_inputs(module, seeds[0]))])
    vault = Vault(module, model, "cpu", Float64Truth(model, "cpu", 0), seeds, [1.0] * runs, None, runs,
                  resident_bytes=budget_runs * per_run)
    originals = []
    for run, seed in enumerate(seeds):
        with torch.no_grad():
            out = [model(*draw_inputs(module, seed))]
        originals.append([t.clone() for t in out])
        vault.keep_reference(run, out)
        held = sum(1 for k in vault.tensors if k.startswith("r"))
        assert held <= max(budget_runs, 1)  # the run just kept, and what the budget allows
    for run in [u % runs for u in uses] + list(range(runs)):
        (again,) = vault.resolve([{"held": f"r{run}.0"}])
        assert bitwise_equal(again, originals[run][0])
    assert vault.recomputed > 0 or runs <= max(budget_runs, 1)


def test_a_task_whose_forward_draws_random_numbers_keeps_every_reference_output():
    from core.verification.worker.session import Float64Truth

    model = torch.nn.Dropout(0.5)
    vault = Vault(None, model, "cpu", Float64Truth(model, "cpu", 0), [1, 2, 3], [1.0] * 3, None, 3, resident_bytes=0)
    vault.recomputable = False  # the reference role sets it when forward moved the RNG
    for run in range(3):
        vault.keep_reference(run, [torch.ones(4) * run])
    assert sorted(vault.tensors) == ["r0.0", "r1.0", "r2.0"] and vault.recomputed == 0


def test_every_built_in_check_declares_the_runs_whose_outputs_it_reads():
    # a check that declares none keeps every run's outputs held until it is evaluated (Check.reads);
    # the built-in ones declare theirs, so a verification's outputs are dropped as soon as they are judged
    from core.plugins import registry

    reg = registry("verifier")
    checks = [reg.create(name) for name in reg.names()]
    # judge-side checks are evaluated on the source, before any run
    undeclared = [c.name for c in checks if c.where != "judge" and getattr(c, "reads", None) is None]
    assert undeclared == [], undeclared


class _Keeper:
    def __init__(self):
        self.released: list[str] = []

    def release(self, items):
        self.released += [x.key for x in items]


def _held(key: str) -> HeldTensor:
    return HeldTensor(key, [4], "float32", True, None)


@pytest.mark.parametrize("pending, kept", [
    ((), set()),
    (("correctness",), {"c0.0", "c1.0"}),  # every trial
    (("determinism",), {"c0.0", "c2.0"}),  # the first trial and the repeat
    (("stability",), {"c3.0"}),
    (("undeclared",), {"c0.0", "c1.0", "c2.0", "c3.0"}),  # reads anything: nothing goes
])
def test_the_outputs_dropped_are_those_no_check_still_to_be_evaluated_reads(pending, kept):
    from types import SimpleNamespace

    from core.verification.evidence import Evidence, RunObservation, Trial
    from core.verification.pipeline import release_unread

    def trial(key):
        return Trial(0, None, [], RunObservation("run", output=[_held(key)]))

    evidence = Evidence(task=None, candidate=None, backend="triton", device="cuda")
    evidence.trials, evidence.repeat, evidence.probes = [trial("c0.0"), trial("c1.0")], [trial("c2.0")], [trial("c3.0")]
    reads = {"correctness": frozenset({"trials"}), "determinism": frozenset({"repeat", "first_trial"}),
             "stability": frozenset({"probes"}), "undeclared": None}
    checks = [SimpleNamespace(name=n, reads=r) for n, r in reads.items()]
    keeper = _Keeper()
    verification = SimpleNamespace(keeper=keeper, checks=checks, evidence=evidence, released=set(),
                                   verdict=SimpleNamespace(checks={n: True for n in reads if n not in pending}))
    release_unread(verification)
    assert set(keeper.released) == {"c0.0", "c1.0", "c2.0", "c3.0"} - kept
    release_unread(verification)  # each output is dropped once
    assert len(keeper.released) == len(set(keeper.released))


@settings(max_examples=20, deadline=None)
@given(values=st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), min_size=1, max_size=40),
       offload=st.booleans())
def test_an_offloaded_output_comes_back_bit_for_bit_and_costs_the_device_nothing_held(values, offload):
    # a lean verification (out of GPU memory with the device to itself) keeps the candidate's outputs as host
    # copies between the requests that read them; every comparison then sees the same bits on their device
    value = torch.tensor(values, dtype=torch.float32)
    vault = Vault(None, None, "cpu", None, [1], [1.0], None, 1)
    vault.keep_reference(0, [value.clone()])
    (described,) = vault.adopt([{"inline": value}], expect=0, allowed_dir=None, offload=offload)
    assert described["held"] == "c0.0" and described["finite"] == bool(torch.isfinite(value).all())
    assert ("c0.0" in vault.offloaded) == offload and vault.offload_count == int(offload)
    if offload:  # a copy of its own, not the adopted tensor
        assert vault.tensors["c0.0"].data_ptr() != value.data_ptr()
    (back,) = vault.resolve([{"held": "c0.0"}])
    assert bitwise_equal(back, value) and back.device == value.device
    freed = vault.release([{"held": "c0.0"}])
    assert freed == (0 if offload else value.numel() * 4) and "c0.0" not in vault.offloaded
    with pytest.raises(TransportError, match="released"):
        vault.resolve([{"held": "c0.0"}])

"""The kernels the Triton backend lends the judge (plugins.backends.triton_judge_kernels), run here in Triton's
interpreter. The plain bound's passes must give the chunked torch passes' answers exactly (plainly within or
not, the judged count, the largest error), for every rule (NaN and infinities in place, the RMS, peak and
per-element median scales, absolute floors) and for programs that walk many steps; a wrong region is never
plainly within. The digest's sums must be the torch path's 128 bits, so the reference's and the candidate's
processes agree whichever path each takes. On a GPU the same tests run the compiled kernels on the device."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from core.verification import devicekernels, digests
from core.verification.digests import device_fingerprint
from core.verification.evidence import _floor_of, tolerance
from core.verification.plainbound import within_plain_bound
from plugins.backends import triton_judge_kernels
from plugins.backends.triton_backend import TritonBackend

KERNELS = triton_judge_kernels.TritonJudgeKernels()

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # inf - inf

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU runs the kernels in Triton's interpreter


@pytest.fixture(autouse=True)
def _no_fallback():
    # on a GPU a kernel that cannot build falls back to torch (the answers still agree): that must fail here
    yield
    assert not devicekernels._broken, devicekernels._broken


def judge(e, g, *, fused, **options):
    e, g = e.to(DEVICE), g.to(DEVICE)
    floor, rtol = tolerance(str(e.dtype))
    return within_plain_bound(e, g, floor, rtol, lambda s: _floor_of(e.dtype, floor, s), chunk=257, fused=fused,
                              **options)


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(DTYPES), n=st.integers(1, 5000), seed=st.integers(0, 2**31 - 1),
       noise=st.sampled_from([0.0, 1e-7, 1e-5, 1e-3, 1.0]), specials=st.booleans(), misplaced=st.booleans(),
       scale_aware=st.sampled_from([False, True, "median"]), absolute=st.booleans(), programs=st.integers(1, 9))
def test_the_fused_passes_answer_as_the_chunked_torch_passes(dtype, n, seed, noise, specials, misplaced, scale_aware,
                                                            absolute, programs):
    gen = torch.Generator().manual_seed(seed)
    e = (torch.randn(n, generator=gen, dtype=torch.float64) * 10 ** torch.randint(-3, 4, (n,), generator=gen)).to(dtype)
    g = (e.to(torch.float64) * (1 + noise * torch.randn(n, generator=gen, dtype=torch.float64))).to(dtype)
    if specials and n >= 4:
        for i, v in ((0, math.nan), (n // 2, math.inf), (n - 1, -math.inf)):
            e[i] = g[i] = v
    if misplaced and n >= 4:
        g[n // 3] = math.nan if not scale_aware else math.inf
    options = {"scale_aware": scale_aware, "absolute": absolute and not scale_aware}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(triton_judge_kernels, "MAX_PROGRAMS", programs)  # few programs: each walks many steps
        fast = judge(e, g, fused=True, **options)
    torch_path = judge(e, g, fused=False, **options)
    assert (fast is None) == (torch_path is None)
    if fast is not None:
        assert (fast.judged, fast.max_abs_err) == (torch_path.judged, torch_path.max_abs_err)
        assert fast.max_rel_err == pytest.approx(torch_path.max_rel_err, rel=1e-6)


@pytest.mark.parametrize("median", [None, 0.37])
def test_elements_at_the_bound_are_counted_as_torch_rounds_it(median):
    # thousands of elements within a few float32 steps of the bound, either side: the fused count is torch's
    gen = torch.Generator().manual_seed(1)
    e = torch.randn(20_000, generator=gen)
    floor, rtol, atol = 1e-4, 1e-4, 3.1e-4
    ref = e.abs()
    if median is None:
        bound = atol + rtol * ref
    else:
        bound = (floor * ref.clamp_min(median)).clamp_min(torch.finfo(torch.float32).tiny) + rtol * ref
    steps = torch.randint(-3, 4, e.shape, generator=gen).float()
    g = e + torch.sign(torch.randn(e.shape, generator=gen)) * bound * (1 + steps * 2.0 ** -23)
    expected = int(((e - g).abs() > bound).sum())
    assert 0 < expected < e.numel()
    tiny = torch.finfo(torch.float32).tiny
    e, g = e.to(DEVICE), g.to(DEVICE)
    assert KERNELS.bound_exceeding(e, g, rtol=rtol, atol=atol, floor=floor, tiny=tiny, median=median) == expected


def test_a_wrong_region_is_never_plainly_within():
    e = torch.randn(1 << 13)
    g = e.clone()
    g[100:140] += 1.0
    e, g = e.to(DEVICE), g.to(DEVICE)
    assert KERNELS.bound_exceeding(e, g, rtol=1e-4, atol=1e-4) == 40
    assert judge(e, g, fused=True) is None


def test_the_statistics_of_one_pass():
    e = torch.tensor([1.0, -2.0, math.nan, math.inf, 0.0, 4.0])
    g = torch.tensor([1.5, -2.0, math.nan, math.inf, 0.0, 4.0])
    e, g = e.to(DEVICE), g.to(DEVICE)
    found = KERNELS.bound_stats(e, g, False)
    assert (found.out_of_place, found.judged, found.peak, found.least) == (0, 4, 4.0, 0.0)
    assert (found.max_abs_err, found.max_rel_err, found.sum_of_squares) == (0.5, 0.5, 21.0)
    g[3] = -math.inf  # an infinity of the other sign is out of place
    assert KERNELS.bound_stats(e, g, False).out_of_place == 1
    g[3], g[2] = math.inf, 1.0  # a number where the reference is NaN
    assert KERNELS.bound_stats(e, g, False).out_of_place == 1
    assert KERNELS.bound_stats(e, g, True).out_of_place == 0  # probes judge where the reference is finite
    assert KERNELS.count_at_most(e, 1.0) == 2  # |1|, |0|: NaN and infinity never count


def test_the_engine_finds_the_kernels_through_the_backend_and_uses_them_on_cuda_outputs_only():
    from core.verification.plainbound import _lent_kernels

    assert TritonBackend.judge_kernels("cuda") is not None  # the optional member, read from the class
    devicekernels._found.clear()
    assert isinstance(devicekernels.judge_kernels("cuda"), triton_judge_kernels.TritonJudgeKernels)
    e = torch.randn(8, 8)
    assert _lent_kernels(e, e, None) is None  # a CPU output: the chunked torch passes judge
    assert _lent_kernels(e.double(), e.double(), True) is None  # float64: torch, in float64
    if DEVICE == "cuda":
        assert _lent_kernels(e.cuda(), e.cuda(), None) is not None
        assert _lent_kernels(e, e, True) is None  # compiled kernels take CUDA tensors only
    else:
        assert _lent_kernels(e, e, True) is not None  # forced (tests): the interpreter runs them here


def fused_fingerprint(words):
    sums = KERNELS.fingerprint_sums(words, tuple(digests._lane_offset(j) for j in range(2)),
                                    (digests._MIX1, digests._MIX2))
    return "fp:" + "".join(f"{int(x) & 0xFFFFFFFFFFFFFFFF:016x}" for x in sums.tolist())


@settings(max_examples=40, deadline=None)
@given(words=st.integers(1, 3000), seed=st.integers(0, 2**31 - 1), position=st.integers(0, 2**31),
       bit=st.integers(0, 63), programs=st.integers(1, 7))
def test_the_digest_kernel_gives_the_torch_paths_fingerprint_and_sees_every_bit(words, seed, position, bit, programs):
    x = torch.randint(-2**63, 2**63 - 1, (words,), dtype=torch.int64, generator=torch.Generator().manual_seed(seed))
    y = x.clone()
    y[position % words] ^= 1 << bit if bit < 63 else -(1 << 63)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(triton_judge_kernels, "MAX_PROGRAMS", programs)  # few programs: each walks many steps
        patch.setattr(triton_judge_kernels, "FINGERPRINT_BLOCK", 64)
        fused_x, fused_y = fused_fingerprint(x.to(DEVICE)), fused_fingerprint(y.to(DEVICE))
    assert fused_x == device_fingerprint(x.view(torch.uint8))  # the torch path, on the CPU
    assert fused_y == device_fingerprint(y.view(torch.uint8)) != fused_x


def test_the_fingerprint_weights_are_odd_and_differ_by_index_and_lane():
    index = torch.arange(0, 10_000, dtype=torch.int64)
    w0, w1 = digests.fingerprint_weight(index, 0), digests.fingerprint_weight(index, 1)
    assert bool((w0 & 1).all()) and bool((w1 & 1).all())
    assert w0.unique().numel() == index.numel() and not bool((w0 == w1).any())


@pytest.mark.skipif(DEVICE != "cuda", reason="the device's digest by the lent kernel against the CPU's")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.uint8])
def test_the_devices_digest_is_the_cpus(dtype):
    x = (torch.randn(3 * 1024 * 1024 + 8) * 100).to(dtype)
    assert device_fingerprint(x.cuda()) == device_fingerprint(x)
    assert not devicekernels._broken


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(DTYPES), n=st.integers(1, 3000), seed=st.integers(0, 2**31 - 1),
       noise=st.sampled_from([1e-7, 1e-4, 1e-2]), outliers=st.integers(0, 30), region=st.booleans(),
       specials=st.sampled_from(["none", "matching", "misplaced"]), scale_aware=st.sampled_from([False, True, "median"]),
       reruns=st.integers(0, 2))
def test_the_large_comparison_reaches_the_torch_paths_verdict_with_the_lent_figures(
        dtype, n, seed, noise, outliers, region, specials, scale_aware, reruns):
    # an output that missed the plain bound: its statistics, median, scale and count beyond the bound by the
    # kernels, the outliers rule by torch; the verdict, words and figures are the torch path's
    from core.verification.largecompare import compare_large

    gen = torch.Generator().manual_seed(seed)
    e64 = torch.randn(n, generator=gen, dtype=torch.float64) * 10 ** torch.randint(-2, 3, (n,), generator=gen)
    e = e64.to(dtype)
    g = (e64 * (1 + noise * torch.randn(n, generator=gen, dtype=torch.float64))).to(dtype)
    scattered = torch.randint(0, n, (outliers,), generator=gen).tolist()
    for k in scattered:
        g[k] = g[k] * 1.01 + 1e-3
    if region and n >= 8:
        g[n // 4:n // 4 + max(2, n // 8)] += 1.0
    if specials != "none" and n >= 4:
        e[2] = g[2] = math.inf
        g[1] = math.nan if specials == "misplaced" and not scale_aware else g[1]
        e[1] = math.nan if specials == "matching" else e[1]
        g[1] = math.nan if specials == "matching" else g[1]
    runs = [(e64 * (1 + 1e-6 * torch.randn(n, generator=gen, dtype=torch.float64))).to(dtype) for _ in range(reruns)]
    e, g, runs = e.to(DEVICE), g.to(DEVICE), [r.to(DEVICE) for r in runs]
    floor, rtol = tolerance(str(dtype))

    def judge(fused):
        return compare_large(e, g, "output", floor, rtol, lambda s: _floor_of(dtype, floor, s), scale_aware=scale_aware,
                             absolute=False, noise_factor=10.0, truth_of=lambda: None,
                             reruns_of=(lambda: runs) if reruns else None, chunk=257, fused=fused)

    lent, torch_path = judge(True), judge(False)
    assert (lent is None) == (torch_path is None)
    if lent is not None:
        assert (lent.detail, lent.judged, lent.max_abs_err, lent.outliers, lent.outlier_positions, lent.band) == \
            (torch_path.detail, torch_path.judged, torch_path.max_abs_err, torch_path.outliers,
             torch_path.outlier_positions, torch_path.band)
        assert lent.max_rel_err == pytest.approx(torch_path.max_rel_err, rel=1e-6)


def test_the_verdict_names_what_compared_its_large_outputs(monkeypatch):
    monkeypatch.setattr(devicekernels, "_found", {"cuda": KERNELS})
    assert devicekernels.in_use() == "TritonJudgeKernels"
    monkeypatch.setattr(devicekernels, "_found", {})
    assert devicekernels.in_use() == "torch"  # none lent, or no large output compared yet
    monkeypatch.setattr(devicekernels, "_broken", ["CompilationError: ptxas"])
    assert devicekernels.in_use() == "torch (the lent kernels failed: CompilationError: ptxas)"
    monkeypatch.setattr(devicekernels, "_broken", [])

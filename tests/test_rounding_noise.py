"""Monte Carlo arithmetic (core.verification.worker.rounding): what fp32 rounding can do to a task's
outputs, measured on the task itself in the reference worker."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from core.verification.worker.rounding import rounding_mode, rounding_noise, unit_roundoff

FP32 = 2.0 ** -24


def _noise(fn, *inputs, unit=FP32, seed=0):
    wide = [x.double() for x in inputs]
    truth = [fn(*wide)]
    return rounding_noise(lambda: [fn(*wide)], truth, unit, "cpu", seed=seed)[0], truth[0]


def test_exact_data_movement_carries_no_noise():
    x = torch.randn(64, 33)
    for fn in (lambda a: a.clone(), lambda a: torch.relu(a), lambda a: a.t().contiguous(),
               lambda a: torch.cat([a, a]), lambda a: a.amax(-1), lambda a: a[:, 3:9]):
        noise, _ = _noise(fn, x)
        assert noise == 0.0


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 256), scale=st.floats(1e-6, 1e6), seed=st.integers(0, 2**31 - 1))
def test_one_rounded_op_moves_each_value_by_at_most_the_unit_roundoff(n, scale, seed):
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * scale
    noise, truth = _noise(lambda a: a * 3.0, x, seed=seed)
    assert noise <= FP32 * float(truth.abs().max()) * (1 + 1e-9)


def test_the_noise_is_what_fp32_does_to_an_ill_conditioned_composition():
    """layer_norm(x + 1) with x ~ 1e-8: fp32 keeps no digit of x, and the normalisation amplifies
    the rounding of "+ 1" by 1/sqrt(eps): the noise is that large, and comparable to an fp32 run's."""
    x = torch.randn(8, 64) * 1e-8 + 2.7e-7

    def task(a):
        return torch.nn.functional.layer_norm(a + 1.0, (64,), eps=1e-5)

    noise, truth = _noise(task, x)
    two_pass = (x + 1.0) - (x + 1.0).flip(-1).sum(-1, keepdim=True) / 64  # fp32, another order
    fp32_err = float((two_pass / (1e-5) ** 0.5 - truth).abs().max())
    assert 1e-6 < noise < 1e-3
    assert noise > fp32_err / 16  # the kernel's error is within REFERENCE_NOISE_FACTOR of it


def test_the_task_rng_is_untouched_and_the_draw_repeats():
    x = torch.randn(16, 16)
    state = torch.get_rng_state()
    first, _ = _noise(lambda a: (a @ a).softmax(-1), x, seed=3)
    assert torch.equal(state, torch.get_rng_state())
    again, _ = _noise(lambda a: (a @ a).softmax(-1), x, seed=3)
    assert first == again > 0.0


def test_the_unit_is_the_most_precise_narrow_output_and_none_for_float64():
    assert unit_roundoff([torch.zeros(2, dtype=torch.float16), torch.zeros(2)]) == FP32
    assert unit_roundoff([torch.zeros(2, dtype=torch.bfloat16)]) == 2.0 ** -8
    assert unit_roundoff([torch.zeros(2, dtype=torch.float64), 3]) is None


def test_an_output_without_truth_or_finite_run_has_no_estimate():
    x = torch.tensor([1.0, 2.0], dtype=torch.float64)
    assert rounding_noise(lambda: [x * 2, x * 2], [None, x * 2], FP32, "cpu")[0] is None
    truth = [torch.tensor([1e308, 1.0], dtype=torch.float64)]
    assert rounding_noise(lambda: [truth[0] * 2.0], truth, FP32, "cpu") == [None]  # overflows where the truth did not



def test_one_element_jumping_at_a_discontinuity_widens_nothing():
    """floor(2x) at x = 0.5 sits on a step: a perturbed 1.0 floors to 0 half the time. One element
    out of many jumping by a whole step must not buy every element a whole step of allowance."""
    x = torch.rand(256, generator=torch.Generator().manual_seed(0)) * 0.4  # 2x in [0, 0.8): floor 0
    x[17] = 0.5
    jumps = 0
    for seed in range(8):
        with torch.no_grad(), rounding_mode(FP32, torch.Generator().manual_seed(seed)):
            jumps += int(torch.floor(x.double() * 2.0)[17] == 0.0)
        noise, _ = _noise(lambda a: torch.floor(a * 2.0), x, seed=seed)
        assert noise == 0.0
    assert jumps > 0  # the step was crossed, and bought no allowance


def test_noise_that_moves_most_elements_is_counted():
    x = torch.randn(8, 64) * 1e-8 + 2.7e-7
    noise, _ = _noise(lambda a: torch.nn.functional.layer_norm(a + 1.0, (64,), eps=1e-5), x)
    assert noise > 1e-6


class _RoundingOracle:
    """Which ATen ops a task's float64 run calls, and which of them round: each call is repeated on its
    float64 inputs jittered within an fp32 ulp (so they are no longer fp32 numbers), once in float64 and
    once on those inputs rounded to fp32. An exact op (a copy, max, relu) commutes with rounding to fp32,
    so the two agree bit for bit; an op that rounds disagrees somewhere (a multiply by a power of two
    may not, so one disagreeing call is enough)."""

    def __init__(self):
        self.calls: dict[str, int] = {}
        self.rounded: set[str] = set()
        self.generator = torch.Generator().manual_seed(0)

    def mode(self):
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten, tree_map

        from core.verification.worker.rounding import _fresh_result

        oracle = self

        def jitter(t):
            if isinstance(t, torch.Tensor) and t.dtype == torch.float64 and t.numel():
                return t * (1 + (torch.rand(t.shape, generator=oracle.generator, dtype=torch.float64) - 0.5) * 2.0 ** -23)
            return t

        def narrow(t):
            return t.to(torch.float32) if isinstance(t, torch.Tensor) and t.dtype == torch.float64 else t

        class Record(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                out = func(*args, **kwargs)
                if not _fresh_result(func):  # the same calls the rounding mode considers
                    return out
                if not any(isinstance(t, torch.Tensor) and t.dtype == torch.float64 for t in tree_flatten(out)[0]):
                    return out
                name = func.overloadpacket.__name__
                oracle.calls[name] = oracle.calls.get(name, 0) + 1
                wide_args, wide_kwargs = tree_map(jitter, args), tree_map(jitter, kwargs)
                wide = tree_flatten(func(*wide_args, **wide_kwargs))[0]
                narrowed = tree_flatten(func(*tree_map(narrow, wide_args), **tree_map(narrow, wide_kwargs)))[0]
                for w, n in zip(wide, narrowed):
                    if isinstance(w, torch.Tensor) and w.dtype == torch.float64 and isinstance(n, torch.Tensor):
                        r = w.to(torch.float32)
                        if not bool(((r == n) | (r.isnan() & n.isnan())).all()):
                            oracle.rounded.add(name)
                return out

        return Record()


def test_the_ops_that_get_noise_are_exactly_those_that_round_in_every_catalog_task():
    # _ROUNDING is an allow-list: a rounding op missing from it gets no noise (the lucky-rounding false
    # rejection comes back for its tasks), an exact op on it would widen acceptance. Every catalog op's
    # tasks, alone and in chains, must sort into the two the way the oracle does.
    from core.contracts import CurriculumState
    from core.plugins import registry
    from core.verification.worker.rounding import _ROUNDING
    from core.verification.worker.session import float64_copies
    from plugins.proposers.validate import load_module

    ops = sorted(registry("op").names())
    tasks = []
    for op in ops:
        proposer = registry("proposer").create("random", seed=1, min_ops=1, max_ops=1)
        tasks += proposer.propose(2, CurriculumState(max_tier=9, allowed_ops=[op]))
    tasks += registry("proposer").create("random", seed=3).propose(80, CurriculumState(max_tier=3))
    oracle = _RoundingOracle()
    for i, task in enumerate(tasks):
        module = load_module(task.source)
        torch.manual_seed(i)
        model = module.Model(*module.get_init_inputs()).double()
        with torch.no_grad(), oracle.mode():
            model(*float64_copies(module.get_inputs()))
    assert len(oracle.calls) >= 40, sorted(oracle.calls)  # the catalog's tasks call a broad set of ATen ops
    missing = sorted(oracle.rounded - _ROUNDING)
    assert not missing, f"ops that round but get no noise: {missing}"
    exact = sorted(set(oracle.calls) - oracle.rounded)
    assert not set(exact) & _ROUNDING, f"ops that never rounded yet get noise: {sorted(set(exact) & _ROUNDING)}"
    assert {"relu", "where", "flip", "amax"} <= set(exact)  # the oracle sees exact ops as exact

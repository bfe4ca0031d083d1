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

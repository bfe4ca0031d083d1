"""How far rounding at the task's own precision can move its outputs: Monte Carlo arithmetic.

An output is judged against the float64 truth within ``REFERENCE_NOISE_FACTOR`` x the fp32
reference's own error against that truth. That error is one sample of fp32 rounding, and it can be a
lucky one: a row that fp32 rounds to a constant (``x * 1e-8 + 1``) has an exact mean and variance in
PyTorch's Welford pass, so the reference is off by the truth's own tiny size, while an honest
two-pass kernel whose partial sums round is 100x further off, through no fault of its own.

Monte Carlo arithmetic (Parker, 1997; Verificarlo) measures what rounding does to *this computation*
instead: the task runs in float64 with every floating output of every ATen op multiplied by
``1 + d``, ``d`` uniform in ``[-u, u]``, ``u`` the narrow dtype's unit roundoff (2^-24 for fp32).
Its distance from the truth is the noise any fp32 evaluation of the task may carry, whatever order
it rounds in. It runs in the reference worker only, on the trusted task, never on a candidate.

Only ops known to round (:data:`_ROUNDING`, an allow-list) are perturbed: noise on an exact op (a
copy, a view, an in-place or out= form, indexing, a constructor, max, relu) would widen acceptance
beyond what rounding can do, and an op not on the list is treated as exact (no noise: the narrower
allowance).

The figure per output is a high quantile (:data:`NOISE_QUANTILE`) of the elements' distances, not
their maximum: behind a discontinuity (``floor``, a comparison, an argmax) one perturbed element may
jump by a whole step, and the allowance is applied to every element of the output. Ill-conditioning
that rounding really drives moves most elements (a constant row's normalisation moves all of them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# ATen ops whose floating outputs are freshly rounded results (matched on the overload packet's name).
# An allow-list: an op missing here is treated as exact and gets no noise, so the judge falls back to the
# fp32 reference's own error, never to a wider allowance. tests/test_rounding_noise.py checks it against
# every catalog op's task with a rounding oracle (inputs jittered within an fp32 ulp, fp32 against float64).
_ROUNDING = frozenset({
    # arithmetic and elementwise functions
    "add", "sub", "rsub", "mul", "div", "pow", "reciprocal", "sqrt", "rsqrt", "exp", "exp2", "expm1", "log",
    "log1p", "log2", "log10", "sin", "cos", "tan", "sinh", "cosh", "tanh", "asin", "acos", "atan", "atan2",
    "erf", "erfc", "erfinv", "sigmoid", "logit", "addcmul", "addcdiv", "lerp", "hypot", "xlogy",
    # activations
    "gelu", "silu", "mish", "softplus", "elu", "selu", "celu", "leaky_relu", "hardsigmoid", "hardswish",
    "log_sigmoid_forward", "softshrink", "prelu", "_prelu_kernel", "glu",
    # contractions and convolutions
    "mm", "bmm", "addmm", "addbmm", "baddbmm", "matmul", "dot", "vdot", "mv", "addmv", "linear", "einsum",
    "convolution", "_convolution", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
    "conv_transpose3d", "mkldnn_convolution", "cudnn_convolution", "cudnn_convolution_transpose",
    "_slow_conv2d_forward", "slow_conv3d_forward", "slow_conv_transpose2d", "slow_conv_transpose3d",
    "_cdist_forward", "cdist",
    # reductions, scans and normalisations
    "sum", "mean", "prod", "var", "std", "var_mean", "std_mean", "norm", "linalg_vector_norm", "cumsum",
    "cumprod", "logsumexp", "logcumsumexp", "_softmax", "_log_softmax", "_safe_softmax", "native_layer_norm",
    "native_group_norm", "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
    "_batch_norm_impl_index", "native_dropout", "rms_norm", "_fused_rms_norm",
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_attention_math", "avg_pool1d", "avg_pool2d", "avg_pool3d", "_adaptive_avg_pool2d",
    "_adaptive_avg_pool3d", "adaptive_avg_pool1d", "upsample_bilinear2d", "upsample_bicubic2d",
    "upsample_linear1d", "upsample_trilinear3d", "grid_sampler_2d",
    # losses and distances
    "smooth_l1_loss", "mse_loss", "l1_loss", "huber_loss", "binary_cross_entropy",
    "binary_cross_entropy_with_logits", "nll_loss_forward", "nll_loss2d_forward", "kl_div", "cosine_similarity",
    "_pdist_forward", "pairwise_distance", "cosine_embedding_loss", "margin_ranking_loss", "soft_margin_loss",
})

NOISE_QUANTILE = 0.9
UNIT_ROUNDOFF = {"float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}


def unit_roundoff(outputs: list[Any]) -> float | None:
    """The unit roundoff of the narrowest-but-most-precise floating output dtype (float64 only: None)."""
    import torch

    units = [UNIT_ROUNDOFF[str(t.dtype).replace("torch.", "")] for t in outputs
             if isinstance(t, torch.Tensor) and str(t.dtype).replace("torch.", "") in UNIT_ROUNDOFF]
    return min(units) if units else None


def _fresh_result(func: Any) -> bool:
    """Whether ``func`` returns new tensors: not a view or alias of its inputs, not an in-place form."""
    schema = func._schema
    return not (any(r.alias_info is not None for r in schema.returns) or schema.is_mutable)


def _rounds(func: Any) -> bool:
    """Whether ``func``'s floating outputs are fresh rounded results (not aliases or exact moves)."""
    return _fresh_result(func) and func.overloadpacket.__name__ in _ROUNDING


# Activations that are formulas of rounded steps, run as PyTorch's own decomposition (``torch._decomp``)
# wherever rounding is moved, so that each step is moved rather than only the result. GELU is
# ``0.5 x (1 + erf(x / sqrt 2))``: below x = -3 the sum ``1 + erf`` cancels, and an erf rounded an ulp
# elsewhere (as every kernel that writes the formula may round it) moves the output by ~1e-7 |x| / 2, up
# to all of an output that is ~0; moving GELU's result by an ulp moves it by nothing there.
_DECOMPOSED = ("gelu", "silu", "mish", "softplus", "elu", "selu", "celu", "hardswish", "log_sigmoid_forward",
               "glu", "logit")
# those whose one output is their first argument's shape, each element a function of its own: run by chunks
ELEMENTWISE_DECOMPOSED = frozenset(_DECOMPOSED) - {"log_sigmoid_forward", "glu"}


def decompositions() -> dict[Any, Callable[..., Any]]:
    """{ATen overload: PyTorch's decomposition} of the :data:`_DECOMPOSED` activations this torch has."""
    import torch
    from torch._decomp import decomposition_table

    found = {}
    for name in _DECOMPOSED:
        packet = getattr(torch.ops.aten, name, None)
        overload = getattr(packet, "default", None) if packet is not None else None
        if overload is not None and overload in decomposition_table:
            found[overload] = decomposition_table[overload]
    return found


def rounding_mode(unit: float, generator: Any) -> Any:
    """A dispatch mode perturbing every rounded op's float64 outputs by a relative ``[-unit, unit]``."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_map

    class RoundingNoise(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not _rounds(func):
                return out

            def perturb(t: Any) -> Any:
                if isinstance(t, torch.Tensor) and t.dtype == torch.float64 and t.numel():
                    d = torch.rand(t.shape, generator=generator, dtype=torch.float64, device=t.device)
                    return t * d.mul_(2.0 * unit).add_(1.0 - unit)
                return t

            return tree_map(perturb, out)

    return RoundingNoise()


def rounding_noise(run: Callable[[], list[Any]], truth: list[Any | None], unit: float, device: str,
                   seed: int = 0) -> list[float | None]:
    """Per output, the :data:`NOISE_QUANTILE` quantile of the distances from ``truth`` of one Monte
    Carlo arithmetic run of ``run`` (the float64 task on its float64 inputs, returning its flattened
    outputs) at unit roundoff ``unit``; None where an output has no truth or the run is not finite
    where the truth is."""
    import torch

    from core.verification.selection import quantile

    generator = torch.Generator(device=device)
    generator.manual_seed(seed)  # its own stream: the task's global RNG state is not touched
    with torch.no_grad(), rounding_mode(unit, generator):
        noisy = run()
    noise: list[float | None] = []
    for t, n in zip(truth, noisy):
        if not (isinstance(t, torch.Tensor) and isinstance(n, torch.Tensor) and n.shape == t.shape):
            noise.append(None)
            continue
        finite = torch.isfinite(t)
        if not bool(torch.isfinite(n)[finite].all()):
            noise.append(None)
            continue
        noise.append(quantile((n.to(torch.float64)[finite] - t[finite]).abs(), NOISE_QUANTILE))
    return noise + [None] * (len(truth) - len(noise))



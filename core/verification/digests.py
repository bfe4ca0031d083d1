"""Digests of a verification's inputs: two workers that drew the same inputs report the same digests,
so the judge can tell the reference's inputs (and inputs left unchanged by forward) from others without
moving the tensors (:func:`core.verification.evidence.inputs_intact`)."""

from __future__ import annotations

import hashlib
from typing import Any

from core.verification.devicekernels import (  # loaded with the harness: its state is recorded
    judge_kernels,
    lent_or_none,
)


def element_bytes(t: Any) -> Any:
    """Every element's bytes in logical order, as a 1-D uint8 tensor. A fresh standard layout first:
    ``contiguous()`` keeps odd strides on size-1 dims, which a byte view refuses."""
    import torch

    flat = t.detach().reshape(-1)
    if flat.stride() != (1,):
        flat = torch.empty(t.shape, dtype=t.dtype, device=t.device).copy_(t.detach()).reshape(-1)
    return flat.view(torch.uint8)


def input_digests(values: list[Any], *, fingerprint: bool | None = None) -> list[str]:
    """One digest per input: dtype, shape, strides, offset and every element's bytes (tensors), or
    the repr of a plain value. Two workers that drew the same inputs report the same digests.

    A tensor on a GPU is digested where it lives (:func:`device_fingerprint`, ~1 ms for 100 MB)
    instead of being copied to the host and hashed there (~0.1 s each, four times a run); a CPU
    tensor gets sha256. ``fingerprint`` forces one or the other (tests)."""
    import torch

    out = []
    for v in values:
        if not isinstance(v, torch.Tensor):
            out.append(f"py:{type(v).__name__}:{v!r}")
            continue
        layout = f"{v.dtype}|{tuple(v.shape)}|{v.stride()}|{v.storage_offset()}"
        if fingerprint if fingerprint is not None else v.device.type != "cpu":
            out.append(f"{layout}|{device_fingerprint(v)}")
            continue
        # sha256: with the SHA extensions of current x86 CPUs, 100 MB in ~60 ms against blake2b's ~150
        # (benchmarks/judge_bench.py)
        h = hashlib.sha256()
        h.update(layout.encode())
        if v.numel():
            h.update(memoryview(element_bytes(v.detach().to("cpu")).numpy()))
        out.append(h.hexdigest())
    return out


# Words fingerprinted per step of the torch path: its weights and products take 4x this in bytes (512 MiB),
# whatever the tensor's size.
FINGERPRINT_CHUNK_WORDS = 1 << 24
# splitmix64's constants as signed 64-bit integers (the arithmetic wraps mod 2^64 either way)
_GOLDEN, _MIX1, _MIX2 = -7046029254386353131, -4658895280553007687, -7723592293110705685
_LANES = 2  # sums, each with its own weights: 128 bits


def _wrap(value: int) -> int:
    """``value`` mod 2^64 as a signed 64-bit integer."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def _lane_offset(lane: int) -> int:
    return _wrap((lane + 1) * _GOLDEN)


def fingerprint_weight(index: Any, lane: int) -> Any:
    """The fixed odd pseudo-random weight of each word index (int64 tensor) in ``lane``: splitmix64 of the
    index, so any process and device computes the same weights without storing them (an odd weight keeps
    every bit of its word)."""

    def shr(z: Any, bits: int) -> Any:  # a logical shift of int64 (torch's >> keeps the sign)
        return (z >> bits) & ((1 << (64 - bits)) - 1)

    z = index + _lane_offset(lane)
    z = (z ^ shr(z, 30)) * _MIX1
    z = (z ^ shr(z, 27)) * _MIX2
    return (z ^ shr(z, 31)) | 1


def device_fingerprint(t: Any) -> str:
    """128 bits that see every byte of ``t``, computed on its device: the tensor's bytes as 64-bit
    words (the last one zero-padded), two sums of word x fixed odd pseudo-random weight (:func:`_weights`
    of the word's index), mod 2^64 (an odd weight keeps every word's every bit; integer sums do not depend
    on the reduction's order, so any two processes agree). On CUDA a kernel a backend lends
    (:mod:`core.verification.devicekernels`) reads the words once and makes the weights in registers; else
    torch computes the same sums, a chunk of :data:`FINGERPRINT_CHUNK_WORDS` words at a time. Not a cryptographic hash, and it need not be one:
    digests are reported by the candidate's process either way (:func:`inputs_intact`); it must only tell
    honest inputs apart from changed ones."""
    import torch

    flat = element_bytes(t.detach())
    n = flat.numel()
    sums = _lent_sums(flat) if flat.is_cuda and n % 8 == 0 and flat.storage_offset() % 8 == 0 else None
    if sums is None:
        sums = torch.zeros(_LANES, dtype=torch.int64, device=flat.device)
        step = 8 * FINGERPRINT_CHUNK_WORDS
        for begin in range(0, n, step):
            part = flat[begin:begin + step]
            if part.numel() % 8:
                part = torch.cat([part, part.new_zeros(8 - part.numel() % 8)])
            elif part.storage_offset() % 8:
                # a view that starts mid-word (an fp32 tensor sliced by one element: the adversarial offset
                # probe) cannot be viewed as 64-bit words where it lies; a copy of the chunk starts its own storage
                part = part.clone()
            words = part.view(torch.int64)
            index = torch.arange(begin // 8, begin // 8 + words.numel(), dtype=torch.int64, device=words.device)
            for lane in range(_LANES):
                sums[lane] += (words * fingerprint_weight(index, lane)).sum()  # wraps mod 2^64
    return "fp:" + "".join(f"{int(x) & 0xFFFFFFFFFFFFFFFF:016x}" for x in sums.tolist())


def _lent_sums(flat: Any) -> Any:
    """The weighted sums by a lent kernel (one read of the words), or None (then torch's)."""
    import torch

    kernels = judge_kernels(flat.device.type)
    if kernels is None:
        return None
    return lent_or_none(lambda: kernels.fingerprint_sums(flat.view(torch.int64),
                                                         tuple(_lane_offset(j) for j in range(_LANES)), (_MIX1, _MIX2)),
                        flat.device.type)

"""Digests of a verification's inputs: two workers that drew the same inputs report the same digests,
so the judge can tell the reference's inputs (and inputs left unchanged by forward) from others without
moving the tensors (:func:`core.verification.evidence.inputs_intact`)."""

from __future__ import annotations

import hashlib
from typing import Any


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


# Words fingerprinted per step: the weights and the products of one step take 4x this in bytes (512 MiB),
# whatever the tensor's size. Weights for all of an 8-GiB input at once took 32 GiB of the GPU.
FINGERPRINT_CHUNK_WORDS = 1 << 24
_WEIGHTS: dict[tuple[int, int, str], Any] = {}  # a few chunks' weights kept, by (chunk, words, device)


def _weights(chunk: int, words: int, device: Any) -> Any:
    """The fixed odd pseudo-random weights of words ``chunk * FINGERPRINT_CHUNK_WORDS + [0, words)``."""
    import torch

    key = (chunk, words, str(device))
    weights = _WEIGHTS.get(key)
    if weights is None:
        if len(_WEIGHTS) >= 4:
            _WEIGHTS.pop(next(iter(_WEIGHTS)))
        g = torch.Generator(device=device).manual_seed(0x6B7A + chunk)
        weights = torch.randint(-(2**63), 2**63 - 1, (2, FINGERPRINT_CHUNK_WORDS), generator=g, dtype=torch.int64,
                                device=device)[:, :words] | 1
        _WEIGHTS[key] = weights
    return weights


def device_fingerprint(t: Any) -> str:
    """128 bits that see every byte of ``t``, computed on its device: the tensor's bytes as 64-bit
    words (the last one zero-padded), two sums of word x fixed odd pseudo-random weight, mod 2^64 (an
    odd weight keeps every word's every bit; integer sums do not depend on the reduction's order, so
    any two processes agree), a chunk of :data:`FINGERPRINT_CHUNK_WORDS` words at a time. Not a
    cryptographic hash, and it need not be one: digests are reported by the candidate's process
    either way (:func:`inputs_intact`); it must only tell honest inputs apart from changed ones."""
    import torch

    flat = element_bytes(t.detach())
    n = flat.numel()
    sums = torch.zeros(2, dtype=torch.int64, device=flat.device)
    step = 8 * FINGERPRINT_CHUNK_WORDS
    for chunk, begin in enumerate(range(0, n, step)):
        part = flat[begin:begin + step]
        if part.numel() % 8:
            part = torch.cat([part, part.new_zeros(8 - part.numel() % 8)])
        elif part.storage_offset() % 8:
            # a view that starts mid-word (an fp32 tensor sliced by one element: the adversarial offset
            # probe) cannot be viewed as 64-bit words where it lies; a copy of the chunk starts its own storage
            part = part.clone()
        words = part.view(torch.int64)
        sums += (words.unsqueeze(0) * _weights(chunk, words.numel(), words.device)).sum(dim=1)  # wraps mod 2^64
    return "fp:" + "".join(f"{int(x) & 0xFFFFFFFFFFFFFFFF:016x}" for x in sums.tolist())

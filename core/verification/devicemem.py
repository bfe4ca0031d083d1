"""Outputs that stay where they were computed: comparing on the device instead of in the judge.

Moving a 100 MB output from a GPU worker to the judge costs a device-to-host copy, a pipe and a
comparison on the host's cores: ~0.4 s per run, seconds per verdict, and all verdicts of a host
queue for the judge's one process. With ``Verifier(compare_on_device=True)`` (the default on CUDA):

* the verification keeps one reference worker (the *keeper*, trusted: it runs task code only) for
  its whole length; the reference's outputs stay in the keeper's :class:`Vault`;
* the candidate's worker hands each output over as an :func:`export` descriptor: a CUDA IPC handle
  of a copy taken right after ``forward`` returned (or, on CPU, a file in its scratch directory);
* the keeper :func:`import_tensor`-s it (checking the claimed range against the real allocation:
  a forged descriptor fails there, in the keeper, never in the judge) into its vault;
* the judge's checks see :class:`core.verification.evidence.HeldTensor` handles; ``compare_outputs`` and
  ``bitwise_equal`` send the comparison to the keeper, which runs the very same functions on the
  device, the float64 truth included (computed there on first need).

The judge never maps memory a candidate names, and the candidate never sees the reference.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

# dtypes a descriptor may name (what the judge's comparison knows how to judge)
DTYPES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
          "complex64", "complex128")
EXPORT_DIR = "exports"  # under a candidate worker's scratch directory (the file transport)


def _dtype_name(t: Any) -> str:
    """``float32`` for a float32 tensor: the names descriptors use (:data:`DTYPES`)."""
    return str(t.dtype).replace("torch.", "")


class TransportError(RuntimeError):
    """A descriptor that cannot be turned back into a tensor (forged, freed, or of another device)."""


# --------------------------------------------------------------------------- CUDA IPC (driver API)

class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_ubyte * 64)]


_LIBCUDA: Any = None


def _libcuda() -> Any:
    """The driver library torch already loaded; the runtime's IPC wrappers are not exported by torch."""
    global _LIBCUDA
    if _LIBCUDA is None:
        lib = ctypes.CDLL("libcuda.so.1")
        lib.cuGetErrorString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        _LIBCUDA = lib
    return _LIBCUDA


def _check(result: int, what: str) -> None:
    if result != 0:
        text = ctypes.c_char_p()
        _libcuda().cuGetErrorString(result, ctypes.byref(text))
        raise TransportError(f"{what} failed: CUDA error {result} ({(text.value or b'?').decode()})")


def _address_range(ptr: int) -> tuple[int, int]:
    """(base, size) of the allocation that holds device address ``ptr``."""
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    _check(_libcuda().cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr)),
           "cuMemGetAddressRange")
    return base.value, size.value


def _open_ipc(handle: bytes) -> int:
    lib = _libcuda()
    opener = getattr(lib, "cuIpcOpenMemHandle_v2", None) or lib.cuIpcOpenMemHandle
    h = _IpcHandle()
    ctypes.memmove(h.reserved, handle, 64)
    ptr = ctypes.c_uint64()
    _check(opener(ctypes.byref(ptr), h, ctypes.c_uint(1)), "cuIpcOpenMemHandle")  # 1: lazy peer access
    return ptr.value


class _CudaBytes:
    """``nbytes`` of device memory at ``ptr`` as a uint8 array torch can alias (CUDA array interface)."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 3, "strides": None}


def cuda_ipc_available() -> str:
    """'' when CUDA IPC can be used here, else why not."""
    try:
        import torch

        if not torch.cuda.is_available():
            return "no CUDA device"
        lib = _libcuda()
        for name in ("cuIpcGetMemHandle", "cuIpcCloseMemHandle", "cuMemGetAddressRange_v2"):
            getattr(lib, name)
    except (OSError, AttributeError) as exc:
        return f"CUDA IPC unavailable: {exc}"
    if "expandable_segments:True" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").replace(" ", ""):
        return "PYTORCH_CUDA_ALLOC_CONF has expandable_segments (no legacy IPC handles)"
    return ""


# --------------------------------------------------------------------------- exporting (candidate side)

class Exports:
    """Copies of a run's outputs kept alive (and their files) until the keeper has taken them.

    Runs in the candidate's process, so nothing here is trusted: whatever the descriptors claim is
    checked by :func:`import_tensor` in the keeper."""

    def __init__(self, device: str, scratch: str):
        self.device, self.dir = device, Path(scratch) / EXPORT_DIR
        self.kept: list[Any] = []
        self.files: list[Path] = []
        self.count = 0

    def export(self, values: list[Any]) -> list[dict[str, Any]]:
        """One entry per output: ``{"tensor": descriptor}``, ``{"inline": tensor}`` (a CPU copy,
        where the device memory cannot be shared) or ``{"value": v}`` (not a tensor)."""
        import torch

        copies = [v.detach().clone(memory_format=torch.contiguous_format) if isinstance(v, torch.Tensor) else v
                  for v in values]
        if any(isinstance(v, torch.Tensor) and v.is_cuda for v in copies):
            torch.cuda.synchronize()  # the keeper reads the copies from another process
        entries = []
        for v in copies:
            if not isinstance(v, torch.Tensor):
                entries.append({"value": v})
                continue
            try:
                entries.append({"tensor": self._describe(v)})
                self.kept.append(v)
            except (TransportError, OSError, AttributeError):  # no IPC for this memory: the bytes travel
                entries.append({"inline": v.to("cpu")})
        return entries

    def _describe(self, t: Any) -> dict[str, Any]:
        import torch

        desc: dict[str, Any] = {"dtype": _dtype_name(t), "shape": list(t.shape),
                                "nbytes": t.numel() * t.element_size()}
        if t.numel() == 0:
            return {**desc, "via": "empty"}
        if t.device.type == "cuda":
            base, _ = _address_range(t.data_ptr())
            handle = _IpcHandle()
            _check(_libcuda().cuIpcGetMemHandle(ctypes.byref(handle), ctypes.c_uint64(base)), "cuIpcGetMemHandle")
            return {**desc, "via": "cuda_ipc", "handle": bytes(handle.reserved), "offset": t.data_ptr() - base,
                    "device": torch.cuda.current_device()}
        if self.device != "cpu":  # a host tensor from a GPU worker (a task that returns .cpu()): inline
            raise TransportError("a host tensor on a GPU worker")
        self.dir.mkdir(exist_ok=True)
        path = self.dir / f"out{self.count}.bin"
        self.count += 1
        t.reshape(-1).view(torch.uint8).numpy().tofile(path)  # every dtype as its bytes (bool: 0/1)
        self.files.append(path)
        return {**desc, "via": "file", "path": str(path)}

    def drop(self) -> None:
        self.kept.clear()
        for path in self.files:
            path.unlink(missing_ok=True)
        self.files.clear()


# --------------------------------------------------------------------------- importing (keeper side)

def import_tensor(desc: dict[str, Any], device: str, allowed_dir: str | None) -> Any:
    """A private copy (on ``device``) of the tensor ``desc`` describes. Raises TransportError when
    the descriptor is malformed, names memory outside the allocation it opens, or a file outside
    ``allowed_dir`` (the exporting worker's export directory, as the judge knows it)."""
    import torch

    dtype_name, shape = desc.get("dtype"), desc.get("shape")
    if dtype_name not in DTYPES:
        raise TransportError(f"unknown dtype {dtype_name!r}")
    if not isinstance(shape, list) or not all(type(s) is int and s >= 0 for s in shape) or len(shape) > 16:
        raise TransportError(f"malformed shape {shape!r}")
    dtype = getattr(torch, dtype_name)
    numel = 1
    for s in shape:
        numel *= s
    nbytes = numel * torch.empty(0, dtype=dtype).element_size()
    if desc.get("nbytes") != nbytes:
        raise TransportError(f"{desc.get('nbytes')!r} bytes claimed for {dtype_name}{shape} ({nbytes})")
    via = desc.get("via")
    if via == "empty" and numel == 0:
        return torch.empty(shape, dtype=dtype, device=device)
    if numel == 0:
        raise TransportError("an empty tensor sent as memory")
    if via == "cuda_ipc" and device == "cuda":
        raw = _import_cuda(desc, nbytes)
    elif via == "file" and device == "cpu" and allowed_dir:
        raw = _import_file(desc, nbytes, allowed_dir)
    else:
        raise TransportError(f"transport {via!r} is not accepted on {device}")
    if dtype == torch.bool:
        if bool((raw > 1).any()):
            raise TransportError("bool output holds bytes other than 0 and 1")
        return raw.to(torch.bool).reshape(shape)
    return raw.view(dtype).reshape(shape)


def _import_cuda(desc: dict[str, Any], nbytes: int) -> Any:
    import torch

    handle, offset = desc.get("handle"), desc.get("offset")
    if not isinstance(handle, bytes) or len(handle) != 64 or type(offset) is not int or offset < 0:
        raise TransportError("malformed CUDA IPC descriptor")
    if desc.get("device") != torch.cuda.current_device():
        raise TransportError(f"memory of device {desc.get('device')!r}, this worker is on "
                             f"{torch.cuda.current_device()}")
    torch.cuda.synchronize()  # makes this thread's context current for the driver calls
    base = _open_ipc(handle)
    try:
        start, size = _address_range(base)
        if start != base or offset + nbytes > size:
            raise TransportError(f"bytes {offset}..{offset + nbytes} claimed of an allocation of {size}")
        copy = torch.as_tensor(_CudaBytes(base + offset, nbytes), device="cuda").clone()
        torch.cuda.synchronize()  # the copy is done before the mapping goes
        return copy
    finally:
        _libcuda().cuIpcCloseMemHandle(ctypes.c_uint64(base))


def _import_file(desc: dict[str, Any], nbytes: int, allowed_dir: str) -> Any:
    import torch

    path = desc.get("path")
    if not isinstance(path, str):
        raise TransportError("malformed file descriptor")
    real_dir = os.path.realpath(allowed_dir)
    if os.path.dirname(os.path.realpath(path)) != real_dir or os.path.dirname(os.path.abspath(path)) != real_dir:
        raise TransportError(f"{path!r} is not in the exporting worker's export directory")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise TransportError(f"cannot open the exported output: {exc}") from None
    try:
        size = os.fstat(fd).st_size
        if size != nbytes:
            raise TransportError(f"the exported file holds {size} bytes, {nbytes} claimed")
        buf = bytearray(nbytes)
        view, got = memoryview(buf), 0
        while got < nbytes:
            n = os.readv(fd, [view[got:]])
            if n <= 0:
                raise TransportError("the exported file ended early")
            got += n
    finally:
        os.close(fd)
    return torch.frombuffer(buf, dtype=torch.uint8)


# --------------------------------------------------------------------------- the keeper's store

# Reference outputs a vault keeps on the device at once, beyond the run in use: the rest are dropped
# and computed again from their seeds when a comparison needs them (a forward at real sizes takes
# milliseconds; holding 9 runs of 8-GiB outputs does not fit a 141-GiB GPU beside the candidate's).
REFERENCE_RESIDENT_BYTES = 2 << 30


def _nbytes(values: list[Any]) -> int:
    import torch

    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


class Vault:
    """One verification's tensors in its keeper: the reference's outputs (``r<run>.<i>``), the
    candidate's adopted outputs (``c<n>.<i>``), and what the float64 truth needs.

    Reference outputs beyond :data:`REFERENCE_RESIDENT_BYTES` (the most recently used kept) are
    dropped and recomputed from the run's seed on the next use (:meth:`expected_of`), unless the task's
    forward draws random numbers (``recomputable`` false) or its inputs are not reproducible by seed."""

    def __init__(self, module: Any, model: Any, device: str, truth: Any, seeds: list[int], scales: list[float],
                 inputs: list[list[Any]] | None, n_trials: int, resident_bytes: int | None = None):
        self.module, self.model, self.device, self.truth = module, model, device, truth
        self.seeds, self.scales, self.inputs, self.n_trials = seeds, scales, inputs, n_trials
        self.tensors: dict[str, Any] = {}
        self.resident_bytes = REFERENCE_RESIDENT_BYTES if resident_bytes is None else resident_bytes
        self.recomputable = True
        self.recomputed = 0  # reference runs computed again after being dropped
        self.released: set[str] = set()  # candidate outputs dropped once no check still to come read them
        self._expected: dict[int, list[Any]] = {}  # resident reference runs' outputs, least recently used first
        self._layout: list[list[Any]] = []  # per reference run: (shape, dtype, device) of each tensor, or the value
        self.truths: dict[int, list[Any] | None] = {}
        self.noises: dict[int, list[float | None] | None] = {}  # per run: rounding noise of each output
        self.truth_trusted: bool | None = None  # None: not vetted yet
        self.adopted = 0
        # adopted outputs kept in host memory (a lean verification: it ran out of GPU memory with the device to
        # itself), each back on its device only for the request that reads it
        self.offloaded: dict[str, Any] = {}
        self.offload_count = 0  # outputs ever kept so

    def describe(self, key: str, value: Any) -> dict[str, Any]:
        import torch

        if not isinstance(value, torch.Tensor):
            return {"value": value}
        self.tensors[key] = value
        finite = bool(torch.isfinite(value).all()) if value.is_floating_point() and value.numel() else True
        return {"held": key, "dtype": _dtype_name(value), "shape": list(value.shape),
                "finite": finite}

    def keep_reference(self, run: int, outputs: list[Any]) -> list[dict[str, Any]]:
        import torch

        self._layout.append([(tuple(v.shape), v.dtype, v.device) if isinstance(v, torch.Tensor) else v
                             for v in outputs])
        described = [self.describe(f"r{run}.{i}", v) for i, v in enumerate(outputs)]
        self._expected[run] = outputs
        self._drop_beyond_budget(keep=run)
        return described

    def expected_of(self, run: int) -> list[Any]:
        """Reference run ``run``'s outputs, computed again from its seed if they were dropped."""
        outputs = self._expected.pop(run, None)
        if outputs is None:
            import torch

            from core.verification.worker.session import flatten_outputs

            with torch.no_grad():
                outputs = flatten_outputs(self.model(*self.inputs_of(run)))
            self.recomputed += 1
            for i, v in enumerate(outputs):
                if isinstance(v, torch.Tensor):
                    self.tensors[f"r{run}.{i}"] = v
        self._expected[run] = outputs  # the most recently used, last
        self._drop_beyond_budget(keep=run)
        return outputs

    def _drop_beyond_budget(self, keep: int) -> None:
        if not self.recomputable:
            return
        held = sum(_nbytes(v) for v in self._expected.values())
        for run in [r for r in self._expected if r != keep]:
            if held <= self.resident_bytes:
                break
            held -= _nbytes(self._expected.pop(run))
            for i in range(len(self._layout[run])):
                self.tensors.pop(f"r{run}.{i}", None)

    def adopt(self, entries: list[dict[str, Any]], expect: int, allowed_dir: str | None,
              offload: bool = False) -> list[dict[str, Any]]:
        """Import one run's exported outputs. Outputs whose count, shape or dtype differ from reference
        run ``expect`` are described, not copied: the comparison fails on those facts alone. ``offload``: each
        is kept as a host copy between the requests that read it (:meth:`resolve` brings it back)."""
        import torch

        want = self._layout[expect] if 0 <= expect < len(self._layout) else []
        n = self.adopted
        self.adopted += 1
        out = []
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict):
                raise TransportError("malformed output entry")
            if "value" in entry:
                out.append({"value": entry["value"]})
                continue
            if "inline" in entry:
                t = entry["inline"]
                if not isinstance(t, torch.Tensor):
                    raise TransportError("malformed inline output")
                desc = {"dtype": _dtype_name(t), "shape": list(t.shape)}
            else:
                desc = entry.get("tensor")
                if not isinstance(desc, dict):
                    raise TransportError("malformed output entry")
            e = want[i] if i < len(want) else None  # (shape, dtype, device) of a reference tensor
            if len(entries) != len(want) or not isinstance(e, tuple) or \
                    desc.get("shape") != list(e[0]) or desc.get("dtype") != str(e[1]).replace("torch.", ""):
                out.append({"held": None, "dtype": str(desc.get("dtype")), "shape": list(desc.get("shape") or []),
                            "finite": True})
                continue
            value = entry["inline"] if "inline" in entry else import_tensor(desc, self.device, allowed_dir)
            # beside the reference's output (a task may return a host tensor from a GPU model)
            key = f"c{n}.{i}"
            out.append(self.describe(key, value.to(e[2])))
            if offload:  # described (its finiteness) on its device; then only a host copy stays
                self.tensors[key] = self.tensors[key].to("cpu", copy=True)
                self.offloaded[key] = e[2]
                self.offload_count += 1
                del value
        return out

    def release(self, items: list[Any]) -> int:
        """Drop the candidate's adopted outputs ``items`` names (handles); the bytes freed. A later
        use of one is an error of the engine (:meth:`resolve`), never a verdict on the candidate."""
        freed = 0
        for item in items:
            key = item.get("held") if isinstance(item, dict) else None
            if isinstance(key, str) and key.startswith("c") and key in self.tensors:
                freed += 0 if self.offloaded.pop(key, None) is not None else _nbytes([self.tensors[key]])
                del self.tensors[key]
                self.released.add(key)
        return freed

    def resolve(self, items: list[Any]) -> list[Any]:
        """Handles (``{"held": key}``) back to the tensors they name; plain values as they are."""
        resolved = []
        for item in items:
            if isinstance(item, dict) and "held" in item:
                key = item["held"]
                if key not in self.tensors and isinstance(key, str) and key.startswith("r"):
                    run = int(key[1:].split(".")[0])
                    if 0 <= run < len(self._layout):
                        self.expected_of(run)  # dropped beyond the budget: computed again
                if key in self.released:
                    raise TransportError(f"{key!r} was released: a check read outputs it did not declare "
                                         f"(Check.reads)")
                if key not in self.tensors:
                    raise TransportError(f"nothing is held as {key!r}")
                value = self.tensors[key]
                resolved.append(value.to(self.offloaded[key]) if key in self.offloaded else value)
            else:
                resolved.append(item.get("value") if isinstance(item, dict) else item)
        return resolved

    def run_of(self, items: list[Any]) -> int | None:
        """The reference run the handles in ``items`` belong to (for its float64 truth)."""
        for item in items:
            key = item.get("held") if isinstance(item, dict) else None
            if isinstance(key, str) and key.startswith("r"):
                return int(key[1:].split(".")[0])
        return None

    def inputs_of(self, run: int) -> list[Any]:
        from core.verification.inputs import draw_inputs
        from core.verification.sandbox import to_device

        if self.inputs is not None:
            return self.inputs[run]
        return to_device(draw_inputs(self.module, self.seeds[run], self.scales[run], self.device), self.device)

    def truth_of(self, run: int, tolerances: dict | None) -> list[Any] | None:
        """The float64 outputs of reference run ``run``, computed on first need; None for every run
        when the float64 task disagrees with the fp32 reference on the ordinary trials."""
        from core.verification.evidence import Trial, truth_agrees

        if self.truth_trusted is None:
            for i in range(self.n_trials):
                self._compute_truth(i)
            trials = [Trial(self.seeds[i], None, self.expected_of(i), None, truth=self.truths[i])
                      for i in range(self.n_trials)]
            note = self.truth.note
            trusted, why = (False, note) if note else truth_agrees(trials, tolerances)
            self.truth_trusted = trusted
            if not trusted:
                self.truth.refuse(why or "float64 reference refused")
        if not self.truth_trusted:
            return None
        if run not in self.truths:
            self._compute_truth(run)
        return self.truths[run]

    def noise_of(self, run: int) -> list[float | None] | None:
        """Rounding noise of run ``run``'s outputs (:meth:`Float64Truth.rounding_noise`), once its
        truth is in use; computed on first need."""
        if not self.truth_trusted or self.truths.get(run) is None:
            return None
        if run not in self.noises:
            self.noises[run] = self.truth.rounding_noise(self.inputs_of(run), self.expected_of(run), self.truths[run])
        return self.noises[run]

    def _compute_truth(self, run: int) -> None:
        if run not in self.truths:
            self.truths[run] = self.truth.outputs(self.inputs_of(run), self.expected_of(run), keep_device=True)

    def truth_note(self) -> str:
        if self.truth.note:  # refused (random numbers, too large, disagrees ...) or disabled
            return self.truth.note
        if self.truth_trusted is None:
            return "float64 reference on demand: no output needed it"
        return self.truth.note or "float64 reference in use"

"""Provenance of host memory during one ``forward`` call on CPU: who produced every byte a kernel
reads and every byte the call returns.

The ATen audit sees every PyTorch op of the audited thread, and the interpreter sees every load
and store of a kernel. What neither sees is memory written some other way: numpy through a
tensor's array interface, raw storage, another thread, ctypes. A candidate that computes the
answer that way and then launches a kernel that only copies it passes both. The ledger closes
that gap by construction instead of by naming the ways:

* every storage the call may start from (its inputs, the module's tensors) and every storage an
  audited op makes or writes is **snapshotted** (its bytes copied);
* before each launch, each argument storage's bytes must still equal its snapshot; bytes that
  changed in between were written by something neither audited nor a kernel;
* a storage that is none of those (not an input, not the module's, not made by an audited op) is
  of unknown origin, and a kernel may not read it;
* each byte carries its producer: a kernel (or an audited copy of a kernel's bytes), a constant
  fill (``zeros``, ``fill_``), or neither. Every element of every output must be produced by a
  kernel or a constant fill, and every output must be exactly a ``torch.Tensor``.

All state lives in this object, which the worker's session holds in a local; a candidate cannot
name it (the runtime guard refuses the harness's modules, and frames are refused).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator

from core.api.evidence import UNPRODUCED

NOTHING, KERNEL, FILL = 0, 1, 2  # who produced a byte
PRODUCERS = {NOTHING: "neither a kernel nor a constant fill", KERNEL: "a kernel", FILL: "a constant fill"}
# ATen ops whose result (or written argument) holds a constant, not data
FILL_OPS = frozenset({"zeros", "zeros_like", "ones", "ones_like", "full", "full_like", "new_zeros", "new_ones",
                      "new_full", "fill_", "zero_", "scalar_tensor"})
# ATen ops that copy their first tensor argument's elements into the result (or into ``self``)
COPY_OPS = frozenset({"clone", "_to_copy", "contiguous", "to", "_copy_from", "_copy_from_and_resize", "copy_",
                      "lift_fresh_copy"})
# In-place ATen ops that change a tensor's metadata, not the bytes of its storage
METADATA_OPS = frozenset({"set_", "resize_", "resize_as_", "as_strided_", "detach_", "squeeze_", "unsqueeze_", "t_",
                          "transpose_", "swapdims_", "swapaxes_"})
MAX_FINDINGS = 8


@dataclass
class Entry:
    """One storage the ledger knows: its bytes as last seen and who produced each byte."""

    storage: Any  # kept alive for the call, so its address cannot be reused by another
    snapshot: Any  # numpy uint8 copy of its bytes
    producer: Any  # numpy uint8 per byte (NOTHING / KERNEL / FILL)
    origin: str  # "input", "module", "torch.<op>", "unknown", a kernel's name


def _bytes_of(storage: Any) -> Any:
    """A numpy uint8 view of a CPU storage's bytes (no ATen op the audit would see)."""
    import torch
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        view = torch.empty(0, dtype=torch.uint8)
        view.set_(storage)
        return view.numpy()


def tensors_in(values: Any, depth: int = 0) -> Iterator[Any]:
    """Every tensor in ``values``: nested lists, tuples and dicts, and the tensor behind a Triton
    ``TensorWrapper`` or ``TensorDescriptor`` (its ``base``)."""
    import torch

    if depth > 8:
        return
    if isinstance(values, torch.Tensor):
        yield values
    elif isinstance(values, (list, tuple)):
        for item in values:
            yield from tensors_in(item, depth + 1)
    elif isinstance(values, dict):
        for item in values.values():
            yield from tensors_in(item, depth + 1)
    else:
        base = getattr(values, "base", None)
        if isinstance(base, torch.Tensor):
            yield base


def storages_of(values: Any) -> list[Any]:
    """The distinct CPU storages behind every tensor in ``values`` (:func:`tensors_in`)."""
    found: dict[int, Any] = {}
    for t in tensors_in(values):
        if t.device.type == "cpu" and not t.is_meta:
            s = t.untyped_storage()
            if s.nbytes():
                found.setdefault(s.data_ptr(), s)
    return list(found.values())


def module_tensors(model: Any) -> list[Any]:
    """Every tensor the module holds: parameters, buffers and plain tensor attributes (weights
    transformed in ``__init__``), of it and its submodules; and the tensors among the globals of
    the module that defines its class (constants made at import, before any input existed)."""
    import sys

    import torch

    if not isinstance(model, torch.nn.Module):
        return []
    defining = sys.modules.get(type(model).__module__)
    out: list[Any] = [v for v in vars(defining).values() if isinstance(v, torch.Tensor)] if defining else []
    for m in model.modules():
        for v in vars(m).values():
            if isinstance(v, (torch.Tensor, list, tuple)):
                out.append(v)
            elif isinstance(v, dict):  # _parameters, _buffers and plain dicts of tensors
                out.extend(x for x in v.values() if isinstance(x, (torch.Tensor, list, tuple)))
    return out


def element_bytes(t: Any) -> Any:
    """Byte offsets, within its storage, of each element of ``t``: shape ``(numel, itemsize)``."""
    import numpy as np
    import torch
    from torch.utils._python_dispatch import _disable_current_modes

    size = t.element_size()
    with _disable_current_modes():
        count = max(1, -(-t.untyped_storage().nbytes() // size))
        index = torch.arange(count, dtype=torch.int64).as_strided(t.shape, t.stride(), t.storage_offset())
        starts = index.reshape(-1).numpy() * size
    return starts[:, None] + np.arange(size, dtype=np.int64)[None, :]


class Ledger:
    """The provenance of one call's host memory (see the module's docstring)."""

    def __init__(self) -> None:
        self.entries: dict[int, Entry] = {}
        self.findings: list[str] = []
        self.launching = 0  # >0 while a kernel launch runs: the launcher's own copies are not judged

    # ------------------------------------------------------------------ recording

    def _note(self, text: str) -> None:
        if text not in self.findings and len(self.findings) < MAX_FINDINGS:
            self.findings.append(text)

    def _enter(self, storage: Any, origin: str, producer: int) -> Entry:
        import numpy as np

        data = _bytes_of(storage)
        entry = Entry(storage, data.copy(), np.full(data.shape, producer, dtype=np.uint8), origin)
        self.entries[storage.data_ptr()] = entry
        return entry

    def trust(self, values: Iterable[Any], origin: str) -> None:
        """Storages the call may start from (inputs, the module's tensors): bytes as they are now."""
        for s in storages_of(list(values)):
            if s.data_ptr() not in self.entries:
                self._enter(s, origin, NOTHING)

    def _resnapshot(self, entry: Entry) -> None:
        import numpy as np

        np.copyto(entry.snapshot, _bytes_of(entry.storage))

    def _changed(self, entry: Entry) -> bool:
        import numpy as np

        return not np.array_equal(_bytes_of(entry.storage), entry.snapshot)

    def after_op(self, func: Any, args: tuple, kwargs: dict, result: Any) -> None:
        """An audited ATen op ran: storages it made or wrote are snapshotted, with their producers."""
        import torch

        name = func.overloadpacket.__name__
        schema = func._schema
        written: list[Any] = []
        for i, arg in enumerate(schema.arguments):
            info = arg.alias_info
            if info is not None and info.is_write:
                value = args[i] if i < len(args) else kwargs.get(arg.name)
                if isinstance(value, torch.Tensor):
                    written.append(value)
        results = [r for r in (result if isinstance(result, (list, tuple)) else [result]) if isinstance(r, torch.Tensor)]
        source = next((a for a in args if isinstance(a, torch.Tensor)), None)
        for t in written + results:
            if t.device.type != "cpu" or t.is_meta or not t.untyped_storage().nbytes():
                continue
            ptr = t.untyped_storage().data_ptr()
            entry = self.entries.get(ptr)
            in_place = any(t is w for w in written)
            if in_place and name in METADATA_OPS:
                if entry is not None and entry.storage.nbytes() != t.untyped_storage().nbytes():
                    self._enter(t.untyped_storage(), f"torch.{name}", NOTHING)  # resized: new bytes are garbage
                continue  # re-pointed at memory the ledger does not know: it stays unknown
            if entry is None:
                if not in_place and self._aliases_unknown(t, args):
                    continue  # a view of memory the ledger does not know stays unknown
                entry = self._enter(t.untyped_storage(), f"torch.{name}", NOTHING)
            elif not in_place and source is not None and ptr == source.untyped_storage().data_ptr():
                continue  # a view of its input: nothing written
            if t.numel():
                self._set_producer(entry, t, name, source if not (in_place and t is source) else
                                   (args[1] if len(args) > 1 and isinstance(args[1], torch.Tensor) else None))
            self._resnapshot(entry)

    def _aliases_unknown(self, t: Any, args: tuple) -> bool:
        import torch

        ptr = t.untyped_storage().data_ptr()
        return any(isinstance(a, torch.Tensor) and a.device.type == "cpu" and a.untyped_storage().data_ptr() == ptr
                   for a in args)

    def _set_producer(self, entry: Entry, t: Any, name: str, source: Any) -> None:
        """Who produced ``t``'s elements after op ``name``: a fill is a constant; a copy carries its
        source's producers element by element; anything else produced nothing the ledger credits."""
        import numpy as np

        where = element_bytes(t)
        if name in FILL_OPS:
            entry.producer[where] = FILL
            return
        if name in COPY_OPS and source is not None and source.numel() and source.device.type == "cpu":
            src_entry = self.entries.get(source.untyped_storage().data_ptr())
            if self.launching:
                pass  # the interpreter staging a launch's arguments, not the candidate
            elif src_entry is None:  # an audited copy does not launder memory nothing audited produced
                self._note(f"torch.{name} copied memory of unknown origin (none of the inputs, the module's "
                           "tensors, a fresh allocation or a kernel's output: filled outside the audit)")
            elif src_entry is not entry and self._changed(src_entry):
                self._note(f"torch.{name} copied memory whose bytes changed after the last kernel or audited "
                           "PyTorch op (host code laundered through a copy)")
            if src_entry is not None:
                per_element = src_entry.producer[element_bytes(source)].min(axis=1).reshape(source.shape)
                try:
                    per_element = np.broadcast_to(per_element, tuple(t.shape)).reshape(-1)
                except ValueError:  # a copy across shapes (resize): the elements in order
                    flat = per_element.reshape(-1)
                    per_element = np.resize(flat, t.numel())
                entry.producer[where] = per_element[:, None]
                return
        entry.producer[where] = NOTHING

    # ------------------------------------------------------------------ launches

    def before_launch(self, kernel: str, storages: list[Any]) -> None:
        """Each argument storage must hold the bytes last seen; an unknown one is entered as such."""
        self.launching += 1
        for s in storages:
            entry = self.entries.get(s.data_ptr())
            if entry is None:
                self._enter(s, "unknown", NOTHING)
                continue
            if entry.storage.nbytes() != s.nbytes():
                self._enter(s, "unknown", NOTHING)  # resized behind the ledger's back
                continue
            if self._changed(entry):
                self._note(f"{kernel} was launched on memory ({entry.origin}) whose bytes changed after the last "
                           "kernel or audited PyTorch op, so they were computed where the judge does not look "
                           "(host code laundered through a kernel)")
                entry.producer[:] = NOTHING
                entry.origin = "host-written memory"
                self._resnapshot(entry)

    def written_mask(self, storage_ptr: int) -> Any:
        """The producer array the interpreter marks a launch's stores in (``None``: not known)."""
        entry = self.entries.get(storage_ptr)
        return None if entry is None else entry.producer

    def after_launch(self, kernel: str, storages: list[Any], loaded: set[int]) -> None:
        """The kernel ran: its argument storages are snapshotted again; reading unknown memory is a finding."""
        self.launching -= 1
        for s in storages:
            entry = self.entries.get(s.data_ptr())
            if entry is None:
                continue
            if entry.origin == "unknown" and s.data_ptr() in loaded:
                self._note(f"{kernel} read memory that is none of the inputs, the module's tensors, a fresh "
                           "allocation or a kernel's output (memory of unknown origin, filled outside the audit)")
            self._resnapshot(entry)

    # ------------------------------------------------------------------ the call's outputs

    def check_outputs(self, outputs: list[Any]) -> list[str]:
        """The call's findings, with those about its outputs: exact tensors, every element produced
        by a kernel or a constant fill, no byte changed since."""
        import numpy as np
        import torch

        for i, out in enumerate(outputs):
            if isinstance(out, torch.Tensor) and type(out) is not torch.Tensor and type(out) is not torch.nn.Parameter:
                self._note(f"output {i} is a {type(out).__qualname__}, not a torch.Tensor")
                continue
            if not isinstance(out, torch.Tensor) or not out.numel() or out.device.type != "cpu":
                continue
            entry = self.entries.get(out.untyped_storage().data_ptr())
            if entry is None:
                self._note(f"output {i} is memory no kernel and no audited PyTorch op produced")
                continue
            if self._changed(entry):
                self._note(f"output {i}'s bytes changed after the last kernel or audited PyTorch op (written by "
                           "host code the judge does not see)")
                continue
            per_element = entry.producer[element_bytes(out)].min(axis=1)
            missing = np.flatnonzero(per_element == NOTHING)
            if missing.size:
                self._note(f"{UNPRODUCED}output {i}: {missing.size} of {out.numel()} elements (the first at flat index "
                           f"{int(missing[0])}) were produced by neither a kernel nor a constant fill in this call "
                           f"(they hold {entry.origin} memory)")
        return list(self.findings)

"""CuPy's array bridge as a ``cuda`` candidate may use it: views of torch's device memory and fresh
buffers, to launch its own kernels on, and nothing that computes.

Every CuPy tutorial hands torch tensors to a ``RawModule`` kernel through ``cupy.asarray`` (the CUDA
array interface) or ``cupy.from_dlpack``, allocates the result with ``cupy.empty_like``, and hands it
back with ``torch.as_tensor`` or ``torch.from_dlpack``. A real ``cupy.ndarray`` also computes: its
operators, ``.sum()``, ``cupy.matmul`` (cuBLAS), ``.astype``: CuPy library compute, not the candidate's
kernel, and invisible to the ATen audit. So in the sandbox worker these functions of ``cupy`` are
replaced (:class:`plugins.backends.cupy_recording.CupyRecorder`) by the ones here, which return a
:class:`DeviceArray`: the array's shape, dtype, strides and pointer, the array and DLPack protocols
that a launch and torch read, views (``reshape`` and ``ravel`` of a contiguous array), and no
arithmetic. Buffers are allocated by torch, so the worker's memory accounting sees them and
:func:`owner_of` can tell which buffer an output returned through ``torch.as_tensor`` really is
(a cached buffer returned again is an earlier call's output, however it is wrapped).
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

BRIDGED = ("asarray", "from_dlpack", "empty", "empty_like", "zeros", "zeros_like")

_HOST_DATA = ("the bridge takes torch CUDA tensors (a view of their memory) or arrays it made; {what} "
              "would be data from the host or another library, not the kernel's")
_NO_COMPUTE = ("a CuPy array in a candidate is a view for launching its own kernels: {what} is CuPy library "
               "compute. Compute in your RawModule kernel, and move data with torch")


class DeviceArray:
    """A CuPy array as a candidate sees it: metadata, the CUDA array interface and DLPack, views, and
    nothing that computes (no operators, reductions, casts or copies)."""

    __slots__ = ("__weakref__", "_array", "_base")

    def __init__(self, array: Any, base: Any) -> None:
        self._array = array  # the real cupy.ndarray (what a launch receives)
        self._base = base  # the torch tensor whose memory it is (kept alive with it)

    # ---- metadata
    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._array.shape)

    @property
    def dtype(self) -> Any:
        return self._array.dtype

    @property
    def strides(self) -> tuple[int, ...]:
        return tuple(self._array.strides)

    @property
    def size(self) -> int:
        return int(self._array.size)

    @property
    def ndim(self) -> int:
        return int(self._array.ndim)

    @property
    def itemsize(self) -> int:
        return int(self._array.itemsize)

    @property
    def nbytes(self) -> int:
        return int(self._array.nbytes)

    @property
    def data(self) -> "DevicePointer":
        return DevicePointer(_pointer(self._array))

    def __len__(self) -> int:
        return len(self._array)

    def __repr__(self) -> str:
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype})"

    # ---- what torch reads (torch.as_tensor, torch.from_dlpack)
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return self._array.__cuda_array_interface__

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self._array.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> Any:
        return self._array.__dlpack_device__()

    # ---- views
    def reshape(self, *shape: Any) -> "DeviceArray":
        """A view of another shape; only of a C-contiguous array (any other would be copied: compute)."""
        if not _c_contiguous(self._array):
            raise TypeError(_NO_COMPUTE.format(what="reshaping a non-contiguous array (a copy)"))
        return DeviceArray(self._array.reshape(*shape), self._base)

    def ravel(self) -> "DeviceArray":
        return self.reshape(-1)

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(_NO_COMPUTE.format(what=f".{name}"))

    __array_ufunc__ = None  # numpy's and CuPy's ufuncs refuse it


def _refuse(symbol: str) -> Callable[..., Any]:
    def operator(self: DeviceArray, *args: Any) -> Any:
        raise TypeError(_NO_COMPUTE.format(what=f"the operator {symbol}"))
    return operator


# Arithmetic, comparisons and indexing (views, masks, fills) are CuPy kernels; == stays identity.
for _name, _symbol in {
    "add": "+", "sub": "-", "mul": "*", "matmul": "@", "truediv": "/", "floordiv": "//", "mod": "%",
    "pow": "**", "and": "&", "or": "|", "xor": "^", "lshift": "<<", "rshift": ">>", "divmod": "divmod",
}.items():
    for _form in (f"__{_name}__", f"__r{_name}__", f"__i{_name}__"):
        setattr(DeviceArray, _form, _refuse(_symbol))
for _form, _symbol in {"__lt__": "<", "__le__": "<=", "__gt__": ">", "__ge__": ">=", "__neg__": "unary -",
                       "__pos__": "unary +", "__abs__": "abs()", "__invert__": "~", "__getitem__": "[] (indexing)",
                       "__setitem__": "[] = (assignment)", "__iter__": "iteration"}.items():
    setattr(DeviceArray, _form, _refuse(_symbol))


class DevicePointer:
    """``array.data`` of a :class:`DeviceArray`, or a module's global (``RawModule.get_global``): its
    address, ``ptr`` (a launch takes it as a pointer), and nothing that copies or fills."""

    __slots__ = ("ptr",)

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def __int__(self) -> int:
        return self.ptr


def _pointer(array: Any) -> int:
    data = getattr(array, "data", None)
    ptr = getattr(data, "ptr", None)
    if isinstance(ptr, int):
        return ptr
    return int(array.__cuda_array_interface__["data"][0]) if hasattr(array, "__cuda_array_interface__") else 0


def _c_contiguous(array: Any) -> bool:
    flags = getattr(array, "flags", None)
    return bool(flags["C_CONTIGUOUS"] if flags is not None else True)


class Bridge:
    """The bridged functions of one worker (:data:`BRIDGED`), and the buffers they made.

    :param cupy: the real ``cupy`` module, before the worker patches it (its own functions make the views;
        buffers are torch's, of the torch dtype of the same name).
    """

    def __init__(self, cupy: Any) -> None:
        self.cupy = cupy
        # CuPy's own functions, taken before the worker puts this bridge's in their place (calling
        # cupy.asarray through the module then would call the bridge again)
        self.real: dict[str, Callable[..., Any]] = {name: getattr(cupy, name) for name in BRIDGED}
        # storages of the torch tensors behind the arrays handed out, weakly: an output returned through
        # torch.as_tensor(array) is a new storage over one of them (owner_of)
        self._bases: list[weakref.ReferenceType[Any]] = []

    def functions(self) -> dict[str, Callable[..., Any]]:
        return {name: getattr(self, name) for name in BRIDGED}

    # ---- views of torch memory
    def asarray(self, obj: Any, dtype: Any = None, order: Any = None, **kwargs: Any) -> DeviceArray:
        """``cupy.asarray``: a view of a CUDA torch tensor, or the array itself; no copy, no cast."""
        return self._view(obj, dtype, "cupy.asarray", self.real["asarray"])

    def from_dlpack(self, obj: Any, **kwargs: Any) -> DeviceArray:
        """``cupy.from_dlpack``: a view of a CUDA torch tensor, or the array itself."""
        return self._view(obj, None, "cupy.from_dlpack", self.real["from_dlpack"])

    def _view(self, obj: Any, dtype: Any, what: str, view: Callable[[Any], Any]) -> DeviceArray:
        import torch

        if isinstance(obj, DeviceArray):
            self._same_dtype(obj.dtype, dtype, what)
            return obj
        if not isinstance(obj, torch.Tensor) or type(obj) not in (torch.Tensor, torch.nn.Parameter):
            raise TypeError(f"{what}: " + _HOST_DATA.format(what=f"a {type(obj).__name__}"))
        if obj.device.type != "cuda":
            raise TypeError(f"{what}: " + _HOST_DATA.format(what=f"a tensor on {obj.device}"))
        array = view(obj)
        self._same_dtype(array.dtype, dtype, what)
        return self._hand_out(array, obj)

    def _same_dtype(self, have: Any, want: Any, what: str) -> None:
        if want is not None and self.cupy.dtype(want) != have:
            raise TypeError(f"{what}(dtype={self.cupy.dtype(want).name}) of a {have} array: "
                            + _NO_COMPUTE.format(what="a dtype conversion"))

    # ---- fresh buffers (torch's allocator)
    def empty(self, shape: Any, dtype: Any = float, order: str = "C") -> DeviceArray:
        return self._allocate(shape, dtype, order, zero=False)

    def zeros(self, shape: Any, dtype: Any = float, order: str = "C") -> DeviceArray:
        return self._allocate(shape, dtype, order, zero=True)

    def empty_like(self, prototype: Any, dtype: Any = None, order: str = "C", shape: Any = None) -> DeviceArray:
        return self._like(prototype, dtype, order, shape, zero=False)

    def zeros_like(self, prototype: Any, dtype: Any = None, order: str = "C", shape: Any = None) -> DeviceArray:
        return self._like(prototype, dtype, order, shape, zero=True)

    def _like(self, prototype: Any, dtype: Any, order: str, shape: Any, zero: bool) -> DeviceArray:
        import torch

        if isinstance(prototype, torch.Tensor):  # CuPy itself refuses a torch tensor here
            raise TypeError("cupy.empty_like/zeros_like take a CuPy array; pass cupy.asarray(tensor)")
        if not isinstance(prototype, DeviceArray):
            raise TypeError(_HOST_DATA.format(what=f"a prototype {type(prototype).__name__}"))
        return self._allocate(prototype.shape if shape is None else shape,
                              prototype.dtype if dtype is None else dtype, order, zero)

    def _allocate(self, shape: Any, dtype: Any, order: str, zero: bool) -> DeviceArray:
        import torch

        if order not in ("C", "K", "A"):
            raise TypeError(f"order={order!r}: the bridge allocates C-contiguous arrays")
        shape = (int(shape),) if isinstance(shape, int) else tuple(int(s) for s in shape)
        kind = self.cupy.dtype(dtype)
        torch_dtype = getattr(torch, kind.name, None)
        if not isinstance(torch_dtype, torch.dtype):
            raise TypeError(f"dtype {kind.name} has no torch equivalent")
        make = torch.zeros if zero else torch.empty  # zeros: a memset fill, as cupy.zeros does
        base = make(shape, dtype=torch_dtype, device=torch.device("cuda", torch.cuda.current_device()))
        return self._hand_out(self.real["asarray"](base), base)

    def _hand_out(self, array: Any, base: Any) -> DeviceArray:
        self._bases = [ref for ref in self._bases if ref() is not None]
        self._bases.append(weakref.ref(base.untyped_storage()))
        return DeviceArray(array, base)

    # ---- what the worker asks
    def owner_of(self, storage: Any) -> Any:
        """The storage of a buffer handed out that ``storage`` lies inside (an output made by
        ``torch.as_tensor(array)`` is a new storage over it), else ``storage`` itself."""
        start = storage.data_ptr()
        end = start + storage.nbytes()
        for ref in self._bases:
            base = ref()
            if base is not None and base is not storage and base.data_ptr() <= start \
                    and end <= base.data_ptr() + base.nbytes() and start < end:
                return base
        return storage


def unwrap(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A kernel launch's ``(grid, block, args)`` with each :class:`DeviceArray` among ``args`` replaced by
    its CuPy array, which CuPy passes as a pointer."""
    def real(values: Any) -> Any:
        if isinstance(values, (tuple, list)):
            return type(values)(v._array if isinstance(v, DeviceArray) else v.ptr if isinstance(v, DevicePointer)
                                else v for v in values)
        return values

    if len(args) >= 3:
        args = (*args[:2], real(args[2]), *args[3:])
    if "args" in kwargs:
        kwargs = {**kwargs, "args": real(kwargs["args"])}
    return args, kwargs

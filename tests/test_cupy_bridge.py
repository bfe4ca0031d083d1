"""The CuPy array bridge a ``cuda`` candidate gets in the worker (plugins/backends/cupy_bridge.py): views of
torch memory to launch kernels on, handed back to torch, and no CuPy compute. The GPU half (views of
CUDA tensors, buffers, launches, verdicts) is tests/gpu/test_cuda_gpu.py; here a host array stands in
for CuPy's, which has the same metadata and DLPack protocol."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

cupy = pytest.importorskip("cupy")

from plugins.backends.cupy_bridge import BRIDGED, Bridge, DeviceArray, unwrap  # noqa: E402
from plugins.backends.cupy_recording import CupyRecorder, GpuRequiredError  # noqa: E402


def _handed_out(bridge: Bridge, base: torch.Tensor) -> DeviceArray:
    """What the bridge hands out for ``base``, with a host view standing in for CuPy's device view."""
    return bridge._hand_out(base.numpy(), base)


@pytest.mark.parametrize("compute", [
    lambda a: a * 2, lambda a: a + a, lambda a: -a, lambda a: a > 0, lambda a: abs(a), lambda a: a @ a,
    lambda a: a.sum(), lambda a: a.clip(0, None), lambda a: a.astype("float64"), lambda a: a.copy(),
    lambda a: a.T, lambda a: a[0], lambda a: a.__setitem__(0, 1.0), lambda a: list(a), lambda a: a ** 2,
    lambda a: 1.0 - a, lambda a: np.maximum(a, 0), lambda a: a.fill(1.0), lambda a: a.max(),
])
def test_an_array_handed_out_computes_nothing(compute):
    array = _handed_out(Bridge(cupy), torch.arange(6, dtype=torch.float32))
    compute(array._array)  # the array it stands for computes
    with pytest.raises((TypeError, AttributeError), match="CuPy library compute|ufunc"):
        compute(array)


def test_an_array_handed_out_has_the_metadata_a_launch_reads_and_goes_back_to_torch_as_a_view():
    base = torch.arange(12, dtype=torch.float32)
    array = _handed_out(Bridge(cupy), base)
    assert (array.shape, array.size, array.ndim, array.itemsize, array.nbytes) == ((12,), 12, 1, 4, 48)
    assert array.dtype == cupy.float32 and array.strides == (4,) and len(array) == 12
    view = array.reshape(3, 4)
    assert view.shape == (3, 4) and array.ravel().shape == (12,)
    back = torch.from_dlpack(view)
    assert back.shape == (3, 4) and back.data_ptr() == base.data_ptr()  # the same memory, no copy
    back[0, 0] = 7.0
    assert base[0] == 7.0


def test_a_non_contiguous_array_is_not_reshaped_since_that_copies():
    base = torch.arange(12, dtype=torch.float32)
    array = Bridge(cupy)._hand_out(base.numpy()[::2], base)
    with pytest.raises(TypeError, match="copy"):
        array.reshape(2, 3)


@pytest.mark.parametrize("bad", [[1.0, 2.0], 3.0, np.ones(4, dtype=np.float32), torch.ones(4)])
def test_asarray_takes_only_cuda_tensors_and_its_own_arrays(bad):
    bridge = Bridge(cupy)
    for bridged in (bridge.asarray, bridge.from_dlpack):
        with pytest.raises(TypeError, match="host or another library"):
            bridged(bad)
    with pytest.raises(TypeError, match="CuPy array"):
        bridge.empty_like(torch.ones(4))


def test_asarray_of_its_own_array_is_that_array_and_a_dtype_change_is_refused():
    bridge = Bridge(cupy)
    array = _handed_out(bridge, torch.ones(4, dtype=torch.float32))
    assert bridge.asarray(array) is array and bridge.asarray(array, dtype=cupy.float32) is array
    with pytest.raises(TypeError, match="dtype conversion"):
        bridge.asarray(array, dtype=cupy.float64)


def test_a_launch_gets_the_real_arrays_in_place_of_the_ones_handed_out():
    array = _handed_out(Bridge(cupy), torch.ones(4))
    scalar = cupy.int64(4)
    args, kwargs = unwrap(((1,), (32,), (array, scalar, 7)), {})
    assert args[2][0] is array._array and args[2][1] is scalar and args[2][2] == 7
    args, kwargs = unwrap(((1,), (32,)), {"args": [array, array.data]})
    assert kwargs["args"][0] is array._array and kwargs["args"][1] == array.data.ptr


@settings(max_examples=30, deadline=None)
@given(size=st.integers(1, 4096), dtype=st.sampled_from([torch.float32, torch.float16, torch.int64]),
       others=st.integers(0, 3))
def test_an_output_over_a_buffer_handed_out_is_owned_by_that_buffer(size, dtype, others):
    # torch.as_tensor(array) / torch.from_dlpack(array) make a new storage each call over the same memory;
    # the worker asks whose memory it is, so a cached buffer returned again is an earlier output
    bridge = Bridge(cupy)
    bystanders = [_handed_out(bridge, torch.zeros(size + k, dtype=dtype)) for k in range(1, others + 1)]
    base = torch.zeros(size, dtype=dtype)
    array = _handed_out(bridge, base)
    for _ in range(2):
        output = torch.from_dlpack(array.reshape(-1)).untyped_storage()
        assert output is not base.untyped_storage() and bridge.owner_of(output) is base.untyped_storage()
    other = torch.zeros(size, dtype=dtype).untyped_storage()
    assert bridge.owner_of(other) is other  # not the bridge's: its own
    assert all(bridge.owner_of(torch.from_dlpack(b).untyped_storage()) is b._base.untyped_storage()
               for b in bystanders)


def test_the_dry_recorder_bridges_nothing_without_a_gpu_and_restores_cupy():
    originals = {name: getattr(cupy, name) for name in BRIDGED}
    with CupyRecorder(dry=True):
        for name in BRIDGED:
            with pytest.raises(GpuRequiredError, match=f"cupy.{name} was called"):
                getattr(cupy, name)(torch.ones(2))
    assert {name: getattr(cupy, name) for name in BRIDGED} == originals


def test_a_modules_global_is_asked_for_only_on_a_gpu():
    # on a GPU, RawModule.get_global gives the global's address (CuPy's MemoryPointer copies from the host)
    with CupyRecorder(dry=True):
        module = cupy.RawModule(code='extern "C" __global__ void k(float* y) { y[0] = 1.0f; }\n__device__ float buf[4];')
        with pytest.raises(GpuRequiredError, match="global 'buf'"):
            module.get_global("buf")


def test_the_installed_bridge_views_through_cupys_own_functions_not_itself():
    # the worker replaces cupy.asarray by the bridge's; the bridge must still reach CuPy's (else it recurses)
    originals = {name: getattr(cupy, name) for name in BRIDGED}
    with CupyRecorder(dry=False) as recorder:
        assert all(getattr(cupy, name) is not originals[name] for name in BRIDGED)
        assert recorder.bridge is not None and recorder.bridge.real == originals
        with pytest.raises(TypeError, match="host or another library"):
            cupy.asarray(torch.ones(3))  # the bridge answers (a CPU tensor is host data)
    assert {name: getattr(cupy, name) for name in BRIDGED} == originals


def test_the_worker_checks_the_bridged_functions_are_still_in_place():
    from plugins.backends.cuda_backend import CudaBackend

    backend = CudaBackend()
    backend.prepare_worker("cpu")
    try:
        patched = backend.instrumentation()
        assert {f"cupy.{name}" for name in BRIDGED} <= set(patched)
        assert all(getattr(cupy, name.split(".")[1]) is obj for name, obj in patched.items())
    finally:
        backend._recorder.uninstall()

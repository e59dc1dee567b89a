"""cubepool.device_api: TVM's DeviceAPI on cubepool's pools, and the runtime helpers."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import cubepool
from cubepool.device_api import (
    DeviceAPI,
    DeviceAttrKind,
    TVMDeviceExtType,
    create_tensor_memory_pool,
    get_preferred_host_device,
    kDefaultWorkspaceAlignment,
    runtime_enabled,
)


@pytest.fixture
def api() -> DeviceAPI:
    """A CPU DeviceAPI over a fresh MemoryManagement."""
    return DeviceAPI("cpu", cubepool.MemoryManagement())


def test_get_returns_one_shared_api_per_device() -> None:
    first = DeviceAPI.get("cpu")
    assert first is DeviceAPI.get(cubepool.Device("cpu", 0))
    assert first is not None and first.device == cubepool.Device("cpu", 0)


def test_get_refuses_devices_without_host_memory() -> None:
    with pytest.raises(cubepool.InvalidArgument, match="no DeviceAPI for"):
        DeviceAPI.get("cuda")
    assert DeviceAPI.get("cuda", allow_missing=True) is None


def test_data_space_is_writable_pool_memory(api: DeviceAPI) -> None:
    space = api.alloc_data_space(256, alignment=64)
    view = np.frombuffer(memoryview(space), dtype=np.uint8)
    view[:] = 7
    assert api.memory.memory_usage().bytes_in_use == 256
    assert api.live_allocations == 1
    with pytest.raises(BufferError, match="buffer view"):
        api.free_data_space(space)  # memory safety: the view still uses the bytes
    assert api.live_allocations == 1
    del view
    api.free_data_space(space)
    assert api.memory.memory_usage().bytes_in_use == 0
    assert api.live_allocations == 0


def test_free_of_a_foreign_or_freed_handle_is_refused(api: DeviceAPI) -> None:
    space = api.alloc_data_space(64)
    api.free_data_space(space)
    with pytest.raises(cubepool.InvalidArgument, match="freed already"):
        api.free_data_space(space)
    workspace = api.alloc_workspace(64)
    with pytest.raises(cubepool.InvalidArgument, match="alloc_data_space does not own"):
        api.free_data_space(workspace)
    api.free_workspace(workspace)


@pytest.mark.parametrize("alignment", [0, 3, 4096])
def test_bad_alignment_is_refused(api: DeviceAPI, alignment: int) -> None:
    with pytest.raises(cubepool.InvalidArgument, match="alignment"):
        api.alloc_data_space(64, alignment=alignment)


def test_workspace_reuse_shows_in_the_report(api: DeviceAPI) -> None:
    first = api.alloc_workspace(10_000)
    reserved = api.memory_report().usage.bytes_reserved
    api.free_workspace(first)
    for _ in range(50):
        api.free_workspace(api.alloc_workspace(10_000))
    report = api.memory_report()
    assert report.usage.bytes_reserved == reserved
    assert report.usage.bytes_in_use == 0
    assert report.dynamic[0].bytes_in_use_peak <= 2 * 10_000


def test_copy_data_from_to(api: DeviceAPI) -> None:
    src = cubepool.empty((4,), "float32")
    np.asarray(src)[:] = [1, 2, 3, 4]
    dst = cubepool.empty((4,), "float32")
    api.copy_data_from_to(src, dst)
    np.testing.assert_array_equal(np.asarray(dst), [1, 2, 3, 4])
    space = api.alloc_data_space(16)
    api.copy_data_from_to(src, space)
    assert bytes(memoryview(space)) == np.asarray(src).tobytes()
    with pytest.raises(cubepool.InvalidArgument, match="16 source bytes into 8"):
        api.copy_data_from_to(src, bytearray(8))
    with pytest.raises(cubepool.InvalidArgument, match="read-only"):
        api.copy_data_from_to(src, bytes(16))
    # An object array's items are pointers it owns: bytes written over them were freed as
    # objects (SIGSEGV), and read from them would be addresses.
    with pytest.raises(cubepool.InvalidArgument, match="destination must hold numbers"):
        api.copy_data_from_to(src, np.empty(2, dtype=object))
    with pytest.raises(cubepool.InvalidArgument, match="source must hold numbers"):
        api.copy_data_from_to(np.empty(2, dtype=object), bytearray(16))
    # ctypes' wchar_t pointers (format 'Z' alone), which ctypes follows when read.
    with pytest.raises(cubepool.InvalidArgument, match="'<Z'"):
        api.copy_data_from_to(bytes(16), (ctypes.c_wchar_p * 2)("a", "b"))
    # Structures of numbers are plain: numpy's structured arrays, ctypes' Structures.
    pairs = np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8")])
    api.copy_data_from_to(np.array([(1, 2.5), (3, 4.5)], dtype=pairs.dtype).tobytes(), pairs)
    assert pairs["b"].tolist() == [2.5, 4.5]

    class Pair(ctypes.Structure):
        _fields_ = [("a", ctypes.c_int), ("b", ctypes.c_double)]

    api.copy_data_from_to(bytes(2 * ctypes.sizeof(Pair)), (Pair * 2)())
    api.stream_sync()


def test_get_attr(api: DeviceAPI) -> None:
    assert api.get_attr(DeviceAttrKind.kExist) is True
    assert api.get_attr(DeviceAttrKind.kDeviceName) == "cpu"
    total = api.get_attr(DeviceAttrKind.kTotalGlobalMemory)
    assert isinstance(total, int) and total > 0
    assert api.get_attr(DeviceAttrKind.kWarpSize) is None
    with pytest.raises(cubepool.InvalidArgument, match="unknown DeviceAttrKind 99"):
        api.get_attr(99)


def test_runtime_enabled() -> None:
    assert runtime_enabled("cpu") and runtime_enabled("llvm")
    assert not runtime_enabled("cuda") and not runtime_enabled("vulkan")
    with pytest.raises(cubepool.InvalidArgument, match="unknown runtime target"):
        runtime_enabled("teapot")
    # TVM's RuntimeEnabled takes these too: by name, and by how the name starts.
    assert runtime_enabled("llvm -mcpu=skylake") and runtime_enabled("llvm-x86")
    for target in ("rpc", "tflite", "hexagon", "nvptx", "nvptx -mcpu=sm_80", "rocm-gfx90a"):
        assert runtime_enabled(target) is False, target


def test_runtime_enabled_takes_tvms_names_as_written() -> None:
    # TVM compares the name as given: no other case, no "c" (the C codegen is not a
    # runtime it names), no options after a name it matches whole, nothing padded, and
    # none of the names it dropped (stackvm, sdaccel) or never had (webgpu).
    for target in (
        "CPU",
        "Cpu",
        "LLVM",
        "Cuda",
        "NVPTX",
        "c",
        "cuda -arch=sm_80",
        " cpu",
        "cpu ",
        "",
        "stackvm",
        "sdaccel",
        "webgpu",
    ):
        with pytest.raises(cubepool.InvalidArgument, match="unknown runtime target"):
            runtime_enabled(target)
    with pytest.raises(cubepool.InvalidArgument, match="target must be a str, got int"):
        runtime_enabled(1)  # type: ignore[arg-type]


def test_preferred_host_device() -> None:
    assert get_preferred_host_device("cuda") == cubepool.Device("cuda_host", 0)
    assert get_preferred_host_device("rocm") == cubepool.Device("rocm_host", 0)
    assert get_preferred_host_device("cpu") == cubepool.Device("cpu", 0)
    assert get_preferred_host_device("vulkan") == cubepool.Device("cpu", 0)


def test_create_tensor_memory_pool() -> None:
    pool = create_tensor_memory_pool("cpu")
    assert pool.device == cubepool.Device("cpu", 0)
    assert pool.empty((3,), "int32").shape == (3,)
    with pytest.raises(cubepool.InvalidArgument, match="no tensor memory pool"):
        create_tensor_memory_pool("cuda")


def test_seed_constants() -> None:
    assert TVMDeviceExtType.TVMDeviceExtType_End == 36
    assert kDefaultWorkspaceAlignment == 1
    assert DeviceAttrKind.kTotalGlobalMemory == 14

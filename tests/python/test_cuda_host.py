"""Issue 32 without a GPU: device names, the missing-driver error, DLPack export of
handles (host bytes through numpy), and cubepool's PyTorch allocator entry points driven
through ctypes with host storage behind them (the same code path but the storage)."""

from __future__ import annotations

import ctypes
import gc
import os
import subprocess
import sys

import numpy as np
import pytest

import cubepool
import cubepool.torch as cubetorch
from cubepool import InvalidArgument, MemoryManagement

MIB = 1 << 20


def test_host_memory_management_names_its_device() -> None:
    assert MemoryManagement().device == "cpu"
    assert MemoryManagement(device="cpu:0").device == "cpu"


@pytest.mark.parametrize("name", ["gpu", "cuda:", "cuda:-1", "cpu:1", "cuda:x", "CUDA:0", ""])
def test_bad_device_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidArgument, match="device must be"):
        MemoryManagement(device=name)


def test_a_missing_driver_is_device_unavailable() -> None:
    # A fresh process whose driver path names nothing: the error is typed and names the
    # library, and importing cubepool (and host memory) never needed it.
    code = (
        "import cubepool\n"
        "cubepool.MemoryManagement().reserve(64)\n"
        "try:\n"
        "    cubepool.MemoryManagement(device='cuda:0')\n"
        "except cubepool.DeviceUnavailable as e:\n"
        "    assert isinstance(e, cubepool.StorageError)\n"
        "    print('unavailable:', e)\n"
    )
    env = dict(os.environ, CUBEPOOL_LIBCUDA="/nonexistent/libcuda.so.1")
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert "unavailable: CUDA driver not found" in done.stdout
    assert "/nonexistent/libcuda.so.1" in done.stdout


def test_host_handles_export_dlpack_without_a_copy() -> None:
    mm = MemoryManagement()
    handle = mm.reserve(4096)
    assert handle.__dlpack_device__() == (1, 0)
    memoryview(handle)[:4] = b"\x01\x02\x03\x04"
    array = np.from_dlpack(handle)
    assert array.dtype == np.uint8
    assert array.shape == (4096,)
    assert list(array[:4]) == [1, 2, 3, 4]
    array[4] = 9
    assert memoryview(handle)[4] == 9, "numpy sees the handle's bytes, not a copy"
    # The export keeps the bytes reserved after the handle is released.
    handle.release()
    assert mm.memory_usage().bytes_in_use >= 4096
    assert array[4] == 9
    del array
    gc.collect()
    assert mm.memory_usage().bytes_in_use == 0


def test_dlpack_refuses_what_it_cannot_do() -> None:
    handle = MemoryManagement().reserve(64)
    with pytest.raises(BufferError, match="not copy"):
        handle.__dlpack__(copy=True)
    with pytest.raises(BufferError, match="DLPack device"):
        handle.__dlpack__(dl_device=(2, 0))
    with pytest.raises(BufferError, match="stream=None"):
        handle.__dlpack__(stream=1)
    handle.__dlpack__(max_version=(1, 0), dl_device=(1, 0), copy=False)
    handle.release()
    with pytest.raises(cubepool.HandleReleased):
        handle.__dlpack__()


def _entry_points() -> tuple[ctypes._CFuncPtr, ctypes._CFuncPtr]:
    lib = ctypes.CDLL(cubetorch.library_path())
    alloc_name, free_name = cubetorch.symbols()
    alloc = getattr(lib, alloc_name)
    alloc.restype = ctypes.c_void_p
    alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    free = getattr(lib, free_name)
    free.restype = None
    free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    return alloc, free


def test_the_c_entry_points_serve_blocks_and_stats() -> None:
    alloc, free = _entry_points()
    cubetorch.install("default", device="cpu")
    a = alloc(MIB, 0, None)
    b = alloc(3 * MIB, 0, 7)
    assert a and b and a != b
    assert a % 512 == 0 and b % 512 == 0
    ctypes.memset(a, 0x5A, MIB)
    assert ctypes.string_at(a, 4) == b"\x5a" * 4
    stats = cubetorch.memory_stats()
    assert stats["allocated_bytes.all.current"] == 4 * MIB
    assert stats["reserved_bytes.all.current"] >= 4 * MIB
    free(a, MIB, 0, None)
    free(b, 3 * MIB, 0, 7)
    stats = cubetorch.memory_stats()
    assert stats["allocated_bytes.all.current"] == 0
    assert stats["allocated_bytes.all.peak"] == 4 * MIB
    assert cubetorch.state()["live"] == 0
    assert alloc(0, 0, None) is None
    cubetorch.empty_cache()
    assert cubetorch.memory_stats()["reserved_bytes.all.current"] == 0


def test_every_error_path_of_the_entry_points() -> None:
    alloc, free = _entry_points()
    cubetorch.install("default", device="cpu")
    a = alloc(MIB, 0, None)
    assert a
    with pytest.raises(InvalidArgument, match="1 live allocation"):
        cubetorch.install("default", device="cpu")
    free(a, MIB, 0, None)
    free(a, MIB, 0, None)
    assert "double free" in cubetorch.state()["last_error"]
    free(0x1000, 64, 0, None)
    assert "unknown pointer" in cubetorch.state()["last_error"]
    assert alloc(MIB, 1, None) is None
    assert "device 1" in cubetorch.state()["last_error"]
    assert alloc(-5, 0, None) is None
    assert alloc(1 << 62, 0, None) is None
    assert cubetorch.state()["errors"] == {
        "double_free": 1,
        "unknown_pointer": 1,
        "wrong_device": 1,
        "bad_size": 1,
        "alloc_failed": 1,
    }
    # 4 EiB is past every pool (refused, as by MemoryManagement.reserve, before any
    # retry). 1 TiB the host storage cannot give: one retry and one out-of-memory, as
    # through MemoryManagement.reserve (the entry point retried the retry and counted
    # two of each).
    stats = cubetorch.memory_stats()
    assert (stats["num_alloc_retries"], stats["num_ooms"]) == (0, 0)
    assert alloc(1 << 40, 0, None) is None
    assert "out of memory" in cubetorch.state()["last_error"]
    stats = cubetorch.memory_stats()
    assert (stats["num_alloc_retries"], stats["num_ooms"]) == (1, 1)
    with pytest.raises(InvalidArgument, match="device must be"):
        cubetorch.install("default", device="tpu:0")
    with pytest.raises(cubepool.PoolConfigError):
        cubetorch.install("sliced(page=oops)", device="cpu")


def test_a_recorded_run_replays() -> None:
    alloc, free = _entry_points()
    cubetorch.install("default", device="cpu")
    sizes = [MIB, 5 * MIB, 300_000, 2 * MIB, 7 * MIB]
    with cubetorch.record("ctypes-run") as run:
        live = []
        for _ in range(3):
            for size in sizes:
                live.append((alloc(size, 0, None), size))
            for pointer, size in live[: len(live) // 2]:
                free(pointer, size, 0, None)
            live = live[len(live) // 2 :]
        for pointer, size in live:
            free(pointer, size, 0, None)
    trace = run.trace
    assert trace is not None
    assert len(trace) == 2 * 3 * len(sizes)
    assert trace.workload == "ctypes-run"
    predicted = cubetorch.predict(trace, "default")
    peak = cubetorch.memory_stats()["reserved_bytes.all.peak"]
    # The replay runs the same layout on the same calls: it predicts the same peak.
    assert predicted.peak_reserved == peak


def test_recordings_do_not_nest() -> None:
    # A second record() inside the first ended the first's recording: the outer run
    # came back with no trace and no word why.
    alloc, free = _entry_points()
    cubetorch.install("default", device="cpu")
    with cubetorch.record("outer") as outer:
        a = alloc(MIB, 0, None)
        with pytest.raises(InvalidArgument, match="do not nest"):
            with cubetorch.record("inner"):
                pass
        free(a, MIB, 0, None)
    assert outer.trace is not None and len(outer.trace) == 2
    # A recording the allocator's reinstallation took away is said to be lost.
    with pytest.raises(InvalidArgument, match="'gone' was lost"):
        with cubetorch.record("gone"):
            cubetorch.install("default", device="cpu")


_STDERR_CLOSED = """
import ctypes
import cubepool.torch as cubetorch
alloc = getattr(ctypes.CDLL(cubetorch.library_path()), cubetorch.symbols()[0])
alloc.restype, alloc.argtypes = ctypes.c_void_p, [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
cubetorch.install(device="cpu")
print(alloc(-1, 0, None), cubetorch.state()["errors"], flush=True)
"""


@pytest.mark.parametrize("stderr", ["/dev/full", "a closed pipe"])
def test_an_entry_point_whose_stderr_cannot_be_written_goes_on(stderr: str) -> None:
    # The entry points write each error to stderr; with stderr a full device or a pipe
    # whose reader left (`python train.py 2>&1 | head`), the write failed, eprintln!
    # panicked, and the panic leaving an extern "C" function aborted the process.
    if stderr == "/dev/full" and not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    read, write = os.pipe()
    os.close(read)
    target = open("/dev/full", "w") if stderr == "/dev/full" else os.fdopen(write, "w")
    with target:
        done = subprocess.run(
            [sys.executable, "-c", _STDERR_CLOSED],
            stdout=subprocess.PIPE,
            stderr=target,
            env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
            timeout=120,
        )
    if stderr == "/dev/full":
        os.close(write)
    assert done.returncode == 0, done.returncode
    assert done.stdout.decode().strip() == "None {'bad_size': 1}"


def test_use_needs_torch_only_when_called() -> None:
    code = "import cubepool, cubepool.torch, sys; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_use_refuses_host_memory_before_touching_torch() -> None:
    with pytest.raises(InvalidArgument, match="needs a CUDA device"):
        cubetorch.use(device="cpu")

"""The CUDA code path without a GPU: cubepool's CUDA storage, events and allocator run
against a fake driver (tests/fake_libcuda/fake_libcuda.c: the 24 entry points, served by
host memory) loaded through ``CUBEPOOL_LIBCUDA``. It checks driver loading, the structs
passed to the driver, the map/unmap bookkeeping, errors and the PyTorch entry points on
CUDA storage; the real driver's behaviour is left to ``scripts/gpu-check``.

Each case runs in a fresh process (the driver is loaded once per process)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[1] / "fake_libcuda" / "fake_libcuda.c"


@pytest.fixture(scope="module")
def fake_driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    compiler = shutil.which("cc")
    if compiler is None:
        pytest.skip("no C compiler to build the fake driver")
    library = tmp_path_factory.mktemp("fake_cuda") / "libcuda.so.1"
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", str(library), str(SOURCE)],
        check=True,
    )
    return library


def run(driver: Path, code: str, **env: str) -> str:
    prelude = (
        "import ctypes, gc, cubepool\n"
        "import cubepool.torch as cubetorch\n"
        f"fake = ctypes.CDLL({str(driver)!r})\n"
        "fake.fake_cuda_used.restype = ctypes.c_size_t\n"
        "MIB = 1 << 20\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        env=dict(os.environ, CUBEPOOL_LIBCUDA=str(driver), **env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_device_memory_maps_unmaps_and_keeps_bytes(fake_driver: Path) -> None:
    run(
        fake_driver,
        """
        mm = cubepool.MemoryManagement(device="cuda:0")
        assert mm.device == "cuda:0"
        free0, total = cubepool.cuda_memory_info()
        keep = mm.reserve(64 * MIB)
        others = [mm.reserve(32 * MIB) for _ in range(4)]
        free1 = cubepool.cuda_memory_info()[0]
        assert free0 - free1 >= 192 * MIB, (free0, free1)
        assert keep.__dlpack_device__() == (2, 0)
        address = mm.resource(keep).address
        assert address % 256 == 0
        ctypes.memset(address, 0x5A, 64 * MIB)
        try:
            memoryview(keep)
            raise SystemExit("memoryview of device memory did not raise")
        except BufferError as e:
            assert "cuda:0" in str(e)
        for handle in others:
            handle.release()
        mm.cleanup()
        free2 = cubepool.cuda_memory_info()[0]
        assert free2 - free1 >= 128 * MIB, (free1, free2)
        assert ctypes.string_at(address, 64 * MIB) == b"\\x5a" * (64 * MIB)
        mm.check_invariants()
        stats = mm.memory_stats()
        assert stats["allocated_bytes.all.current"] == 64 * MIB
        keep.release()
        # Handles keep their memory management (and its storage) alive; with the last
        # gone, the storage gives every byte back to the driver.
        del mm, keep, others, handle
        gc.collect()
        assert fake.fake_cuda_used() == 0, fake.fake_cuda_used()
        """,
    )


def test_dlpack_capsules_name_the_cuda_device(fake_driver: Path) -> None:
    run(
        fake_driver,
        """
        mm = cubepool.MemoryManagement(device="cuda:0")
        handle = mm.reserve(4096)
        capsule = handle.__dlpack__(stream=1)
        assert type(capsule).__name__ == "PyCapsule"
        try:
            handle.__dlpack__(dl_device=(1, 0))
            raise SystemExit("export to the host did not raise")
        except BufferError as e:
            assert "(2, 0)" in str(e)
        handle.release()
        # The capsule holds the reservation until it is gone.
        assert mm.memory_usage().bytes_in_use == 4096
        del capsule
        gc.collect()
        assert mm.memory_usage().bytes_in_use == 0
        """,
    )


def test_device_errors_are_typed(fake_driver: Path) -> None:
    out = run(
        fake_driver,
        """
        try:
            cubepool.MemoryManagement(device="cuda:1")
        except cubepool.DeviceUnavailable as e:
            print("device:", e)
        mm = cubepool.MemoryManagement(device="cuda:0")
        try:
            mm.reserve(128 * MIB)
        except cubepool.OutOfMemory as e:
            print("oom:", e.size)
        """,
        FAKE_CUDA_CAPACITY=str(64 << 20),
    )
    assert "device: no CUDA device 1: the driver sees 1 device(s)" in out
    assert "oom:" in out
    wrong = subprocess.run(
        [sys.executable, "-c", "import cubepool; cubepool.MemoryManagement(device='cuda:0')"],
        env=dict(os.environ, CUBEPOOL_LIBCUDA="libc.so.6"),
        capture_output=True,
        text=True,
    )
    assert "DeviceUnavailable" in wrong.stderr
    assert "has no cuInit" in wrong.stderr


def test_the_torch_entry_points_on_cuda_storage(fake_driver: Path) -> None:
    run(
        fake_driver,
        """
        lib = ctypes.CDLL(cubetorch.library_path())
        alloc, free = (getattr(lib, name) for name in cubetorch.symbols())
        alloc.restype = ctypes.c_void_p
        alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        free.restype = None
        free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        cubetorch.install("default", device="cuda:0")
        with cubetorch.record("fake") as run:
            a = alloc(3 * MIB, 0, 0x10)
            b = alloc(5 * MIB, 0, 0x20)
            ctypes.memset(a, 1, 3 * MIB)
            free(a, 3 * MIB, 0, 0x10)
            c = alloc(3 * MIB, 0, 0x20)  # another stream: after stream 0x10's event
            free(b, 5 * MIB, 0, 0x20)
            free(c, 3 * MIB, 0, 0x20)
        state = cubetorch.state()
        assert state["errors"] == {}, state
        assert state["live"] == 0
        peak = cubetorch.memory_stats()["reserved_bytes.all.peak"]
        assert cubetorch.predict(run.trace).peak_reserved == peak
        assert fake.fake_cuda_used() >= 8 * MIB
        cubetorch.empty_cache()
        assert fake.fake_cuda_used() == 0, fake.fake_cuda_used()
        """,
    )


def test_a_block_crosses_streams_only_after_the_freeing_streams_work(fake_driver: Path) -> None:
    run(
        fake_driver,
        """
        lib = ctypes.CDLL(cubetorch.library_path())
        alloc, free = (getattr(lib, name) for name in cubetorch.symbols())
        alloc.restype = ctypes.c_void_p
        alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        free.restype = None
        free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        cubetorch.install("default", device="cuda:0")
        a = alloc(4 * MIB, 0, 0x10)
        free(a, 4 * MIB, 0, 0x10)  # its event: not ready (the fake device is busy)
        same = alloc(4 * MIB, 0, 0x10)
        assert same == a
        assert cubetorch.state()["cross_stream_waits"] == 0, "same stream: no wait"
        free(same, 4 * MIB, 0, 0x10)
        other = alloc(4 * MIB, 0, 0x20)
        assert other == a
        state = cubetorch.state()
        assert state["cross_stream_waits"] == 1, state
        assert state["in_flight_frees"] == 0, state
        free(other, 4 * MIB, 0, 0x20)
        assert cubetorch.state()["in_flight_frees"] == 1
        fake.fake_cuda_finish()
        b = alloc(MIB, 0, 0x30)  # finished work is pruned without a wait
        state = cubetorch.state()
        assert state["in_flight_frees"] == 0 and state["cross_stream_waits"] == 1, state
        free(b, MIB, 0, 0x30)
        assert state["errors"] == {}, state
        """,
    )


def test_the_allocator_under_memory_pressure(fake_driver: Path) -> None:
    run(
        fake_driver,
        """
        lib = ctypes.CDLL(cubetorch.library_path())
        alloc, free = (getattr(lib, name) for name in cubetorch.symbols())
        alloc.restype = ctypes.c_void_p
        alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        free.restype = None
        free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        cubetorch.install("default", device="cuda:0")
        a = alloc(40 * MIB, 0, 0)
        free(a, 40 * MIB, 0, 0)
        # 50 MiB fit the 64 MiB device only once the idle 40 MiB go back to it.
        b = alloc(50 * MIB, 0, 0x20)
        assert b, cubetorch.state()
        assert cubetorch.state()["errors"] == {}
        assert alloc(40 * MIB, 0, 0) is None
        state = cubetorch.state()
        assert state["errors"] == {"alloc_failed": 1}, state
        assert "out of memory" in state["last_error"], state
        assert cubetorch.memory_stats()["num_ooms"] >= 1
        free(b, 50 * MIB, 0, 0x20)
        assert alloc(60 * MIB, 0, 0), cubetorch.state()
        """,
        FAKE_CUDA_CAPACITY=str(64 << 20),
    )

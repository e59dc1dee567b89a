"""Zero-copy views of reserved memory, and the memory-safety rules around them."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

import cubepool
from conftest import custom, sliced


def test_memoryview_is_writable_contiguous_and_exact(mm: cubepool.MemoryManagement) -> None:
    h = mm.reserve(100)
    view = memoryview(h)
    assert (view.nbytes, view.ndim, view.format, view.readonly) == (100, 1, "B", False)
    assert view.c_contiguous
    view[:] = bytes(range(100))
    assert bytes(memoryview(h)) == bytes(range(100))
    view.release()


def test_numpy_frombuffer_is_zero_copy(mm: cubepool.MemoryManagement) -> None:
    h = mm.reserve(4096)
    a = np.frombuffer(h, dtype=np.float32)
    a[:] = 1.5
    b = np.frombuffer(h, dtype=np.float32)
    assert b[0] == 1.5 and b.shape == (1024,)
    assert a.ctypes.data == mm.resource(h).address
    del a, b


def test_distinct_reservations_do_not_alias(mm: cubepool.MemoryManagement) -> None:
    handles = [mm.reserve(64) for _ in range(50)]
    for i, h in enumerate(handles):
        memoryview(h)[:] = bytes([i]) * 64
    for i, h in enumerate(handles):
        assert bytes(memoryview(h)) == bytes([i]) * 64


def test_release_with_live_view_raises_buffer_error(mm: cubepool.MemoryManagement) -> None:
    h = mm.reserve(64)
    view = memoryview(h)
    with pytest.raises(BufferError, match="buffer view"):
        h.release()
    view[0] = 7  # still valid
    view.release()
    h.release()
    assert mm.memory_usage().bytes_in_use == 0


def test_numpy_array_keeps_the_handle_exported(mm: cubepool.MemoryManagement) -> None:
    h = mm.reserve(64)
    arr = np.frombuffer(h, dtype=np.uint8)
    with pytest.raises(BufferError):
        h.release()
    del arr
    gc.collect()
    h.release()


def test_released_handle_raises_handle_released(mm: cubepool.MemoryManagement) -> None:
    h = mm.reserve(64)
    h.release()
    assert h.released
    with pytest.raises(cubepool.HandleReleased):
        memoryview(h)
    with pytest.raises(cubepool.HandleReleased):
        h.release()
    with pytest.raises(cubepool.HandleReleased):
        h.binding()
    with pytest.raises(ValueError):
        _ = h.can_mut
    with pytest.raises(cubepool.HandleReleased):
        mm.resource(h)


def test_views_outlive_the_memory_management() -> None:
    mm = custom(sliced(4096, 4096))
    h = mm.reserve(256)
    view = memoryview(h)
    view[:] = b"\xab" * 256
    del mm, h
    gc.collect()
    # The view holds the handle, the handle holds the storage.
    assert bytes(view) == b"\xab" * 256
    view[:4] = b"abcd"
    assert bytes(view[:4]) == b"abcd"


def test_handle_context_manager_releases(mm: cubepool.MemoryManagement) -> None:
    with mm.reserve(128) as h:
        memoryview(h)[0] = 1
    assert h.released
    assert mm.memory_usage().bytes_in_use == 0


def test_freed_memory_is_not_reachable_through_an_old_handle_clone(
    mm: cubepool.MemoryManagement,
) -> None:
    h = mm.reserve(64)
    clone = h.clone()
    h.release()
    # The clone still owns the reservation: a new reserve must not alias it.
    memoryview(clone)[:] = b"\x01" * 64
    other = mm.reserve(64)
    memoryview(other)[:] = b"\x02" * 64
    assert bytes(memoryview(clone)) == b"\x01" * 64


def test_many_threads_reserve_write_and_release() -> None:
    mm = custom(sliced(1 << 20, 1 << 16), alignment=64)
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            for i in range(300):
                size = 64 + (seed * 131 + i * 17) % 4000
                h = mm.reserve(size)
                mv = memoryview(h)
                mv[:] = bytes([seed]) * size
                assert bytes(mv) == bytes([seed]) * size
                mv.release()
                if i % 3:
                    h.release()
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    gc.collect()
    mm.check_invariants()
    assert mm.memory_usage().number_allocs == 0

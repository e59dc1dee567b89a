"""TensorMemoryPool: reuse, clear, used_memory, the cache bound, alloc_backing overrides,
thread safety."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import cubepool as cp


def test_reuse_scenario() -> None:
    pool = cp.TensorMemoryPool()
    assert (pool.page_size, pool.device, pool.max_cached_bytes) == (4096, cp.Device("cpu"), None)
    assert pool.used_memory() == 0
    a = pool.empty((10,), "float32")
    assert a.data_ptr() % 64 == 0
    assert (a.shape, a.dtype, a.nbytes, a.byte_offset) == ((10,), "float32", 40, 0)
    addr = a.data_ptr()
    assert pool.used_memory() == 4096 and pool.checked_out == 1
    del a
    assert pool.used_memory() == 4096 and pool.cached_bytes == 4096 and pool.checked_out == 0
    b = pool.empty((1024,), "float32")  # same 4096-byte bucket: same backing
    assert b.data_ptr() == addr
    assert pool.cached_bytes == 0
    c = pool.empty((1025,), "float32")  # 8192-byte bucket
    assert c.data_ptr() != addr
    assert pool.used_memory() == 4096 + 8192
    # clear while tensors live: they stay valid and come back later
    del c
    assert pool.cached_bytes == 8192
    pool.clear()
    assert pool.used_memory() == 4096
    np.asarray(b)[:] = 5.0
    assert (np.asarray(b) == 5.0).all()
    del b
    assert pool.used_memory() == 4096 and pool.cached_bytes == 4096
    pool.clear()
    assert pool.used_memory() == 0
    assert "TensorMemoryPool page_size=4096" in repr(pool)


def test_views_and_exports_hold_the_backing() -> None:
    pool = cp.TensorMemoryPool(page_size=256)
    t = pool.empty((4,), "int32")
    view = pool.create_view(t, (2,), "int32", 8)
    assert view.byte_offset == 8
    arr = np.asarray(t)
    del t
    assert pool.cached_bytes == 0
    del view
    assert pool.cached_bytes == 0
    del arr
    gc.collect()
    assert pool.cached_bytes == 256
    with pytest.raises(cp.TensorError, match="would occupy bytes"):
        pool.create_view(pool.empty((4,), "int32"), (5,), "int32")


def test_tensors_keep_the_pool_books_alive() -> None:
    pool = cp.TensorMemoryPool()
    t = pool.empty((4,), "float64")
    del pool
    gc.collect()
    np.asarray(t)[:] = 1.0
    del t  # returns to a pool nobody references: freed with it


def test_zero_size_and_page_rounding() -> None:
    pool = cp.TensorMemoryPool(page_size=100)
    assert pool.empty((0,), "float32").nbytes == 0
    pool.clear()
    t = pool.empty((30,), "float32")  # 120 bytes -> 200
    assert pool.used_memory() == 200
    del t


def test_cache_bound() -> None:
    pool = cp.TensorMemoryPool(max_cached_bytes=8192)
    small = [pool.empty((1,), "float32") for _ in range(3)]
    big = pool.empty((4096,), "float32")  # 16 KiB: more than the bound
    del big
    assert pool.cached_bytes == 0
    del small
    assert pool.cached_bytes == 8192  # the oldest entry was evicted
    assert pool.used_memory() == 8192


def test_reuse_respects_alignment() -> None:
    class Offset(cp.TensorMemoryPool):
        """Hands out backing aligned to 64 but not to 128."""

        def alloc_backing(self, nbytes: int, alignment: int, device: cp.Device) -> np.ndarray:
            base = np.zeros(nbytes + 256, np.uint8)
            start = (-base.ctypes.data) % 128 + 64
            assert alignment <= 64
            return base[start : start + nbytes]

    pool = Offset()
    t = pool.empty((1,), "float32")
    assert t.data_ptr() % 128 == 64
    del t
    assert pool.cached_bytes == 4096
    # float64x16 needs 128-byte alignment: the cached backing does not qualify, and the
    # subclass is asked for 128 (which this one refuses by assertion).
    with pytest.raises(AssertionError):
        pool.empty((1,), "float64x16")
    assert pool.cached_bytes == 4096


def test_alloc_backing_override() -> None:
    calls: list[tuple[int, int, cp.Device]] = []

    class NumpyBacked(cp.TensorMemoryPool):
        def alloc_backing(self, nbytes: int, alignment: int, device: cp.Device) -> np.ndarray:
            calls.append((nbytes, alignment, device))
            base = np.zeros(nbytes + alignment, np.uint8)
            start = (-base.ctypes.data) % alignment
            return base[start : start + nbytes]

    pool = NumpyBacked(page_size=1024)
    t = pool.empty((3,), "int64")
    assert calls == [(1024, 64, cp.Device("cpu:0"))]
    np.asarray(t)[:] = [1, 2, 3]
    del t
    u = pool.empty((10,), "int8")
    assert len(calls) == 1  # reused
    assert bytes(np.asarray(u)) == np.array([1], np.int64).tobytes() + b"\x02\x00"
    assert pool.used_memory() == 1024

    class TensorBacked(cp.TensorMemoryPool):
        def alloc_backing(self, nbytes: int, alignment: int, device: cp.Device) -> object:
            return super().alloc_backing(nbytes, alignment, device)

    assert TensorBacked().empty((2,), "float32").nbytes == 8


@pytest.mark.parametrize(
    ("result", "error", "message"),
    [
        (lambda n, a: np.zeros(n // 2, np.uint8), cp.TensorError, "2048 bytes but 4096"),
        (lambda n, a: np.zeros(n + 64, np.uint8)[1 : n + 1], cp.TensorError, "not aligned to 64"),
        (lambda n, a: bytes(n), cp.TensorError, "read-only"),
        (lambda n, a: np.zeros(2 * n, np.uint8)[::2], cp.TensorError, "C-contiguous"),
        (lambda n, a: 42, TypeError, None),
        (lambda n, a: cp.empty((n,), "uint8", device="cpu"), None, None),
    ],
)
def test_alloc_backing_results_are_validated(result, error, message) -> None:  # type: ignore[no-untyped-def]
    class Custom(cp.TensorMemoryPool):
        def alloc_backing(self, nbytes: int, alignment: int, device: cp.Device) -> object:
            return result(nbytes, alignment)

    pool = Custom()
    if error is None:
        pool.empty((4,), "float32")
        return
    with pytest.raises(error, match=message):
        pool.empty((4,), "float32")
    assert pool.used_memory() == 0


def test_one_buffer_handed_out_twice_by_alloc_backing_is_refused() -> None:
    # An alloc_backing that gave one buffer every time made two live tensors over the
    # same bytes: a write to one showed in the other.
    raw = cp.empty((8192,), "uint8", device="cpu")
    whole = cp.create_view(raw, (4096,), "uint8")

    class Same(cp.TensorMemoryPool):
        def alloc_backing(self, nbytes: int, alignment: int, device: cp.Device) -> object:
            return whole

    pool = Same()
    first = pool.empty((4,), "uint8")
    with pytest.raises(cp.TensorError, match="overlaps backing the pool holds already"):
        pool.empty((4,), "uint8")
    assert pool.used_memory() == 4096
    del first
    assert pool.empty((4,), "uint8").data_ptr() == raw.data_ptr()  # the cached one, again


def test_memory_error_releases_cache_and_retries_once() -> None:
    attempts = []

    class Flaky(cp.TensorMemoryPool):
        def alloc_backing(self, nbytes: int, alignment: int, device: cp.Device) -> object:
            attempts.append(nbytes)
            if len(attempts) == 2:
                raise MemoryError("device full")
            return super().alloc_backing(nbytes, alignment, device)

    pool = Flaky()
    pool.empty((1,), "float32")  # attempt 1; dropped at once, so cached
    assert pool.cached_bytes == 4096
    t = pool.empty((2000,), "float32")  # attempt 2 fails, cache released, attempt 3
    assert attempts == [4096, 8192, 8192]
    assert pool.cached_bytes == 0 and pool.used_memory() == 8192
    del t

    class AlwaysFull(cp.TensorMemoryPool):
        def alloc_backing(self, nbytes: int, alignment: int, device: cp.Device) -> cp.Tensor:
            raise MemoryError("device full")

    with pytest.raises(MemoryError):
        AlwaysFull().empty((1,), "float32")


def test_constructor_checks() -> None:
    with pytest.raises(cp.TensorError, match="page_size"):
        cp.TensorMemoryPool(page_size=0)
    with pytest.raises(cp.TensorError, match="not supported"):
        cp.TensorMemoryPool(device="cuda:0")
    with pytest.raises(cp.InvalidArgument, match="page_size must be non-negative"):
        cp.TensorMemoryPool(page_size=-1)
    with pytest.raises(cp.TensorError, match="overflows"):
        cp.TensorMemoryPool(page_size=2**62).empty((2**62 + 1,), "uint8")
    with pytest.raises(cp.TensorError, match="not a power of two"):
        cp.TensorMemoryPool().alloc_backing(16, 3, "cpu")  # type: ignore[arg-type]


def test_one_pool_from_many_threads() -> None:
    pool = cp.TensorMemoryPool(page_size=1024, max_cached_bytes=64 * 1024)
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def work(seed: int) -> None:
        try:
            rng = np.random.default_rng(seed)
            barrier.wait()
            live = []
            for _ in range(300):
                n = int(rng.integers(0, 3000))
                t = pool.empty((n,), "uint8")
                a = np.asarray(t)
                a[:] = seed
                live.append((t, seed))
                if len(live) > 4:
                    old, value = live.pop(int(rng.integers(0, len(live))))
                    assert (np.asarray(old) == value).all()
                if rng.random() < 0.05:
                    pool.clear()
            for old, value in live:
                assert (np.asarray(old) == value).all()
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    gc.collect()
    assert pool.checked_out == 0
    assert pool.used_memory() == pool.cached_bytes <= 64 * 1024
    pool.clear()
    assert pool.used_memory() == 0


class PoolMachine(RuleBasedStateMachine):
    """Random empty/view/export/drop/clear sequences: nothing live is ever handed out again.

    Every tensor gets a unique fill byte; views and numpy exports must keep reading it
    whatever happens to the tensor they came from, and the books must balance.
    """

    def __init__(self) -> None:
        super().__init__()
        self.pool = cp.TensorMemoryPool(page_size=512, max_cached_bytes=4096)
        self.live: list[tuple[object, int]] = []
        self.next_fill = 1

    @rule(n=st.integers(0, 2000), dtype=st.sampled_from(["uint8", "int16", "float32", "int64"]))
    def empty(self, n: int, dtype: str) -> None:
        t = self.pool.empty((n,), dtype)
        assert t.data_ptr() % 64 == 0
        fill = self.next_fill
        self.next_fill = self.next_fill % 255 + 1
        np.asarray(t).view(np.uint8)[:] = fill
        self.live.append((t, fill))

    @precondition(lambda self: bool(self.live))
    @rule(i=st.integers(0, 10**6), data=st.data())
    def view(self, i: int, data: st.DataObject) -> None:
        obj, fill = self.live[i % len(self.live)]
        if not isinstance(obj, cp.Tensor) or obj.nbytes == 0:
            return
        offset = data.draw(st.integers(0, obj.nbytes - 1))
        length = data.draw(st.integers(0, obj.nbytes - offset))
        self.live.append((self.pool.create_view(obj, (length,), "uint8", offset), fill))

    @precondition(lambda self: bool(self.live))
    @rule(i=st.integers(0, 10**6), how=st.sampled_from(["buffer", "dlpack", "capsule"]))
    def export(self, i: int, how: str) -> None:
        obj, fill = self.live[i % len(self.live)]
        if not isinstance(obj, cp.Tensor):
            return
        if how == "buffer":
            self.live.append((np.asarray(obj), fill))
        elif how == "dlpack":
            self.live.append((np.from_dlpack(obj), fill))
        else:
            self.live.append((cp.from_dlpack(obj.__dlpack__()), fill))

    @precondition(lambda self: bool(self.live))
    @rule(i=st.integers(0, 10**6))
    def drop(self, i: int) -> None:
        self.live.pop(i % len(self.live))

    @rule()
    def clear(self) -> None:
        self.pool.clear()

    @invariant()
    def contents_survive(self) -> None:
        for obj, fill in self.live:
            raw = np.asarray(obj).reshape(-1).view(np.uint8)
            assert (raw == fill).all()

    @invariant()
    def books_balance(self) -> None:
        assert self.pool.used_memory() >= self.pool.cached_bytes
        assert self.pool.cached_bytes <= 4096

    def teardown(self) -> None:
        self.live.clear()
        gc.collect()
        assert self.pool.checked_out == 0
        assert self.pool.used_memory() == self.pool.cached_bytes
        self.pool.clear()
        assert self.pool.used_memory() == 0


PoolMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestPoolMachine = PoolMachine.TestCase

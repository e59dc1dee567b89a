"""MemoryManagement from Python: the scenarios of the core issue and the error rules."""

from __future__ import annotations

import gc
import inspect
import subprocess
import sys
import tracemalloc
from collections.abc import Callable

import pytest

import cubepool
from conftest import MIB, custom, sliced
from cubepool import MemoryUsage
from cubepool._cubepool import pool_spec


def test_two_held_reserves_share_a_page() -> None:
    mm = custom(sliced(2048, 2048))
    a, b = mm.reserve(512), mm.reserve(512)
    assert mm.memory_usage() == MemoryUsage(2, 1024, 0, 2048)
    assert (a.size, b.size) == (512, 512)


def test_two_large_slices_reserve_two_pages() -> None:
    mm = custom(sliced(1024, 1024))
    _held = [mm.reserve(768), mm.reserve(768)]
    assert mm.memory_usage().bytes_reserved == 2048


def test_capped_pool_raises_and_reserves_nothing_more() -> None:
    mm = custom(sliced(1024, 1024, cap=2048))
    a, _b = mm.reserve(1024), mm.reserve(1024)
    with pytest.raises(cubepool.PoolCapacityExceeded) as info:
        mm.reserve(1024)
    assert (info.value.size, info.value.capacity) == (1024, 2048)
    assert mm.memory_usage().bytes_reserved == 2048
    a.release()
    c = mm.reserve(1024)
    assert c.size == 1024
    assert mm.memory_usage() == MemoryUsage(2, 2048, 0, 2048)


def test_full_capped_pool_passes_the_request_on() -> None:
    mm = custom(sliced(MIB, MIB, cap=MIB), sliced(4 * MIB, 4 * MIB))
    a, b = mm.reserve(MIB), mm.reserve(MIB)
    assert mm.resource(a).pool == 0
    assert mm.resource(b).pool == 1


def test_sub_slices_near_page_rule() -> None:
    mm = cubepool.MemoryManagement(
        cubepool.MemoryConfiguration.sub_slices(),
        cubepool.MemoryDeviceProperties(max_page_size=2**31, alignment=32),
    )
    a = mm.reserve(7 * MIB)
    b = mm.reserve(1 * MIB)
    assert mm.resource(a).pool == 1
    assert mm.resource(b).pool == 2
    assert mm.memory_usage() == MemoryUsage(2, 8 * MIB, 0, 40 * MIB)


def test_zero_byte_reserve(mm: cubepool.MemoryManagement) -> None:
    h = mm.reserve(0)
    assert h.size == 0
    assert mm.memory_usage().bytes_reserved == 0
    assert bytes(memoryview(h)) == b""
    assert mm.resource(h).pool is None


def test_explicit_cleanup_frees_only_fully_free_pages() -> None:
    mm = custom(sliced(1024, 1024))
    a, b, c = mm.reserve(600), mm.reserve(600), mm.reserve(100)
    a.release()
    b.release()
    mm.cleanup(explicit=True)
    assert mm.memory_usage() == MemoryUsage(1, 100, 28, 1024)
    c.release()
    mm.cleanup()
    assert mm.memory_usage() == MemoryUsage()


def test_binding_keeps_memory_in_use() -> None:
    mm = custom(sliced(1024, 1024))
    h = mm.reserve(256)
    binding = h.binding()
    assert h.can_mut
    h2 = h.clone()
    assert not h.can_mut
    h.release()
    h2.release()
    assert mm.memory_usage().bytes_in_use == 256
    assert mm.resource(binding).size == 256
    del binding
    assert mm.memory_usage().bytes_in_use == 0


def test_persistent_mode_reuses_exact_size_buffers(mm: cubepool.MemoryManagement) -> None:
    with mm.persistent():
        assert mm.mode == "persistent"
        a = mm.reserve(100)
        first = mm.resource(a)
        a.release()
        b = mm.reserve(100)
        assert mm.resource(b).address == first.address
    assert mm.mode == "auto"


def test_mode_setter_nests_windows(mm: cubepool.MemoryManagement) -> None:
    mm.mode = "persistent"
    mm.mode = "persistent"
    mm.mode = "auto"
    assert mm.mode == "persistent"
    mm.mode = "auto"
    assert mm.mode == "auto"
    with pytest.raises(cubepool.InvalidArgument, match="mode must be"):
        mm.mode = "sometimes"


def test_lookups_check_identity() -> None:
    a, b = custom(sliced(1024, 1024)), custom(sliced(1024, 1024))
    h = a.reserve(64)
    _other = b.reserve(64)
    # Refused as every call that takes a handle refuses another management's.
    with pytest.raises(cubepool.InvalidArgument, match="belongs to another MemoryManagement"):
        b.resource(h)
    with pytest.raises(ValueError, match="belongs to another MemoryManagement"):
        b.resource(h.binding())


def test_negative_and_wrong_sizes_are_clear_errors(mm: cubepool.MemoryManagement) -> None:
    with pytest.raises(cubepool.InvalidArgument, match="size must be non-negative, got -5"):
        mm.reserve(-5)
    with pytest.raises(ValueError, match="too large"):
        mm.reserve(2**70)
    with pytest.raises(TypeError, match="size must be an int"):
        mm.reserve("12")  # type: ignore[arg-type]
    assert mm.memory_usage() == MemoryUsage()


def test_reserve_takes_its_size_by_position_only(mm: cubepool.MemoryManagement) -> None:
    # Entered as METH_O (src/python/method_o.rs): one positional argument, checked
    # self, and the documented signature.
    assert str(inspect.signature(cubepool.MemoryManagement.reserve)) == "(self, size, /)"
    assert (cubepool.MemoryManagement.reserve.__doc__ or "").startswith("Reserves `size` bytes")
    with pytest.raises(TypeError, match="no keyword arguments"):
        mm.reserve(size=64)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="exactly one argument"):
        mm.reserve()  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="exactly one argument"):
        mm.reserve(64, 64)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="doesn't apply to a 'object' object"):
        cubepool.MemoryManagement.reserve(object(), 64)  # type: ignore[arg-type]
    assert mm.memory_usage() == MemoryUsage()
    # The unbound form takes the same path as the bound one.
    handle = cubepool.MemoryManagement.reserve(mm, 64)
    assert handle.size == 64 and mm.memory_usage().number_allocs == 1
    del handle
    assert mm.memory_usage().number_allocs == 0


def live_exceptions() -> int:
    """Exception objects alive now, after a collection."""
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, BaseException))


@pytest.mark.parametrize("size", [-1, 2**70, 1.5, None, True, "12"])
def test_a_refused_size_leaks_nothing(mm: cubepool.MemoryManagement, size: object) -> None:
    # Such a size leaves reserve's fast path (an exact int of 64 bits) for its whole
    # body under PyO3's attach: an exception dropped outside it would be leaked (the
    # build disables PyO3's reference pool), as a build of this entry once did.
    before = live_exceptions()
    for _ in range(200):
        with pytest.raises((TypeError, ValueError)):
            mm.reserve(size)  # type: ignore[arg-type]
    assert live_exceptions() - before < 10
    # Nor a lazy error's parts (a type's reference, its message), which are no
    # exception objects.
    assert python_bytes_kept(lambda: mm.reserve(size), 1000) < 8 * 1024  # type: ignore[arg-type]
    assert mm.memory_usage() == MemoryUsage()


def test_a_failed_reserve_leaks_nothing() -> None:
    # The fast path's failures become exceptions under PyO3's attach (with their
    # attributes): none stays alive, nor does its class gain references.
    mm = custom(sliced(1024, 1024, cap=2048))
    held = [mm.reserve(1024), mm.reserve(1024)]
    before = live_exceptions(), sys.getrefcount(cubepool.PoolCapacityExceeded)
    for _ in range(200):
        with pytest.raises(cubepool.PoolCapacityExceeded):
            mm.reserve(1024)
        with pytest.raises(cubepool.BufferTooBig):
            mm.reserve(4096)
    assert live_exceptions() - before[0] < 10
    assert sys.getrefcount(cubepool.PoolCapacityExceeded) - before[1] < 10
    # Nor do the attributes it carries (a leaked `size` int is 28 bytes a call).
    assert python_bytes_kept(lambda: mm.reserve(1024), 2000) < 8 * 1024
    assert mm.memory_usage().number_allocs == len(held)
    # Nor does the error graph keep them: a failed reserve's id was never handed out.
    assert mm.error_graph().is_empty()


def python_bytes_kept(call: Callable[[], object], times: int) -> int:
    """Bytes of the Python heap still held after ``times`` failing calls (tracemalloc),
    counted after as many calls to warm up."""

    def fail_times() -> None:
        for _ in range(times):
            try:
                call()
            except Exception:  # the calls are meant to fail
                pass
        gc.collect()

    tracemalloc.start()
    try:
        fail_times()
        start = tracemalloc.get_traced_memory()[0]
        fail_times()
        return tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()


def test_a_size_whose_index_fails_keeps_nothing(mm: cubepool.MemoryManagement) -> None:
    # `__index__` runs Python code inside reserve: what it reserves and drops comes
    # back, and the error it raises is not leaked with its frame.
    class Raises:
        def __index__(self) -> int:
            _held = mm.reserve(MIB)
            raise RuntimeError("no size")

    before = live_exceptions()
    for _ in range(50):
        with pytest.raises((TypeError, RuntimeError)):
            mm.reserve(Raises())  # type: ignore[arg-type]
    assert live_exceptions() - before < 10
    gc.collect()
    assert mm.memory_usage().number_allocs == 0


AT_SHUTDOWN = """
import sys
import cubepool

class AtExit:
    def __init__(self):
        self.mm = cubepool.MemoryManagement()
        self.cycle = self

    def __del__(self):
        outcomes = []
        for size in (64, -1, "x", 2**70, 1 << 50):
            try:
                outcomes.append(type(self.mm.reserve(size)).__name__)
            except Exception as error:
                outcomes.append(type(error).__name__)
        sys.stdout.write(f"{sys.is_finalizing()} {outcomes}\\n")

keep = AtExit()
"""


def test_reserve_while_the_interpreter_shuts_down() -> None:
    # A finalizer run at shutdown reserves a good size and refuses bad ones: PyO3 will
    # not attach then, and reserve's errors are raised all the same (no abort).
    done = subprocess.run(
        [sys.executable, "-c", AT_SHUTDOWN], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split(" ", 1) == [
        "True",
        "['ManagedMemoryHandle', 'InvalidArgument', 'TypeError', 'InvalidArgument', "
        "'BufferTooBig']\n",
    ]


def test_buffer_too_big() -> None:
    mm = custom(sliced(1024, 512, cap=1024))
    with pytest.raises(cubepool.BufferTooBig) as info:
        mm.reserve(600)
    assert info.value.size == 600


def test_out_of_memory_is_a_memory_error_and_loses_nothing() -> None:
    mm = cubepool.MemoryManagement(
        cubepool.MemoryConfiguration.custom(
            [cubepool.MemoryPoolOptions(cubepool.PoolType.direct())]
        ),
        cubepool.MemoryDeviceProperties(max_page_size=2**62, alignment=64),
    )
    kept = mm.reserve(64)
    memoryview(kept)[:] = b"x" * 64
    with pytest.raises(cubepool.OutOfMemory) as info:
        mm.reserve(2**61)
    assert isinstance(info.value, MemoryError)
    assert bytes(memoryview(kept)) == b"x" * 64
    assert mm.memory_usage().bytes_in_use == 64


@pytest.mark.parametrize(
    ("pool", "kind", "field"),
    [
        (cubepool.PoolType.sliced_pages(0, 0), "ZeroSize", "page_size"),
        (cubepool.PoolType.sliced_pages(1024, 2048), "SliceLargerThanPage", "max_slice_size"),
        (cubepool.PoolType.sliced_pages(1024, 1024, 512), "CapSmallerThanPage", "max_pool_size"),
        (cubepool.PoolType.sliced_pages(64, 64, 64 * 70_000), "TooManyPages", "max_pool_size"),
    ],
)
def test_config_errors_name_the_field(pool: cubepool.PoolType, kind: str, field: str) -> None:
    with pytest.raises(cubepool.PoolConfigError) as info:
        cubepool.MemoryConfiguration.custom([cubepool.MemoryPoolOptions(pool)])
    assert info.value.kind == kind
    assert info.value.field == field
    assert field in str(info.value)
    assert isinstance(info.value, ValueError)


def test_empty_pool_list_and_bad_properties() -> None:
    with pytest.raises(cubepool.PoolConfigError, match="empty"):
        cubepool.MemoryConfiguration.custom([])
    with pytest.raises(cubepool.PoolConfigError, match="power of two") as info:
        cubepool.MemoryDeviceProperties(alignment=48)
    assert info.value.field == "alignment"
    with pytest.raises(cubepool.InvalidArgument):
        cubepool.MemoryDeviceProperties(max_page_size=-1)


def test_reprs_help_debugging(mm: cubepool.MemoryManagement) -> None:
    h = mm.reserve(4096)
    assert repr(h) == f"<ManagedMemoryHandle id={h.id} size=4096>"
    assert repr(mm.memory_usage()).startswith("MemoryUsage(number_allocs=1, bytes_in_use=4096")
    assert "sliced_pages" in repr(
        cubepool.MemoryPoolOptions(cubepool.PoolType.sliced_pages(1024, 512))
    )
    assert repr(cubepool.MemoryConfiguration.sub_slices()) == "MemoryConfiguration.sub_slices()"


def test_effective_pools_of_sub_slices() -> None:
    pools = cubepool.MemoryConfiguration.sub_slices().pools(
        cubepool.MemoryDeviceProperties(max_page_size=2**31, alignment=32)
    )
    # A zero-byte exclusive pool, the ladder, and (as CubeCL 0.10) a sliced tail of
    # whole device pages.
    assert [p.pool_type.kind for p in pools] == ["exclusive_pages"] + ["sliced_pages"] * 5
    tail = pool_spec(pools[-1])
    assert (tail["page_size"], tail["max_slice_size"]) == (2**31, 2**31)


def test_optimal_align() -> None:
    assert cubepool.optimal_align(1, 4, 256) == 4
    assert cubepool.optimal_align(10, 4, 256) == 64
    assert cubepool.optimal_align(1000, 4, 256) == 256


def test_check_invariants_after_a_workload(mm: cubepool.MemoryManagement) -> None:
    handles = [mm.reserve(size) for size in range(1, 5000, 37)]
    for h in handles[::2]:
        h.release()
    mm.check_invariants()
    del handles
    mm.cleanup()
    assert mm.memory_usage() == MemoryUsage()
    mm.check_invariants()


def test_a_window_closes_only_what_it_opened(mm: cubepool.MemoryManagement) -> None:
    # A stray __exit__ (a window object never entered, or exited twice) closed another
    # caller's window, sending its reservations to the dynamic pools.
    with mm.persistent():
        stray = mm.persistent()
        stray.__exit__(None, None, None)
        assert mm.mode == "persistent"
        window = mm.persistent()
        window.__enter__()
        window.__exit__(None, None, None)
        window.__exit__(None, None, None)  # a second exit closes nothing
        assert mm.mode == "persistent"
    assert mm.mode == "auto"
    # One window object entered twice (nested) closes twice.
    window = mm.persistent()
    with window:
        with window:
            assert mm.mode == "persistent"
        assert mm.mode == "persistent"
    assert mm.mode == "auto"

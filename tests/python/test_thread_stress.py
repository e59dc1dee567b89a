"""Four threads on one MemoryManagement, handing handles to each other, with every
reservation's bytes checked by whichever thread takes it next.

Each thread reserves, writes a pattern and hands the handle over a shared queue; takes
handles the others made, checks their bytes, rewrites them, clones, binds and pins
them, reads through views while others work, releases or drops them. The switch
interval is made tiny so threads interleave inside every step. Bounded by a fixed
number of steps per thread (a few seconds), not by a clock.
"""

from __future__ import annotations

import queue
import random
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import cubepool

THREADS = 4
STEPS = 4_000
_CYCLE = bytes(range(251)) * 80


def pattern_bytes(size: int, pattern: int) -> bytes:
    start = pattern % 251
    return _CYCLE[start : start + size]


@contextmanager
def fast_switching() -> Iterator[None]:
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)


def test_four_threads_pass_handles_and_check_their_bytes() -> None:
    mm = cubepool.MemoryManagement(
        cubepool.MemoryConfiguration.parse(
            "sliced(page=64KiB, max_slice=8KiB); exclusive(max_alloc=1MiB)"
        ),
        cubepool.MemoryDeviceProperties(max_page_size=1 << 20, alignment=256),
    )
    passed: queue.Queue[tuple[cubepool.ManagedMemoryHandle, int]] = queue.Queue()
    failures: list[BaseException] = []
    checked = [0] * THREADS

    def take() -> tuple[cubepool.ManagedMemoryHandle, int] | None:
        try:
            return passed.get_nowait()
        except queue.Empty:
            return None

    def verify(handle: cubepool.ManagedMemoryHandle, pattern: int, n: int) -> None:
        with memoryview(handle) as view:
            assert bytes(view) == pattern_bytes(handle.size, pattern), (
                f"handle {handle.id} lost its bytes"
            )
        checked[n] += 1

    def work(n: int) -> None:
        rng = random.Random(n)
        try:
            for step in range(STEPS):
                pattern = n * STEPS + step
                choice = rng.random()
                if choice < 0.35:
                    handle = mm.reserve(rng.randint(1, 12_000))
                    with memoryview(handle) as view:
                        view[:] = pattern_bytes(handle.size, pattern)
                    passed.put((handle, pattern))
                    continue
                got = take()
                if got is None:
                    continue
                handle, old = got
                verify(handle, old, n)
                if choice < 0.55:
                    # Rewrite and hand on.
                    with memoryview(handle) as view:
                        view[:] = pattern_bytes(handle.size, pattern)
                    passed.put((handle, pattern))
                elif choice < 0.65:
                    # A clone and a pinned binding keep the bytes; the original goes.
                    clone = handle.clone()
                    with mm.shared_bindings([handle.binding()]):
                        handle.release()
                        verify(clone, old, n)
                    passed.put((clone, old))
                elif choice < 0.8:
                    handle.release()
                else:
                    del handle  # dropped: given back at some thread's next operation
        except BaseException as error:  # reported by the main thread
            failures.append(error)

    with fast_switching():
        threads = [threading.Thread(target=work, args=(n,)) for n in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert not failures, failures
    # Whatever is still in flight has kept its bytes.
    while (got := take()) is not None:
        verify(got[0], got[1], 0)
        del got
    assert all(count > 100 for count in checked), checked
    mm.check_invariants()
    mm.cleanup(True)
    assert mm.memory_usage().bytes_in_use == 0

"""A hypothesis state machine over the public API, against a model of live ranges."""

from __future__ import annotations

import itertools

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import cubepool
from conftest import custom, sliced


class MemoryMachine(RuleBasedStateMachine):
    """Reserves, writes, clones, releases and cleans up; every live reservation keeps
    its own bytes, never overlaps another, and usage matches the model."""

    def __init__(self) -> None:
        super().__init__()
        self.mm = custom(
            sliced(4096, 1024, cap=4 * 4096),
            sliced(16384, 16384),
            cubepool.MemoryPoolOptions(cubepool.PoolType.exclusive_pages(65536), 20),
            alignment=64,
        )
        # reservation id -> (handles, fill byte, size)
        self.live: dict[int, tuple[list[cubepool.ManagedMemoryHandle], int, int]] = {}
        self.fill = 0

    @rule(size=st.integers(min_value=0, max_value=70_000))
    def reserve(self, size: int) -> None:
        try:
            h = self.mm.reserve(size)
        except (cubepool.PoolCapacityExceeded, cubepool.BufferTooBig):
            return
        self.fill = (self.fill + 1) % 251
        memoryview(h)[:] = bytes([self.fill]) * size
        self.live[h.id] = ([h], self.fill, size)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def clone(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.live)))
        handles = self.live[key][0]
        handles.append(handles[0].clone())

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.live)))
        handles, _, _ = self.live[key]
        handles.pop().release()
        if not handles:
            del self.live[key]

    @rule(explicit=st.booleans())
    def cleanup(self, explicit: bool) -> None:
        self.mm.cleanup(explicit)

    @invariant()
    def bytes_are_intact_and_disjoint(self) -> None:
        ranges = []
        for handles, fill, size in self.live.values():
            assert bytes(memoryview(handles[0])) == bytes([fill]) * size
            if size:
                start = self.mm.resource(handles[0]).address
                assert start % 64 == 0
                ranges.append((start, start + size))
        ranges.sort()
        for (_, end), (start, _) in itertools.pairwise(ranges):
            assert end <= start

    @invariant()
    def usage_matches_the_model(self) -> None:
        usage = self.mm.memory_usage()
        sized = [size for _, _, size in self.live.values() if size]
        assert usage.bytes_in_use == sum(sized)
        assert usage.number_allocs == len(sized)
        self.mm.check_invariants()

    def teardown(self) -> None:
        for handles, _, _ in self.live.values():
            for h in handles:
                h.release()
        self.mm.cleanup()
        assert self.mm.memory_usage() == cubepool.MemoryUsage()


TestMemoryMachine = MemoryMachine.TestCase
TestMemoryMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)

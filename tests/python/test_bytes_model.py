"""Model-based test with real bytes: handles, clones, bindings, shared bindings and
layout swaps on host storage, at alignments up to 4 KiB, with every live reservation's
bytes written through its handle and checked after every step.

What must hold after any program: a reservation's bytes are what was last written to
them until its last handle, binding and pin are gone; no two live reservations share a
byte; every reservation starts at a multiple of the alignment; the memory management's
own invariants hold; ``install_pools`` swaps the layout only with nothing in use.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
)

import cubepool

LAYOUTS = (
    "sliced(page=64KiB, max_slice=16KiB); exclusive(max_alloc=1MiB)",
    "exclusive(max_alloc=1MiB)",
    "sliced(page=16KiB, max_slice=4KiB); direct()",
    "direct(reclaim_at=64KiB)",
)


@dataclass
class Reservation:
    """One reservation and everything that keeps it: handles, bindings, pins."""

    handles: list[cubepool.ManagedMemoryHandle]
    size: int
    pattern: int
    bindings: list[cubepool.ManagedMemoryBinding] = field(default_factory=list)
    pins: list[cubepool.SharedMemoryBindings] = field(default_factory=list)

    def alive(self) -> bool:
        return bool(self.handles or self.bindings or any(not p.released for p in self.pins))


# Byte i of a reservation written with pattern p is (p + i) % 251: a shifted or
# overlapping range shows as a mismatch.
_CYCLE = bytes(range(251)) * (70_000 // 251 + 2)


def expected(size: int, pattern: int) -> bytes:
    start = pattern % 251
    return _CYCLE[start : start + size]


def fill(handle: cubepool.ManagedMemoryHandle, pattern: int) -> None:
    with memoryview(handle) as view:
        view[:] = expected(len(view), pattern)


class BytesModel(RuleBasedStateMachine):
    """Random programs over one MemoryManagement, checked against their real bytes."""

    reservations = Bundle("reservations")

    @initialize(
        alignment=st.sampled_from([32, 64, 256, 1024, 4096]), layout=st.sampled_from(LAYOUTS)
    )
    def start(self, alignment: int, layout: str) -> None:
        self.alignment = alignment
        self.mm = cubepool.MemoryManagement(
            cubepool.MemoryConfiguration.parse(layout),
            cubepool.MemoryDeviceProperties(max_page_size=1 << 20, alignment=alignment),
        )
        self.live: list[Reservation] = []
        self.sets: list[cubepool.SharedMemoryBindings] = []
        self.next_pattern = 1

    @rule(target=reservations, size=st.integers(1, 70_000))
    def reserve(self, size: int) -> Reservation:
        handle = self.mm.reserve(size)
        pattern = self.next_pattern
        self.next_pattern += 1
        fill(handle, pattern)
        reservation = Reservation([handle], size, pattern)
        self.live.append(reservation)
        return reservation

    @precondition(lambda self: any(r.handles for r in self.live))
    @rule(data=st.data())
    def rewrite(self, data: st.DataObject) -> None:
        r = data.draw(st.sampled_from([r for r in self.live if r.handles]))
        r.pattern = self.next_pattern
        self.next_pattern += 1
        fill(r.handles[-1], r.pattern)

    @rule(r=reservations)
    def clone(self, r: Reservation) -> None:
        if r.handles:
            r.handles.append(r.handles[0].clone())

    @rule(r=reservations)
    def bind(self, r: Reservation) -> None:
        if r.handles:
            r.bindings.append(r.handles[0].binding())

    @rule(r=reservations, through_binding=st.booleans())
    def pin(self, r: Reservation, through_binding: bool) -> None:
        target: cubepool.ManagedMemoryHandle | cubepool.ManagedMemoryBinding
        if through_binding and r.bindings:
            target = r.bindings[0]
        elif r.handles:
            target = r.handles[0]
        else:
            return
        shared = self.mm.shared_bindings([target])
        r.pins.append(shared)
        self.sets.append(shared)

    @rule(r=reservations, release=st.booleans())
    def drop_handle(self, r: Reservation, release: bool) -> None:
        if r.handles:
            handle = r.handles.pop()
            if release:
                handle.release()
            del handle

    @rule(r=consumes(reservations))
    def drop_all_but_pins(self, r: Reservation) -> None:
        r.handles.clear()
        r.bindings.clear()

    @precondition(lambda self: bool(self.sets))
    @rule(data=st.data())
    def release_shared(self, data: st.DataObject) -> None:
        shared = data.draw(st.sampled_from(self.sets))
        shared.release()
        self.sets.remove(shared)

    @rule(explicit=st.booleans())
    def cleanup(self, explicit: bool) -> None:
        self.mm.cleanup(explicit)

    @rule(layout=st.sampled_from(LAYOUTS))
    def install_pools(self, layout: str) -> None:
        in_use = any(r.alive() for r in self.live)
        try:
            self.mm.install_pools(layout)
        except cubepool.InstallMemoryPoolsError as error:
            assert in_use, f"refused with nothing in use: {error}"
        else:
            assert not in_use, "installed a layout under live reservations"

    @invariant()
    def bytes_alignment_and_disjointness(self) -> None:
        if not hasattr(self, "mm"):
            return
        self.live = [r for r in self.live if r.alive()]
        extents: list[tuple[int, int]] = []
        for r in self.live:
            keeper = r.handles[0] if r.handles else r.bindings[0] if r.bindings else None
            if r.handles:
                assert bytes(memoryview(r.handles[0])) == expected(r.size, r.pattern)
            if keeper is not None:
                resource = self.mm.resource(keeper)
                assert resource.size == r.size
                assert resource.address % self.alignment == 0
                extents.append((resource.address, resource.address + r.size))
        extents.sort()
        for (_, end), (start, _) in itertools.pairwise(extents):
            assert end <= start, "two live reservations share bytes"
        self.mm.check_invariants()

    def teardown(self) -> None:
        if not hasattr(self, "mm"):
            return
        for shared in self.sets:
            shared.release()
        for r in self.live:
            r.handles.clear()
            r.bindings.clear()
        self.live.clear()
        self.mm.cleanup(True)
        assert self.mm.memory_usage().bytes_in_use == 0


BytesModel.TestCase.settings = settings(max_examples=150, stateful_step_count=50, deadline=None)
TestBytesModel = BytesModel.TestCase

"""The Rust model of PyTorch's caching allocator against a second, deliberately plain
implementation of the same rules (the defaults, and expandable segments; no
max_split_size): lists of blocks per segment, scanned in full on every request. Both
must agree on every figure of a replay, on random traces and on the bundled real ones."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cubepool

KIB = 1 << 10
MIB = 1 << 20


@dataclass
class Block:
    addr: int
    size: int
    allocated: bool = False


@dataclass
class Segment:
    small: bool
    blocks: list[Block] = field(default_factory=list)


class Reference:
    """PyTorch's caching allocator with its defaults, written as plainly as possible."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.segments: list[Segment] = []
        self.next_addr = 20 * MIB
        self.reserved = 0
        self.mallocs = 0
        self.frees = 0

    def malloc(self, requested: int) -> tuple[Segment, Block] | None:
        size = max(512, -(-requested // 512) * 512)
        small = size <= MIB
        found = self.best_fit(small, size)
        if found is None:
            segment_size = (
                2 * MIB
                if small
                else 20 * MIB
                if size < 10 * MIB
                else -(-size // (2 * MIB)) * 2 * MIB
            )
            if not self.fits(segment_size):
                # release_cached_blocks: every free whole segment goes back.
                for segment in list(self.segments):
                    if len(segment.blocks) == 1 and not segment.blocks[0].allocated:
                        self.segments.remove(segment)
                        self.reserved -= segment.blocks[0].size
                        self.frees += 1
                if not self.fits(segment_size):
                    return None
            addr = -(-self.next_addr // (20 * MIB)) * 20 * MIB
            self.next_addr = addr + segment_size
            segment = Segment(small, [Block(addr, segment_size)])
            self.segments.append(segment)
            self.reserved += segment_size
            self.mallocs += 1
            found = (segment, segment.blocks[0])
        segment, block = found
        rest = block.size - size
        if rest >= 512 if small else rest > MIB:
            index = segment.blocks.index(block)
            segment.blocks.insert(index + 1, Block(block.addr + size, rest))
            block.size = size
        block.allocated = True
        return segment, block

    def best_fit(self, small: bool, size: int) -> tuple[Segment, Block] | None:
        fitting = [
            (block.size, block.addr, segment, block)
            for segment in self.segments
            if segment.small == small
            for block in segment.blocks
            if not block.allocated and block.size >= size
        ]
        if not fitting:
            return None
        _, _, segment, block = min(fitting, key=lambda item: (item[0], item[1]))
        return segment, block

    def fits(self, size: int) -> bool:
        return self.limit is None or self.reserved + size <= self.limit

    def free(self, segment: Segment, block: Block) -> None:
        block.allocated = False
        merged: list[Block] = []
        for current in segment.blocks:
            if merged and not merged[-1].allocated and not current.allocated:
                merged[-1].size += current.size
            else:
                merged.append(current)
        segment.blocks[:] = merged


@dataclass
class Range:
    """A block of an expandable segment: allocated, free, or unmapped."""

    addr: int
    size: int
    state: str = "unmapped"


class ExpandableReference:
    """PyTorch's caching allocator with expandable_segments:True, written plainly: one
    list of ranges per segment, merged after every change."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.segments: dict[bool, list[list[Range]]] = {True: [], False: []}
        self.next_addr = 20 * MIB
        self.reserved = 0
        self.mallocs = 0
        self.frees = 0

    def malloc(self, requested: int) -> tuple[list[Range], Range] | None:
        size = max(512, -(-requested // 512) * 512)
        small = size <= MIB
        found = self.best_fit(small, size) or self.grow(small, size)
        if found is None:
            self.release()
            found = self.grow(small, size)
            if found is None:
                return None
        segment, block = found
        if block.size - size >= 512:
            segment.insert(
                segment.index(block) + 1, Range(block.addr + size, block.size - size, "free")
            )
            block.size = size
        block.state = "allocated"
        return segment, block

    def best_fit(self, small: bool, size: int) -> tuple[list[Range], Range] | None:
        def growable(segment: list[Range], block: Range) -> int:
            index = segment.index(block)
            after = segment[index + 1] if index + 1 < len(segment) else None
            return block.size + (after.size if after and after.state == "unmapped" else 0)

        fitting = sorted(
            (
                (b.size, b.addr, segment, b)
                for segment in self.segments[small]
                for b in segment
                if b.state == "free" and b.size >= size
            ),
            key=lambda item: (item[0], item[1]),
        )
        if not fitting:
            return None
        _, _, segment, block = fitting[0]
        for _, _, other_segment, other in fitting[1:]:
            if growable(other_segment, other) >= growable(segment, block):
                break
            segment, block = other_segment, other
        return segment, block

    def grow(self, small: bool, size: int) -> tuple[list[Range], Range] | None:
        granule = 2 * MIB if small else 20 * MIB
        start = None
        for segment in sorted(self.segments[small], key=lambda seg: seg[0].addr):
            for index, block in enumerate(segment):
                if block.state != "unmapped":
                    continue
                first = index - 1 if index and segment[index - 1].state == "free" else index
                room = 0
                for candidate in segment[first:]:
                    if room >= size or candidate.state == "allocated":
                        break
                    room += candidate.size
                if room >= size:
                    start = (segment, segment[first])
                    break
            if start is not None:
                break
        if start is None:
            device = self.limit if self.limit is not None else 1 << 46
            span = -(-(device + device // 8) // granule) * granule
            if span < size:
                return None
            base = -(-self.next_addr // (20 * MIB)) * 20 * MIB
            self.next_addr = base + span
            segment = [Range(base, span)]
            self.segments[small].append(segment)
            start = (segment, segment[0])
        segment, block = start
        if block.state == "unmapped":
            block = self.map(segment, block, min(block.size, size), granule)
            if block is None:
                return None
        while block.size < size:
            after = segment[segment.index(block) + 1]
            block = self.map(segment, after, min(size - block.size, after.size), granule)
            if block is None:
                return None
        return segment, block

    def map(self, segment: list[Range], block: Range, size: int, granule: int) -> Range | None:
        mapped = -(-size // granule) * granule
        if self.limit is not None and self.reserved + mapped > self.limit:
            return None
        if mapped < block.size:
            segment.insert(
                segment.index(block) + 1, Range(block.addr + mapped, block.size - mapped)
            )
        block.size, block.state = mapped, "free"
        self.reserved += mapped
        self.mallocs += 1
        return self.merge(segment, block.addr)

    def release(self) -> None:
        for small in (False, True):
            granule = 2 * MIB if small else 20 * MIB
            for segment in list(self.segments[small]):
                unmapped_any = False
                for block in [b for b in segment if b.state == "free"]:
                    end = block.addr + block.size
                    first, last = -(-block.addr // granule) * granule, end // granule * granule
                    if last <= first:
                        continue
                    index = segment.index(block)
                    pieces = [
                        Range(block.addr, first - block.addr, "free"),
                        Range(first, last - first),
                        Range(last, end - last, "free"),
                    ]
                    segment[index : index + 1] = [p for p in pieces if p.size]
                    self.reserved -= last - first
                    self.frees += 1
                    unmapped_any = True
                    self.merge(segment, first)
                if unmapped_any and len(segment) == 1 and segment[0].state == "unmapped":
                    self.segments[small].remove(segment)

    @staticmethod
    def merge(segment: list[Range], addr: int) -> Range:
        """Merges neighbouring free (or unmapped) ranges; the range now holding addr."""
        merged: list[Range] = []
        for block in segment:
            if merged and merged[-1].state == block.state != "allocated":
                merged[-1].size += block.size
            else:
                merged.append(block)
        segment[:] = merged
        return next(b for b in segment if b.addr <= addr < b.addr + b.size)

    def free(self, segment: list[Range], block: Range) -> None:
        block.state = "free"
        self.merge(segment, block.addr)


def reference_replay(
    trace: cubepool.Trace, limit: int | None, expandable: bool = False
) -> dict[str, int]:
    model: Reference | ExpandableReference = (
        ExpandableReference(limit) if expandable else Reference(limit)
    )
    live: dict[int, Any] = {}
    peak = failed = 0
    for _, op, ident, size in trace.events():
        if op == "alloc":
            if size == 0:
                live[ident] = None
                continue
            got = model.malloc(size)
            if got is None:
                failed += 1
            else:
                live[ident] = got
                peak = max(peak, model.reserved)
        elif ident in live:
            held = live.pop(ident)
            if held is not None:
                model.free(*held)
    return {
        "peak_reserved": peak,
        "storage_allocations": model.mallocs,
        "storage_frees": model.frees,
        "failed_reserves": failed,
        "final_reserved": model.reserved,
    }


def model_replay(
    trace: cubepool.Trace, limit: int | None, expandable: bool = False
) -> dict[str, int]:
    model = cubepool.TorchAllocatorModel(expandable)
    result = cubepool.replay(trace, model, limit=limit, samples=0)
    return {
        "peak_reserved": result.peak_reserved,
        "storage_allocations": result.storage_allocations,
        "storage_frees": result.storage_frees,
        "failed_reserves": result.failed_reserves,
        "final_reserved": result.final_usage.bytes_reserved,
    }


sizes = st.one_of(
    st.integers(0, 4 * KIB),
    st.integers(1, 2 * MIB),
    st.integers(MIB, 48 * MIB),
    # Whole half-MiBs, so that remainders land on the rules' edges (exactly 1 MiB left).
    st.integers(1, 96).map(lambda n: n * 512 * KIB),
)


@st.composite
def traces(draw: st.DrawFn) -> cubepool.Trace:
    events: list[tuple[int, str, int, int]] = []
    live: list[int] = []
    for ident in range(draw(st.integers(1, 120))):
        while live and draw(st.booleans()):
            victim = live.pop(draw(st.integers(0, len(live) - 1)))
            events.append((len(events), "free", victim, 0))
        events.append((len(events), "alloc", ident, draw(sizes)))
        live.append(ident)
    return cubepool.Trace.from_events(events)


@settings(max_examples=150, deadline=None)
@given(
    trace=traces(),
    limit=st.one_of(st.none(), st.integers(4, 200).map(lambda n: n * MIB)),
    expandable=st.booleans(),
)
def test_the_model_agrees_with_a_plain_implementation(
    trace: cubepool.Trace, limit: int | None, expandable: bool
) -> None:
    assert model_replay(trace, limit, expandable) == reference_replay(trace, limit, expandable)


@pytest.mark.parametrize("expandable", [False, True])
@pytest.mark.parametrize("name", cubepool.examples.names())
def test_the_model_agrees_on_the_bundled_traces(name: str, expandable: bool) -> None:
    trace = cubepool.load_trace(cubepool.examples.path(name))
    unlimited = model_replay(trace, None, expandable)
    assert unlimited == reference_replay(trace, None, expandable)
    # Under a limit between the peak live bytes and what the model reserves, the
    # release-and-retry path runs.
    limit = trace.peak_live + (unlimited["peak_reserved"] - trace.peak_live) // 2
    assert model_replay(trace, limit, expandable) == reference_replay(trace, limit, expandable)

"""The Rust model of PyTorch's caching allocator against a second, deliberately plain
implementation of the same rules (default settings: no expandable segments, no
max_split_size): lists of blocks per segment, scanned in full on every request. Both
must agree on every figure of a replay, on random traces and on the bundled real ones."""

from __future__ import annotations

from dataclasses import dataclass, field

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


def reference_replay(trace: cubepool.Trace, limit: int | None) -> dict[str, int]:
    model = Reference(limit)
    live: dict[int, tuple[Segment, Block] | None] = {}
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


def model_replay(trace: cubepool.Trace, limit: int | None) -> dict[str, int]:
    result = cubepool.replay(trace, cubepool.TorchAllocatorModel(), limit=limit, samples=0)
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
@given(trace=traces(), limit=st.one_of(st.none(), st.integers(4, 200).map(lambda n: n * MIB)))
def test_the_model_agrees_with_a_plain_implementation(
    trace: cubepool.Trace, limit: int | None
) -> None:
    assert model_replay(trace, limit) == reference_replay(trace, limit)


@pytest.mark.parametrize("name", cubepool.examples.names())
def test_the_model_agrees_on_the_bundled_traces(name: str) -> None:
    trace = cubepool.load_trace(cubepool.examples.path(name))
    assert model_replay(trace, None) == reference_replay(trace, None)
    # Under a limit between the peak live bytes and what the model reserves, the
    # release-and-retry path runs.
    limit = trace.peak_live + (model_replay(trace, None)["peak_reserved"] - trace.peak_live) // 2
    assert model_replay(trace, limit) == reference_replay(trace, limit)

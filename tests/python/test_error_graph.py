"""The error/taint graph from Python: failed launches, skipped launches, claims, reports."""

from __future__ import annotations

from collections.abc import Iterator

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import cubepool
from conftest import custom, sliced


@pytest.fixture
def mm() -> cubepool.MemoryManagement:
    return custom(sliced(4096, 4096, cap=4096))


def test_failed_launch_taints_its_outputs(mm: cubepool.MemoryManagement) -> None:
    a, b = mm.reserve(64), mm.reserve(64)
    assert mm.launch("init", writes=[a]) is None
    failure = mm.launch("matmul", reads=[a], writes=[b], fail="illegal address")
    assert isinstance(failure, cubepool.FailureId)
    claim = mm.claim(b)
    assert claim is not None
    assert (claim.kind, claim.failure, claim.start, claim.end) == ("failed", failure, 0, 64)
    assert mm.claim(a) is None
    graph = mm.error_graph()
    assert graph.failures() == [failure]
    assert graph.carriers(failure) == 1
    assert graph.message(failure) == "illegal address"


def test_reading_a_tainted_input_skips_and_propagates(mm: cubepool.MemoryManagement) -> None:
    a, b, c = mm.reserve(32), mm.reserve(32), mm.reserve(32)
    failure = mm.launch("producer", writes=[a], fail="NaN check")
    skipped = mm.launch("relu", reads=[a], writes=[b, (c, 0, 16)])
    assert isinstance(skipped, cubepool.Skipped)
    assert skipped.kernel == "relu"
    assert skipped.failure == failure
    assert skipped.needed.alloc == a.id
    assert mm.claim(c, 0, 16).failure == failure  # type: ignore[union-attr]
    assert mm.claim(c, 16, 32) is None
    graph = mm.error_graph()
    assert graph.carriers(failure) == 3
    assert [s.kernel for s in graph.skipped(failure)] == ["relu"]
    report = graph.report(c)
    assert report is not None
    assert "relu" in report and "producer" in report and "NaN check" in report


def test_writing_the_whole_range_clears_the_claim(mm: cubepool.MemoryManagement) -> None:
    a = mm.reserve(64)
    mm.launch("k", writes=[a], fail="boom")
    mm.write(a)
    assert mm.claim(a) is None
    assert mm.error_graph().is_empty()


def test_partial_write_leaves_a_partial_claim(mm: cubepool.MemoryManagement) -> None:
    a = mm.reserve(64)
    failure = mm.launch("k", writes=[a], fail="boom")
    mm.write(a, 0, 40)
    assert mm.claim(a, 0, 40) is None
    claim = mm.claim(a)
    assert claim is not None and (claim.start, claim.end, claim.failure) == (40, 64, failure)


def test_dropping_the_last_carrier_removes_the_failure(mm: cubepool.MemoryManagement) -> None:
    a, b = mm.reserve(64), mm.reserve(64)
    failure = mm.launch("k", writes=[a], fail="boom")
    mm.launch("copy", reads=[a], writes=[b])
    graph = mm.error_graph()
    assert graph.carriers(failure) == 2
    a.release()
    assert graph.carriers(failure) == 1
    del b
    assert graph.failures() == []
    assert graph.message(failure) is None


def test_a_launch_refuses_a_handle_released_while_its_arguments_are_read(
    mm: cubepool.MemoryManagement,
) -> None:
    a, b = mm.reserve(64), mm.reserve(64)

    def writes() -> Iterator[cubepool.ManagedMemoryHandle]:
        yield a
        a.release()  # Python code run by the launch, after a's range was taken
        yield b

    with pytest.raises(cubepool.HandleReleased):
        mm.launch("k", writes=writes(), fail="boom")
    graph = mm.error_graph()
    assert graph.failures() == [], "no failure is left on the freed allocation"
    assert mm.claim(b) is None
    mm.check_invariants()


def test_a_failed_bind_leaves_an_unallocated_claim_that_propagates(
    mm: cubepool.MemoryManagement,
) -> None:
    held = mm.reserve(4096)  # the capped pool is now full
    h = mm.handle()
    assert not h.bound and h.size == 0
    with pytest.raises(cubepool.PoolCapacityExceeded):
        mm.bind(h, 1024)
    claim = mm.claim(h)
    assert claim is not None and claim.kind == "unallocated" and claim.end == 1024
    held.release()
    out = mm.reserve(128)
    skipped = mm.launch("consumer", reads=[h], writes=[out])
    assert isinstance(skipped, cubepool.Skipped)
    assert skipped.needed.kind == "unallocated"
    report = mm.error_graph().report(out)
    assert report is not None and "1024" in report
    mm.bind(h, 1024)  # memory is free again: the handle gets bytes
    assert h.bound and h.size == 1024
    assert mm.claim(h) is None
    memoryview(h)[:4] = b"abcd"


def test_a_handle_bound_while_a_launch_reads_its_arguments_is_refused(
    mm: cubepool.MemoryManagement,
) -> None:
    # The launch took h's range from its unallocated claim (1,024 bytes), then the
    # writes' iterator bound h to 16: a failure was recorded on bytes 16..1024 past its
    # end, which no write could clear, while claim(h) said it was clean.
    held = mm.reserve(4096)
    h = mm.handle()
    with pytest.raises(cubepool.PoolCapacityExceeded):
        mm.bind(h, 1024)
    held.release()

    def writes() -> Iterator[cubepool.ManagedMemoryHandle]:
        yield h
        mm.bind(h, 16)

    with pytest.raises(cubepool.InvalidArgument, match="was bound while the launch's arguments"):
        mm.launch("k", writes=writes(), fail="boom")
    assert len(mm.error_graph()) == 0
    assert mm.launch("k", writes=[h], fail="boom") is not None  # its range is its 16 bytes
    mm.write(h)
    assert mm.claim(h) is None and len(mm.error_graph()) == 0


def test_an_unbound_handle_cannot_be_bound_to_pinned_exported_or_located(
    mm: cubepool.MemoryManagement,
) -> None:
    # A binding or pin of a handle not bound yet held nothing: bound later, the handle's
    # memory was freed at its release while the binding and the pin said they held it.
    h = mm.handle()
    with pytest.raises(cubepool.InvalidArgument, match="not bound yet; bind it before taking"):
        h.binding()
    with pytest.raises(cubepool.InvalidArgument, match="not bound yet; bind it before pinning"):
        mm.shared_bindings([h])
    # An export took a binding of the unbound descriptor: once the handle was bound
    # (under the same id), dropping the capsule cleared the bound allocation's books.
    with pytest.raises(cubepool.InvalidArgument, match="bind it before exporting it to DLPack"):
        h.__dlpack__()
    # It has no bytes: where they are is no answer of 0 bytes at address 0.
    with pytest.raises(cubepool.InvalidArgument, match="bind it before asking where its bytes"):
        mm.resource(h)
    mm.bind(h, 1024)
    failure = mm.launch("k", writes=[h], fail="boom")
    capsule = h.__dlpack__()
    del capsule
    mm.cleanup()
    assert mm.claim(h) is not None and mm.error_graph().carriers(failure) == 1
    shared = mm.shared_bindings([h])
    binding = h.binding()
    h.release()
    assert binding.size == 1024 and shared.bytes >= 1024
    assert mm.memory_usage().number_allocs == 1
    shared.release()
    del binding
    assert mm.memory_usage().number_allocs == 0


def test_a_binding_dropped_while_the_arguments_are_read_outlives_the_launch(
    mm: cubepool.MemoryManagement,
) -> None:
    # The iterator of `writes` dropped the last binding of an allocation whose range was
    # taken: the allocation went, and the failure was recorded on it after, where no
    # release would ever clear it (1 carrier, 0 bytes in use).
    h = mm.reserve(256)
    kept = [h.binding()]
    h.release()

    def writes() -> Iterator[cubepool.ManagedMemoryBinding]:
        yield kept.pop()
        mm.cleanup()

    failure = mm.launch("k", writes=writes(), fail="boom")
    assert failure is not None
    mm.cleanup()
    usage = mm.memory_usage()
    assert (usage.bytes_in_use, mm.error_graph().carriers(failure)) == (0, 0)
    mm.check_invariants()


def test_bad_ranges_and_targets_are_clear_errors(mm: cubepool.MemoryManagement) -> None:
    a = mm.reserve(64)
    with pytest.raises(cubepool.InvalidArgument, match="outside allocation"):
        mm.launch("k", writes=[(a, 0, 65)])
    with pytest.raises(cubepool.InvalidArgument, match="outside allocation"):
        mm.claim(a, 10, 5)
    with pytest.raises(TypeError):
        mm.launch("k", reads=[42])
    unbound = mm.handle()
    with pytest.raises(cubepool.InvalidArgument, match="not bound"):
        mm.launch("k", reads=[unbound])
    with pytest.raises(cubepool.InvalidArgument, match="not bound"):
        memoryview(unbound)
    a.release()
    with pytest.raises(cubepool.HandleReleased):
        mm.claim(a)


def test_a_bound_that_binds_its_target_is_checked_against_the_new_extent(
    mm: cubepool.MemoryManagement,
) -> None:
    """A bound's `__index__` runs Python code: one that binds the target first must not
    let a range past the new allocation through (the extent is read after the bounds)."""
    held = mm.reserve(4096)  # the capped pool is full: the bind below fails
    h = mm.handle()
    with pytest.raises(cubepool.PoolCapacityExceeded):
        mm.bind(h, 2048)  # an "unallocated" claim of 2,048 bytes
    held.release()

    class BindsFirst:
        def __index__(self) -> int:
            mm.bind(h, 16)
            return 0

    with pytest.raises(cubepool.InvalidArgument, match=r"outside allocation .* of 16 bytes"):
        mm.write(h, BindsFirst(), 2048)
    other = mm.handle()

    class BindsOther:
        def __index__(self) -> int:
            mm.bind(other, 16)
            return 0

    with pytest.raises(cubepool.InvalidArgument, match=r"outside allocation .* of 16 bytes"):
        mm.launch("k", writes=[(other, BindsOther(), 32)])


def test_handles_and_bindings_of_another_management_are_refused(
    mm: cubepool.MemoryManagement,
) -> None:
    other = custom(sliced(4096, 4096, cap=4096))
    mine, theirs = mm.reserve(64), other.reserve(64)
    for foreign in (theirs, theirs.binding(), (theirs, 0, 8)):
        with pytest.raises(cubepool.InvalidArgument, match="another MemoryManagement"):
            mm.launch("k", writes=[foreign], fail="boom")
        with pytest.raises(cubepool.InvalidArgument, match="another MemoryManagement"):
            mm.launch("k", reads=[foreign], writes=[mine])
    for target in (theirs, theirs.binding()):
        with pytest.raises(cubepool.InvalidArgument, match="another MemoryManagement"):
            mm.claim(target)
        with pytest.raises(cubepool.InvalidArgument, match="another MemoryManagement"):
            mm.write(target)
        with pytest.raises(cubepool.InvalidArgument, match="another MemoryManagement"):
            mm.error_graph().report(target)
        # The same error from every call that takes one, as the README's guarantee
        # says (`resource` raised `NotFound`: helper-132's find).
        with pytest.raises(cubepool.InvalidArgument, match="another MemoryManagement"):
            mm.resource(target)
        with pytest.raises(cubepool.InvalidArgument, match="another MemoryManagement"):
            mm.shared_bindings([target])
    with pytest.raises(cubepool.InvalidArgument, match="another MemoryManagement"):
        mm.bind(other.handle(), 16)
    # Nothing leaked into either graph, and the owner still sees its bytes as clean.
    assert mm.error_graph().is_empty() and other.error_graph().is_empty()
    assert other.claim(theirs) is None


def test_bindings_are_targets_too(mm: cubepool.MemoryManagement) -> None:
    a = mm.reserve(64)
    binding = a.binding()
    failure = mm.launch("k", writes=[binding], fail="x")
    assert mm.claim(a).failure == failure  # type: ignore[union-attr]


SIZE = 16


class GraphMachine(RuleBasedStateMachine):
    """Launches, writes and releases against a per-byte model of failure ids."""

    def __init__(self) -> None:
        super().__init__()
        self.mm = custom(sliced(4096, 4096))
        self.handles: list[cubepool.ManagedMemoryHandle] = []
        self.bytes: dict[int, list[cubepool.FailureId | None]] = {}

    @precondition(lambda self: len(self.handles) < 6)
    @rule()
    def reserve(self) -> None:
        h = self.mm.reserve(SIZE)
        self.handles.append(h)
        self.bytes[h.id] = [None] * SIZE

    def _range(self, data: st.DataObject) -> tuple[cubepool.ManagedMemoryHandle, int, int]:
        h = data.draw(st.sampled_from(self.handles))
        start = data.draw(st.integers(0, SIZE))
        end = data.draw(st.integers(start, SIZE))
        return h, start, end

    @precondition(lambda self: self.handles)
    @rule(data=st.data(), fail=st.booleans(), n_reads=st.integers(0, 2), n_writes=st.integers(0, 2))
    def launch(self, data: st.DataObject, fail: bool, n_reads: int, n_writes: int) -> None:
        reads = [self._range(data) for _ in range(n_reads)]
        writes = [self._range(data) for _ in range(n_writes)]
        outcome = self.mm.launch("k", reads=reads, writes=writes, fail="f" if fail else None)
        expected = None
        for h, start, end in reads:
            tainted = [f for f in self.bytes[h.id][start:end] if f is not None]
            if tainted:
                expected = tainted[0]
                break
        if expected is not None:
            assert isinstance(outcome, cubepool.Skipped)
            assert outcome.failure == expected
            self._taint(writes, expected)
        elif fail:
            assert isinstance(outcome, cubepool.FailureId)
            self._taint(writes, outcome)
        else:
            assert outcome is None
            self._taint(writes, None)

    def _taint(
        self,
        writes: list[tuple[cubepool.ManagedMemoryHandle, int, int]],
        failure: cubepool.FailureId | None,
    ) -> None:
        for h, start, end in writes:
            for i in range(start, end):
                self.bytes[h.id][i] = failure

    @precondition(lambda self: self.handles)
    @rule(data=st.data())
    def write(self, data: st.DataObject) -> None:
        h, start, end = self._range(data)
        self.mm.write(h, start, end)
        self._taint([(h, start, end)], None)

    @precondition(lambda self: self.handles)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        h = data.draw(st.sampled_from(self.handles))
        self.handles.remove(h)
        del self.bytes[h.id]
        h.release()

    @invariant()
    def carriers_are_exact(self) -> None:
        graph = self.mm.error_graph()
        counts: dict[cubepool.FailureId, int] = {}
        for byte_failures in self.bytes.values():
            for failure in {f for f in byte_failures if f is not None}:
                counts[failure] = counts.get(failure, 0) + 1
        assert sorted(graph.failures()) == sorted(counts)
        for failure, count in counts.items():
            assert graph.carriers(failure) == count
        for h in self.handles:
            claim = self.mm.claim(h)
            first = next((i for i, f in enumerate(self.bytes[h.id]) if f is not None), None)
            if first is None:
                assert claim is None
            else:
                assert claim is not None and claim.start == first
                assert claim.failure == self.bytes[h.id][first]


TestGraphMachine = GraphMachine.TestCase
TestGraphMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)

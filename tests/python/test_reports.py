"""Reports, records, measured plans, install_pools, statistics and shared bindings."""

from __future__ import annotations

import json
import pickle

import pytest

import cubepool
from conftest import KIB, MIB

SLICED = pytest.mark.skipif(
    cubepool.EXCLUSIVE_MEMORY_ONLY, reason="sliced pools are unavailable in this build"
)


def small(text: str) -> cubepool.MemoryManagement:
    """A MemoryManagement over `text` with 64 MiB pages and 32-byte alignment."""
    return cubepool.MemoryManagement(
        text, cubepool.MemoryDeviceProperties(max_page_size=64 * MIB, alignment=32)
    )


def test_a_report_describes_every_pool() -> None:
    mm = small("exclusive(max_alloc=1MiB, dealloc_period=500); direct(reclaim_at=1GiB)")
    held = [mm.reserve(1000), mm.reserve(2 * MIB)]
    report = mm.memory_report()
    assert [p.kind.type for p in report.dynamic] == ["exclusive", "direct"]
    assert report.persistent.kind.type == "persistent"
    exclusive, direct = report.dynamic
    assert exclusive.kind.max_alloc_size == MIB
    assert exclusive.kind.page_size is None
    assert exclusive.dealloc_period == 500
    assert exclusive.usage == cubepool.MemoryUsage(1, 1000, 24, 1024)
    assert (exclusive.pages, exclusive.pages_peak, exclusive.largest_alloc) == (1, 1, 1000)
    assert direct.kind.reclaim_at == 1 << 30
    assert report.usage.bytes_in_use == 1000 + 2 * MIB
    assert exclusive.options() == cubepool.MemoryPoolOptions(
        cubepool.PoolType.exclusive_pages(MIB), 500
    )
    assert report.persistent.options() is None
    assert report.configuration() == mm.config
    del held


def test_reports_are_plain_data() -> None:
    mm = small("exclusive(max_alloc=1MiB)")
    _held = mm.reserve(100)
    report = mm.memory_report()
    assert report == mm.memory_report()
    assert hash(report) == hash(mm.memory_report())
    data = report.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert data["dynamic"][0]["kind"] == {"type": "exclusive", "max_alloc_size": MIB}
    assert data["dynamic"][0]["usage"]["bytes_in_use"] == 100
    assert cubepool.MemoryReport.from_dict(data) == report
    assert pickle.loads(pickle.dumps(report)) == report
    assert "MemoryReport" in repr(report) and "1 pools" in repr(report).replace("=1", " 1")
    assert "MemoryPoolReport(kind=exclusive(max_alloc=1MiB)" in repr(report.dynamic[0])
    table = str(report)
    assert "exclusive(max_alloc=1MiB)" in table and "persistent" in table and "total" in table
    assert str(report.dynamic[0].kind) == "exclusive(max_alloc=1MiB)"
    assert report.dynamic[0].kind.to_dict() == {"type": "exclusive", "max_alloc_size": MIB}


def test_from_dict_refuses_what_to_dict_does_not_write() -> None:
    with pytest.raises(cubepool.InvalidArgument, match="not a MemoryReport"):
        cubepool.MemoryReport.from_dict({"dynamic": []})
    with pytest.raises(TypeError):
        cubepool.MemoryReport.from_dict([])  # type: ignore[arg-type]
    with pytest.raises(cubepool.InvalidArgument):
        cubepool.MemoryRecord.from_dict({"label": "x"})


def test_records_number_and_time_their_reports_and_survive_install() -> None:
    mm = small("exclusive(max_alloc=1MiB)")
    first = mm.record_memory("empty")
    handle = mm.reserve(KIB)
    second = mm.record_memory("one buffer")
    assert (first.label, first.sequence, second.sequence) == ("empty", 0, 1)
    assert 0 <= first.time <= second.time
    assert second.report.usage.bytes_in_use == KIB
    assert mm.records() == [first, second]
    assert "sequence=1" in repr(second) and 'label="one buffer"' in repr(second)
    assert str(second).startswith('record 1 "one buffer" at ')
    assert cubepool.MemoryRecord.from_dict(second.to_dict()) == second
    assert pickle.loads(pickle.dumps(second)) == second
    handle.release()
    mm.install_pools("exclusive(max_alloc=4MiB)")
    assert mm.records() == [first, second]
    assert len(mm.take_records()) == 2
    assert mm.records() == []
    assert mm.record_memory("after").sequence == 2


def test_install_pools_refuses_live_memory_and_keeps_the_persistent_pool() -> None:
    mm = small("exclusive(max_alloc=1MiB); direct()")
    with mm.persistent():
        weights = mm.reserve(4000)
    live = mm.reserve(100)
    with pytest.raises(cubepool.InstallMemoryPoolsError) as info:
        mm.install_pools("exclusive(max_alloc=8MiB)")
    assert (info.value.kind, info.value.bytes_in_use) == ("PoolsInUse", 100)
    assert isinstance(info.value, cubepool.CubepoolError)
    assert len(mm.memory_report().dynamic) == 2, "a refusal changes nothing"
    with pytest.raises(cubepool.PoolConfigError) as bad:
        mm.install_pools("exclusive(max_alloc=1MiB); bogus()")
    assert bad.value.kind == "UnknownPoolKind"
    live.release()
    mm.install_pools(cubepool.MemoryConfiguration.parse("exclusive(max_alloc=8MiB)"))
    assert str(mm.config) == "exclusive(max_alloc=8MiB)"
    report = mm.memory_report()
    assert len(report.dynamic) == 1 and report.dynamic[0].pages_peak == 0
    assert report.persistent.usage.bytes_in_use == 4000
    assert mm.resource(weights).size == 4000
    assert mm.resource(mm.reserve(5 * MIB)).pool == 0
    mm.check_invariants()


def test_memory_stats_use_torch_keys() -> None:
    mm = small("exclusive(max_alloc=4MiB)")
    a, b = mm.reserve(100), mm.reserve(2 * MIB)
    stats = mm.memory_stats()
    for key in [
        "allocation",
        "allocated_bytes",
        "segment",
        "reserved_bytes",
        "active",
        "active_bytes",
        "inactive_split",
        "inactive_split_bytes",
        "requested_bytes",
    ]:
        for field in ["current", "peak", "allocated", "freed"]:
            assert f"{key}.all.{field}" in stats
    for key in ["num_ooms", "num_alloc_retries", "num_device_alloc", "num_device_free"]:
        assert key in stats
    assert list(stats) == sorted(stats)
    assert stats["allocation.all.current"] == 2
    assert stats["requested_bytes.all.current"] == 100 + 2 * MIB
    assert stats["allocated_bytes.all.current"] == 128 + 2 * MIB
    assert stats["reserved_bytes.all.current"] == 128 + 2 * MIB
    assert stats["segment.all.current"] == stats["num_device_alloc"] == 2
    b.release()
    stats = mm.memory_stats()
    assert stats["allocated_bytes.all.current"] == 128
    assert stats["allocated_bytes.all.peak"] == 128 + 2 * MIB
    assert stats["allocation.all.freed"] == 1
    assert stats["inactive_split_bytes.all.current"] == 2 * MIB
    mm.reset_peak_memory_stats()
    assert mm.memory_stats()["allocated_bytes.all.peak"] == 128
    mm.reset_accumulated_memory_stats()
    stats = mm.memory_stats()
    assert (stats["allocation.all.allocated"], stats["num_device_alloc"]) == (0, 0)
    summary = mm.memory_summary()
    for row in ["Allocated memory", "Reserved memory", "Allocations", "OOMs"]:
        assert row in summary
    assert all(len(line) == 77 for line in summary.splitlines())
    a.release()


@SLICED
def test_capacity_errors_count_as_ooms() -> None:
    mm = small("sliced(page=1MiB, max_slice=1MiB, cap=1MiB)")
    _full = mm.reserve(MIB)
    with pytest.raises(cubepool.PoolCapacityExceeded):
        mm.reserve(10)
    assert mm.memory_stats()["num_ooms"] == 1


def test_shared_bindings_keep_memory_in_use_until_exit() -> None:
    mm = small("exclusive(max_alloc=1MiB)")
    a, b = mm.reserve(1000), mm.reserve(24)
    with mm.shared_bindings([a, b.binding()]) as shared:
        assert len(shared) == 2 and shared.bytes == 1024
        assert shared.ids == [a.id, b.id]
        assert a.can_mut, "a pinned handle stays writable: bindings are not handles"
        a.release()
        b.release()
        assert mm.memory_usage().bytes_in_use == 1024
        assert "bindings=2" in repr(shared)
    assert shared.released and len(shared) == 0
    assert mm.memory_usage().bytes_in_use == 0
    shared.release()  # releasing twice does nothing
    with pytest.raises(cubepool.InvalidArgument, match="released"):
        shared.pin(mm.reserve(10))


def test_shared_bindings_check_their_targets() -> None:
    mm, other = small("exclusive(max_alloc=1MiB)"), small("exclusive(max_alloc=1MiB)")
    shared = mm.shared_bindings()
    with pytest.raises(cubepool.InvalidArgument, match="another MemoryManagement"):
        shared.pin(other.reserve(8))
    with pytest.raises(TypeError):
        shared.pin(42)  # type: ignore[arg-type]
    released = mm.reserve(8)
    released.release()
    with pytest.raises(cubepool.HandleReleased):
        shared.pin(released)
    shared.pin(mm.reserve(8))
    assert len(shared) == 1
    shared.release()
    assert mm.memory_usage().number_allocs == 0


def test_exclusive_memory_only_is_visible() -> None:
    assert isinstance(cubepool.EXCLUSIVE_MEMORY_ONLY, bool)
    if cubepool.EXCLUSIVE_MEMORY_ONLY:
        with pytest.raises(cubepool.PoolConfigError) as info:
            cubepool.MemoryConfiguration.parse("sliced(page=1MiB, max_slice=1KiB)")
        assert info.value.kind == "SlicedPoolsUnavailable"
        assert cubepool.MemoryManagement().config.preset == "exclusive_pages"
    else:
        assert cubepool.MemoryManagement().config.preset == "virtual_pages"


def run_trace(mm: cubepool.MemoryManagement, trace: cubepool.Trace) -> int:
    """Reserves and releases per the trace; returns the failed reserves."""
    live: dict[int, cubepool.ManagedMemoryHandle] = {}
    failures = 0
    for _, op, ident, size in trace.events():
        if op == "alloc":
            try:
                live[ident] = mm.reserve(size)
            except (cubepool.PoolCapacityExceeded, cubepool.OutOfMemory):
                failures += 1
        elif ident in live:
            live.pop(ident).release()
    for handle in live.values():
        handle.release()
    return failures


@pytest.mark.parametrize("layout", ["sub_slices", "exclusive_pages"])
def test_a_plan_replays_the_workload_with_no_error_and_no_more_memory(layout: str) -> None:
    if layout == "sub_slices" and cubepool.EXCLUSIVE_MEMORY_ONLY:
        pytest.skip("sliced pools are unavailable in this build")
    trace = cubepool.load_trace(cubepool.examples.path("gpt2-generate"))
    mm = cubepool.MemoryManagement(layout)
    assert run_trace(mm, trace) == 0
    measured = mm.memory_stats()["reserved_bytes.all.peak"]
    plan = mm.memory_report().plan()
    assert plan.preset == "custom"
    # Measure the plan on the same MemoryManagement: install it, then run again.
    mm.install_pools(plan)
    mm.reset_peak_memory_stats()
    assert run_trace(mm, trace) == 0
    assert mm.memory_stats()["reserved_bytes.all.peak"] <= measured
    assert mm.memory_stats()["num_ooms"] == 0
    # And as a hard budget in a replay: a device of exactly the measured peak serves it.
    result = cubepool.replay(trace, plan, limit=measured)
    assert result.failed_reserves == 0
    assert result.peak_reserved <= measured
    mm.check_invariants()


@SLICED
def test_plans_cap_sliced_pools_and_keep_exclusive_pools() -> None:
    mm = small(
        "sliced(page=1MiB, max_slice=64KiB); sliced(page=4MiB, max_slice=1MiB); "
        "exclusive(max_alloc=64MiB)"
    )
    held = [mm.reserve(60 * KIB) for _ in range(40)] + [mm.reserve(32 * MIB)]
    report = mm.memory_report()
    assert report.dynamic[0].pages_peak == 3
    assert str(report.plan()) == (
        "sliced(page=1MiB, max_slice=64KiB, cap=3MiB); "
        "sliced(page=4MiB, max_slice=1MiB, cap=4MiB); exclusive(max_alloc=64MiB)"
    )
    assert "cap=4MiB" in str(report.plan(headroom=0.25)).split(";")[0]
    with pytest.raises(cubepool.InvalidArgument, match="headroom"):
        report.plan(-1.0)
    del held

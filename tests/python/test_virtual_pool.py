"""The virtual pool from Python: host memory mapped on demand, viewed by numpy without
copying, given back when handles go; its kind in layouts, replays and reports."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import cubepool
from conftest import load_script
from cubepool import MemoryConfiguration, MemoryPoolOptions, PoolType

MIB = 1 << 20
linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="host virtual memory is Linux-only"
)


def resident_bytes() -> int:
    """Resident memory of this process, from /proc/self/statm."""
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


@linux_only
def test_virtual_memory_is_real_host_memory_that_resident_memory_follows() -> None:
    mm = cubepool.MemoryManagement("virtual(granule=2MiB)")
    before = resident_bytes()
    handle = mm.reserve(64 * MIB)
    array = np.frombuffer(handle, dtype=np.uint8)
    array[:] = 7
    mapped = resident_bytes()
    assert mapped >= before + 60 * MIB, (before, mapped)
    assert mm.memory_usage().bytes_reserved == 64 * MIB
    assert int(array.sum()) == 7 * 64 * MIB
    del array
    handle.release()
    assert mm.memory_usage().bytes_reserved == 0, "unmapped as soon as the handle went"
    assert resident_bytes() + 60 * MIB <= mapped, "resident memory fell"
    stats = mm.memory_stats()
    assert (stats["num_device_alloc"], stats["num_device_free"]) == (1, 1)


@linux_only
def test_a_view_survives_other_handles_unmaps_with_its_bytes() -> None:
    mm = cubepool.MemoryManagement("virtual(granule=2MiB)")
    handles = [mm.reserve(4 * MIB) for _ in range(4)]
    kept = handles.pop(1)
    view = np.frombuffer(kept, dtype=np.uint8)
    view[:] = np.arange(view.size, dtype=np.uint64) % 251
    expected = view.copy()
    address = mm.resource(kept).address
    freed = mm.memory_stats()["num_device_free"]
    for handle in handles:
        handle.release()
    assert mm.memory_stats()["num_device_free"] == freed + 3, "the others were unmapped"
    # New reservations fill the freed space (mapped again) and are written over.
    others = [mm.reserve(3 * MIB) for _ in range(4)]
    for other in others:
        with memoryview(other) as raw:
            raw[:] = b"\xff" * len(raw)
    assert mm.resource(kept).address == address, "a handle's bytes never move"
    assert np.array_equal(view, expected)
    for other in others:
        other.release()
    assert np.array_equal(view, expected)
    del view
    kept.release()
    mm.cleanup()
    assert mm.memory_usage().bytes_reserved == 0


def test_pool_type_virtual_pages_reads_back_from_text_and_pickles() -> None:
    eager = PoolType.virtual_pages(2 * MIB)
    assert eager.kind == "virtual_pages"
    assert str(MemoryPoolOptions(eager)) == "virtual(granule=2MiB)"
    config = MemoryConfiguration.custom(
        [MemoryPoolOptions(PoolType.virtual_pages(2 * MIB, keep=None, small=0))]
    )
    assert str(config) == "virtual(granule=2MiB, keep=none, small=0B)"
    assert MemoryConfiguration.parse(str(config)) == config
    assert pickle.loads(pickle.dumps(config)) == config
    assert cubepool.describe(config) == "virtual 2 MiB granules (idle kept under the peak)"


def test_bad_virtual_pools_name_the_problem() -> None:
    with pytest.raises(cubepool.PoolConfigError) as info:
        MemoryConfiguration.parse("virtual(granule=3MiB)")
    assert (info.value.kind, info.value.field) == ("GranuleNotPowerOfTwo", "granule")
    with pytest.raises(cubepool.InvalidArgument):
        PoolType.virtual_pages(-1)


def test_replays_count_maps_and_unmaps_as_storage_calls() -> None:
    trace = cubepool.load_trace(cubepool.examples.path("gpt2-train"))
    eager = cubepool.replay(trace, MemoryConfiguration.parse("virtual(granule=2MiB)"))
    kept = cubepool.replay(
        trace, MemoryConfiguration.parse("virtual(granule=2MiB, keep=none, small=0)")
    )
    assert [pool.kind for pool in eager.pools] == ["virtual_pages"]
    assert eager.failed_reserves == 0
    # Every step frees and takes the same large tensors: eager unmapping maps them
    # again each time, keeping idle granules under the peak does not.
    assert eager.storage_allocations > 2 * kept.storage_allocations > 0
    assert eager.storage_frees > 0
    # It is the default layout; it reserves less than the default before it.
    assert kept.peak_reserved == cubepool.replay(trace).peak_reserved
    assert kept.peak_reserved < cubepool.replay(trace, MemoryConfiguration.compact()).peak_reserved
    table = str(cubepool.compare(trace, ["default", "virtual(granule=2MiB, keep=none)"]))
    assert "virtual" in table


def test_sizes_past_2_gib_are_served_when_the_limit_allows() -> None:
    events = [(0, "alloc", 0, 5 << 30), (1, "alloc", 1, 3 << 30), (2, "free", 0, 0)]
    trace = cubepool.Trace.from_events(events)
    virtual = MemoryConfiguration.parse("virtual(granule=2MiB)")
    result = cubepool.replay(trace, virtual, limit=9 << 30)
    assert result.failed_reserves == 0
    assert result.peak_reserved == 8 << 30
    assert cubepool.replay(trace, virtual, limit=6 << 30).failed_reserves == 1


@linux_only
def test_reports_describe_the_virtual_pool() -> None:
    mm = cubepool.MemoryManagement(
        MemoryConfiguration.parse("virtual(granule=64KiB, keep=1MiB, small=4KiB)")
    )
    handle = mm.reserve(100_000)
    report = mm.memory_report()
    kind = report.dynamic[0].kind
    assert (kind.type, kind.granule, kind.keep, kind.small) == ("virtual", 65536, MIB, 4096)
    assert report.dynamic[0].usage.bytes_reserved == 2 * 65536
    handle.release()
    assert mm.memory_report().dynamic[0].usage.bytes_reserved == 2 * 65536, "kept: 1 MiB"


def test_the_picture_names_a_virtual_pool_by_its_kind(tmp_path: Path) -> None:
    out = tmp_path / "mem.html"
    cubepool.plot("gpt2-train", "virtual(granule=2MiB)", out)
    page = out.read_text(encoding="utf-8")
    assert "pool 0: virtual 2 MiB granules" in page
    assert "direct buffers" not in page


@pytest.mark.skipif(sys.platform != "linux", reason="address-space limits as Linux sets them")
def test_the_default_serves_under_an_address_space_limit() -> None:
    # A 1 TiB address range cannot be reserved under `ulimit -v 4 GiB` (batch systems set
    # such limits): the pool takes the largest half, quarter, ... the host grants.
    script = (
        "import resource\n"
        "resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))\n"
        "import numpy as np, cubepool\n"
        "mm = cubepool.MemoryManagement()\n"
        "h = mm.reserve(64 << 20)\n"
        "a = np.frombuffer(h, dtype=np.uint8)\n"
        "a[:] = 7\n"
        "assert int(a.sum()) == 7 * (64 << 20)\n"
        "print(mm.memory_usage().bytes_reserved)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) >= 64 << 20


ROOT = Path(__file__).resolve().parents[2]
# Every trace we hold: bundled, captured (benches/traces, and its wider models in
# benches/traces/wider) and shared (../shared/traces, where the checkout has it).
TRACE_FILES = sorted(
    [
        *(ROOT / "python" / "cubepool" / "examples" / "data").glob("*.jsonl.gz"),
        *(ROOT / "benches" / "traces").glob("*.jsonl.gz"),
        *(ROOT / "benches" / "traces" / "wider").glob("*.jsonl.gz"),
        *(ROOT.parent / "shared" / "traces").glob("*.jsonl"),
    ]
)


def trace_id(path: Path) -> str:
    """A trace's name, the wider captures' marked as such."""
    name = path.name.split(".")[0]
    return f"wider-{name}" if path.parent.name == "wider" else name


@pytest.mark.parametrize("path", TRACE_FILES, ids=trace_id)
def test_the_peak_of_mapped_bytes_is_eager_unmappings_whatever_is_kept(path: Path) -> None:
    """Issue 28: idle granules kept for reuse never raise the peak of mapped bytes
    above eager unmapping's (``keep=0``), with the default's size split or none."""
    trace = cubepool.load_trace(path)
    for small in ("0", "16MiB"):
        peaks = {
            keep: cubepool.replay(
                trace,
                MemoryConfiguration.parse(f"virtual(granule=2MiB, keep={keep}, small={small})"),
            ).peak_reserved
            for keep in ("0", "64MiB", "none")
        }
        assert len(set(peaks.values())) == 1, (small, peaks)


def test_the_default_keeps_up_with_expandable_segments_on_varied_calibration() -> None:
    """Issue 28's goal, never more than 0.005 below ``torch_expandable`` (model), on ten
    variants of layer-wise calibration (every distinct size of ``calibrate-layers``
    times its own factor in [0.85, 1.15]): where a per-channel statistic split the hole
    an activation had just left, the default fell to 0.059 below it on some."""
    tradeoff = load_script(ROOT / "benches" / "python" / "virtual_tradeoff.py")
    trace = cubepool.load_trace(ROOT / "benches" / "traces" / "calibrate-layers.jsonl.gz")
    margins = []
    for seed in range(1, 11):
        variant = tradeoff.scaled(trace, seed, 0.85, 1.15)
        ours, _ = tradeoff.measure(variant, "virtual_pages")
        theirs, _ = tradeoff.measure(variant, "torch_expandable")
        margins.append(round(ours - theirs, 4))
    assert min(margins) >= -0.005, margins


def test_timed_replays_hold_blocks_past_the_previous_defaults_largest_page() -> None:
    """The replay timing of ``virtual_tradeoff.py`` (parts 3 and 9) compares the default
    with ``compact``, whose largest page is 2 GiB by default: a trace scaled x128 holds
    larger blocks, which ``compact`` failed to reserve, so its replays did less work and
    its time flattered it. Both layouts are now resolved with a largest page that holds
    the trace, so both hold every block; the default properties stay where they do."""
    tradeoff = load_script(ROOT / "benches" / "python" / "virtual_tradeoff.py")
    small = cubepool.Trace.from_events(
        [(0, "alloc", 0, 3 * MIB), (1, "free", 0, 3 * MIB)], {"workload": "small"}
    )
    assert tradeoff.timing_properties(small) == cubepool.MemoryDeviceProperties()
    large = tradeoff.scaled_by(small, 1000)  # one block of 3,000 MiB
    properties = tradeoff.timing_properties(large)
    assert properties.max_page_size == 4096 * MIB
    assert not cubepool.replay(large, "compact").complete
    best = tradeoff.fastest(large, 1)
    assert sorted(best) == ["compact", "virtual_pages"]
    assert all(result.complete for result in best.values())


def test_the_timeline_falls_when_a_release_gives_storage_back() -> None:
    # keep=0 unmaps a run as soon as no live byte is in it: the storage's bytes fall at
    # the free, and the timeline said they stayed at their high (only allocations were
    # read), while each pool's line and the final usage fell.
    mib = 1 << 20
    trace = cubepool.Trace.from_events(
        [(0, "alloc", 0, 100 * mib), (1, "alloc", 1, 30 * mib), (2, "free", 0), (3, "free", 1)]
    )
    result = cubepool.replay(trace, "virtual(granule=2MiB, keep=0B)")
    timeline = result.timeline
    assert list(timeline.reserved_end) == [100 * mib, 130 * mib, 30 * mib, 0]
    assert list(timeline.reserved_min) == [0, 100 * mib, 30 * mib, 0]
    assert list(timeline.reserved_end) == list(timeline.pool_reserved[0])
    assert result.peak_reserved == 130 * mib and result.final_usage.bytes_reserved == 0

"""Allocation experiments: replay metrics, loading any format, layouts, compare, plan,
sweep, pictures, and the command line (issue 6)."""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import pickle
import random
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cubepool
from conftest import running
from cubepool import layouts
from cubepool._cubepool import pool_spec
from cubepool.cli import ProgressBar, main, parse_size
from cubepool.plan import derivation_trace, perturb

MIB = 1 << 20
EXAMPLES = cubepool.examples.names()


@pytest.fixture(scope="module")
def traces() -> dict[str, cubepool.Trace]:
    return {name: cubepool.load_trace(cubepool.examples.path(name)) for name in EXAMPLES}


def staircase(steps: int, size: int = MIB) -> cubepool.Trace:
    """Live bytes rise to ``steps * size``, fall to zero, rise to half of it."""
    events: list[tuple[int, str, int, int]] = []
    t = 0
    for i in range(steps):
        events.append((t := t + 10, "alloc", i, size))
    for i in range(steps):
        events.append((t := t + 10, "free", i, 0))
    for i in range(steps, steps + steps // 2):
        events.append((t := t + 10, "alloc", i, size))
    return cubepool.Trace.from_events(events, {"workload": "staircase"})


# --------------------------------------------------------------------------- replay metrics


@pytest.mark.parametrize("samples", [1, 7, 100, 512, 100_000])
def test_timeline_is_bounded_and_keeps_the_exact_peaks(
    traces: dict[str, cubepool.Trace], samples: int
) -> None:
    trace = traces["gpt2-train"]
    result = cubepool.replay(trace, samples=samples)
    timeline = result.timeline
    assert 1 <= len(timeline) <= samples
    assert max(timeline.reserved_max) == result.peak_reserved
    assert max(timeline.in_use_max) == result.peak_in_use == trace.peak_live
    assert sum(timeline.events) == len(trace) == result.events
    assert timeline.first_event[0] == 0
    assert all(a <= b for a, b in zip(timeline.t_start, timeline.t_end, strict=True))
    assert all(
        lo <= end <= hi
        for lo, end, hi in zip(
            timeline.in_use_min, timeline.in_use_end, timeline.in_use_max, strict=True
        )
    )
    assert timeline.reserved_end[-1] == result.final_usage.bytes_reserved
    assert timeline.in_use_end[-1] == result.final_usage.bytes_in_use
    # Every pool's bytes add up to the totals at the end of each sample.
    for i in range(len(timeline)):
        assert sum(p[i] for p in timeline.pool_reserved) == timeline.reserved_end[i]
        assert sum(p[i] for p in timeline.pool_in_use) == timeline.in_use_end[i]


def test_no_samples_keeps_no_timeline(traces: dict[str, cubepool.Trace]) -> None:
    result = cubepool.replay(traces["gpt2-train"], samples=0)
    # One (empty) series per pool of the default layout, which has one.
    assert len(result.timeline) == 0 and result.timeline.pool_reserved == [[]]
    assert result.peak_reserved == cubepool.replay(traces["gpt2-train"]).peak_reserved


def test_per_pool_breakdown(traces: dict[str, cubepool.Trace]) -> None:
    trace = traces["gpt2-train"]
    result = cubepool.replay(trace, cubepool.MemoryConfiguration.sub_slices())
    pools = result.pools
    assert [p.index for p in pools] == list(range(len(pools)))
    assert sum(p.reservations for p in pools) == trace.allocations
    assert sum(p.final_usage.bytes_reserved for p in pools) == result.final_usage.bytes_reserved
    assert max(p.largest_alloc for p in pools) == 32 * MIB
    assert all(p.peak_in_use <= p.peak_reserved for p in pools)
    assert {p.kind for p in pools} == {"exclusive_pages", "sliced_pages"}
    busy = [p for p in pools if p.reservations]
    assert busy and all(p.pages_peak > 0 for p in busy)
    assert "PoolReplay index=1" in repr(pools[1])
    assert pools[1].pool_type.kind == "sliced_pages"
    assert pools[1].options.pool_type == pools[1].pool_type


def test_result_figures_and_json(traces: dict[str, cubepool.Trace]) -> None:
    result = cubepool.replay(traces["transformer-train"])
    assert result.fragmentation == pytest.approx(1 - result.utilization)
    assert result.ns_per_event > 0
    assert 0 <= result.peak_reserved_event < result.events
    assert 0 <= result.peak_in_use_event < result.events
    assert result.first_failed_event is None
    data = json.loads(json.dumps(result.to_dict()))
    assert data["peak_reserved"] == result.peak_reserved
    assert len(data["timeline"]["reserved_max"]) == len(result.timeline)
    assert [p["index"] for p in data["pools"]] == [p.index for p in result.pools]
    assert "timeline" not in result.to_dict(timeline=False)


def test_limit_counts_failures_and_names_the_first() -> None:
    trace = staircase(10)
    config = cubepool.MemoryConfiguration.custom(
        [cubepool.MemoryPoolOptions(cubepool.PoolType.direct())]
    )
    result = cubepool.replay(trace, config, limit=4 * MIB)
    assert result.failed_reserves == 7
    assert result.first_failed_event == 4
    assert result.peak_reserved <= 4 * MIB


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(st.tuples(st.booleans(), st.integers(1, 1 << 22)), min_size=1, max_size=300),
    samples=st.integers(0, 50),
    preset=st.sampled_from([*sorted(layouts.PRESETS), "virtual(granule=2MiB, keep=0B)"]),
)
def test_timeline_invariants_on_random_traces(
    ops: list[tuple[bool, int]], samples: int, preset: str
) -> None:
    events: list[tuple[int, str, int, int]] = []
    live: list[int] = []
    for t, (free, size) in enumerate(ops):
        if free and live:
            events.append((t, "free", live.pop(size % len(live)), 0))
        else:
            events.append((t, "alloc", t, size))
            live.append(t)
    trace = cubepool.Trace.from_events(events)
    # The presets, and a virtual pool that gives storage back at a release (keep=0).
    layout = layouts.PRESETS[preset]() if preset in layouts.PRESETS else preset
    result = cubepool.replay(trace, layout, samples=samples)
    assert result.peak_in_use == trace.peak_live
    timeline = result.timeline
    assert len(timeline) <= samples
    if samples:
        assert max(timeline.reserved_max) == result.peak_reserved
        assert max(timeline.in_use_max) == result.peak_in_use
        assert sum(timeline.events) == len(trace)
        # At each sample's end the bytes held are the pools' (a release that gave
        # storage back was not read until the next allocation).
        ends = [sum(pool[i] for pool in timeline.pool_reserved) for i in range(len(timeline))]
        assert list(timeline.reserved_end) == ends
        assert timeline.reserved_end[-1] == result.final_usage.bytes_reserved


# --------------------------------------------------------------------------- traces


def test_trace_prefix_and_pickle(traces: dict[str, cubepool.Trace]) -> None:
    trace = traces["gpt2-train"]
    head = trace.prefix(100)
    assert len(head) == 100 and head.events() == trace.events()[:100]
    assert head.peak_live <= trace.peak_live
    assert trace.prefix(10**9).events() == trace.events()
    again = pickle.loads(pickle.dumps(trace))
    assert again.events() == trace.events()
    assert again.phases == trace.phases and again.peak_live == trace.peak_live
    assert again.header == trace.header
    # A trace pickles as its v1 text, which the v1 reader reads back.
    rebuild, (text,) = trace.__reduce__()
    assert rebuild == cubepool.Trace.from_jsonl and text == trace.to_jsonl()
    assert text.startswith(b'{"format":"cubepool-trace","version":1,')


def profiler_file(path: Path) -> Path:
    """A torch.profiler chrome trace with [memory] events on the CPU and cuda:0."""

    def mem(ts: float, addr: int, nbytes: int, device_type: int, device_id: int) -> dict[str, Any]:
        return {
            "ph": "i",
            "name": "[memory]",
            "pid": 1,
            "tid": 1,
            "ts": ts,
            "args": {
                "Addr": addr,
                "Bytes": nbytes,
                "Total Allocated": 0,
                "Total Reserved": 0,
                "Device Type": device_type,
                "Device Id": device_id,
            },
        }

    events = [
        mem(1, 0x1000, 4096, 1, 0),
        mem(2, 0x2000, 1 << 20, 1, 0),
        mem(3, 0x1000, -4096, 1, 0),
        mem(4, 0x9000, -64, 1, 0),  # a block live before the recording began
        mem(5, 0x3000, 512, 0, -1),
    ]
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_load_trace_detects_foreign_formats(tmp_path: Path) -> None:
    path = profiler_file(tmp_path / "prof.json")
    # Left to choose, cuda:0 (a GPU before the CPU), said in a warning, as the report
    # that says it is not returned.
    with pytest.warns(UserWarning, match="imported cuda:0, the only GPU") as said:
        chosen = cubepool.load_trace(path)
    assert chosen.events() == cubepool.load_trace(path, device=0).events()
    with pytest.warns(UserWarning, match="imported cuda:0") as said_again:
        assert cubepool.replay(path).peak_live == chosen.peak_live
    # Each names the line that asked for the trace, not one inside cubepool.
    assert [w.filename for w in (*said, *said_again)] == [__file__, __file__]
    trace, report = cubepool.load_trace_with_report(path, device="cuda:0")
    # The 64 B block freed at 0x9000 was live before the recording: allocated at its start.
    assert (len(trace), trace.allocations, trace.peak_live) == (5, 3, 64 + 4096 + (1 << 20))
    assert trace.events()[0] == (0, "alloc", 0, 64)
    assert report is not None and (report.live_before, report.live_before_bytes) == (1, 64)
    assert report.unmatched_frees == 0 and report.live_at_end == 1
    empty, report = cubepool.load_trace_with_report(path, device="cuda:0", live_before=False)
    assert (len(empty), empty.allocations, empty.peak_live) == (3, 2, 4096 + (1 << 20))
    assert report is not None and report.unmatched_frees == 1 and report.live_before == 0
    assert cubepool.load_trace(path, device="cuda:0", live_before=False).events() == empty.events()
    assert "prof" in trace.workload and "torch.profiler" in trace.header["source"]
    cpu = cubepool.load_trace(path, device="cpu")
    assert cpu.peak_live == 512
    # RMM logs too.
    rmm = tmp_path / "rmm.csv"
    rmm.write_text(
        "Thread,Time,Action,Pointer,Size,Stream\n"
        "1,10:00:00.000001,allocate,0x10,256,0x0\n"
        "1,10:00:00.000002,free,0x10,256,0x0\n"
    )
    assert cubepool.load_trace(rmm).allocations == 1


def test_load_trace_v1_refuses_a_device(traces: dict[str, cubepool.Trace]) -> None:
    path = cubepool.examples.path("gpt2-train")
    trace, report = cubepool.load_trace_with_report(path)
    assert report is None and len(trace) == len(traces["gpt2-train"])
    with pytest.raises(cubepool.CubepoolError, match="leave device"):
        cubepool.load_trace(path, device="cpu")


# --------------------------------------------------------------------------- layouts


@pytest.mark.parametrize("name", EXAMPLES)
def test_default_layout_reaches_085_on_every_shared_trace(
    traces: dict[str, cubepool.Trace], name: str
) -> None:
    result = cubepool.replay(traces[name])
    assert result.utilization >= 0.85, (name, result.utilization)
    assert (
        result.utilization
        > cubepool.replay(traces[name], cubepool.MemoryConfiguration.sub_slices()).utilization
    )
    # Issue 17's bar: at most 5 storage calls (maps and unmaps) per 100 allocations.
    trace = traces[name]
    assert 100 * (result.storage_allocations + result.storage_frees) <= 5 * trace.allocations


def test_default_configuration_shape() -> None:
    config = cubepool.default_configuration()
    assert config == cubepool.MemoryConfiguration.virtual_pages()
    pools = config.pools()
    assert [p.pool_type.kind for p in pools] == ["virtual_pages"]
    assert (
        layouts.describe(config)
        == "virtual 2 MiB granules (idle kept under the peak, small <= 16 MiB apart)"
    )
    assert str(config) == "virtual_pages"
    spec = pool_spec(pools[0])
    assert (spec["granule"], spec["keep"], spec["small"]) == (2 * MIB, None, 16 * MIB)
    # The compact preset stays available by name.
    compact = cubepool.MemoryConfiguration.compact()
    assert layouts.describe(compact) == "sliced 8 MiB pages (slices <= 4 MiB) -> exclusive pages"
    small = cubepool.MemoryDeviceProperties(max_page_size=4 * MIB, alignment=256)
    assert pool_spec(compact.pools(small)[0])["page_size"] == 4 * MIB
    # Usable by MemoryManagement directly.
    mm = cubepool.MemoryManagement(config)
    with mm.reserve(1000) as handle:
        assert handle.size == 1000


def test_specs_round_trip_and_pickle() -> None:
    sliced = cubepool.PoolType.sliced_pages(8 * MIB, 1 * MIB, 64 * MIB)
    config = cubepool.MemoryConfiguration.custom(
        [
            cubepool.MemoryPoolOptions(sliced),
            cubepool.MemoryPoolOptions(cubepool.PoolType.exclusive_pages(1 << 30), 5000),
            cubepool.MemoryPoolOptions(cubepool.PoolType.direct(123)),
        ]
    )
    spec = layouts.to_spec(config)
    # The spec holds the layout's text, which the configuration language reads back.
    assert spec == {"layout": str(config)}
    assert json.loads(json.dumps(spec)) == spec
    assert layouts.from_spec(spec) == config
    assert cubepool.MemoryConfiguration.parse(spec["layout"]) == config
    # The pools form earlier versions wrote (cubepool plan --save files) still loads.
    old_pools = [
        {
            "kind": "sliced_pages",
            "page_size": 8 * MIB,
            "max_slice_size": MIB,
            "max_pool_size": 64 * MIB,
        },
        {"kind": "exclusive_pages", "max_alloc_size": 1 << 30, "dealloc_period": 5000},
        {"kind": "direct", "reclaim_at": 123},
    ]
    assert layouts.from_spec({"pools": old_pools}) == config
    assert layouts.from_spec(old_pools) == config
    for value in (
        config,
        cubepool.MemoryConfiguration.sub_slices(),
        sliced,
        cubepool.MemoryPoolOptions(sliced, 7),
        cubepool.MemoryDeviceProperties(max_page_size=1 << 20, alignment=32),
    ):
        assert pickle.loads(pickle.dumps(value)) == value
    # Layouts, pools and pool types pickle as their text, and nothing else.
    options = cubepool.MemoryPoolOptions(sliced, 7)
    for value in (config, sliced, options):
        rebuild, args = value.__reduce__()
        assert rebuild == type(value).parse and len(args) == 1, (value, args)
        assert isinstance(args[0], str) and rebuild(*args) == value
    assert (
        str(options) == args[0] == "sliced(page=8MiB, max_slice=1MiB, cap=64MiB, dealloc_period=7)"
    )
    properties = cubepool.MemoryDeviceProperties(max_page_size=1 << 20, alignment=32)
    assert properties.__reduce__() == (cubepool.MemoryDeviceProperties, (1 << 20, 32))
    assert layouts.to_spec(cubepool.MemoryConfiguration.sub_slices()) == {"layout": "sub_slices"}
    assert layouts.from_spec({"preset": "sub_slices"}) == cubepool.MemoryConfiguration.sub_slices()
    assert "direct buffers (cache released past 123 B)" in layouts.describe(config)
    assert "[free pages released after 5,000 reserves]" in layouts.describe(config)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"preset": "nope"}, "unknown preset"),
        ({"pools": []}, "non-empty"),
        ({"pools": [{"kind": "heap"}]}, "unknown pool kind"),
        ({"pools": [{"kind": "direct", "size": 3}]}, "direct"),
        ({"pools": [3]}, "JSON object"),
        ({"layout": 3}, "written as text"),
    ],
)
def test_bad_specs(spec: Any, message: str) -> None:
    with pytest.raises(cubepool.InvalidArgument, match=message):
        layouts.from_spec(spec)


def test_pools_and_pool_types_read_one_entry_of_the_language() -> None:
    options = cubepool.MemoryPoolOptions.parse("exclusive(max_alloc=2GiB, dealloc_period=5000)")
    assert options == cubepool.MemoryPoolOptions(cubepool.PoolType.exclusive_pages(2 << 30), 5000)
    assert cubepool.PoolType.parse("direct(reclaim_at=1KiB)") == cubepool.PoolType.direct(1024)
    with pytest.raises(cubepool.InvalidArgument, match="a pool is one entry"):
        cubepool.MemoryPoolOptions.parse("direct(); direct()")
    with pytest.raises(cubepool.InvalidArgument, match="a pool is one entry"):
        cubepool.PoolType.parse("sub_slices")
    with pytest.raises(cubepool.InvalidArgument, match="no dealloc_period"):
        cubepool.PoolType.parse("direct(dealloc_period=3)")
    with pytest.raises(cubepool.PoolConfigError):
        cubepool.PoolType.parse("heap()")


def test_config_from_arg(tmp_path: Path) -> None:
    assert layouts.config_from_arg("Sub-Slices") == (
        "sub_slices",
        cubepool.MemoryConfiguration.sub_slices(),
    )
    saved = tmp_path / "layout.json"
    saved.write_text(json.dumps(layouts.to_spec(cubepool.default_configuration())))
    label, config = layouts.config_from_arg(str(saved))
    assert (label, config) == ("layout.json", cubepool.default_configuration())
    assert layouts.config_from_arg('{"preset": "exclusive_pages"}')[1].preset == "exclusive_pages"
    with pytest.raises(cubepool.InvalidArgument, match="default, compact, sub_slices"):
        layouts.config_from_arg("best")
    (tmp_path / "bad.json").write_text("{oops")
    with pytest.raises(cubepool.InvalidArgument, match="not a JSON layout"):
        layouts.config_from_arg(str(tmp_path / "bad.json"))


# --------------------------------------------------------------------------- compare


def test_compare_ranks_best_first(traces: dict[str, cubepool.Trace]) -> None:
    comparison = cubepool.compare(traces["gpt2-generate"])
    labels = [row.label for row in comparison.rows]
    assert sorted(labels) == ["default", "exclusive_pages", "sub_slices"]
    reserved = [row.result.peak_reserved for row in comparison.rows]
    assert reserved == sorted(reserved)
    assert comparison.best.label == "default"
    text = comparison.table()
    assert text.splitlines()[0].split()[:3] == ["layout", "peak", "reserved"]
    assert "1.00x" in text and str(comparison) == text
    data = json.loads(json.dumps(comparison.to_dict()))
    assert data["rows"][0]["label"] == "default" and "timeline" not in data["rows"][0]


def test_compare_takes_mappings_pairs_and_configs(traces: dict[str, cubepool.Trace]) -> None:
    trace = traces["gpt2-train"]
    sub = cubepool.MemoryConfiguration.sub_slices()
    assert [r.label for r in cubepool.compare(trace, {"mine": sub}).rows] == ["mine"]
    rows = cubepool.compare(trace, [sub, ("x", sub), "default"], limit=64 * MIB).rows
    assert {r.label for r in rows} == {"sub_slices", "x", "default"}
    assert all(r.result.failed_reserves > 0 for r in rows)
    by_calls = cubepool.compare(trace, objective="storage_allocations")
    assert by_calls.rows[0].label == "sub_slices"
    # "vs best" is over the least reserved, not over the first row's bytes (sub_slices
    # reserves more than the default: the column read under 1.00x).
    least = min(row.result.peak_reserved for row in by_calls.rows)
    vs_best = {
        line.split()[0]: line.split()[6]
        for line in by_calls.table().splitlines()[2:]
        if line.split() and line.split()[0] in {r.label for r in by_calls.rows}
    }
    for row in by_calls.rows:
        assert vs_best[row.label] == f"{row.result.peak_reserved / least:.2f}x"
    assert min(vs_best.values()) == "1.00x"
    with pytest.raises(ValueError, match="at least one"):
        cubepool.compare(trace, [])


# --------------------------------------------------------------------------- plan


@pytest.fixture(scope="module")
def plans(traces: dict[str, cubepool.Trace]) -> dict[str, cubepool.Plan]:
    return {name: cubepool.plan(trace) for name, trace in traces.items()}


@pytest.mark.parametrize("name", EXAMPLES)
def test_plan_reaches_095_on_the_whole_trace(plans: dict[str, cubepool.Plan], name: str) -> None:
    planned = plans[name]
    config, result = planned
    assert config is planned.config and result is planned.result
    assert result.utilization >= 0.95, (name, result.utilization, planned.summary())
    assert result.peak_reserved <= planned.baseline.peak_reserved
    assert result.failed_reserves == 0
    # The budget bounds the layouts the search makes; the default layout, a finalist
    # whatever its storage calls, may win.
    if config != cubepool.default_configuration():
        assert planned.derivation.storage_allocations <= planned.max_storage_allocations
    assert json.loads(json.dumps(planned.to_dict()))["layout"] == layouts.to_spec(config)


@pytest.mark.parametrize("name", ["gpt2-train", "transformer-train"])
def test_training_plans_are_derived_on_the_first_two_steps(
    traces: dict[str, cubepool.Trace], plans: dict[str, cubepool.Plan], name: str
) -> None:
    # The header names three steps: the plan is derived on the setup and the first two
    # as recorded, perturbed from the second on.
    trace = traces[name]
    step1, step2 = dict(trace.phases)["step1"], dict(trace.phases)["step2"]
    assert f"events 0-{step2 - 1:,}" in plans[name].derived_on
    derived, start, what = derivation_trace(trace)
    assert what == plans[name].derived_on and "as recorded" in what
    assert derived.events() == trace.events()[:step2]
    assert [p for p, _ in derived.phases] == ["setup", "step0", "step1"]
    assert start == step1
    assert derivation_trace(trace, "two_steps")[2] == what


@pytest.mark.parametrize("name", ["gpt2-train", "transformer-train"])
def test_one_step_derivation_runs_the_first_step_once_more(
    traces: dict[str, cubepool.Trace], name: str
) -> None:
    trace = traces[name]
    step1 = dict(trace.phases)["step1"]
    derived, start, what = derivation_trace(trace, "one_step")
    assert f"events 0-{step1 - 1:,}" in what
    # The first events are the trace's own; the repeated step follows.
    assert derived.events()[:step1] == trace.events()[:step1]
    assert start == step1 and len(derived) > step1
    assert [p for p, _ in derived.phases][-1] == "step0 (again)"
    # The repeated step does not see beyond the first step: same sizes, no new ones.
    sizes = {e[3] for e in trace.events()[:step1] if e[1] == "alloc"}
    assert {e[3] for e in derived.events() if e[1] == "alloc"} <= sizes
    # With two steps named, first_step and two_steps fall back to it.
    two = trace.prefix(dict(trace.phases)["step2"])
    assert derivation_trace(two)[2] == derivation_trace(two, "two_steps")[2]
    assert derivation_trace(two)[2] == derivation_trace(two, "one_step")[2]
    assert "once more" in derivation_trace(two)[2]


def test_derivation_choices(traces: dict[str, cubepool.Trace]) -> None:
    generate = traces["gpt2-generate"]
    derived, _, what = derivation_trace(generate)
    assert derived is generate and "no second step" in what
    head, start, what = derivation_trace(generate, 1000)
    assert len(head) == 1000 and start == 0 and "first 1,000" in what
    assert derivation_trace(traces["gpt2-train"], "all")[0] is traces["gpt2-train"]
    # An InvalidArgument (a ValueError), as the README's table of errors says.
    with pytest.raises(cubepool.InvalidArgument, match="derive must be 'first_step', 'two_steps'"):
        derivation_trace(generate, "sometimes")  # type: ignore[arg-type]
    with pytest.raises(cubepool.InvalidArgument, match="positive"):
        derivation_trace(generate, 0)


def test_perturbed_replicas_keep_the_trace_valid(traces: dict[str, cubepool.Trace]) -> None:
    trace = traces["gpt2-train"]
    derived, start, _ = derivation_trace(trace)
    replica = perturb(derived, start, 16, seed=3)
    assert len(replica) == len(derived) and replica.allocations == derived.allocations
    assert replica.events()[:start] == derived.events()[:start]
    times = [e[0] for e in replica.events()]
    assert times == sorted(times)
    bigger = perturb(derived, start, 0, seed=3, extra=0.03)
    assert bigger.peak_live >= derived.peak_live * 1.03


def test_plan_objectives_and_budget(traces: dict[str, cubepool.Trace]) -> None:
    trace = traces["gpt2-train"]
    calls: list[tuple[int, int, str]] = []
    frugal = cubepool.plan(
        trace, "storage_allocations", progress=lambda d, t, s: calls.append((d, t, s))
    )
    reserved = cubepool.plan(trace, derive="all", workers=1)
    assert frugal.result.storage_allocations <= reserved.result.storage_allocations
    assert {s for _, _, s in calls} >= {"one sliced pool", "two sliced pools", "robustness"}
    assert all(0 < d <= t for d, t, _ in calls)
    tight = cubepool.plan(trace, max_storage_allocations=8)
    assert tight.derivation.storage_allocations <= 8 or tight.config in (
        cubepool.default_configuration(),
        cubepool.MemoryConfiguration.sub_slices(),
    )
    with pytest.raises(ValueError, match="objective"):
        cubepool.plan(trace, "speed")  # type: ignore[arg-type]


def test_plan_on_a_trace_without_phases() -> None:
    trace = staircase(64, 3 * MIB)
    planned = cubepool.plan(trace)
    assert planned.result.utilization >= 0.95
    assert "whole trace" in planned.derived_on


# --------------------------------------------------------------------------- sweep


def test_sweep_on_local_processes() -> None:
    done: list[int] = []
    result = cubepool.sweep(
        ["gpt2-train", "example:gpt2-generate"],
        ["default", "sub_slices"],
        max_workers=2,
        progress=lambda d, t, s: done.append(d),
    )
    assert [(r.trace, r.layout) for r in result.rows] == [
        ("gpt2-train", "default"),
        ("gpt2-train", "sub_slices"),
        ("gpt2-generate", "default"),
        ("gpt2-generate", "sub_slices"),
    ]
    assert sorted(done) == [1, 2, 3, 4]
    grid = result.pivot()
    assert grid["gpt2-train"]["default"] == pytest.approx(0.971, abs=0.01)
    assert "gpt2-generate" in result.table() and "default" in result.table()
    assert "MiB" in result.table("peak_reserved")
    assert json.loads(json.dumps(result.to_dict()))["rows"][0]["spec"] == {
        "layout": "virtual_pages"
    }


def test_sweep_takes_any_executor_and_loaded_traces(
    traces: dict[str, cubepool.Trace], tmp_path: Path
) -> None:
    path = tmp_path / "copy.jsonl.gz"
    path.write_bytes(cubepool.examples.path("gpt2-train").read_bytes())
    with ThreadPoolExecutor(2) as pool:
        result = cubepool.sweep(
            {"loaded": traces["transformer-train"], "file": path}, None, pool, limit=None
        )
        assert not pool._shutdown  # a given executor is left running
    assert {r.trace for r in result.rows} == {"loaded", "file"}
    assert len(result.rows) == 6
    # A trace read from a file goes by its workload, as in the command line and compare.
    assert cubepool.sweep([path], ["default"], max_workers=1).rows[0].trace == "gpt2-train"
    assert cubepool.sweep([], ["default"]).rows == ()


def test_sweep_uses_threads_when_main_cannot_be_imported_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    # The package's `sweep` is the function; the module is in sys.modules.
    sweep_module = sys.modules["cubepool.sweep"]
    monkeypatch.setattr(sys.modules["__main__"], "__file__", "/nonexistent/<stdin>", raising=False)
    executor = sweep_module._default_executor(4, 2)
    assert isinstance(executor, ThreadPoolExecutor)
    executor.shutdown()
    result = cubepool.sweep(["gpt2-train"], ["default"])
    assert result.rows[0].utilization == pytest.approx(0.971, abs=0.01)


def test_sweep_uses_threads_in_a_deleted_working_directory(tmp_path: Path) -> None:
    # A spawned process is handed the working directory: in a deleted one `cubepool
    # sweep` ended with "No such file or directory" and nothing else.
    gone = tmp_path / "gone"
    gone.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "cubepool.cli", "sweep", "gpt2-generate", "--json"],
        cwd=gone,
        preexec_fn=lambda: os.rmdir(gone),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)["rows"]) == 3


def _group(pgid: int) -> list[int]:
    """The processes of process group ``pgid`` that run (zombies are gone), from /proc."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            pids.append(int(entry.name))
    return pids


def _starting_workers(pid: int) -> int:
    """How many multiprocessing workers of process group ``pid`` have their Python up:
    SIGINT caught (Python's handler, installed before the worker imports for a second
    or two) or ignored (inherited so)."""
    count = 0
    for child in _group(pid):
        try:
            if b"spawn_main" not in Path(f"/proc/{child}/cmdline").read_bytes():
                continue
            status = dict(
                line.split(":", 1)
                for line in Path(f"/proc/{child}/status").read_text().splitlines()
            )
        except (OSError, ValueError):
            continue
        sigint = 1 << (signal.SIGINT - 1)
        count += bool((int(status["SigCgt"], 16) | int(status["SigIgn"], 16)) & sigint)
    return count


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads processes in /proc")
def test_ctrl_c_stops_a_sweep_without_tracebacks_or_workers_left() -> None:
    # A terminal's Ctrl-C goes to the whole process group: spawned workers, which take a
    # second or two to import, each printed a KeyboardInterrupt traceback under
    # "cubepool: interrupted" (4 times in 6). Only the command handles it now, and it
    # terminates its workers rather than wait for their replays.
    seen: set[int] = set()
    with running(
        [sys.executable, "-m", "cubepool.cli", "sweep", *EXAMPLES, "--workers", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    ) as process:
        deadline = time.monotonic() + 60
        while _starting_workers(process.pid) == 0 and process.poll() is None:
            assert time.monotonic() < deadline, "no worker started"
            time.sleep(0.01)
        # While the workers start (import), and again once they may be replaying.
        for pause in (0.1, 1.0):
            time.sleep(pause)
            seen.update(_group(process.pid))
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGINT)
        out, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    assert "cubepool: interrupted" in err and "Traceback" not in err, err
    assert out == ""
    # The workers (and the resource tracker) end with the command, or soon after.
    left = seen | set(_group(process.pid))
    deadline = time.monotonic() + 30
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left &= set(_group(process.pid))
    assert not left


# --------------------------------------------------------------------------- pictures


def test_plot_html_is_self_contained(traces: dict[str, cubepool.Trace], tmp_path: Path) -> None:
    out = cubepool.plot(traces["gpt2-train"], ["default", "sub_slices"], tmp_path / "mem.html")
    text = out.read_text()
    # One page, interactive by an inline script, and nothing fetched from anywhere.
    assert text.startswith("<!DOCTYPE html>") and text.count("<svg") == 1
    assert "http://" not in text.replace("http://www.w3.org", "") and "https://" not in text
    assert " src=" not in text and "<link" not in text
    for needle in ("step0", "step2", "peak reserved 350.0 MiB", "sub_slices", "peak live"):
        assert needle in text
    svg = cubepool.plot(traces["gpt2-train"], out=tmp_path / "mem.svg")
    assert svg.read_text().startswith("<svg")


def test_plot_png_with_matplotlib(traces: dict[str, cubepool.Trace], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    result = cubepool.replay(traces["gpt2-generate"])
    out = cubepool.plot(
        traces["gpt2-generate"], out=tmp_path / "mem.png", results=[("mine", result)]
    )
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_needs_a_layout(traces: dict[str, cubepool.Trace], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="nothing to plot"):
        cubepool.plot(traces["gpt2-train"], [], tmp_path / "x.html")


# --------------------------------------------------------------------------- command line


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_report_tells_the_whole_story(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out_file = tmp_path / "mem.html"
    code, out, _ = run(capsys, "report", "--example", "gpt2-train", "--out", str(out_file))
    assert code == 0
    for needle in (
        "1. Replay with the default layout",
        "2. Plan a layout",
        "3. Compare the layouts",
        "planned",
        "sub_slices",
        "exclusive_pages",
        f"wrote {out_file}",
    ):
        assert needle in out
    assert "<svg" in out_file.read_text()


def test_cli_report_of_an_incomplete_replay_says_whose_peak_it_explains(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Under a limit the replay fails reservations: its peak is that of what it served,
    # and the heading of the view at the peak says so (it read as for a whole replay).
    code, out, _ = run(
        capsys,
        "report",
        "--example",
        "gpt2-train",
        "--limit",
        "100MiB",
        "--no-plan",
        "--out",
        str(tmp_path / "mem.html"),
    )
    assert code == 3
    assert (
        "Why the default layout reserves more than is live, at its peak "
        "(of the reservations it served):" in out
    )
    code, out, _ = run(capsys, "report", "--example", "gpt2-generate", "--no-plan")
    assert "reserves more than is live, at its peak:" in out


def test_cli_compare_plan_save_and_reuse(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, _ = run(capsys, "compare", "--example", "gpt2-generate")
    assert code == 0 and out.index("default") < out.index("sub_slices")
    saved = tmp_path / "plan.json"
    code, out, _ = run(capsys, "plan", "--example", "gpt2-train", "--save", str(saved))
    assert code == 0 and "planned layout:" in out and "derived on the setup, step0 and step1" in out
    code, out, _ = run(
        capsys, "compare", "--example", "gpt2-train", "--config", str(saved), "--json"
    )
    data = json.loads(out)
    assert data["rows"][0]["label"] == "plan.json"
    assert data["rows"][0]["utilization"] >= 0.95


def test_cli_replay_sweep_plot_convert(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = run(capsys, "replay", "--example", "gpt2-train", "--config", "sub_slices")
    assert code == 0 and "sliced 8 MiB pages" in out and "reservations" in out
    code, out, _ = run(capsys, "replay", "--example", "gpt2-train", "--json", "--timeline")
    assert "timeline" in json.loads(out)
    code, out, _ = run(capsys, "replay", "--example", "gpt2-train", "--limit", "64MiB")
    assert code == 3 and "INCOMPLETE" in out and "over the memory limit" in out
    code, out, _ = run(capsys, "sweep", "gpt2-train", "transformer-train", "--workers", "1")
    assert code == 0 and "transformer-train" in out
    code, out, _ = run(
        capsys, "plot", "--example", "gpt2-generate", "--out", str(tmp_path / "g.svg")
    )
    assert code == 0 and (tmp_path / "g.svg").exists()
    prof = profiler_file(tmp_path / "prof.json")
    v1 = tmp_path / "prof.jsonl.gz"
    code, out, _ = run(capsys, "convert", str(prof), str(v1), "--device", "cuda:0")
    assert code == 0 and "allocated 1 blocks live before the recording began" in out
    assert gzip.decompress(v1.read_bytes()).startswith(b'{"format":"cubepool-trace"')
    assert cubepool.load_trace(v1).allocations == 3
    code, _, err = run(capsys, "replay", str(prof), "--device", "cuda:0")
    assert code == 0 and "imported" in err and "allocated 1 blocks live before" in err
    code, _, err = run(capsys, "replay", str(prof), "--device", "cuda:0", "--start-empty")
    assert code == 0 and "dropped 1 frees" in err and "live before" not in err
    empty = tmp_path / "empty.jsonl"
    code, out, _ = run(
        capsys, "convert", str(prof), str(empty), "--device", "cuda:0", "--start-empty"
    )
    assert code == 0 and "dropped 1 frees" in out
    assert cubepool.load_trace(empty).allocations == 2
    again = tmp_path / "again.jsonl"
    code, _, _ = run(capsys, "convert", str(v1), str(again))
    assert cubepool.load_trace(again).events() == cubepool.load_trace(v1).events()


def test_cli_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # An unknown layout is an argument out of range: a usage error (exit status 2).
    with pytest.raises(SystemExit) as exited:
        main(["compare", "--example", "gpt2-train", "--config", "best"])
    assert exited.value.code == 2 and "unknown layout 'best'" in capsys.readouterr().err
    # A file of several devices: the one whose blocks peak highest, said on stderr.
    code, _, err = run(capsys, "replay", str(profiler_file(tmp_path / "p.json")))
    assert code == 0 and "imported cuda:0, the only GPU, a GPU going before the CPU" in err
    code, _, err = run(capsys, "replay", str(tmp_path / "p.json"), "--device", "cuda:3")
    assert code == 1 and "no device 'cuda:3'" in err
    with pytest.raises(SystemExit):
        main(["replay"])


def test_a_tiny_fraction_of_a_byte_is_called_what_it_is(
    capsys: pytest.CaptureFixture[str],
) -> None:
    tiny = "0." + "0" * 39 + "1"
    with pytest.raises(argparse.ArgumentTypeError, match=r"is not a whole number of bytes$"):
        parse_size(tiny)
    with pytest.raises(SystemExit):
        main(["replay", "--example", "gpt2-train", "--limit", tiny])
    err = capsys.readouterr().err
    assert "--limit" in err and "is not a whole number of bytes" in err and "64 bits" not in err


def test_parse_size_and_progress_bar() -> None:
    assert parse_size("4096") == 4096
    assert parse_size("64KiB") == 64 << 10
    assert parse_size("1.5 GiB") == 3 << 29
    # One grammar, the pools language's: KB is 1000 bytes, and "2g" is no size.
    assert parse_size("64KB") == 64_000
    with pytest.raises(argparse.ArgumentTypeError, match="unknown unit"):
        parse_size("2g")
    stream = io.StringIO()
    bar = ProgressBar(True, stream)
    for done in range(1, 11):
        bar(done, 10, "robustness")
    text = stream.getvalue()
    assert "robustness" in text and "10/10" in text and text.endswith("\n")
    quiet = io.StringIO()
    ProgressBar(None, quiet)(1, 2, "x")  # not a terminal: nothing drawn
    assert quiet.getvalue() == ""


def test_random_layouts_replay_without_failures() -> None:
    rng = random.Random(7)
    trace = staircase(40, 3 * MIB)
    for _ in range(10):
        page = rng.choice([1, 2, 4, 8, 32]) * MIB
        spec = {
            "pools": [
                {"kind": "sliced_pages", "page_size": page, "max_slice_size": page // 2},
                {"kind": "exclusive_pages", "max_alloc_size": 1 << 40},
            ]
        }
        assert cubepool.replay(trace, layouts.from_spec(spec)).failed_reserves == 0


def test_plan_under_a_limit_exits_alike_in_text_and_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The search takes no --limit; the plan's replay under it decides the exit status,
    # which was 3 in text (the table's replay under the limit) and 0 with --json.
    args = ["plan", "--example", "gpt2-generate", "--limit", "16MiB", "--static-time-limit", "0.1"]
    code, out, _ = run(capsys, *args)
    assert code == 3 and "incomplete" in out
    code, out, _ = run(capsys, *args, "--json")
    assert code == 3 and json.loads(out)["complete_within_limit"] is False
    # At 40 MiB the plan holds the trace and a layout beside it does not: 3 both ways
    # (the text's status counts every layout of its table).
    args[4] = "40MiB"
    code, out, _ = run(capsys, *args)
    assert code == 3 and "incomplete" in out
    code, out, _ = run(capsys, *args, "--json")
    assert code == 3 and json.loads(out)["complete_within_limit"] is True


def test_a_planned_layout_travels_to_workers_without_its_plan_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A job carried planned(file=PATH) alone: a worker on another machine (or in another
    # folder) had no such file and failed (helper-143's find). The job carries the plan's
    # text now. Here the worker's folder holds no plan of that name, and another folder's
    # plan.json, of other content, must not be read in its place.
    from cubepool.plan.planned import save_planned

    trace = cubepool.load_trace("gpt2-generate")
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.chdir(home)
    layout = save_planned(trace, "plan.json")
    expected = cubepool.replay(trace, layout).peak_reserved

    class Elsewhere(ThreadPoolExecutor):
        """Runs each job from a folder of its own, whose plan.json is another's."""

        def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def, override]
            away = tmp_path / "away"
            away.mkdir(exist_ok=True)
            (away / "plan.json").write_text("{}")
            os.chdir(away)
            return super().submit(fn, *args, **kwargs)

    with Elsewhere(1) as pool:
        study = cubepool.sweep({"gpt2-generate": trace}, {"planned": layout}, executor=pool)
    (row,) = study.rows
    assert row.complete and row.peak_reserved == expected
    assert row.spec == layouts.to_spec(layout)  # the row names the layout as given

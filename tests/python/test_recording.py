"""The recording: PyTorch's own reserved bytes over time, kept from snapshots (segment
events and the final ``segments`` list) and profiler traces ("Total Reserved").

The snapshots are built in the format ``torch.cuda.memory._dump_snapshot`` writes (a
dict with ``segments``, ``device_traces`` and ``allocator_settings``; the entries' keys
and actions as ``c10/cuda/CUDACachingAllocator.cpp`` records them and
``torch/cuda/_memory_viz.py`` reads them), and every curve is checked against values
worked out by hand in the comments.
"""

from __future__ import annotations

import importlib.util
import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from cubepool import InvalidArgument, Trace, compare, load_trace, plot, replay
from cubepool._errors import TraceFormatError
from cubepool._interactive_peak import MAX_FRAMES_SHOWN, _Stacks
from cubepool.importers import import_trace

MiB = 1 << 20
FRAMES = [
    {"filename": "train.py", "line": 41, "name": "forward"},
    {"filename": "torch/nn/modules/linear.py", "line": 125, "name": "forward"},
]


def entry(action: str, addr: int, size: int, time_us: int, stream: int = 0) -> dict[str, Any]:
    """One ``device_traces`` entry with the keys PyTorch writes."""
    return {
        "action": action,
        "addr": addr,
        "size": size,
        "stream": stream,
        "time_us": time_us,
        "frames": FRAMES,
    }


def segment(
    address: int, total: int, blocks: list[tuple[int, str]], *, expandable: bool = False
) -> dict[str, Any]:
    """One entry of the final ``segments`` list, blocks tiling it."""
    out_blocks = []
    at = address
    for size, state in blocks:
        out_blocks.append(
            {
                "address": at,
                "size": size,
                "requested_size": size,
                "state": state,
                "frames": FRAMES if state == "active_allocated" else [],
            }
        )
        at += size
    allocated = sum(size for size, state in blocks if state == "active_allocated")
    return {
        "device": 0,
        "address": address,
        "total_size": total,
        "allocated_size": allocated,
        "active_size": allocated,
        "requested_size": allocated,
        "stream": 0,
        "segment_type": "large" if total > 1 * MiB else "small",
        "segment_pool_id": (0, 0),
        "is_expandable": expandable,
        "frames": FRAMES,
        "blocks": out_blocks,
    }


def write_snapshot(path: Path, segments: list[dict[str, Any]], trace: list[dict[str, Any]]) -> Path:
    doc = {
        "segments": segments,
        "device_traces": [trace],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1},
    }
    path.write_bytes(pickle.dumps(doc, protocol=4))
    return path


A = 0x7F00_0000_0000
B = 0x7F10_0000_0000

# A run from its start: a 2 MiB segment, two blocks in it, a 20 MiB segment for a 12 MiB
# tensor, given back (empty_cache), then the first block freed.
FROM_START = [
    entry("segment_alloc", A, 2 * MiB, 100),
    entry("alloc", A, 512, 101),  # event 0
    entry("alloc", A + 512, 1 * MiB, 102),  # event 1
    entry("segment_alloc", B, 20 * MiB, 103),  # after 2 events: 22 MiB
    entry("alloc", B, 12 * MiB, 104),  # event 2
    entry("free_requested", B, 12 * MiB, 105),
    entry("free_completed", B, 12 * MiB, 106),  # event 3
    entry("segment_free", B, 20 * MiB, 107),  # after 4 events: 2 MiB
    entry("free_completed", A, 512, 108),  # event 4
]
FINAL = [
    segment(A, 2 * MiB, [(512, "inactive"), (MiB, "active_allocated"), (MiB - 512, "inactive")])
]


def test_a_snapshot_from_the_start_gives_the_curve_by_hand(tmp_path: Path) -> None:
    trace = load_trace(write_snapshot(tmp_path / "s.pickle", FINAL, FROM_START))
    recording = trace.recording
    assert recording is not None
    assert (recording.source, recording.device) == ("torch-snapshot segments", "cuda:0")
    # Times: ns since the first entry (time_us 100), each point at its own entry's
    # time, as Recording documents t (a segment entry took the last block event's time,
    # 2000 and 6000 ns here: helper-143's find).
    assert recording.points == [
        (0, 0, 0),
        (0, 0, 2 * MiB),
        (2, 3000, 22 * MiB),
        (4, 7000, 2 * MiB),
    ]
    assert (recording.peak, recording.peak_event, recording.initial) == (22 * MiB, 2, 0)
    assert recording.covers == "start"
    assert recording.expandable_segments is False  # segment_alloc, and is_expandable False
    assert "Recorded reserved bytes" in trace.header["notes"]


def test_a_late_start_window_is_the_final_segments_minus_the_later_events(
    tmp_path: Path,
) -> None:
    # Recording began after the first three entries: the 2 MiB segment and both blocks
    # were already there. Final 2 MiB; the window adds 20 MiB and returns 20 MiB, so
    # it began at 2 - 20 + 20 = 2 MiB.
    trace = import_trace(write_snapshot(tmp_path / "late.pickle", FINAL, FROM_START[3:]))
    recording = trace.trace.recording
    assert recording is not None
    assert recording.covers == "window"
    assert recording.initial == 2 * MiB
    # The blocks live when the window began are the trace's first two events: the 512 B
    # block the window frees, and the 1 MiB one the final segments list live, which no
    # entry of the window names. So the window's events come after them, as they do in
    # the run recorded from its start.
    assert [(e, r) for e, _, r in recording.points] == [(0, 2 * MiB), (2, 22 * MiB), (4, 2 * MiB)]
    assert recording.peak == 22 * MiB
    assert trace.events[:2] == [(0, "alloc", 0, 512), (0, "alloc", 1, MiB)]
    assert (trace.dropped.live_before, trace.dropped.live_before_bytes) == (2, 512 + MiB)
    assert trace.dropped.unmatched_frees == 0
    whole = import_trace(write_snapshot(tmp_path / "whole.pickle", FINAL, FROM_START))
    assert [op for _, op, _, _ in trace.events] == [op for _, op, _, _ in whole.events]
    assert trace.trace.peak_live == whole.trace.peak_live
    # Started empty, the window holds only its own blocks and drops the free of the first.
    empty = import_trace(tmp_path / "late.pickle", live_before=False)
    assert [(e, r) for e, _, r in empty.trace.recording.points] == [
        (0, 2 * MiB),
        (0, 22 * MiB),
        (2, 2 * MiB),
    ]
    assert (empty.dropped.unmatched_frees, empty.dropped.live_before) == (1, 0)


def test_expandable_segments_are_read_from_segment_map_events(tmp_path: Path) -> None:
    # Expandable segments map 2 MiB pages into one address range: 2 + 4 - 2 = 4 MiB at
    # the end, mapped bytes only.
    events = [
        entry("segment_map", A, 2 * MiB, 10),
        entry("alloc", A, 1 * MiB, 11),  # event 0
        entry("segment_map", A + 2 * MiB, 4 * MiB, 12),  # after 1 event: 6 MiB
        entry("alloc", A + 1 * MiB, 5 * MiB, 13),  # event 1
        entry("free_completed", A + 1 * MiB, 5 * MiB, 14),  # event 2
        entry("segment_unmap", A + 4 * MiB, 2 * MiB, 15),  # after 3 events: 4 MiB
    ]
    final = [
        segment(A, 4 * MiB, [(MiB, "active_allocated"), (3 * MiB, "inactive")], expandable=True)
    ]
    recording = load_trace(write_snapshot(tmp_path / "x.pickle", final, events)).recording
    assert recording is not None
    assert recording.expandable_segments is True
    assert [(e, r) for e, _, r in recording.points] == [
        (0, 0),
        (0, 2 * MiB),
        (1, 6 * MiB),
        (3, 4 * MiB),
    ]
    assert recording.covers == "start"


def test_a_selected_stream_records_only_its_segments(tmp_path: Path) -> None:
    other = dict(segment(B, 8 * MiB, [(8 * MiB, "inactive")]), stream=7)
    events = [*FROM_START, entry("segment_alloc", B + 64 * MiB, 8 * MiB, 109, stream=7)]
    events.append(entry("alloc", B + 64 * MiB, 4096, 110, stream=7))
    path = write_snapshot(tmp_path / "streams.pickle", [*FINAL, other], events)
    whole = load_trace(path).recording
    assert whole is not None and whole.points[-1][2] == 10 * MiB
    only0 = load_trace(path, stream=0).recording
    assert only0 is not None and only0.peak == 22 * MiB and only0.points[-1][2] == 2 * MiB
    only7 = load_trace(path, stream=7).recording
    assert only7 is not None and [(e, r) for e, _, r in only7.points] == [(0, 0), (0, 8 * MiB)]


def test_inconsistent_or_missing_segments_give_no_recording_and_say_why(tmp_path: Path) -> None:
    # The window takes 20 MiB that the final segments do not hold, and never returns it.
    bad = write_snapshot(tmp_path / "bad.pickle", [], [entry("segment_alloc", B, 20 * MiB, 1)])
    bad_doc = pickle.loads(bad.read_bytes())
    bad_doc["device_traces"][0].append(entry("alloc", A, 64, 2))
    bad.write_bytes(pickle.dumps(bad_doc))
    trace = load_trace(bad)
    assert trace.recording is None
    assert "no recording of reserved bytes" in trace.header["notes"]
    # Segment events that reserve 2^64 bytes at once, given back by the end.
    events = [
        *(entry("segment_alloc", B, 2**63, 1) for _ in range(2)),
        entry("alloc", A, 64, 2),
        *(entry("segment_free", B, 2**63, 3) for _ in range(2)),
    ]
    trace = load_trace(write_snapshot(tmp_path / "huge.pickle", [], events))
    assert trace.recording is None
    assert "reserve 2^64 bytes or more at once" in trace.header["notes"]
    doc = {"device_traces": [[entry("alloc", A, 64, 1)]]}
    (tmp_path / "nosegments.pickle").write_bytes(pickle.dumps(doc))
    trace = load_trace(tmp_path / "nosegments.pickle")
    assert trace.recording is None
    assert "no final 'segments' list" in trace.header["notes"]


@pytest.mark.parametrize("strict", [True, False])
def test_reserved_figures_below_the_live_bytes_are_left_out_and_said(
    tmp_path: Path, strict: bool
) -> None:
    # Not shown as the truth: no segments under a 1 MiB block, a 2 MiB segment under an
    # 8 MiB block, a "Total Reserved" of 10 bytes after a 1 KiB allocation.
    block = [entry("alloc", A, MiB, 1)]
    small = [segment(A, 2 * MiB, [(2 * MiB, "inactive")])]
    profiled = tmp_path / "p.json"
    profiled.write_text(json.dumps({"traceEvents": [mem(1.0, A, 1024, 10, 1024)]}))
    cases = [
        (write_snapshot(tmp_path / "n.pickle", [], block), "0 B", "1.0 MiB"),
        (
            write_snapshot(tmp_path / "s.pickle", small, [entry("alloc", A, 8 * MiB, 1)]),
            "2.0 MiB",
            "8.0 MiB",
        ),
        (profiled, "10 B", "1.0 KiB"),
    ]
    for path, reserved, live in cases:
        imported = import_trace(path, strict=strict)
        assert imported.trace.recording is None
        said = f"say {reserved} reserved from event {0 if path.suffix == '.pickle' else 1}, "
        said += f"below the {live} the trace holds live while that figure stands"
        assert said in imported.dropped.recording_left_out
        assert "recorded reserved bytes left out: " in imported.dropped.summary()
        assert "no recording of reserved bytes" in imported.trace.header["notes"]
    # A profiler event without a figure of its own leaves the last in force, and the
    # trace's reader checks it there (Recording::below_live): the import leaves such a
    # figure out and says so, where it kept it for the reader to drop unsaid.
    gap = [mem(1.0, A, MiB, 2 * MiB, MiB), mem(2.0, B, 3 * MiB, 2 * MiB, 4 * MiB)]
    del gap[1]["args"]["Total Reserved"]
    gap.append(mem(3.0, B, -3 * MiB, 4 * MiB, MiB))
    (tmp_path / "gap.json").write_text(json.dumps({"traceEvents": gap}))
    imported = import_trace(tmp_path / "gap.json")
    assert imported.trace.recording is None
    assert "say 2.0 MiB reserved from event 1, below the 4.0 MiB" in (
        imported.dropped.recording_left_out
    )
    assert "was left out: after" not in imported.trace.header["notes"]
    # Figures that cover the live bytes are kept, as are a window's (FROM_START[3:]).
    assert load_trace(write_snapshot(tmp_path / "ok.pickle", small, block)).recording is not None
    late = import_trace(write_snapshot(tmp_path / "late.pickle", FINAL, FROM_START[3:]))
    assert late.trace.recording is not None and late.dropped.recording_left_out == ""


def test_cpu_events_have_no_reserved_figure(tmp_path: Path) -> None:
    # PyTorch writes "Total Reserved": 0 for its CPU allocator: not a recording.
    cpu = mem(1.0, A, 1024, 0, 1024)
    cpu["args"].update({"Device Type": 0, "Device Id": -1})
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps({"traceEvents": [cpu]}))
    imported = import_trace(path)
    assert imported.trace.recording is None and imported.dropped.recording_left_out == ""


def test_malformed_segments_are_refused_strictly(tmp_path: Path) -> None:
    path = write_snapshot(tmp_path / "m.pickle", [{"device": 0, "total_size": "big"}], FROM_START)
    with pytest.raises(TraceFormatError, match=r"segments\[0\]: 'total_size' must be an integer"):
        load_trace(path)
    lenient = load_trace(path, strict=False)
    assert lenient.recording is None and len(lenient) == 5


def mem(ts: float, addr: int, nbytes: int, reserved: int, allocated: int) -> dict[str, Any]:
    return {
        "ph": "i",
        "cat": "cpu_instant_event",
        "s": "t",
        "name": "[memory]",
        "pid": 1,
        "tid": 1,
        "ts": ts,
        "args": {
            "Total Reserved": reserved,
            "Total Allocated": allocated,
            "Bytes": nbytes,
            "Addr": addr,
            "Device Type": 1,
            "Device Id": 0,
        },
    }


def test_profiler_total_reserved_is_the_curve_after_each_event(tmp_path: Path) -> None:
    events = [
        mem(10.0, A, 512, 2 * MiB, 512),  # after event 0: 2 MiB
        mem(11.0, A + 512, MiB, 2 * MiB, MiB + 512),  # after 2
        mem(12.0, B, 12 * MiB, 22 * MiB, 13 * MiB + 512),  # after 3: 22 MiB
        mem(13.0, B, -12 * MiB, 22 * MiB, MiB + 512),  # after 4
    ]
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"traceEvents": events}))
    trace = load_trace(path)
    recording = trace.recording
    assert recording is not None
    assert recording.source == "torch-profiler Total Reserved"
    assert recording.points == [
        (1, 0, 2 * MiB),
        (2, 1000, 2 * MiB),
        (3, 2000, 22 * MiB),
        (4, 3000, 22 * MiB),
    ]
    assert (recording.peak, recording.peak_event, recording.covers) == (22 * MiB, 3, "window")
    assert recording.expandable_segments is None
    # Its first figure is after the first event, whose own 2 MiB segment it counts: not
    # bytes "already reserved when it began".
    text = compare(trace, ["torch"]).table()
    (window,) = [line for line in text.splitlines() if "covers a window" in line]
    assert "its first figure, 2.0 MiB reserved, is after its first event (" in window
    assert "already reserved" not in window


def test_the_recording_survives_v1_files_and_pickles(tmp_path: Path) -> None:
    trace = load_trace(write_snapshot(tmp_path / "s.pickle", FINAL, FROM_START))
    out = tmp_path / "s.jsonl"
    trace.write(out)
    header = json.loads(out.read_text().splitlines()[0])
    # An optional field of the v1 header: the other fields as before, in their order.
    assert list(header)[:6] == ["format", "version", "workload", "source", "model", "notes"]
    assert header["recorded"]["points"] == [
        [0, 0, 0],
        [0, 0, 2 * MiB],
        [2, 3000, 22 * MiB],
        [4, 7000, 2 * MiB],
    ]
    again = load_trace(out)
    assert again.header == trace.header
    assert again.recording is not None and again.recording.points == trace.recording.points  # type: ignore[union-attr]
    assert pickle.loads(pickle.dumps(again)).header == trace.header
    # A prefix keeps the points up to its cut.
    cut = trace.prefix(2).recording
    assert cut is not None and cut.points == trace.recording.points[:3]  # type: ignore[union-attr]
    # A file without the field reads as before: no recording.
    del header["recorded"]
    lines = [json.dumps(header), *out.read_text().splitlines()[1:]]
    out.write_text("\n".join(lines) + "\n")
    assert load_trace(out).recording is None


def test_a_trace_with_a_recording_rebuilds_from_its_events_and_header(tmp_path: Path) -> None:
    # The header gives the points back as lists (as a v1 file holds them), which
    # from_events refused: it took tuples alone.
    trace = load_trace(write_snapshot(tmp_path / "s.pickle", FINAL, FROM_START))
    again = Trace.from_events(trace.events(), trace.header)
    assert again.recording is not None and trace.recording is not None
    assert again.recording.points == trace.recording.points
    assert again.header == trace.header


@pytest.mark.parametrize(
    ("recorded", "message"),
    [
        (
            {"source": "s", "device": "d", "covers": "all", "points": []},
            'must be "start" or "window"',
        ),
        (
            {"source": "s", "device": "d", "covers": "start", "points": [(3, 0, 1), (2, 0, 1)]},
            "before the previous",
        ),
        (
            {"source": "s", "device": "d", "covers": "start", "points": [(0, 0, -1)]},
            "three non-negative",
        ),
        (
            {"source": "s", "device": "d", "covers": "start", "points": [[0, 0]]},
            "three non-negative",
        ),
        (
            {"source": "s", "device": "d", "covers": "start", "points": ["abc"]},
            "three non-negative",
        ),
        (
            {"source": "s", "device": "d", "covers": "start", "points": [b"\x00\x00\x01"]},
            "three non-negative",
        ),
        (
            {"source": "s", "device": "d", "covers": "start", "points": [(9, 0, 1)]},
            "past the trace's 1 events",
        ),
        ({"source": "s", "device": "d", "covers": "start"}, 'has no "points"'),
    ],
)
def test_a_bad_recording_in_a_header_is_refused(recorded: dict[str, Any], message: str) -> None:
    with pytest.raises(TraceFormatError, match=message):
        Trace.from_events([(0, "alloc", 0, 8)], {"recorded": recorded})


def test_a_v1_file_with_points_past_its_events_is_refused() -> None:
    header = {
        "format": "cubepool-trace",
        "version": 1,
        "recorded": {"source": "s", "device": "d", "covers": "start", "points": [[5, 0, 1]]},
    }
    text = json.dumps(header) + '\n{"t":0,"op":"alloc","id":0,"size":8}\n'
    with pytest.raises(TraceFormatError, match="past the trace's 1 events"):
        Trace.from_jsonl(text.encode())


def test_a_recording_under_the_live_bytes_is_left_out_when_read_and_said() -> None:
    # A header may give a curve that reserves less than the trace holds live (a
    # profiler's CPU "Total Reserved", always 0): it is not this trace's allocator's
    # account, so it is left out as the importers leave it out, and the notes say why.
    recorded = {"source": "s", "device": "cuda:0", "covers": "start", "points": [[0, 0, 0]]}
    live = Trace.from_events([(0, "alloc", 0, 64), (1, "free", 0)], {"recorded": recorded})
    assert live.recording is None
    assert (
        "was left out: after 1 event it says 0 bytes reserved, under the 64 "
        in (live.header["notes"])
    )
    assert "torch (recorded)" not in compare(live, ["default"]).table()
    # Read from a file alike.
    text = json.dumps({"format": "cubepool-trace", "version": 1, "recorded": recorded})
    read = Trace.from_jsonl((text + '\n{"t":0,"op":"alloc","id":0,"size":8}\n').encode())
    assert read.recording is None and "was left out: after" in read.header["notes"]
    # A curve of 0 B beside nothing live contradicts nothing: kept, at utilization 1.
    empty = Trace.from_events([], {"recorded": recorded})
    assert empty.recording is not None
    table = compare(empty, ["default"]).table()
    row = next(line for line in table.splitlines() if line.startswith("torch (recorded)"))
    assert row.split()[4] == "1.000", table


def test_no_bundled_trace_carries_a_recording_under_its_live_bytes() -> None:
    # The captured CPU traces carried the profiler's CPU "Total Reserved" (all 0) until
    # it was stripped; each bundled trace now reads with any recording it has.
    root = Path(__file__).resolve().parents[2]
    files = sorted((root / "benches" / "traces").glob("**/*.jsonl.gz"))
    files += sorted((root / "python" / "cubepool" / "examples" / "data").glob("*.jsonl.gz"))
    assert len(files) > 40
    for path in files:
        trace = load_trace(path)
        assert "was left out: after" not in trace.header["notes"], path


def framed(action: str, addr: int, size: int, time_us: int, frames: object) -> dict[str, Any]:
    """An entry with frames of its own (``frames`` as given, even malformed)."""
    return {**entry(action, addr, size, time_us), "frames": frames}


LAYER = [
    {"filename": "model.py", "line": 12, "name": "attention"},
    {"filename": "train.py", "line": 41, "name": "step"},
]


def test_stack_frames_go_from_the_snapshot_through_v1_to_the_view_at_the_peak(
    tmp_path: Path,
) -> None:
    # Allocation 0 from FRAMES, 1 from LAYER, 2 with no frames, 3 with malformed frames
    # (a frame that is no dict, one without a name; the good one kept), 4 with frames
    # that are not a list (passed over: frames are optional, never a malformed entry).
    events = [
        entry("segment_alloc", A, 2 * MiB, 100),
        framed("alloc", A, 512, 101, FRAMES),
        framed("alloc", A + 512, 1024, 102, LAYER),
        framed("alloc", A + 1536, 512, 103, []),
        framed("alloc", A + 2048, 512, 104, [7, {"filename": "x.py"}, LAYER[1]]),
        framed("alloc", A + 2560, 512, 105, "not a list"),
        # Allocation 5, 12 MiB in a segment of its own: the peak, with every block live.
        entry("segment_alloc", B, 20 * MiB, 106),
        framed("alloc", B, 12 * MiB, 106, LAYER),
    ]
    final = [
        segment(
            A,
            2 * MiB,
            [(size, "active_allocated") for size in (512, 1024, 512, 512, 512)]
            + [(2 * MiB - 3072, "inactive")],
        ),
        segment(B, 20 * MiB, [(12 * MiB, "active_allocated"), (8 * MiB, "inactive")]),
    ]
    trace = load_trace(write_snapshot(tmp_path / "f.pickle", final, events))
    assert trace.has_frames
    assert trace.frames(0) == ["forward (train.py:41)", "forward (torch/nn/modules/linear.py:125)"]
    assert trace.frames(1) == ["attention (model.py:12)", "step (train.py:41)"]
    assert trace.frames(2) is None
    assert trace.frames(3) == ["step (train.py:41)"]
    assert trace.frames(4) is None
    assert trace.frames(5) == trace.frames(1)
    with pytest.raises(InvalidArgument, match="past the trace's 6 allocations"):
        trace.frames(6)
    # Kept in v1 (an optional field of alloc lines), pickles and prefixes.
    out = tmp_path / "f.jsonl"
    trace.write(out)
    lines = [json.loads(line) for line in out.read_text().splitlines()[1:]]
    assert lines[1]["frames"] == trace.frames(1) and "frames" not in lines[2]
    again = load_trace(out)
    assert [again.frames(i) for i in range(6)] == [trace.frames(i) for i in range(6)]
    assert pickle.loads(pickle.dumps(trace)).frames(1) == trace.frames(1)
    assert trace.prefix(1).frames(0) == trace.frames(0)
    # A file without the field reads as before: no frames.
    for line in lines:
        line.pop("frames", None)
    header = out.read_text().splitlines()[0]
    out.write_text("\n".join([header, *map(json.dumps, lines)]) + "\n")
    assert not load_trace(out).has_frames
    # The view at the peak shows each pinning block's stack.
    view = replay(trace, "torch").at_peak()
    frames = {b.id: b.frames for s in view.segments for b in s.blocks}
    assert frames == {i: trace.frames(i) for i in range(6)}
    # The model gives the 12 MiB request a 12 MiB segment of its own (no free bytes):
    # the 2 MiB segment has the most free bytes, and its largest block is allocation 1
    # (1 KiB), named by its innermost frame.
    assert "1.0 KiB (allocation 1) from attention (model.py:12)" in view.text(top=1)


def test_odd_frames_are_passed_over_or_cut() -> None:
    # The importers' corpus case: frames are optional, so what is odd about them never
    # makes an entry malformed; a frame is cut at 240 characters, a stack at 64 frames.
    corpus = Path(__file__).parent / "corpus" / "importers" / "snapshot_odd_frames.pickle"
    imported = import_trace(corpus)
    trace = imported.trace
    assert imported.dropped.malformed == 0
    assert trace.frames(0) is None  # "frames" is a string
    assert trace.frames(1) == ["ok (a.py)"]  # the one frame with a name and a file
    (long,) = trace.frames(2) or []
    assert len(long) == 240 + len("...") and long.endswith("...")
    deep = trace.frames(3) or []
    assert len(deep) == 64 and deep[0] == "g (f.py:0)" and deep[-1] == "g (f.py:63)"


def test_the_unwinders_dispatchers_and_interpreters_frames_are_passed_over(
    tmp_path: Path,
) -> None:
    # With stacks="all" (_record_memory_history's default) every stack starts with the
    # unwinder's, the allocator's and the dispatcher's C++ frames, and Python calls go
    # through ceval.c: the view at the peak showed "from unwind::unwind() (??:0)".
    # PyTorch's own viewer passes those over (_memory_viz._frame_filter); so does the
    # import, before it keeps the innermost 64, and a frame dict shared by several
    # stacks (as PyTorch pickles them) reads the same in each.
    cpp = [
        {"filename": "??", "line": 0, "name": "unwind::unwind()"},
        {"filename": "??", "line": 0, "name": "torch::CapturedTraceback::gather(bool, bool, bool)"},
        {"filename": "c10/cuda/CUDACachingAllocator.cpp", "line": 0, "name": "malloc"},
        {"filename": "aten/src/ATen/core/boxing/impl.h", "line": 0, "name": "call"},
        {"filename": "build/aten/RegisterCUDA.cpp", "line": 0, "name": "wrapper"},
        {"filename": "Python/ceval.c", "line": 0, "name": "_PyEval_EvalFrameDefault"},
        {"filename": "Objects/call.c", "line": 0, "name": "_PyObject_MakeTpCall"},
    ]
    user = {"filename": "train.py", "line": 7, "name": "on_train_start"}
    entry_point = {"filename": "??", "line": 0, "name": "_start"}
    # Deep: 300 interpreter frames between the allocator and 70 of the user's.
    deep = cpp + cpp[5:] * 150 + [{"filename": "m.py", "line": i, "name": "f"} for i in range(70)]
    events = [
        entry("segment_alloc", A, 2 * MiB, 100),
        framed("alloc", A, 512, 101, [*cpp, user, entry_point]),
        framed("alloc", A + 512, 512, 102, [*cpp, user]),
        framed("alloc", A + 1024, 512, 103, deep),
        framed("alloc", A + 1536, 512, 104, cpp),
    ]
    final = [
        segment(
            A,
            2 * MiB,
            [(512, "active_allocated")] * 4 + [(2 * MiB - 2048, "inactive")],
        )
    ]
    trace = load_trace(write_snapshot(tmp_path / "cpp.pickle", final, events))
    assert trace.frames(0) == [
        "malloc (c10/cuda/CUDACachingAllocator.cpp:0)",
        "on_train_start (train.py:7)",
    ]
    assert trace.frames(1) == trace.frames(0)
    kept = trace.frames(2) or []
    assert kept[0].startswith("malloc") and kept[1:] == [f"f (m.py:{i})" for i in range(63)]
    assert trace.frames(3) == ["malloc (c10/cuda/CUDACachingAllocator.cpp:0)"]
    # A block is named in one line by its innermost frame of Python code, and the page's
    # view at the peak shows its frames from there.
    view = replay(trace, "torch").at_peak()
    assert "512 B (allocation 0) from on_train_start (train.py:7)" in view.text(top=1)
    page = plot(trace, ["torch"], out=tmp_path / "cpp.html").read_text()
    payload = json.loads(
        page.split('id="cubepool-data">', 1)[1].split("</script>", 1)[0].replace("<\\/", "</")
    )
    (peak,) = payload["at_peak"]  # after the first allocation: block 0 alone
    assert [peak["frame_texts"][i] for i in peak["stacks"][0]] == ["on_train_start (train.py:7)"]
    stacks = _Stacks()
    for block in range(4):
        stacks.add(block, trace.frames(block) or [])
    shown = [
        [stacks.frame_texts[i] for i in stacks.stacks[stacks.of_block[str(b)]]] for b in range(4)
    ]
    assert shown[2] == [f"f (m.py:{i})" for i in range(MAX_FRAMES_SHOWN)]
    assert shown[3] == ["malloc (c10/cuda/CUDACachingAllocator.cpp:0)"]  # no Python frame


def test_the_pictures_draw_the_recording_on_every_panel(tmp_path: Path) -> None:
    trace = load_trace(write_snapshot(tmp_path / "s.pickle", FINAL, FROM_START))
    page = plot(trace, ["default", "torch"], out=tmp_path / "mem.html").read_text()
    payload = json.loads(
        page.split('id="cubepool-data">', 1)[1].split("</script>", 1)[0].replace("<\\/", "</")
    )
    # Points (events, t, reserved) (0, 0, 0), (0, 0, 2), (2, 3000, 22), (4, 7000, 2) MiB
    # as a step line, each step at the event that follows: events are at 1, 2, 4, 6 and
    # 8 us after the first entry, so at 0, 1, 3, 5, 7 us on the axis (from event 0).
    recorded = payload["recorded"]
    assert recorded["label"] == "torch (recorded)"
    assert recorded["y"] == [0, 0, 2, 2, 22, 22, 2]
    assert recorded["x"] == [0, 0, 0, 3e-6, 3e-6, 7e-6, 7e-6]
    # In the static picture too, once per panel, with its legend entry.
    svg = plot(trace, ["default", "torch"], out=tmp_path / "mem.svg").read_text()
    assert svg.count('stroke="#8e44ad"') == 2 * 2  # the line and the legend's, per panel
    assert svg.count(">torch (recorded)</text>") == 2
    # A trace without a recording has no such line.
    bare = Trace.from_events([(0, "alloc", 0, 10), (1, "free", 0)])
    page = plot(bare, "default", out=tmp_path / "bare.html").read_text()
    assert '"recorded":null' in page


def test_a_real_trace_cut_late_replays_what_the_run_held(tmp_path: Path) -> None:
    # benches/python/late_start.py's snapshot of gpt2-train whose history drops the first
    # 30 % of its entries: with the blocks live at the cut put first, the window holds
    # the run's peak of live bytes (it comes after the cut); started empty it holds less.
    spec = importlib.util.spec_from_file_location(
        "late_start", Path(__file__).resolve().parents[2] / "benches/python/late_start.py"
    )
    assert spec is not None and spec.loader is not None
    late_start = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(late_start)
    whole = load_trace("gpt2-train")
    cut = len(whole) * 3 // 10
    path = tmp_path / "window.pickle"
    path.write_bytes(pickle.dumps(late_start.snapshot_window(whole, cut), protocol=4))
    held = import_trace(path)
    sizes: dict[int, int] = {}
    live = 0
    for _, op, ident, size in whole.events()[:cut]:
        if op == "alloc":
            sizes[ident] = size
            live += size
        else:
            live -= sizes.pop(ident)
    assert held.dropped.live_before_bytes == live
    assert held.trace.peak_live == whole.peak_live
    assert len(held.trace) == len(whole) - cut + held.dropped.live_before
    empty = import_trace(path, live_before=False)
    assert empty.trace.peak_live < whole.peak_live
    # The figures README.md gives.
    assert f"{whole.peak_live / MiB:.1f} {empty.trace.peak_live / MiB:.1f}" == "340.0 279.1"
    assert empty.dropped.unmatched_free_bytes > 0


def test_an_incomplete_model_replay_is_set_beside_the_recording_by_no_figure(
    tmp_path: Path,
) -> None:
    # Under a limit the model cannot meet, its peak covers only what was served: the
    # table printed "-" for it, yet the lines under it and the JSON gave a difference
    # from the recording as if it were the run's.
    trace = load_trace(write_snapshot(tmp_path / "s.pickle", FINAL, FROM_START))
    comparison = compare(trace, ["torch"], limit="1MiB")
    (row,) = comparison.rows
    assert not row.result.complete
    assert comparison.to_dict()["rows"][0]["vs_recorded_percent"] is None
    text = comparison.table()
    assert "torch (model) failed reservations: its peak is not the run's" in text
    assert "differs from the recording" not in text and "matches the recording" not in text


def test_replay_sets_no_failed_replay_beside_the_recording(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `cubepool replay` under a limit the layout cannot meet printed "-100.0 % against
    # the recorded peak" and gave it in JSON, as compare no longer does.
    from cubepool.cli import main

    path = write_snapshot(tmp_path / "s.pickle", FINAL, FROM_START)
    args = ["replay", str(path), "--config", "default", "--limit", "1MiB"]
    assert main(args) == 3
    out = capsys.readouterr().out
    assert "against the recorded peak" not in out
    assert main([*args, "--json"]) == 3
    data = json.loads(capsys.readouterr().out)
    assert data["complete"] is False and data["vs_recorded_percent"] is None
    # Complete, it is set beside the recording.
    assert main(["replay", str(path), "--config", "default"]) == 0
    assert "against the recorded peak" in capsys.readouterr().out


# --------------------------------------------------------------------------- settings

# The allocator_settings of a run with max_split_size_mb:512 and
# roundup_power2_divisions:[256:1,>:8], as torch/csrc/cuda/memory_snapshot.cpp writes
# them: max_split_size in bytes, one entry of divisions per interval ("1" to "32768"
# MiB), the keys that do not change device memory beside them.
SETTINGS: dict[str, Any] = {
    "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512,roundup_power2_divisions:[256:1,>:8]",
    "max_split_size": 512 * MiB,
    "garbage_collection_threshold": 0.0,
    "expandable_segments": False,
    "pinned_num_register_threads": 1,
    "release_lock_on_cudamalloc": False,
    "pinned_use_cuda_host_register": False,
    "graph_capture_record_stream_reuse": False,
    "roundup_power2_divisions": {str(1 << i): 1 if i <= 8 else 8 for i in range(16)},
}
SETTINGS_MODEL = "torch(max_split_size_mb=512, roundup_power2_divisions=[256:1,>:8])"


def write_with_settings(path: Path, settings: object, *, events: list[Any] = FROM_START) -> Path:
    """The FROM_START snapshot with ``allocator_settings`` = ``settings`` (left out for
    ``None``)."""
    doc: dict[str, Any] = {"segments": FINAL, "device_traces": [events]}
    if settings is not None:
        doc["allocator_settings"] = settings
    path.write_bytes(pickle.dumps(doc, protocol=4))
    return path


def test_a_snapshots_allocator_settings_name_the_model_it_is_compared_with(
    tmp_path: Path,
) -> None:
    from cubepool.recorded import matching_model

    imported = import_trace(write_with_settings(tmp_path / "s.pickle", SETTINGS))
    recording = imported.trace.recording
    assert recording is not None
    assert recording.settings == SETTINGS_MODEL
    assert matching_model(recording) == SETTINGS_MODEL
    assert f"allocator settings: {SETTINGS_MODEL}." in imported.trace.header["notes"]
    assert imported.dropped.notes == ()
    # Expandable segments from the segments (segment_alloc: no), the rest from the
    # settings; PyTorch's defaults name the plain model.
    defaults = dict(SETTINGS, max_split_size=-1, roundup_power2_divisions={})
    plain = load_trace(write_with_settings(tmp_path / "d.pickle", defaults)).recording
    assert plain is not None and plain.settings == "torch"
    # A size_t past the int64 range comes back negative: 2^64 - 1 MiB is a limit
    # above every request, read as PyTorch held it.
    huge = dict(SETTINGS, max_split_size=-MiB)
    recording = load_trace(write_with_settings(tmp_path / "h.pickle", huge)).recording
    assert recording is not None
    assert recording.settings is not None and "max_split_size_mb=8589934592" in recording.settings
    # So do 2^63 divisions, which PyTorch's stoull takes and its int64_t writes as
    # -2^63 (they were refused: helper-148's find).
    most = dict(SETTINGS, roundup_power2_divisions={str(1 << i): -(1 << 63) for i in range(16)})
    recording = load_trace(write_with_settings(tmp_path / "m.pickle", most)).recording
    assert recording is not None
    assert (
        recording.settings
        == "torch(max_split_size_mb=512, roundup_power2_divisions=9223372036854775808)"
    )


def test_the_settings_travel_in_the_header_through_v1_files(tmp_path: Path) -> None:
    trace = load_trace(write_with_settings(tmp_path / "s.pickle", SETTINGS))
    out = tmp_path / "s.jsonl"
    trace.write(out)
    header = json.loads(out.read_text().splitlines()[0])
    assert header["recorded"]["settings"] == SETTINGS_MODEL
    again = load_trace(out)
    assert again.header == trace.header
    assert again.recording is not None and again.recording.settings == SETTINGS_MODEL
    assert pickle.loads(pickle.dumps(again)).header == trace.header
    assert Trace.from_events(trace.events(), trace.header).header == trace.header
    assert trace.prefix(2).recording.settings == SETTINGS_MODEL  # type: ignore[union-attr]
    # A trace without settings writes no field, and one written before it reads as
    # without.
    old = load_trace(write_with_settings(tmp_path / "old.pickle", None))
    assert old.recording is not None and old.recording.settings is None
    old.write(out)
    # Neither the file nor the header dict holds the field then, so the two compare
    # equal.
    assert "settings" not in json.loads(out.read_text().splitlines()[0])["recorded"]
    assert "settings" not in old.header["recorded"]  # type: ignore[operator]
    assert load_trace(out).header == old.header


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ("torch(max_split_size_mb=5)", "max_split_size_mb must be at least 20"),
        ("torch(roundup_power2_divisions=[256:3])", "256:3"),
        ("tensorflow", "unknown model"),
        (7, "must be a str"),
    ],
)
def test_bad_settings_in_a_header_are_refused(settings: object, message: str) -> None:
    recorded = {"source": "s", "device": "d", "covers": "start", "points": [], "settings": settings}
    with pytest.raises(TraceFormatError, match=message):
        Trace.from_events([(0, "alloc", 0, 8)], {"recorded": recorded})
    if isinstance(settings, str):
        header = {"format": "cubepool-trace", "version": 1, "recorded": recorded}
        text = json.dumps(header) + '\n{"t":0,"op":"alloc","id":0,"size":8}\n'
        with pytest.raises(TraceFormatError, match=message):
            Trace.from_jsonl(text.encode())


def test_an_old_snapshot_without_settings_is_compared_as_before(tmp_path: Path) -> None:
    from cubepool.recorded import matching_model

    for settings in (None, {}, {"PYTORCH_CUDA_ALLOC_CONF": ""}):
        imported = import_trace(write_with_settings(tmp_path / "old.pickle", settings))
        recording = imported.trace.recording
        assert recording is not None and recording.settings is None
        assert matching_model(recording) == "torch"
        assert imported.dropped.notes == ()
        assert "allocator settings" not in imported.trace.header["notes"]


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        ([1, 2], "it must be a dict, got list"),
        (dict(SETTINGS, expandable_segments="True"), "'expandable_segments' must be a bool"),
        (dict(SETTINGS, max_split_size=512 * MiB + 1), "not a whole number of MiB"),
        (dict(SETTINGS, max_split_size=16 * MiB), "of at least 20"),
        (dict(SETTINGS, max_split_size=2.5), "'max_split_size' must be an int"),
        (dict(SETTINGS, max_split_size=1 << 70), "outside the 64-bit range"),
        (dict(SETTINGS, roundup_power2_divisions=[4] * 16), "must be a dict, got list"),
        (dict(SETTINGS, roundup_power2_divisions={"256": 3}), "must be 0 or a power of two"),
        (dict(SETTINGS, roundup_power2_divisions={"256": -4}), "must be 0 or a power of two"),
        # Past 64 bits: no size_t PyTorch held (it wrapped to 4 before the mend).
        (dict(SETTINGS, roundup_power2_divisions={"256": 2**64 + 4}), "must be 0 or a power"),
        (dict(SETTINGS, roundup_power2_divisions={"3": 4}), "has an interval '3'"),
        (dict(SETTINGS, roundup_power2_divisions={"65536": 4}), "has an interval '65536'"),
        (dict(SETTINGS, roundup_power2_divisions={"x" * 100: 4}), "has an interval 'xxx"),
        (dict(SETTINGS, garbage_collection_threshold=float("nan")), "in [0, 1)"),
        (dict(SETTINGS, garbage_collection_threshold=1.5), "in [0, 1)"),
        (dict(SETTINGS, garbage_collection_threshold="0.5"), "in [0, 1)"),
    ],
)
def test_malformed_settings_are_noted_and_ignored_in_strict_imports_too(
    tmp_path: Path, settings: object, said: str
) -> None:
    from cubepool.recorded import matching_model

    imported = import_trace(write_with_settings(tmp_path / "bad.pickle", settings), strict=True)
    recording = imported.trace.recording
    assert recording is not None and recording.settings is None
    # The segments still say the run did not use expandable segments.
    assert matching_model(recording) == "torch"
    (note,) = imported.dropped.notes
    assert note.startswith("allocator_settings ignored: ") and said in note, note
    assert imported.dropped.malformed == 0


def test_settings_and_segments_that_disagree_keep_the_segments_word(tmp_path: Path) -> None:
    # The segments were allocated whole (segment_alloc, is_expandable False): the
    # settings' expandable_segments True is overruled, and said.
    disagree = dict(SETTINGS, expandable_segments=True)
    imported = import_trace(write_with_settings(tmp_path / "d.pickle", disagree))
    recording = imported.trace.recording
    assert recording is not None and recording.expandable_segments is False
    assert recording.settings == SETTINGS_MODEL
    (note,) = imported.dropped.notes
    assert "say expandable_segments True but its segments say False" in note
    assert note in imported.trace.header["notes"]
    # Where the segments say nothing (no segment events, no is_expandable), the
    # settings' word is taken.
    silent = [{k: v for k, v in s.items() if k != "is_expandable"} for s in FINAL]
    events = [e for e in FROM_START if e["addr"] < B and not e["action"].startswith("segment")]
    doc = {
        "segments": silent,
        "device_traces": [events],
        "allocator_settings": dict(SETTINGS, expandable_segments=True),
    }
    path = tmp_path / "silent.pickle"
    path.write_bytes(pickle.dumps(doc, protocol=4))
    recording = import_trace(path, strict=False).trace.recording
    assert recording is not None and recording.expandable_segments is True
    assert recording.settings == "torch_expandable" + SETTINGS_MODEL.removeprefix("torch")
    # Where neither says, the recording carries no settings, and the notes say why.
    del doc["allocator_settings"]["expandable_segments"]  # type: ignore[attr-defined]
    path.write_bytes(pickle.dumps(doc, protocol=4))
    imported = import_trace(path, strict=False)
    assert imported.trace.recording is not None
    assert imported.trace.recording.settings is None
    assert any("neither the snapshot's allocator_settings" in n for n in imported.dropped.notes)


def test_a_garbage_collection_threshold_is_noted_as_not_modelled(tmp_path: Path) -> None:
    imported = import_trace(
        write_with_settings(
            tmp_path / "gc.pickle", dict(SETTINGS, garbage_collection_threshold=0.6)
        )
    )
    assert imported.trace.recording is not None
    assert imported.trace.recording.settings == SETTINGS_MODEL
    (note,) = imported.dropped.notes
    assert "garbage_collection_threshold 0.6 is not modelled" in note
    assert "per-process memory fraction" in imported.trace.header["notes"]


def test_report_and_compare_use_the_settings_bearing_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from cubepool.cli import main

    path = write_with_settings(tmp_path / "s.pickle", SETTINGS)
    assert main(["report", str(path), "--no-plan", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert (
        f"the recorded run did not use expandable segments: the comparison models PyTorch as "
        f"{SETTINGS_MODEL}"
    ) in out
    assert f"{SETTINGS_MODEL} (model)" in out
    assert "torch_expandable (model)" not in out
    # The lines under the table set the model beside the recording.
    assert f"did not use expandable segments (settings: {SETTINGS_MODEL})" in out
    assert f"  {SETTINGS_MODEL} (model) matches the recording" in out or (
        f"  {SETTINGS_MODEL} (model) differs from the recording" in out
    )
    trace = load_trace(path)
    comparison = compare(trace, [SETTINGS_MODEL])
    assert comparison.to_dict()["recorded"]["settings"] == SETTINGS_MODEL


def test_a_header_whose_settings_contradict_its_expandable_flag_is_refused(
    tmp_path: Path,
) -> None:
    # "expandable_segments": false beside "settings": "torch_expandable" was read, and
    # `cubepool report` then said the run both used and did not use expandable segments
    # (helper-148's find).
    trace = load_trace(write_with_settings(tmp_path / "s.pickle", SETTINGS))
    out = tmp_path / "s.jsonl"
    trace.write(out)
    lines = out.read_text().splitlines()
    header = json.loads(lines[0])
    for flag in (True, None):  # the settings say off (segment_alloc: no expandable)
        header["recorded"]["expandable_segments"] = flag
        bad = tmp_path / "bad.jsonl"
        bad.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
        with pytest.raises(TraceFormatError, match="recorded settings"):
            load_trace(bad)

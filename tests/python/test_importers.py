"""Tests of cubepool.importers: each foreign format is built by hand in tmp_path,
following the documented structures (REFERENCE.md section 3), then imported."""

from __future__ import annotations

import collections.abc
import csv
import gzip
import io
import json
import os
import pickle
import pickletools
import subprocess
import sys
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cubepool._cubepool import Trace, TraceBuilder
from cubepool._errors import (
    CubepoolError,
    InvalidArgument,
    TraceFormatError,
    TraceSelectionError,
)
from cubepool._pickle import restricted_loads
from cubepool.importers import (
    DeviceInfo,
    ImportedTrace,
    ImportReport,
    detect_format,
    import_trace,
    list_devices,
    write_trace_v1,
)

CORPUS = Path(__file__).parent / "corpus" / "importers"
EXAMPLES = Path(__file__).resolve().parents[1] / "python" / "cubepool" / "examples" / "data"
SHARED_TRACE = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces" / "gpt2-train.jsonl"

# --------------------------------------------------------------------------- builders


def mem(
    ts: float, addr: int, nbytes: int, device_type: int = 0, device_id: int = -1
) -> dict[str, Any]:
    """One profiler "[memory]" instant event, as torch.profiler's export_chrome_trace writes it."""
    return {
        "ph": "i",
        "cat": "cpu_instant_event",
        "s": "t",
        "name": "[memory]",
        "pid": 1,
        "tid": 1,
        "ts": ts,
        "args": {
            "Total Reserved": 0,
            "Total Allocated": 0,
            "Bytes": nbytes,
            "Addr": addr,
            "Device Type": device_type,
            "Device Id": device_id,
        },
    }


def op(name: str, ts: float, dur: float = 1.0) -> dict[str, Any]:
    """A complete ("X") event, like an operator or a ProfilerStep#N annotation."""
    return {
        "ph": "X",
        "cat": "user_annotation",
        "name": name,
        "pid": 1,
        "tid": 1,
        "ts": ts,
        "dur": dur,
    }


def profiler_doc(events: list[Any]) -> dict[str, Any]:
    return {
        "schemaVersion": 1,
        "deviceProperties": [],
        "traceEvents": events,
        "traceName": "trace.json",
    }


def write_json(path: Path, doc: object, *, compress: bool = False, indent: int | None = 1) -> Path:
    data = json.dumps(doc, indent=indent).encode()
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


def snap_entry(
    action: str, addr: int, size: int, *, stream: int = 0, time_us: int | None = None
) -> dict[str, Any]:
    """One device_traces entry, as torch.cuda.memory._snapshot() records it."""
    entry: dict[str, Any] = {
        "action": action,
        "addr": addr,
        "size": size,
        "stream": stream,
        "frames": [{"filename": "train.py", "line": 12, "name": "forward"}],
    }
    if time_us is not None:
        entry["time_us"] = time_us
    return entry


def snapshot_doc(device_traces: list[list[dict[str, Any]]]) -> dict[str, Any]:
    return {
        "segments": [
            {
                "device": 0,
                "address": 1 << 32,
                "total_size": 2 << 20,
                "stream": 0,
                "segment_type": "large",
                "allocated_size": 0,
                "active_size": 0,
                "blocks": [{"address": 1 << 32, "size": 2 << 20, "state": "inactive"}],
            }
        ],
        "device_traces": device_traces,
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1},
    }


def write_pickle(path: Path, obj: object, *, compress: bool = False, protocol: int = 4) -> Path:
    data = pickle.dumps(obj, protocol=protocol)
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


DEEP = "<a list nested 2,000 deep>"
"""Stands in a document for a list nested too deep for ``pickle.dumps`` to write."""


def write_deep_pickle(path: Path, doc: object, depth: int = 2000) -> Path:
    """``doc`` pickled with the string :data:`DEEP` replaced by a list nested ``depth``
    deep (EMPTY_LIST opcodes, then APPENDs), as a hostile file would hold it."""
    data = pickle.dumps(doc, protocol=2)  # unframed: bytes can be swapped in place
    placeholder = b"X" + len(DEEP).to_bytes(4, "little") + DEEP.encode()  # BINUNICODE
    assert data.count(placeholder) == 1
    path.write_bytes(data.replace(placeholder, b"]" * depth + b"a" * (depth - 1)))
    return path


RMM_HEADER = "Thread,Time,Action,Pointer,Size,Stream"


def write_rmm(path: Path, rows: Sequence[str], *, compress: bool = False) -> Path:
    text = "\n".join([RMM_HEADER, *rows]) + "\n"
    path.write_bytes(gzip.compress(text.encode()) if compress else text.encode())
    return path


def read_v1(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    opener: Callable[..., Any] = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        lines = [json.loads(line) for line in f]
    return lines[0], lines[1:]


def check_v1_events(events: list[tuple[int, str, int, int]]) -> None:
    """The invariants of trace v1: time order, dense ids, frees of live ids only."""
    live: set[int] = set()
    next_id = 0
    last_t = 0
    for t, kind, ident, size in events:
        assert t >= last_t
        last_t = t
        if kind == "alloc":
            assert ident == next_id and size > 0
            next_id += 1
            live.add(ident)
        else:
            assert kind == "free" and size == 0 and ident in live
            live.remove(ident)


# --------------------------------------------------------------------------- detection


def test_detect_format_by_content_not_extension(tmp_path: Path) -> None:
    prof = write_json(tmp_path / "a.txt", profiler_doc([mem(1, 16, 8)]))
    prof_gz = write_json(tmp_path / "b.bin", profiler_doc([mem(1, 16, 8)]), compress=True)
    minified = write_json(tmp_path / "c", profiler_doc([mem(1, 16, 8)]), indent=None)
    array_form = write_json(tmp_path / "d.json", [mem(1, 16, 8)])
    snap = write_pickle(tmp_path / "e.json", snapshot_doc([[]]))
    snap_gz = write_pickle(tmp_path / "f", snapshot_doc([[]]), compress=True, protocol=2)
    rmm = write_rmm(tmp_path / "g.pickle", ["1,08:00:00.000001,allocate,0x10,8,0x0"])
    rmm_gz = write_rmm(tmp_path / "h.csv.gz", [], compress=True)
    v1 = tmp_path / "i.csv"
    v1.write_text('{"format":"cubepool-trace","version":1}\n{"t":0,"op":"alloc","id":0,"size":8}\n')
    assert detect_format(prof) == "torch-profiler"
    assert detect_format(prof_gz) == "torch-profiler"
    assert detect_format(minified) == "torch-profiler"
    assert detect_format(array_form) == "torch-profiler"
    assert detect_format(snap) == "torch-snapshot"
    assert detect_format(snap_gz) == "torch-snapshot"
    assert detect_format(rmm) == "rmm-csv"
    assert detect_format(rmm_gz) == "rmm-csv"
    assert detect_format(v1) == "cubepool"


@pytest.mark.skipif(not SHARED_TRACE.exists(), reason="shared traces not present")
def test_detect_format_on_a_shared_v1_trace() -> None:
    assert detect_format(SHARED_TRACE) == "cubepool"
    with pytest.raises(TraceFormatError, match="already a cubepool trace v1"):
        import_trace(SHARED_TRACE)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty file"),
        (b"hello, world\n", "unknown trace format"),
        (b'{"schemaVersion": 1}\n', "neither cubepool trace v1"),
        (gzip.compress(b"x" * 100)[:-9], "corrupt or truncated gzip"),
        (b"\x1f\x8bnot gzip at all", "corrupt or truncated gzip"),
    ],
)
def test_detect_format_errors(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "x"
    path.write_bytes(content)
    with pytest.raises(TraceFormatError, match=message) as info:
        detect_format(path)
    assert info.value.path == str(path)


def test_missing_file_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        import_trace(tmp_path / "absent.json")


# --------------------------------------------------------------------------- profiler


def test_profiler_pairs_frees_by_address_in_ts_order(tmp_path: Path) -> None:
    events = [
        op("aten::empty", 999.0),
        mem(1002.0, 0x100, -4096),  # out of file order: sorted by ts
        mem(1000.0, 0x100, 4096),
        mem(1000.5, 0x200, 512),
        mem(1001.0, 0x300, 8),
        mem(1003.25, 0x300, -8),
        mem(1004.0, 0x100, 1024),  # the address is reused after its free
        mem(1005.0, 0x100, -1024),
    ]
    trace = import_trace(write_json(tmp_path / "trace.json", profiler_doc(events)))
    assert trace.events == [
        (0, "alloc", 0, 4096),
        (500, "alloc", 1, 512),
        (1000, "alloc", 2, 8),
        (2000, "free", 0, 0),
        (3250, "free", 2, 0),
        (4000, "alloc", 3, 1024),
        (5000, "free", 3, 0),
    ]
    assert trace.dropped.live_at_end == 1
    assert trace.dropped.live_at_end_bytes == 512
    assert trace.dropped.unmatched_frees == 0
    assert trace.header["format"] == "cubepool-trace"
    assert trace.header["version"] == 1
    assert trace.header["workload"] == "trace"
    assert "device cpu" in str(trace.header["source"])
    assert "phases" not in trace.header
    check_v1_events(trace.events)


def test_profiler_gzip_gives_the_same_trace(tmp_path: Path) -> None:
    events = [mem(1.0, 16, 64), mem(2.0, 16, -64), mem(3.0, 32, 8)]
    plain = import_trace(write_json(tmp_path / "t.json", profiler_doc(events)))
    packed = import_trace(write_json(tmp_path / "t.json.gz", profiler_doc(events), compress=True))
    assert plain.events == packed.events
    assert packed.header["workload"] == "t"


def test_profiler_per_device(tmp_path: Path) -> None:
    events = [
        mem(1.0, 0x10, 100),  # cpu
        mem(2.0, 0x10, 200, 1, 0),  # the same address on cuda:0 is another block
        mem(3.0, 0x10, 300, 1, 1),
        mem(4.0, 0x10, -200, 1, 0),
        mem(5.0, 0x10, -100),
        mem(6.0, 0x20, 50, 1, 1),
    ]
    path = write_json(tmp_path / "multi.json", profiler_doc(events))
    assert list_devices(path) == [
        DeviceInfo("cpu", (), 1, 1),
        DeviceInfo("cuda:0", (), 1, 1),
        DeviceInfo("cuda:1", (), 2, 0),
    ]
    # Left to choose, the import takes the device whose blocks peak highest: cuda:1
    # holds 350 B at once (cuda:0 200 B, the CPU 100 B), and says so.
    chosen = import_trace(path)
    assert chosen.header["source"].endswith("device cuda:1)")
    assert chosen.dropped.device_choice == (
        "the file holds blocks on 3 devices (cpu, cuda:0, cuda:1); imported cuda:1, of the "
        "GPUs the one whose blocks' peak live bytes are the largest (cuda:1's blocks peak at "
        "350 B; next cuda:0, 200 B), a GPU going before the CPU: choose another with "
        "device=..."
    )
    assert chosen.dropped.summary().startswith(chosen.dropped.device_choice + "; ")
    assert chosen.dropped.device_choice in chosen.header["notes"]
    cpu = import_trace(path, device="cpu")
    assert cpu.dropped.device_choice == ""
    assert cpu.events == [(0, "alloc", 0, 100), (4000, "free", 0, 0)]
    assert cpu.dropped.filtered == 4
    cuda0 = import_trace(path, device="cuda:0")
    assert cuda0.events == [(1000, "alloc", 0, 200), (3000, "free", 0, 0)]
    cuda1 = import_trace(path, device=1)  # an int n means cuda:n
    assert cuda1.events == [(2000, "alloc", 0, 300), (5000, "alloc", 1, 50)]
    assert cuda1.dropped.live_at_end == 2
    assert cuda1.dropped.live_at_end_bytes == 350
    with pytest.raises(TraceSelectionError, match="no device 'cuda:7'"):
        import_trace(path, device="cuda:7")
    with pytest.raises(TraceSelectionError, match="no streams"):
        import_trace(path, device="cpu", stream=0)


def test_a_file_of_many_devices_is_walked_once_not_once_a_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import cubepool.importers as importers

    # A profiler trace names any device id: 4,000 devices in a 1 MB file took a pass
    # over every record for each device (seconds; hours at 100 MB) to list them or to
    # say which hold allocations.
    count = 200
    events = [mem(float(i), 0x10, 8, 1, i) for i in range(count)]
    path = write_json(tmp_path / "devices.json", profiler_doc(events))

    class Walked(list[Any]):
        walks = 0

        def __iter__(self) -> Any:
            Walked.walks += 1
            return super().__iter__()

    parse = importers._parse

    def counted(*args: Any, **kwargs: Any) -> Any:
        parsed = parse(*args, **kwargs)
        parsed.records = Walked(parsed.records)
        return parsed

    monkeypatch.setattr(importers, "_parse", counted)
    infos = list_devices(path)
    assert Walked.walks <= 2
    assert infos[:2] == [DeviceInfo("cuda:0", (), 1, 0), DeviceInfo("cuda:1", (), 1, 0)]
    assert len(infos) == count
    Walked.walks = 0
    chosen = import_trace(path)
    # Every device peaks at 8 B: of equal peaks the first in the file's order.
    assert chosen.header["source"].endswith("device cuda:0)")
    assert f"blocks on {count:,} devices" in chosen.dropped.device_choice
    # The device's peaks (the blocks live before and the peaks, each one pass for every
    # device at once), then the chosen device's blocks live before and its pairing.
    assert Walked.walks <= 4


def test_a_file_of_many_devices_names_ten_in_its_errors(tmp_path: Path) -> None:
    # A profiler trace names any device id: the error that asks for one listed them
    # all, so 30,000 devices made a message of 300 kB (megabytes at a million), and a
    # device or stream the file lacks did the same. The message names ten and counts
    # the rest; the error keeps them all.
    count = 30_000
    events = [mem(float(i), 0x10, 8, 1, i) for i in range(count)]
    path = write_json(tmp_path / "devices.json", profiler_doc(events), indent=None)
    choice = import_trace(path).dropped.device_choice
    assert "30,000 devices (cuda:0, cuda:1," in choice and "cuda:9 and 29,990 more);" in choice
    assert "cuda:10," not in choice and len(choice) < 300, len(choice)
    with pytest.raises(TraceSelectionError, match="no device 'cuda:99999'") as info:
        import_trace(path, device="cuda:99999")
    assert "cuda:9 and 29,990 more" in str(info.value) and len(str(info.value)) < 300
    assert len(info.value.available) == count
    # Streams too: a snapshot lists any stream number.
    entries = [snap_entry("alloc", 0x10 * (s + 1), 8, stream=s) for s in range(50)]
    snapshot = write_pickle(tmp_path / "s.pickle", snapshot_doc([entries]))
    with pytest.raises(TraceSelectionError, match=r"streams present: 0, 1, .*, 9 and 40 more$"):
        import_trace(snapshot, stream=99)


def test_profiler_dropped_report(tmp_path: Path) -> None:
    events = [
        mem(1.0, 0x10, -64),  # a free whose allocation was before the recording
        mem(2.0, 0x20, 100),
        mem(3.0, 0x20, 200),  # allocation at a live address
        mem(4.0, 0x20, -150),  # frees the second one, with a different size
        mem(5.0, 0x30, 0),  # zero bytes
        mem(6.0, 0x40, 8),
    ]
    # Started empty: the free of a block allocated before the recording is dropped.
    trace = import_trace(write_json(tmp_path / "d.json", profiler_doc(events)), live_before=False)
    assert trace.events == [
        (1000, "alloc", 0, 100),
        (2000, "free", 0, 0),  # the implicit free of the old allocation
        (2000, "alloc", 1, 200),
        (3000, "free", 1, 0),
        (5000, "alloc", 2, 8),
    ]
    d = trace.dropped
    assert (d.unmatched_frees, d.unmatched_free_bytes) == (1, 64)
    assert (d.duplicate_allocs, d.duplicate_alloc_bytes) == (1, 100)
    assert (d.live_at_end, d.live_at_end_bytes) == (1, 8)
    assert d.size_mismatches == 1
    assert d.zero_size == 1
    assert d.malformed == 0
    summary = d.summary()
    assert "1 frees without a live allocation (64 B)" in summary
    assert summary in str(trace.header["notes"])
    assert d.to_dict()["unmatched_frees"] == 1
    check_v1_events(trace.events)
    # By default that block is allocated at the trace's start and freed where it was.
    held = import_trace(tmp_path / "d.json")
    assert held.events == [
        (0, "alloc", 0, 64),
        (0, "free", 0, 0),
        (1000, "alloc", 1, 100),
        (2000, "free", 1, 0),
        (2000, "alloc", 2, 200),
        (3000, "free", 2, 0),
        (5000, "alloc", 3, 8),
    ]
    assert (held.dropped.live_before, held.dropped.live_before_bytes) == (1, 64)
    assert held.dropped.unmatched_frees == 0
    assert "allocated 1 blocks live before the recording began at its start (64 B)" in (
        held.dropped.summary()
    )


def test_profiler_malformed_entries_strict_and_lenient(tmp_path: Path) -> None:
    bad = mem(2.0, 0x20, 8)
    bad["args"]["Bytes"] = "8"
    events = [mem(1.0, 0x10, 8), bad, mem(3.0, 0x10, -8), "not an event"]
    path = write_json(tmp_path / "m.json", profiler_doc(events))
    with pytest.raises(TraceFormatError, match=r"traceEvents\[1\].*'Bytes' must be an integer"):
        import_trace(path)
    trace = import_trace(path, strict=False)
    assert trace.events == [(0, "alloc", 0, 8), (2000, "free", 0, 0)]
    assert trace.dropped.malformed == 2
    assert any("'Bytes'" in note for note in trace.dropped.notes)


def test_notes_are_bounded(tmp_path: Path) -> None:
    events = [mem(1.0, 16, 8), *(["junk"] * 25)]
    trace = import_trace(write_json(tmp_path / "n.json", profiler_doc(events)), strict=False)
    assert trace.dropped.malformed == 25
    assert len(trace.dropped.notes) == 21
    assert trace.dropped.notes[-1] == "(5 further notes left out)"


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda e: e.pop("ts"), "missing 'ts'"),
        (lambda e: e.update(ts=float("nan")), "not a usable time"),
        (lambda e: e.update(ts=True), "'ts' must be a number"),
        (lambda e: e.update(ts=10**400), "'ts' = <int of 1,329 bits> is not a usable time"),
        (lambda e: e.update(ts=2.0**53), "'ts' = 9007199254740992.0 is not a usable time"),
        (lambda e: e.update(args=[1, 2]), "'args' must be an object"),
        (lambda e: e["args"].pop("Addr"), "missing 'Addr'"),
        (lambda e: e["args"].update(Addr=1 << 70), "outside the 64-bit range"),
        (lambda e: e["args"].pop("Device Type"), "missing 'Device Type'"),
        (lambda e: e["args"].update({"Device Id": None}), "'Device Id' must be an integer"),
    ],
)
def test_profiler_field_errors(
    tmp_path: Path, mutate: Callable[[dict[str, Any]], object], message: str
) -> None:
    event = mem(1.0, 0x10, 8)
    mutate(event)
    path = tmp_path / "f.json"
    path.write_text(json.dumps(profiler_doc([event]), allow_nan=True))
    with pytest.raises(TraceFormatError, match=message):
        import_trace(path)


def test_profiler_document_errors(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text('{"traceEvents": [\n{"name": "[memory]",\n')
    with pytest.raises(TraceFormatError, match="invalid JSON") as info:
        import_trace(path)
    assert info.value.line == 3
    path.write_text('{"traceEvents": {"a": 1}}')
    with pytest.raises(TraceFormatError, match="'traceEvents' must be a list"):
        import_trace(path)
    path.write_text('{"traceEvents": []}')
    with pytest.raises(TraceFormatError, match="profile_memory=True"):
        import_trace(path)
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(TraceFormatError, match="invalid JSON"):
        import_trace(path)
    # An integer too long for Python (json names no place for it) is found and named.
    digits = "9" * (sys.get_int_max_str_digits() + 1)
    path.write_text('{"traceEvents": [\n{"name": "[memory]",\n "ts": ' + digits + "}]}")
    too_long = r"integer of over [0-9,]+ digits \(column 8\)"
    with pytest.raises(TraceFormatError, match=too_long) as info:
        import_trace(path)
    assert info.value.line == 3 and str(info.value).startswith(f"{path}:3:")


def test_profiler_steps_become_phases(tmp_path: Path) -> None:
    events = [
        mem(10.0, 0x10, 8),
        op("ProfilerStep#1", 20.0),
        mem(21.0, 0x20, 8),
        mem(22.0, 0x20, -8),
        op("ProfilerStep#2", 30.0),
        op("ProfilerStep#2", 31.0),  # the GPU-side copy of the annotation: the earliest counts
        mem(30.0, 0x30, 8),
        op("ProfilerStep#x", 5.0),  # not a step number: ignored
    ]
    trace = import_trace(write_json(tmp_path / "s.json", profiler_doc(events)))
    assert trace.header["phases"] == [
        {"name": "setup", "first_event": 0, "t": 0},
        {"name": "step1", "first_event": 1, "t": 10_000},
        {"name": "step2", "first_event": 3, "t": 20_000},
    ]


def test_a_step_without_a_usable_time_is_malformed(tmp_path: Path) -> None:
    events = [
        mem(10.0, 0x10, 8),
        op("ProfilerStep#1", 10**400),
        op("ProfilerStep#\u00b2", 11.0),  # "²" is a digit to str.isdigit, not to int()
        op("ProfilerStep#" + "9" * 5000, 12.0),  # past int()'s digits: not a step
    ]
    path = write_json(tmp_path / "s.json", profiler_doc(events))
    with pytest.raises(
        TraceFormatError,
        match=r"traceEvents\[1\] \(ProfilerStep#1\): 'ts' = <int of 1,329 bits> is not a usable",
    ):
        import_trace(path)
    lenient = import_trace(path, strict=False)
    assert lenient.dropped.malformed == 1
    assert "phases" not in lenient.header and lenient.events == [(0, "alloc", 0, 8)]


def test_profiler_document_bound(tmp_path: Path) -> None:
    path = write_json(
        tmp_path / "big.json.gz",
        profiler_doc([mem(1.0, 16 * i, 8) for i in range(1, 501)]),
        compress=True,
    )
    with pytest.raises(TraceFormatError, match="max_bytes"):
        import_trace(path, max_bytes=1000)
    assert len(import_trace(path, max_bytes=None).events) == 500


# --------------------------------------------------------------------------- snapshots


def test_snapshot_pairs_alloc_and_free_completed(tmp_path: Path) -> None:
    trace0 = [
        snap_entry("segment_alloc", 0x1000, 2 << 20, time_us=100),
        snap_entry("alloc", 0x1000, 512, time_us=101),
        snap_entry("alloc", 0x1200, 1024, stream=7, time_us=102),
        snap_entry("free_requested", 0x1000, 512, time_us=103),
        snap_entry("free_completed", 0x1000, 512, time_us=104),
        snap_entry("free_completed", 0x9000, 64, time_us=105),  # allocated before the ring buffer
        snap_entry("oom", 0, 1 << 40, time_us=106),
        {"action": "snapshot", "time_us": 107},
    ]
    trace1 = [snap_entry("alloc", 0x1000, 4096, time_us=150)]
    path = write_pickle(tmp_path / "snap.pickle", snapshot_doc([trace0, trace1]))
    assert list_devices(path) == [
        DeviceInfo("cuda:0", (0, 7), 2, 2),
        DeviceInfo("cuda:1", (0,), 1, 0),
    ]
    # cuda:0 peaks at 1,536 B, cuda:1 at 4,096 B: left to choose, cuda:1.
    assert "imported cuda:1, whose blocks' peak live bytes" in (
        import_trace(path).dropped.device_choice
    )
    trace = import_trace(path, device=0, live_before=False)
    assert trace.events == [
        (1000, "alloc", 0, 512),
        (2000, "alloc", 1, 1024),
        (4000, "free", 0, 0),
    ]
    d = trace.dropped
    assert (d.unmatched_frees, d.unmatched_free_bytes) == (1, 64)
    assert (d.live_at_end, d.live_at_end_bytes) == (1, 1024)
    assert d.ignored == 4  # segment_alloc, free_requested, oom, snapshot
    assert d.filtered == 1  # cuda:1's allocation
    assert import_trace(path, device="cuda:1").events == [(50_000, "alloc", 0, 4096)]
    # By default the block freed at 0x9000 was live before the ring buffer's window.
    held = import_trace(path, device=0)
    assert held.events == [
        (0, "alloc", 0, 64),
        (1000, "alloc", 1, 512),
        (2000, "alloc", 2, 1024),
        (4000, "free", 1, 0),
        (5000, "free", 0, 0),
    ]
    assert (held.dropped.live_before, held.dropped.unmatched_frees) == (1, 0)


def _live_series(events: Sequence[tuple[int, str, int, int]]) -> list[int]:
    """The live bytes before the first event and after each one."""
    sizes: dict[int, int] = {}
    series = [0]
    for _, op, ident, size in events:
        if op == "alloc":
            sizes[ident] = size
            series.append(series[-1] + size)
        else:
            series.append(series[-1] - sizes.pop(ident))
    return series


def _active_segment(addr: int, size: int, *, stream: int = 0, **block: Any) -> dict[str, Any]:
    """A final segment holding one active block of ``size`` bytes at ``addr``."""
    return {
        "device": 0,
        "address": addr,
        "total_size": size,
        "stream": stream,
        "blocks": [
            {"address": addr, "size": size, "requested_size": size, "state": "active_allocated"}
            | block
        ],
    }


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    ops=st.lists(st.tuples(st.integers(0, 7), st.integers(1, 4096)), min_size=1, max_size=40),
    cut=st.integers(0, 40),
)
def test_a_window_starts_with_the_blocks_then_live(
    tmp_path: Path, ops: list[tuple[int, int]], cut: int
) -> None:
    # A run of allocations and frees at eight addresses, recorded whole and as a window
    # (the ring buffer kept the entries from `cut` on). The window's trace starts with
    # the blocks live at the cut, so from there on its live bytes are the whole run's.
    entries: list[dict[str, Any]] = []
    live: dict[int, int] = {}
    for slot, size in ops:
        addr = 0x1000 * (slot + 1)
        if addr in live:
            entries.append(snap_entry("free_completed", addr, live.pop(addr)))
        else:
            live[addr] = size
            entries.append(snap_entry("alloc", addr, size))
    cut = min(cut, len(entries) - 1)  # a window holds at least one entry
    final = [_active_segment(addr, size) for addr, size in sorted(live.items())]
    whole = import_trace(
        write_pickle(tmp_path / "whole.pickle", {**snapshot_doc([entries]), "segments": final})
    )
    window = import_trace(
        write_pickle(
            tmp_path / "window.pickle", {**snapshot_doc([entries[cut:]]), "segments": final}
        )
    )
    start = window.dropped.live_before
    before = _live_series(whole.events)
    after = _live_series(window.events)
    assert after[start:] == before[cut:]
    assert window.dropped.unmatched_frees == 0 and whole.dropped.live_before == 0
    assert window.dropped.live_before_bytes == before[cut]
    check_v1_events(window.events)


@pytest.mark.parametrize("shared", ["segment", "list of blocks", "block"])
def test_final_segments_that_share_a_pickle_reference_are_refused(
    tmp_path: Path, shared: str
) -> None:
    # A 33 KB pickle of 1,000 segments sharing one list of 1,990 blocks stood for two
    # million live blocks (7.4 s, 1.2 GB); PyTorch never writes such sharing.
    one = _active_segment(0x1000, 512)
    if shared == "segment":
        final = [one, one]
    elif shared == "list of blocks":
        final = [one, {**_active_segment(0x9000, 512), "blocks": one["blocks"]}]
    else:
        final = [{**one, "blocks": one["blocks"] * 2}]
    path = write_pickle(tmp_path / "shared.pickle", {**snapshot_doc([[]]), "segments": final})
    with pytest.raises(TraceFormatError, match=f"is the same {shared} as an earlier one"):
        import_trace(path)


def test_a_snapshots_live_blocks_are_read_as_pytorch_writes_them(tmp_path: Path) -> None:
    entries = [
        snap_entry("alloc", 0x5000, 100, time_us=10),
        snap_entry("free_completed", 0x4000, 48, time_us=11),  # live before the window
        snap_entry("alloc", 0x9000, 8, stream=3, time_us=12),
    ]
    final = [
        # Named by the window's allocation: not live before it.
        _active_segment(0x5000, 512, requested_size=100),
        # Live all along, asked for 300 bytes of a 512-byte block, with its stack.
        _active_segment(
            0x3000,
            512,
            requested_size=300,
            frames=[{"filename": "m.py", "line": 3, "name": "init"}],
        ),
        # Freed by the program, waiting on another stream: still live.
        _active_segment(0x2000, 64, state="active_pending_free"),
        # A block without an address sits where the blocks before it end.
        {
            "device": 0,
            "address": 0x6000,
            "total_size": 1024,
            "stream": 0,
            "blocks": [
                {"size": 512, "state": "inactive"},
                {"size": 512, "requested_size": 500, "state": "active_allocated"},
            ],
        },
        # Another stream's block, and a free one.
        _active_segment(0x8000, 32, stream=3),
        _active_segment(0x7000, 16, state="inactive"),
    ]
    path = write_pickle(tmp_path / "s.pickle", {**snapshot_doc([entries]), "segments": final})
    trace = import_trace(path)
    # By address: 0x2000 (64), 0x3000 (300), 0x4000 (48), 0x6200 (500), 0x8000 (32).
    assert trace.events[:5] == [
        (0, "alloc", 0, 64),
        (0, "alloc", 1, 300),
        (0, "alloc", 2, 48),
        (0, "alloc", 3, 500),
        (0, "alloc", 4, 32),
    ]
    assert trace.trace.frames(1) == ["init (m.py:3)"]
    assert (trace.dropped.live_before, trace.dropped.live_before_bytes) == (5, 944)
    assert trace.events[5:] == [
        (0, "alloc", 5, 100),
        (1000, "free", 2, 0),
        (2000, "alloc", 6, 8),
    ]
    # One stream takes only its own blocks.
    assert import_trace(path, stream=3).events == [(0, "alloc", 0, 32), (2000, "alloc", 1, 8)]
    # A malformed block list is an error (strict) or a note and no blocks (lenient).
    bad = [*final, {"device": 0, "address": 0, "total_size": 8, "blocks": "x"}]
    path = write_pickle(tmp_path / "bad.pickle", {**snapshot_doc([entries]), "segments": bad})
    with pytest.raises(TraceFormatError, match=r"segments\[6\]\.blocks must be a list"):
        import_trace(path)
    lenient = import_trace(path, strict=False)
    assert lenient.dropped.malformed == 1
    assert lenient.dropped.live_before == 1  # the free at 0x4000 only


def test_odd_block_states_and_frame_lines_are_passed_over(tmp_path: Path) -> None:
    huge_line = [{"filename": "m.py", "line": 1 << 20000, "name": "f"}]
    entries = [snap_entry("alloc", 0x10, 8, time_us=0) | {"frames": huge_line}]
    # A state that is a list (unhashable) is no active state; a line past 64 bits no line.
    final = [_active_segment(0x10, 8), _active_segment(0x100, 16, state=["active_allocated"])]
    trace = import_trace(
        write_pickle(tmp_path / "odd.pickle", {**snapshot_doc([entries]), "segments": final})
    )
    assert trace.events == [(0, "alloc", 0, 8)]
    assert trace.trace.frames(0) == ["f (m.py)"]


def test_a_frame_with_a_lone_surrogate_is_read_with_a_replacement_character(
    tmp_path: Path,
) -> None:
    """A snapshot's frame text with a lone surrogate (which the unpickler keeps, as
    Python's does) is no UTF-8: it becomes U+FFFD, in the trace's events and in a final
    segment's blocks alike, where it raised a bare TypeError naming no file
    (helper-131's find)."""
    frames = [{"filename": "a\ud800.py", "line": 1, "name": "f\udfff"}]
    entries = [snap_entry("alloc", 0x10, 8, time_us=0) | {"frames": frames}]
    # The block at 0x100 was live before the recording: its frames are the segment's.
    final = [_active_segment(0x10, 8), _active_segment(0x100, 16, frames=frames)]
    doc = {**snapshot_doc([entries]), "segments": final}
    trace = import_trace(write_pickle(tmp_path / "surrogate.pickle", doc)).trace
    replaced = ["f\ufffd\ufffd\ufffd (a\ufffd\ufffd\ufffd.py:1)"]
    assert [trace.frames(ident) for ident in (0, 1)] == [replaced, replaced]


def test_a_memory_events_args_holding_a_name_is_still_read(tmp_path: Path) -> None:
    """The profiler's hook drops named events as it parses them, and parses an event's
    ``args`` first: ``args`` holding a ``"name"`` were dropped as an event, and the
    ``[memory]`` event read as missing ``'Addr'`` (strict) or skipped (lenient)
    (helper-131's find). Only event-shaped objects (with ``ph`` or ``ts``) are dropped."""
    event = mem(1.0, 0x2000, 200, 1, 0)
    event["args"]["name"] = "x"
    op = {"ph": "X", "name": "aten::add", "ts": 0.5, "dur": 1, "args": {"name": "y"}}
    path = write_json(tmp_path / "named.json", profiler_doc([op, event]))
    assert import_trace(path).events == [(0, "alloc", 0, 200)]


def test_an_entry_missing_two_fields_is_one_malformed_entry(tmp_path: Path) -> None:
    """Both fields were read before either was checked, so an entry missing both was
    counted two malformed entries (helper-131's find)."""
    entries = [{"action": "alloc", "stream": 0}, snap_entry("alloc", 0x10, 8, time_us=1)]
    lenient = import_trace(
        write_pickle(tmp_path / "two.pickle", snapshot_doc([entries])), strict=False
    )
    assert lenient.dropped.malformed == 1
    no_fields = {"ph": "i", "name": "[memory]", "ts": 1.0, "args": {}}
    doc = profiler_doc([no_fields, mem(2.0, 0x2000, 64, 1, 0)])
    lenient = import_trace(write_json(tmp_path / "two.json", doc), strict=False)
    assert lenient.dropped.malformed == 1 and len(lenient.events) == 1


def test_a_long_string_shared_by_every_frame_is_not_copied_into_each(tmp_path: Path) -> None:
    from cubepool.importers.snapshot import MAX_FRAME_CHARS, _Stacks

    # The pickle holds the string once and names it in every frame for a few bytes: a
    # frame built of it whole copied it, 64 frames an entry (a 1 MiB string, 8 entries:
    # a GiB of frames from a 1 MiB file).
    long = "n" * (1 << 20)
    frames = [{"filename": long, "line": k, "name": long} for k in range(64)]
    stack = _Stacks().read(frames)
    assert stack is not None and len(stack) == 64
    assert all(len(frame) <= 2 * (MAX_FRAME_CHARS + 1) + 24 for frame in stack)
    entries = [
        snap_entry("alloc", 0x10 * (i + 1), 8, time_us=i) | {"frames": frames} for i in range(2)
    ]
    trace = import_trace(write_pickle(tmp_path / "shared.pickle", snapshot_doc([entries]))).trace
    # The trace cuts every frame where it did before: its first 240 characters, marked.
    assert trace.frames(1) == [long[:MAX_FRAME_CHARS] + "..."] * 64
    short = [{"filename": "f" * 300, "line": 7, "name": "g"}]
    assert _Stacks().read(short) == (f"g ({'f' * (MAX_FRAME_CHARS + 1)}:7)",)


def test_stacks_that_differ_share_the_frames_they_have_in_common(tmp_path: Path) -> None:
    from cubepool.importers.snapshot import _Stacks

    # Every entry's 64 frames drawn from two long ones, each stack different: a pickle
    # names the two frame dicts through its memo for a few bytes a frame, and formatting
    # each stack's frames afresh took 5.3 GB for a 22 MB snapshot of 60,000 entries.
    two = [{"filename": c * 240, "line": 1, "name": c.upper() * 240} for c in "ab"]
    stacks = _Stacks()
    read = [stacks.read([two[(i >> bit) & 1] for bit in range(64)]) for i in range(200)]
    assert len({stack for stack in read}) == 200
    first = {id(stack[0]) for stack in read if stack is not None}
    assert len(first) == 2  # one string object per distinct frame, shared by every stack
    assert len(stacks._frames) == 2
    assert stacks.read([two[1], two[0]]) is stacks.read([two[1], two[0]])
    # Through the whole import, and out of the trace, the frames are the same.
    entries = [
        snap_entry("alloc", 0x10 * (i + 1), 8, time_us=i)
        | {"frames": [two[(i >> bit) & 1] for bit in range(64)]}
        for i in range(50)
    ]
    trace = import_trace(write_pickle(tmp_path / "two.pickle", snapshot_doc([entries]))).trace
    frame = ["A" * 240 + "...", "B" * 240 + "..."]  # each cut at 240 characters
    assert trace.frames(5) == [frame[(5 >> bit) & 1] for bit in range(64)]


def test_a_bound_past_the_memory_there_is_reads_a_small_file(tmp_path: Path) -> None:
    from cubepool.importers.limits import LARGEST_BOUND

    # The bound is a most, not what the read sets aside: read(max_bytes + 1) asked for
    # the whole bound before reading, and a small file ran out of memory.
    entries = [snap_entry("alloc", 0x10, 8, time_us=0)]
    for compress in (False, True):
        name = "raised.pickle" + (".gz" if compress else "")
        path = write_pickle(tmp_path / name, snapshot_doc([entries]), compress=compress)
        assert import_trace(path, max_bytes=LARGEST_BOUND).events == [(0, "alloc", 0, 8)]
    profile = write_json(tmp_path / "raised.json", profiler_doc([mem(1.0, 16, 8)]))
    assert len(import_trace(profile, max_bytes=LARGEST_BOUND).events) == 1


def test_snapshot_per_stream(tmp_path: Path) -> None:
    entries = [
        snap_entry("alloc", 0x10, 8, stream=0, time_us=1),
        snap_entry("alloc", 0x20, 16, stream=5, time_us=2),
        snap_entry("free_completed", 0x20, 16, stream=5, time_us=3),
        snap_entry("free_completed", 0x10, 8, stream=0, time_us=4),
    ]
    path = write_pickle(tmp_path / "s.pickle", snapshot_doc([entries]))
    both = import_trace(path)
    assert [e[1] for e in both.events] == ["alloc", "alloc", "free", "free"]
    only5 = import_trace(path, stream=5)
    assert only5.events == [(1000, "alloc", 0, 16), (2000, "free", 0, 0)]
    assert only5.dropped.filtered == 2
    assert "stream 5" in str(only5.header["source"])
    with pytest.raises(TraceSelectionError, match="streams present: 0, 5"):
        import_trace(path, stream=3)


def test_snapshot_without_times_uses_entry_index(tmp_path: Path) -> None:
    entries = [snap_entry("alloc", 0x10, 8), snap_entry("free_completed", 0x10, 8)]
    trace = import_trace(write_pickle(tmp_path / "old.pickle", snapshot_doc([entries])))
    assert trace.events == [(0, "alloc", 0, 8), (1, "free", 0, 0)]
    assert "no time_us" in str(trace.header["notes"])


def test_snapshot_out_of_order_times_are_clamped(tmp_path: Path) -> None:
    entries = [
        snap_entry("alloc", 0x10, 8, time_us=10),
        snap_entry("alloc", 0x20, 8, time_us=9),
    ]
    trace = import_trace(write_pickle(tmp_path / "o.pickle", snapshot_doc([entries])))
    assert trace.events == [(1000, "alloc", 0, 8), (1000, "alloc", 1, 8)]
    assert trace.dropped.clamped_times == 1


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (snap_entry("alloc", 0x10, -8, time_us=1), "negative size"),
        (snap_entry("alloc", -1.5, 8, time_us=1), "'addr' must be an integer"),  # type: ignore[arg-type]
        ({"action": "alloc", "size": 8, "stream": 0, "time_us": 1}, "missing 'addr'"),
        ({"action": 3}, "'action' must be a string"),
        ([1, 2], "an entry must be a dict"),
        (snap_entry("alloc", 0x10, 8, time_us=1) | {"stream": "s"}, "'stream' must be an integer"),
        (snap_entry("alloc", 1 << 20000, 8, time_us=1), "'addr' = <int of 20,001 bits> is outside"),
        (snap_entry("alloc", 0x10, 8, time_us=1 << 1100), "'time_us' = <int of 1,101 bits> is not"),
        (snap_entry("alloc", 0x10, 8, time_us=2**53), "'time_us' = 9007199254740992 is not a"),
        ([1 << 20000], r"must be a dict, got list \[<int of 20,001 bits>\] \(pass"),
    ],
)
def test_snapshot_entry_errors(tmp_path: Path, entry: object, message: str) -> None:
    good = snap_entry("alloc", 0x99, 8, time_us=0)
    path = write_pickle(tmp_path / "e.pickle", snapshot_doc([[good, entry]]))  # type: ignore[list-item]
    with pytest.raises(TraceFormatError, match=message):
        import_trace(path)
    lenient = import_trace(path, strict=False)
    assert lenient.dropped.malformed == 1
    assert lenient.events == [(0, "alloc", 0, 8)]


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (
            snapshot_doc([[DEEP]]),
            r"device_traces\[0\]\[0\]: an entry must be a dict, got list \[\[\[",
        ),
        (
            snapshot_doc([[snap_entry("alloc", 0x10, 8) | {"size": DEEP}]]),
            r"device_traces\[0\]\[0\]: 'size' must be an integer, got list \[\[\[",
        ),
        (snapshot_doc([]) | {"segments": [DEEP]}, r"segments\[0\]: a segment must be a dict"),
        (
            snapshot_doc([]) | {"segments": [_active_segment(0x10, 8) | {"blocks": DEEP}]},
            r"segments\[0\]\.blocks\[0\]: a block must be a dict, got list \[\[\[",
        ),
    ],
)
def test_values_nested_past_the_recursion_limit_are_named(
    tmp_path: Path, doc: object, message: str
) -> None:
    # A 2,000-deep list where a scalar or a dict belongs: refused, named and shown cut
    # short, never walked (repr would recurse past Python's limit).
    path = write_deep_pickle(tmp_path / "deep.pickle", doc)
    with pytest.raises(TraceFormatError, match=message) as info:
        import_trace(path)
    assert len(str(info.value)) < 300
    with pytest.raises(TraceFormatError):
        import_trace(path, strict=False)  # nothing left to import


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([1, 2, 3], "without a 'device_traces' or 'segments' key"),
        ({"segments": []}, "_record_memory_history"),
        ({"device_traces": {"0": []}}, "must be a list of lists"),
        ({"device_traces": [[], []]}, "_record_memory_history"),
    ],
)
def test_snapshot_document_errors(tmp_path: Path, doc: object, message: str) -> None:
    with pytest.raises(TraceFormatError, match=message):
        import_trace(write_pickle(tmp_path / "d.pickle", doc))


def test_snapshot_empty_device_chosen_explicitly(tmp_path: Path) -> None:
    path = write_pickle(
        tmp_path / "d.pickle", snapshot_doc([[snap_entry("alloc", 1, 8, time_us=0)], []])
    )
    trace = import_trace(path, device="cuda:1")
    assert trace.events == []
    assert trace.dropped.filtered == 1


class _Evil:
    """Pickles into a call of os.system: the classic pickle exploit."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Callable[..., object], tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def test_restricted_unpickler_refuses_os_system(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    payload = {"segments": [], "device_traces": [[_Evil(marker)]]}
    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps(payload))
    assert detect_format(path) == "torch-snapshot"
    with pytest.raises(TraceFormatError, match=r"global (posix|os|nt)\.system") as info:
        import_trace(path)
    assert "refuse" in str(info.value)
    with pytest.raises(TraceFormatError):
        list_devices(path)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (pickle.dumps(io.BytesIO), "global _io.BytesIO"),
        (b"\x80\x02cbuiltins\nprint\n)R.", "global builtins.print"),  # protocol-0 GLOBAL + REDUCE
        (b"\x80\x02\x82\x01.", "copyreg extension"),  # EXT1
        (b"\x80\x02X\x01\x00\x00\x00aQ.", "persistent id"),  # BINPERSID
        (b"\x80\x04}\x94.trailing", None),  # fine: trailing bytes are never read
        (b"\x80\x04}(", "truncated pickle: the data ends before the pickle does"),
        (pickle.dumps({"segments": [{"a": 1}] * 100})[:100], "truncated pickle"),
        (b"\x80\x04\xff.", "malformed pickle"),  # an opcode no pickle has
        (b"\x80\x02]q\x00h\x00a.", None),  # a list containing itself: plain containers only
    ],
)
def test_restricted_loads(data: bytes, message: str | None) -> None:
    if message is None:
        restricted_loads(data)
    else:
        with pytest.raises(TraceFormatError, match=message):
            restricted_loads(data)


def test_restricted_loads_cuts_what_the_pickle_puts_in_its_error() -> None:
    # FLOAT of a 4,000-character line: Python's float() quotes every character.
    with pytest.raises(TraceFormatError, match="could not convert string to float") as info:
        restricted_loads(b"\x80\x02F" + b"9" * 4000 + b"x\n.")
    assert len(str(info.value)) < 300
    # GET of a 4,000-digit memo index (past 2^64: no memo holds it) is named briefly.
    with pytest.raises(TraceFormatError, match="Memo value not found at an index past") as info:
        restricted_loads(b"\x80\x02g" + b"9" * 4000 + b"\n.")
    assert len(str(info.value)) < 300


def test_restricted_unpickler_survives_a_huge_memo_index() -> None:
    # LONG_BINPUT 0x7fffffff: the C unpickler would size its memo array by this index.
    data = b"\x80\x04N" + b"r" + (0x7FFFFFFF).to_bytes(4, "little") + b"."
    assert "LONG_BINPUT" in {op.name for op, _, _ in pickletools.genops(data)}
    assert restricted_loads(data) is None


def test_restricted_loads_builds_plain_containers() -> None:
    obj = {"a": [1, 2.5, "x", b"y", None, True, (1, 2)], "s": {"1", "2"}, "f": frozenset({"3"})}
    for protocol in range(4, pickle.HIGHEST_PROTOCOL + 1):
        assert restricted_loads(pickle.dumps(obj, protocol=protocol)) == obj
    # Protocols 2 and 3 pickle sets (and protocol 2 bytes) as calls of globals: refused.
    plain = {"a": [1, 2.5, "x", None, True, (1, 2)], "d": {"k": -(2**70)}}
    for protocol in (2, 3):
        assert restricted_loads(pickle.dumps(plain, protocol=protocol)) == plain
        with pytest.raises(TraceFormatError, match=r"global (__builtin__|builtins)\.set"):
            restricted_loads(pickle.dumps({"1"}, protocol=protocol))


# What the restricted unpickler hashes (dict keys, set members): a snapshot's keys.
_KEYS = st.text(max_size=8) | st.binary(max_size=4) | st.none() | st.booleans()
_PLAIN = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
    | st.binary(max_size=12),
    lambda children: (
        st.lists(children, max_size=4)
        | st.tuples(children, children)
        | st.dictionaries(_KEYS, children, max_size=4)
        | st.frozensets(_KEYS, max_size=3)
    ),
    max_leaves=24,
)


@settings(max_examples=300, deadline=None)
@given(_PLAIN, st.integers(0, pickle.HIGHEST_PROTOCOL))
def test_restricted_loads_builds_what_pickle_loads_builds(obj: object, protocol: int) -> None:
    data = pickle.dumps(obj, protocol=protocol)
    ops = {op.name for op, _, _ in pickletools.genops(data)}
    if ops & {"GLOBAL", "STACK_GLOBAL"}:
        # Protocols 0 to 3 write bytes, sets or frozensets as calls of globals.
        with pytest.raises(TraceFormatError, match="references the global"):
            restricted_loads(data)
    else:
        assert restricted_loads(data) == pickle.loads(data)


def test_restricted_loads_shares_what_the_pickle_shares() -> None:
    shared = [1, "x"]
    looped: list[object] = []
    looped.append(looped)
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        doc = restricted_loads(pickle.dumps({"a": shared, "b": shared}, protocol=protocol))
        assert isinstance(doc, dict) and doc["a"] == shared and doc["a"] is doc["b"]
        again = restricted_loads(pickle.dumps(looped, protocol=protocol))
        assert isinstance(again, list) and again[0] is again


def test_a_deeply_nested_tuple_key_is_refused_not_hashed(tmp_path: Path) -> None:
    # {((...(),),): None} nested 200,000 deep, in 400 KB: Python hashes a tuple by
    # hashing its items, recursively in C without a bound, and overflowed the stack (the
    # pure-Python unpickler cubepool used before killed the interpreter with SIGSEGV). In
    # a child process, so that a regression fails this test and not the whole run. Each
    # tuple memoized, as Python's pickler writes it: without, one byte a tuple, the
    # unpickler's budget of objects would refuse the pickle before the key is hashed.
    path = tmp_path / "deep.pickle"
    path.write_bytes(b"\x80\x04}(\x8c\rdevice_traces]" + b")" + b"\x85\x94" * 200_000 + b"Nu.")
    child = subprocess.run(
        [sys.executable, "-c", _REFUSAL_PROBE, str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert child.returncode == 0, child.stderr
    assert "TraceFormatError" in child.stdout
    assert "SETITEMS hashes a tuple" in child.stdout


_REFUSAL_PROBE = """
import sys
from cubepool.importers import import_trace
try:
    import_trace(sys.argv[1])
except Exception as exc:
    print(type(exc).__name__, exc)
"""


def _frozenset_chain(base: int, depth: int = 40) -> bytes:
    """A_0 = frozenset(), A_i = frozenset({(A_i-1, 0), (A_i-1, 1)}), memoized from
    ``base``: comparing two equal chains takes 2^depth steps."""
    out = b"(\x91r" + base.to_bytes(4, "little")
    for i in range(1, depth + 1):
        get = b"j" + (base + i - 1).to_bytes(4, "little")
        out += (
            b"0(" + get + b"K\x00\x86" + get + b"K\x01\x86\x91r" + (base + i).to_bytes(4, "little")
        )
    return out


@pytest.mark.parametrize(
    ("data", "message"),
    [
        # t0 = (), t1 = (t0, t0), ... t64: hashing t64 takes 2^64 steps.
        (b"\x80\x04})" + b"2\x86" * 64 + b"Ns.", "SETITEM hashes a tuple"),
        # Equal frozenset chains as two keys: comparing them takes 2^40 steps.
        (
            b"\x80\x04}" + _frozenset_chain(0) + b"K\x01s" + _frozenset_chain(1000) + b"K\x02s.",
            "FROZENSET hashes a tuple",
        ),
        # Ints hash alike in every process: keys can be chosen to collide.
        (pickle.dumps({1: 2}, protocol=4), "SETITEM hashes a int"),
        (pickle.dumps({2**100: 1}, protocol=4), "hashes a int"),
        (pickle.dumps({1.5: 1}, protocol=4), "hashes a float"),
        (pickle.dumps({"a": 1, (1, 2): 1}, protocol=4), "SETITEMS hashes a tuple"),
        (pickle.dumps({frozenset({"a"}): 1}, protocol=4), "hashes a frozenset"),
        (pickle.dumps({3}, protocol=4), "ADDITEMS hashes a int"),
        (b"\x80\x04}]Ns.", "hashes a list"),
        (b"\x80\x04\x8f(]\x90.", "ADDITEMS hashes a list"),
        (b"\x80\x04(}\x91.", "FROZENSET hashes a dict"),
    ],
)
def test_a_key_that_is_costly_or_impossible_to_hash_is_refused(data: bytes, message: str) -> None:
    with pytest.raises(TraceFormatError, match=message):
        restricted_loads(data)


def test_str_bytes_none_and_bools_are_keys() -> None:
    obj = {"a": {b"k": 1, None: 2, True: 3}, "s": {"x", b"y"}, "f": frozenset({"z", False})}
    for protocol in (4, 5):
        assert restricted_loads(pickle.dumps(obj, protocol=protocol)) == obj


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x80\x06N.", "unsupported pickle protocol: 6"),
        (b"a.", "APPEND with no value on the stack"),
        (b"(Na.", "APPEND with no value on the stack"),  # the mark hides what is below
        (b"NNa.", "APPEND onto a NoneType"),
        (b"}(Nd.", "DICT with an odd number of items"),
        (b"}(Nu.", "SETITEMS with an odd number of items"),
        (b"N\x86.", "TUPLE2 needs 2 values"),
        (b"Ne.", "APPENDS with no MARK"),
        (b"1.", "POP_MARK with no MARK"),
        (b".", "STOP with no value on the stack"),
        (b"\x94.", "MEMOIZE with no value on the stack"),
        (b"Nh\x05.", "Memo value not found at index 5"),
        (b"Sabc\n.", "must be quoted"),
        (b"U\x01\xff.", "UnicodeDecodeError"),
        (b"Iabc\n.", "ValueError"),
        (b"T\xff\xff\xff\xff.", "negative length"),
        (b"\x8d\xff\xff\xff\xff\xff\xff\xff\x7f.", "truncated pickle"),
        (b"\x80\x05\x97.", "out-of-band buffers"),
        (b"]R.", r"calls or builds an object \(REDUCE\)"),
    ],
)
def test_restricted_loads_names_what_is_wrong(data: bytes, message: str) -> None:
    with pytest.raises(TraceFormatError, match=message):
        restricted_loads(data)


def test_restricted_loads_reads_text_opcodes_and_a_sparse_memo() -> None:
    # Protocol 0's text forms, as Python 2 and 3 wrote them, and PUT indices that are
    # not consecutive (which pickletools.optimize may leave).
    data = b"(I00\nI01\nI0x1f\nL12345678901234567890L\nF2.5\nS'a\\x41'\nVcaf\\u00e9\np7\ng7\nl."
    assert restricted_loads(data) == [
        False,
        True,
        31,
        12345678901234567890,
        2.5,
        "aA",
        "café",
        "café",
    ]
    assert restricted_loads(data) == pickle.loads(data)
    # A list at 2^31 - 1, then MEMOIZE stores 7 at the memo's size, 1; [7, 7] comes back.
    sparse = b"\x80\x04]r\xff\xff\xff\x7fK\x07\x940(h\x01h\x01e0j\xff\xff\xff\x7f."
    # (The C unpickler sizes its memo by the index: MemoryError, hence Python's own.)
    assert restricted_loads(sparse) == pickle._loads(sparse) == [7, 7]  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- RMM


def test_rmm_pairs_and_reports(tmp_path: Path) -> None:
    rows = [
        "140,08:23:34.000001,allocate,0x7f0000000000,256,0x0",
        "140,08:23:34.000002,allocate,0x7f0000000100,512,0x0",
        "141,08:23:34.000003,allocate failure,0x0,99999999999,0x0",
        "140,08:23:34.000004,free,0x7f0000000000,256,0x0",
        "140,08:23:34.000005,free,0x7f0000001000,64,0x0",
        "141,08:23:34.000006,free failure,0x7f0000002000,64,0x0",
        "140,08:23:34.000007,allocate,0x7f0000000100,128,0x0",
        "",
    ]
    trace = import_trace(write_rmm(tmp_path / "rmm_log.csv", rows), live_before=False)
    assert trace.events == [
        (0, "alloc", 0, 256),
        (1000, "alloc", 1, 512),
        (3000, "free", 0, 0),
        (6000, "free", 1, 0),
        (6000, "alloc", 2, 128),
    ]
    d = trace.dropped
    assert d.failed == 2
    assert (d.unmatched_frees, d.unmatched_free_bytes) == (1, 64)
    assert (d.duplicate_allocs, d.duplicate_alloc_bytes) == (1, 512)
    assert (d.live_at_end, d.live_at_end_bytes) == (1, 128)
    assert trace.header["workload"] == "rmm_log"
    assert list_devices(tmp_path / "rmm_log.csv") == [DeviceInfo(None, (0,), 3, 2)]
    held = import_trace(tmp_path / "rmm_log.csv")
    assert held.events[0] == (0, "alloc", 0, 64) and held.events[4] == (4000, "free", 0, 0)
    assert (held.dropped.live_before, held.dropped.live_before_bytes) == (1, 64)


@pytest.mark.parametrize(
    "rows",
    [
        [],
        ["141,08:23:34.000003,allocate failure,0x0,99999999999,0x0"],
        ["1,08:00:00,allocate,0x10,0,0x0", "1,08:00:01,free failure,0x10,0,0x0"],
        ["1,later,allocate,0x10,8,0x0"],  # malformed: skipped when lenient
    ],
)
def test_an_rmm_log_without_allocations_is_refused(tmp_path: Path, rows: list[str]) -> None:
    # As an empty profiler trace or snapshot is: not an empty trace that replays to 0 B.
    path = write_rmm(tmp_path / "empty.csv", rows)
    zero = any(",0,0x0" in row and ",allocate," in row for row in rows)
    why = r"\(its one block entry is of 0 bytes" if zero else r"\(no allocate or free"
    with pytest.raises(TraceFormatError, match=r"no allocation events " + why):
        import_trace(path, strict=False)


def test_rmm_times_and_streams(tmp_path: Path) -> None:
    rows = [
        "1,23:59:59.999999,allocate,0x10,8,0x1",
        "1,00:00:00.000001,allocate,0x20,8,0x2",  # past midnight: one day added
        "2,00:00:00.000000,free,0x10,8,0x1",  # another thread logged slightly late: clamped
        "1,00:00:01.5,free,0x20,8,0x2",
    ]
    path = write_rmm(tmp_path / "r.csv", rows)
    trace = import_trace(path)
    assert trace.events == [
        (0, "alloc", 0, 8),
        (2000, "alloc", 1, 8),
        (2000, "free", 0, 0),
        (1_500_001_000, "free", 1, 0),
    ]
    assert trace.dropped.clamped_times == 1
    assert any("midnight" in n for n in trace.dropped.notes)
    assert import_trace(path, stream=2).events == [
        (2000, "alloc", 0, 8),
        (1_500_001_000, "free", 0, 0),
    ]
    with pytest.raises(TraceSelectionError, match="streams present: 1, 2"):
        import_trace(path, stream=3)
    with pytest.raises(TraceSelectionError, match="record no device"):
        import_trace(path, device="cuda:0")


@pytest.mark.parametrize(
    ("times", "expected"),
    [
        (["2024-05-01 10:00:00.5", "2024-05-02 10:00:00.5"], [0, 86_400 * 10**9]),
        (["12.5", "12.75"], [0, 250_000_000]),
        (["100", "101"], [0, 10**9]),
    ],
)
def test_rmm_time_forms(tmp_path: Path, times: list[str], expected: list[int]) -> None:
    rows = [f"1,{t},allocate,{16 * (i + 1)},8,0" for i, t in enumerate(times)]
    trace = import_trace(write_rmm(tmp_path / "t.csv", rows))
    assert [e[0] for e in trace.events] == expected


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("1,08:00:00,allocate,0x10,8", "expected 6 columns"),
        ("1,later,allocate,0x10,8,0x0", "Time 'later' is not a time"),
        ("1,25:00:00,allocate,0x10,8,0x0", "is not a time"),
        ("1,08:00:00,reallocate,0x10,8,0x0", "unknown Action"),
        ("1,08:00:00,allocate,zz,8,0x0", "Pointer 'zz' is not an address"),
        ("1,08:00:00,allocate,0x10,-8,0x0", "Size '-8' is not a byte count"),
        ("1,08:00:00,allocate,0x10,8.5,0x0", "is not a byte count"),
        ("1,08:00:00,allocate,0x10,\u00b2,0x0", "Size '\u00b2' is not a byte count"),
        ("1,08:00:00,allocate,0x10,8,stream", "Stream 'stream' is not a number"),
    ],
)
def test_rmm_row_errors(tmp_path: Path, row: str, message: str) -> None:
    path = write_rmm(tmp_path / "e.csv", ["1,08:00:00,allocate,0x99,8,0x0", row])
    with pytest.raises(TraceFormatError, match=message) as info:
        import_trace(path)
    assert info.value.line == 3
    lenient = import_trace(path, strict=False)
    assert lenient.dropped.malformed == 1
    assert lenient.dropped.notes[0].startswith("skipped line 3:")
    assert len(lenient.events) == 1


def test_rmm_encoding_errors(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_bytes(RMM_HEADER.encode() + b"\n1,08:00:00,allocate,0x10,8,0x0\n1,\xff\xfe,free\n")
    with pytest.raises(TraceFormatError, match="not UTF-8") as info:
        import_trace(path)
    assert info.value.line == 3
    path.write_bytes(RMM_HEADER.encode() + b"\n1,08:00\x00:00,allocate,0x10,8,0x0\n")
    with pytest.raises(TraceFormatError, match="is not a time"):
        import_trace(path)
    path.write_bytes(RMM_HEADER.encode() + b'\n1,"' + b"x" * 200_000 + b'",allocate,0x10,8,0x0\n')
    with pytest.raises(TraceFormatError, match=r"malformed CSV.*field limit") as info:
        import_trace(path)
    assert info.value.line == 2


# --------------------------------------------------------------------------- entries at fault

HALF = 2**63  # two live blocks of this many bytes overflow 64 bits


def test_an_event_the_trace_refuses_names_the_line_or_entry_it_came_from(tmp_path: Path) -> None:
    # Not the trace's event number alone: the file's line or entry, past skipped ones.
    rows = ["1,1.0,allocate,0x10,9223372036854775808,0", "1,1.5,allocate failure,0x0,8,0"]
    log = write_rmm(tmp_path / "huge.csv", [*rows, "", "1,2.0,allocate,0x20,9223372036854775808,0"])
    with pytest.raises(TraceFormatError, match="imported as rmm-csv: event 1: live bytes") as info:
        import_trace(log)
    assert info.value.line == 5
    events = [mem(1.0, 0x10, HALF, 1, 0), op("aten::empty", 1.5), mem(2.0, 0x20, HALF, 1, 0)]
    with pytest.raises(TraceFormatError, match=r"torch-profiler: traceEvents\[2\]: event 1: live"):
        import_trace(write_json(tmp_path / "p.json", profiler_doc(events)))
    entries = [
        snap_entry("free_requested", 0x10, 8),
        *(snap_entry("alloc", a, HALF) for a in (1, 2)),
    ]
    with pytest.raises(TraceFormatError, match=r"device_traces\[0\]\[2\]: event 1: live"):
        import_trace(write_pickle(tmp_path / "s.pickle", snapshot_doc([entries])))
    # Blocks live before the recording: named by the free that shows them...
    frees = [snap_entry("free_completed", a, HALF) for a in (1, 2)]
    with pytest.raises(TraceFormatError, match=r"device_traces\[0\]\[1\]: event 1: live"):
        import_trace(write_pickle(tmp_path / "f.pickle", snapshot_doc([frees])))
    # ... or by their place in the final segments (blocks larger than their segment).
    block = {"size": HALF, "state": "active_allocated"}
    segment = _active_segment(0x100, 2 << 20) | {"blocks": [block, dict(block)]}
    doc = {**snapshot_doc([[snap_entry("alloc", 0x10, 8)]]), "segments": [segment]}
    with pytest.raises(TraceFormatError, match=r"segments\[0\]\.blocks\[1\]: event 1: live"):
        import_trace(write_pickle(tmp_path / "b.pickle", doc))


def test_times_and_reserved_totals_past_64_bits_are_malformed_entries(tmp_path: Path) -> None:
    # 10^11 s after the first line is 10^20 ns: past a 64-bit clock.
    log = write_rmm(tmp_path / "t.csv", ["1,0,allocate,0x10,8,0", "1,99999999999,free,0x10,8,0"])
    with pytest.raises(TraceFormatError, match="2\\^64 ns or more after the first line's") as info:
        import_trace(log)
    assert info.value.line == 3
    assert import_trace(log, strict=False).dropped.malformed == 1
    # Segments reserving 2^64 bytes in all: refused naming the segment, not the header.
    huge = [_active_segment(0x100, HALF), _active_segment(0x200, HALF)]
    doc = {**snapshot_doc([[snap_entry("alloc", 0x10, 8, time_us=0)]]), "segments": huge}
    path = write_pickle(tmp_path / "s.pickle", doc)
    with pytest.raises(TraceFormatError, match=r"segments\[1\]: the segments of cuda:0 hold 2\^64"):
        import_trace(path)
    lenient = import_trace(path, strict=False)
    assert lenient.trace.recording is None and lenient.dropped.malformed == 1


# --------------------------------------------------------------------------- writing v1


@pytest.mark.parametrize("name", ["out.jsonl", "out.jsonl.gz"])
def test_write_trace_v1_round_trip(tmp_path: Path, name: str) -> None:
    events = [
        op("ProfilerStep#0", 0.5),
        mem(1.0, 16, 64),
        mem(2.0, 32, 128),
        mem(3.0, 16, -64),
        mem(4.0, 48, 8),
    ]
    trace = import_trace(write_json(tmp_path / "p.json", profiler_doc(events)))
    out = tmp_path / name
    write_trace_v1(trace, out)
    if name.endswith(".gz"):
        assert out.read_bytes()[:2] == b"\x1f\x8b"
    header, lines = read_v1(out)
    assert list(header)[:2] == ["format", "version"]
    assert header == trace.header
    assert header["format"] == "cubepool-trace" and header["version"] == 1
    for key in ("workload", "source", "notes"):
        assert isinstance(header[key], str)
    expected = [
        {"t": t, "op": kind, "id": ident, "size": size}
        if kind == "alloc"
        else {"t": t, "op": kind, "id": ident}
        for t, kind, ident, size in trace.events
    ]
    assert lines == expected
    assert detect_format(out) == "cubepool"
    assert oct(out.stat().st_mode & 0o777) == oct(0o644)


@pytest.mark.skipif(not SHARED_TRACE.exists(), reason="shared traces not present")
def test_write_trace_v1_matches_the_shared_files_byte_for_byte(tmp_path: Path) -> None:
    lines = SHARED_TRACE.read_text().splitlines(keepends=True)
    header, events = json.loads(lines[0]), [json.loads(x) for x in lines[1:]]
    trace = Trace.from_events(
        [(e["t"], e["op"], e["id"], e.get("size", 0)) for e in events], header
    )
    write_trace_v1(trace, tmp_path / "copy.jsonl")
    assert (tmp_path / "copy.jsonl").read_text() == "".join(lines)
    trace.write(tmp_path / "again.jsonl")
    assert (tmp_path / "again.jsonl").read_text() == "".join(lines)
    assert trace.to_jsonl().decode() == "".join(lines)


def test_bundled_examples_are_written_back_byte_for_byte(tmp_path: Path) -> None:
    for path in sorted(EXAMPLES.glob("*.jsonl.gz")):
        text = gzip.decompress(path.read_bytes())
        trace = Trace.from_jsonl(path.read_bytes())
        assert trace.to_jsonl() == text, path.name
        trace.write(tmp_path / "copy.jsonl")
        assert (tmp_path / "copy.jsonl").read_bytes() == text, path.name


@pytest.mark.parametrize(
    ("events", "message"),
    [
        ([("free", 0, 0, 0)], "event 0: free of id 0, which is not live"),
        ([("alloc", 5, 0, 8), ("free", 4, 0, 0)], "event 1: time goes backwards"),
        ([("alloc", 0, 3, 8), ("alloc", 1, 3, 8)], "event 1: alloc of id 3, which is already live"),
        ([("alloc", 0, 0, 2**63), ("alloc", 0, 1, 2**63)], "live bytes overflow 64 bits"),
    ],
)
def test_trace_builder_refuses_invalid_events(
    events: list[tuple[str, int, int, int]], message: str
) -> None:
    builder = TraceBuilder({"workload": "w"})
    with pytest.raises(TraceFormatError, match=message):
        for op_name, t, ident, size in events:
            if op_name == "alloc":
                builder.alloc(t, ident, size)
            else:
                builder.free(t, ident)
    # The refused event left the builder as it was.
    assert len(builder) == len(events) - 1
    assert len(builder.finish()) == len(events) - 1


def test_trace_builder_takes_only_64_bit_ints_and_finishes_once() -> None:
    builder = TraceBuilder()
    with pytest.raises(InvalidArgument, match="size must be non-negative, got -1"):
        builder.alloc(0, 0, -1)
    with pytest.raises(InvalidArgument, match="t is too large"):
        builder.alloc(2**64, 0, 8)
    with pytest.raises(TypeError):
        builder.alloc(0.5, 0, 8)  # type: ignore[arg-type]
    builder.alloc(0, 10, 8)
    trace = builder.finish({"workload": "late", "phases": [{"name": "s", "first_event": 0}]})
    assert trace.workload == "late" and trace.phases == [("s", 0)]
    assert trace.events() == [(0, "alloc", 0, 8)]
    with pytest.raises(CubepoolError, match="finished"):
        builder.free(1, 10)


def test_trace_builder_takes_events_added_while_its_arguments_are_read() -> None:
    # Reading `frames` (a sequence's __getitem__) or finish's header (a dict subclass's
    # __getitem__) runs Python code; an event it added failed with "Already borrowed".
    builder = TraceBuilder()

    class Frames(collections.abc.Sequence[str]):
        def __len__(self) -> int:
            return 1

        def __getitem__(self, index: Any) -> Any:
            if index:
                raise IndexError(index)
            builder.alloc(0, 99, 8)
            return "frame"

    class Header(dict[str, Any]):
        def __getitem__(self, key: str) -> Any:
            if len(builder) == 4:
                builder.free(5, 99)
            return super().__getitem__(key)

    class Time:
        def __index__(self) -> int:
            builder.alloc(3, 3, 4)
            return 4

    builder.alloc(1, 1, 16, frames=Frames())
    builder.free(Time(), 3)  # `t` read before the builder is borrowed: 3 comes first
    trace = builder.finish(Header(workload="w"))
    assert trace.workload == "w"
    # Ids are numbered in order of allocation; a free carries no size.
    assert trace.events() == [
        (0, "alloc", 0, 8),
        (1, "alloc", 1, 16),
        (3, "alloc", 2, 4),
        (4, "free", 2, 0),
        (5, "free", 0, 0),
    ]


def test_trace_builder_gives_a_tuple_stack_the_frames_a_list_gives() -> None:
    # A stack's 64 frames were read again for every allocation made from it (6 us an
    # allocation): a tuple of str is now read once and known by its identity after.
    long = "x" * 300
    stack = ("inner (a.py:1)", long, "outer (b.py:2)")
    by_tuple, by_list = TraceBuilder(), TraceBuilder()
    for builder, frames in ((by_tuple, lambda: stack), (by_list, lambda: list(stack))):
        builder.alloc(0, 1, 8, frames())
        builder.alloc(1, 2, 8)  # no stack between two of the same
        builder.alloc(2, 3, 8, frames())
        with pytest.raises(TraceFormatError, match="already live"):
            builder.alloc(3, 1, 8, frames())  # refused: nothing added, nothing known
        builder.alloc(4, 4, 8, frames())
    tuple_trace, list_trace = by_tuple.finish(), by_list.finish()
    assert tuple_trace.events() == list_trace.events()
    for dense in range(4):
        assert tuple_trace.frames(dense) == list_trace.frames(dense)
    # Cut as any stack is (a frame of 300 characters to the trace's limit).
    assert tuple_trace.frames(0) == list_trace.frames(0) != list(stack)
    assert tuple_trace.frames(1) is None and tuple_trace.frames(3) == tuple_trace.frames(0)

    # A tuple holding anything but plain str is read every time, as any sequence is.
    class Frame(str):
        pass

    odd = TraceBuilder()
    odd.alloc(0, 1, 8, (Frame("f (c.py:3)"),))
    odd.alloc(1, 2, 8, (Frame("f (c.py:3)"),))
    assert odd.finish().frames(1) == ["f (c.py:3)"]
    with pytest.raises(TypeError, match="must be a str"):
        TraceBuilder().alloc(0, 1, 8, ("f", 3))
    # A str that is no UTF-8 text is told as such (it read "must be a str, got str").
    for frames in (("f", "g\ud800"), ["f", "g\ud800"]):
        with pytest.raises(ValueError, match=r"frames\[1\] is not UTF-8 text"):
            TraceBuilder().alloc(0, 1, 8, frames)


def test_trace_builder_holds_tuple_stacks_of_a_bounded_size() -> None:
    # Each new tuple was held until finish(): a caller making a new tuple for every
    # allocation (tuple(traceback.format_stack())) had them all kept, 3.5 KB an
    # allocation of 40 frames (helper-128's find). Held now: 16 Mi characters at most.
    builder = TraceBuilder()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(100):
            # 64 frames of 16 Ki characters: a new tuple of 1 Mi characters each time.
            frames = tuple(f"{i:05d}{j:02d}".ljust(1 << 14, "x") for j in range(64))
            builder.alloc(i, i, 8, frames)
            builder.free(i, i)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 40 << 20, held  # all 100 tuples are 100 MiB
    # The frames are what a list of them gives (cut to the trace's limits).
    by_list = TraceBuilder()
    by_list.alloc(0, 0, 8, list(frames))
    assert builder.finish().frames(99) == by_list.finish().frames(0)


def test_a_header_mappings_own_errors_are_raised_not_taken_for_missing_keys() -> None:
    # Any error of the mapping's __getitem__ read as a missing key: an interrupt while
    # the header was read gave a trace with no workload.
    class Header(dict[str, Any]):
        def __getitem__(self, key: str) -> Any:
            if key == "source":
                raise ValueError("the mapping failed")
            return super().__getitem__(key)

    with pytest.raises(ValueError, match="the mapping failed"):
        TraceBuilder(Header(workload="w"))
    builder = TraceBuilder()
    with pytest.raises(ValueError, match="the mapping failed"):
        builder.finish(Header(workload="w"))
    assert builder.finish({"workload": "w"}).workload == "w"


def test_trace_builder_finish_refuses_a_header_past_its_events_and_keeps_the_builder() -> None:
    builder = TraceBuilder({"phases": [{"name": "late", "first_event": 5}]})
    builder.alloc(0, 10, 8)
    late = {"phases": [{"name": "s", "first_event": 0}, {"name": "t", "first_event": 9}]}
    with pytest.raises(TraceFormatError, match='phase "t" starts at event 9') as refused:
        builder.finish(late)
    # Built in memory, not read from a file: no hint of a file cut short.
    assert "cut short" not in str(refused.value)
    assert len(builder) == 1, "the refusal left the events"
    with pytest.raises(TraceFormatError, match='phase "late" starts at event 5'):
        builder.finish()  # the builder's own header, as before the refused one
    with pytest.raises(TraceFormatError, match="malformed header"):
        builder.finish({"phases": [{"name": "no first_event"}]})  # does not parse
    assert len(builder) == 1, "the refusal left the events"
    builder.free(1, 10)
    trace = builder.finish({"phases": [{"name": "s", "first_event": 2}]})
    assert trace.phases == [("s", 2)] and len(trace) == 2


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ([], "expected a dict"),
        ({"workload": 3}, '"workload" must be a str'),
        ({"phases": {}}, '"phases" must be a list'),
        ({"phases": [{"name": "a"}]}, 'phases\\[0\\] has no "first_event"'),
        ({"phases": [{"name": "a", "first_event": -1}]}, "non-negative 64-bit int"),
        ({"phases": [{"name": "a", "first_event": True}]}, "got bool"),
    ],
)
def test_headers_from_python_are_typed(header: object, message: str) -> None:
    with pytest.raises(TraceFormatError, match=f"malformed header: .*{message}"):
        TraceBuilder(header)
    with pytest.raises(TraceFormatError, match=f"malformed header: .*{message}"):
        Trace.from_events([], header)  # type: ignore[arg-type]


def test_a_header_keeps_its_fields_and_passes_over_others() -> None:
    header = {"format": "cubepool-trace", "version": 1, "workload": "w", "extra": object()}
    trace = Trace.from_events([(0, "alloc", 0, 8)], header)  # type: ignore[arg-type]
    assert trace.header == {"workload": "w", "source": "", "model": "", "notes": ""}


# --------------------------------------------------------------------------- errors


def test_error_types_and_pickling() -> None:
    err = TraceFormatError("bad Bytes", "/x/trace.json", 7)
    assert isinstance(err, CubepoolError) and isinstance(err, ValueError)
    assert str(err) == "/x/trace.json:7: bad Bytes"
    again = pickle.loads(pickle.dumps(err))
    assert (again.message, again.path, again.line) == ("bad Bytes", "/x/trace.json", 7)
    sel = TraceSelectionError("choose", "f", ("cpu", "cuda:0"))
    assert isinstance(sel, CubepoolError) and isinstance(sel, ValueError)
    assert pickle.loads(pickle.dumps(sel)).available == ("cpu", "cuda:0")
    assert ImportReport().summary() == "nothing dropped"
    # Counts read as the events beside them do, with thousands separators.
    summary = ImportReport(ignored=1_000_785, live_at_end=12_345).summary()
    assert "1,000,785 non-block entries ignored" in summary
    assert "kept 12,345 allocations live at the end" in summary


# --------------------------------------------------------------------------- corpus


def _corpus_cases() -> list[tuple[str, dict[str, Any]]]:
    manifest = json.loads((CORPUS / "MANIFEST.json").read_text())
    return sorted(manifest["cases"].items())


def test_corpus_manifest_lists_every_file() -> None:
    names = {p.name for p in CORPUS.iterdir() if p.name not in ("MANIFEST.json", "README.md")}
    assert names == {name for name, _ in _corpus_cases()}


@pytest.mark.parametrize(("name", "case"), _corpus_cases())
def test_corpus(name: str, case: dict[str, Any]) -> None:
    path = CORPUS / name
    kwargs = case.get("kwargs", {})
    if "error" in case:
        with pytest.raises(TraceFormatError, match=case["error"]) as info:
            import_trace(path, **kwargs)
        assert info.value.path == str(path)
        if "line" in case:
            assert info.value.line == case["line"]
    else:
        trace = import_trace(path, **kwargs)
        check_v1_events(trace.events)
        for key, value in case.get("dropped", {}).items():
            assert getattr(trace.dropped, key) == value, key


# --------------------------------------------------------------------------- fuzzing

_addr = st.sampled_from([0x10, 0x20, 0x30, 0x40])
_size = st.integers(min_value=-3, max_value=1 << 20)
_ops = st.lists(st.tuples(_addr, _size, st.integers(0, 2)), max_size=12)


def _profiler_bytes(ops: list[tuple[int, int, int]]) -> bytes:
    events: list[Any] = [op("ProfilerStep#0", 0.0)]
    events += [mem(1.0 + i / 3, a, s, 1 if d else 0, d - 1) for i, (a, s, d) in enumerate(ops)]
    return json.dumps(profiler_doc(events)).encode()


def _snapshot_bytes(ops: list[tuple[int, int, int]]) -> bytes:
    entries = [
        snap_entry("alloc" if s > 0 else "free_completed", a, abs(s), stream=d, time_us=i)
        for i, (a, s, d) in enumerate(ops)
    ]
    return pickle.dumps(snapshot_doc([entries, []]), protocol=4)


def _rmm_bytes(ops: list[tuple[int, int, int]]) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(RMM_HEADER.split(","))
    for i, (a, s, d) in enumerate(ops):
        writer.writerow(
            [1, f"08:00:{i:02d}.5", "allocate" if s > 0 else "free", hex(a), abs(s), hex(d)]
        )
    return out.getvalue().encode()


_BUILDERS = {
    "torch-profiler": _profiler_bytes,
    "torch-snapshot": _snapshot_bytes,
    "rmm-csv": _rmm_bytes,
}


def _mutate(data: bytes, edits: list[tuple[int, int, int]]) -> bytes:
    buf = bytearray(data)
    for kind, pos, value in edits:
        if not buf:
            break
        pos %= len(buf)
        if kind == 0:
            del buf[pos:]  # truncate
        elif kind == 1:
            buf[pos] = value  # overwrite a byte
        elif kind == 2:
            buf.insert(pos, value)
        else:
            del buf[pos : pos + 1 + value % 8]
    return bytes(buf)


def _import_everything(path: Path) -> None:
    """Run every entry point; only cubepool's own errors may come out."""
    try:
        fmt = detect_format(path)
    except TraceFormatError:
        return
    assert fmt in ("cubepool", "torch-profiler", "torch-snapshot", "rmm-csv")
    for call in (
        lambda: list_devices(path),
        lambda: import_trace(path, strict=False),
        lambda: import_trace(path, device=0),
        lambda: import_trace(path),
    ):
        try:
            result = call()
        except (TraceFormatError, TraceSelectionError):
            continue
        if isinstance(result, ImportedTrace):
            check_v1_events(result.events)
            write_trace_v1(result, path.with_suffix(".out.jsonl"))


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    fmt=st.sampled_from(sorted(_BUILDERS)),
    ops=_ops,
    edits=st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 1 << 16), st.integers(0, 255)), max_size=4
    ),
    compress=st.booleans(),
)
def test_fuzz_mutated_inputs_raise_only_trace_format_errors(
    tmp_path: Path,
    fmt: str,
    ops: list[tuple[int, int, int]],
    edits: list[tuple[int, int, int]],
    compress: bool,
) -> None:
    data = _BUILDERS[fmt](ops)
    if compress:
        data = gzip.compress(data)
    data = _mutate(data, edits)
    path = tmp_path / "fuzz.in"
    path.write_bytes(data)
    _import_everything(path)


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(fmt=st.sampled_from(sorted(_BUILDERS)), ops=_ops, compress=st.booleans())
def test_fuzz_valid_inputs_import_and_round_trip(
    tmp_path: Path, fmt: str, ops: list[tuple[int, int, int]], compress: bool
) -> None:
    data = _BUILDERS[fmt](ops)
    path = tmp_path / ("in.gz" if compress else "in")
    path.write_bytes(gzip.compress(data) if compress else data)
    assert detect_format(path) == fmt
    devices = [info.device for info in list_devices(path) if info.allocs + info.frees]
    for device in devices or [None]:
        try:
            trace = import_trace(path, device=device)
        except TraceFormatError as exc:
            assert not devices and "no allocation events" in str(exc)
            continue
        check_v1_events(trace.events)
        d = trace.dropped
        allocs = sum(1 for e in trace.events if e[1] == "alloc")
        frees = sum(1 for e in trace.events if e[1] == "free")
        assert allocs == frees + d.live_at_end
        assert d.malformed == 0
        out = path.with_suffix(".jsonl.gz")
        write_trace_v1(trace, out)
        header, lines = read_v1(out)
        assert header == trace.header
        assert [(x["t"], x["op"], x["id"], x.get("size", 0)) for x in lines] == trace.events


_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
_profiler_keys = st.sampled_from(
    ["ts", "args", "name", "Addr", "Bytes", "Device Type", "Device Id"]
)
_snapshot_keys = st.sampled_from(["action", "addr", "size", "stream", "time_us", "frames"])


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    fmt=st.sampled_from(["torch-profiler", "torch-snapshot"]),
    ops=_ops,
    replacements=st.lists(
        st.tuples(st.integers(0, 20), _profiler_keys | _snapshot_keys, _json_values), max_size=4
    ),
)
def test_fuzz_wrong_types_raise_only_trace_format_errors(
    tmp_path: Path,
    fmt: str,
    ops: list[tuple[int, int, int]],
    replacements: list[tuple[int, str, Any]],
) -> None:
    """Entries whose fields hold values of any JSON type, in the documented structures."""
    path = tmp_path / "types.in"
    if fmt == "torch-profiler":
        events = [mem(1.0 + i, a, s, 1 if d else 0, d - 1) for i, (a, s, d) in enumerate(ops)]
        for index, key, value in replacements:
            if events:
                event = events[index % len(events)]
                args = event["args"]
                (args if isinstance(args, dict) and key in args else event)[key] = value
        path.write_text(json.dumps(profiler_doc(events), allow_nan=True))
    else:
        entries = [
            snap_entry("alloc" if s > 0 else "free_completed", a, abs(s), stream=d, time_us=i)
            for i, (a, s, d) in enumerate(ops)
        ]
        for index, key, value in replacements:
            if entries:
                entries[index % len(entries)][key] = value
        path.write_bytes(pickle.dumps(snapshot_doc([entries]), protocol=5))
    _import_everything(path)


def _live_segment(device: int, blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """A final segment of 20 MiB on ``device`` at 1 << 32 holding ``blocks`` in order."""
    return {
        "device": device,
        "address": 1 << 32,
        "total_size": 20 << 20,
        "stream": 0,
        "segment_type": "large",
        "blocks": blocks,
    }


def test_a_snapshot_without_history_imports_the_blocks_live_at_its_dump(tmp_path: Path) -> None:
    # `_dump_snapshot()` without `_record_memory_history()` (or with enabled="state",
    # which keeps one entry) holds no allocation entries; its segments' active blocks
    # are what was live, and the segments what was reserved. A pickled
    # `torch.cuda.memory_snapshot()` is the segments alone.
    blocks = [
        {
            "address": 1 << 32,
            "size": 6 << 20,
            "requested_size": 6 << 20,
            "state": "active_allocated",
        },
        {"address": (1 << 32) + (6 << 20), "size": 2 << 20, "state": "inactive"},
        {"address": (1 << 32) + (8 << 20), "size": 4 << 20, "state": "active_awaiting_free"},
    ]
    docs = {
        "empty-history": {"segments": [_live_segment(0, blocks)], "device_traces": [[]]},
        "state-mode": {
            "segments": [_live_segment(0, blocks)],
            "device_traces": [[{"action": "snapshot", "time_us": 5}]],
        },
        "no-traces-key": {"segments": [_live_segment(0, blocks)]},
        "bare-segments": [_live_segment(0, blocks)],
    }
    for name, doc in docs.items():
        imported = import_trace(write_pickle(tmp_path / f"{name}.pickle", doc))
        trace = imported.trace
        assert trace.events() == [(0, "alloc", 0, 6 << 20), (0, "alloc", 1, 4 << 20)], name
        assert imported.dropped.live_before == 2 and imported.dropped.device_choice == "", name
        assert trace.recording is not None and trace.recording.peak == 20 << 20, name
    # Without the blocks live at the dump there is nothing to import: refused, saying so.
    empty = tmp_path / "empty-history.pickle"
    with pytest.raises(TraceFormatError, match="no allocation events"):
        import_trace(empty, live_before=False)
    # Segments on a device the device traces do not reach are still that device's.
    doc = {"segments": [_live_segment(2, blocks)], "device_traces": [[]]}
    imported = import_trace(write_pickle(tmp_path / "cuda2.pickle", doc))
    assert imported.header["source"].endswith("device cuda:2)") and len(imported.trace) == 2
    assert [d.device for d in list_devices(tmp_path / "cuda2.pickle")] == ["cuda:0", "cuda:2"]


def test_a_torch_2_0_snapshot_keeps_the_stacks_of_blocks_live_at_its_dump(tmp_path: Path) -> None:
    # torch 2.0 kept a block's allocations in its `history`, newest first (PyTorch's
    # `_memory_viz` reads `history[0]`: its frames and `real_size`, the bytes asked
    # for), and wrote no `frames` or `requested_size` of its own.
    newest = [{"filename": "model.py", "line": 7, "name": "load"}]
    oldest = [{"filename": "warmup.py", "line": 3, "name": "first_use"}]
    block = {
        "size": 2 << 20,
        "state": "active_allocated",
        "history": [
            {"addr": 1 << 32, "real_size": 1000, "frames": newest},
            {"addr": 1 << 32, "real_size": 2 << 20, "frames": oldest},
        ],
    }
    doc = {"segments": [_live_segment(0, [block])], "device_traces": [[]]}
    trace = import_trace(write_pickle(tmp_path / "t20.pickle", doc)).trace
    assert trace.events() == [(0, "alloc", 0, 1000)]
    assert trace.frames(0) == ["load (model.py:7)"]


def test_rmm_logs_of_every_era_parse(tmp_path: Path) -> None:
    # RMM 0.14 to 21.04 wrote the time as %H:%M:%S:%f (a colon before the fraction);
    # RMM 24.12 on prints pointers with printf's %p, so a null one (allocate(0)) is
    # "(nil)" under glibc.
    path = write_rmm(
        tmp_path / "eras.csv",
        [
            "7,14:02:11:123456,allocate,0x7f8a2c000000,1048576,0",
            "7,14:02:11.123500,allocate,(nil),0,0",
            "7,14:02:11.123600,free,(nil),0,0",
            "7,14:02:11.123700,allocate failure,(nil),99999999999,0",
            "7,14:02:11:123800,free,0x7f8a2c000000,1048576,0",
        ],
    )
    imported = import_trace(path)
    assert imported.events == [(0, "alloc", 0, 1048576), (344_000, "free", 0, 0)]
    assert (imported.dropped.zero_size, imported.dropped.failed) == (2, 1)


def test_rmm_null_pointers_and_colon_times_are_read_strictly(tmp_path: Path) -> None:
    # A null pointer names a block only for zero bytes; the colon form of the time is
    # RMM's %f, six digits of microseconds.
    for row, problem in [
        ("7,14:02:11.000001,free,(nil),1048576,0", "null for 1,048,576 bytes"),
        ("7,14:02:11.000001,allocate,0x0,64,0", "null for 64 bytes"),
        ("7,14:02:11:5,allocate,0x10,64,0", "is not a time"),
    ]:
        with pytest.raises(TraceFormatError, match=problem):
            import_trace(write_rmm(tmp_path / "strict.csv", [row]))


@pytest.mark.parametrize(
    ("cell", "column"),
    [
        ("0x-5", "Pointer"),
        ("-5", "Pointer"),
        ("0x_10", "Pointer"),
        ("0x 10", "Pointer"),
        ("\u0661\u0662", "Pointer"),  # Arabic-Indic digits, which str.isdigit and int take
        ("0x" + "f" * 41, "Pointer"),
        ("0x-" + "f" * 4000, "Stream"),  # past Python's 4,300-digit int conversion
    ],
)
def test_rmm_pointers_and_streams_are_ascii_numbers_of_64_bits(
    tmp_path: Path, cell: str, column: str
) -> None:
    """A Pointer or Stream cell is ASCII hex or decimal digits: ``int`` took a sign
    (``0x-5`` was the address -5, and negative multiples of 2**61 - 1, which hash
    alike, made 20,000 lines take 12.6 s), ``_``, spaces and other scripts' digits, and
    a ``0x-`` of 4,000 digits escaped as a ValueError naming no file
    (helper-131's finds)."""
    pointer, stream = (cell, "0") if column == "Pointer" else ("0x10", cell)
    path = write_rmm(tmp_path / "bad.csv", [f"1,1.0,allocate,{pointer},100,{stream}"])
    with pytest.raises(TraceFormatError, match=rf"bad\.csv:2: .*{column}") as caught:
        import_trace(path)
    assert len(str(caught.value)) < 400
    # Lenient, the line is skipped and counted.
    lenient = import_trace(
        write_rmm(
            tmp_path / "mixed.csv",
            [f"1,1.0,allocate,{pointer},100,{stream}", "1,2.0,allocate,0x20,64,0"],
        ),
        strict=False,
    )
    assert [(kind, size) for _, kind, _, size in lenient.events] == [("alloc", 64)]
    assert lenient.dropped.malformed == 1


def test_rmm_pointers_in_hex_and_decimal_still_read() -> None:
    from cubepool.importers.rmm import _parse_pointer

    assert [_parse_pointer(text) for text in ("0x7F8A", "7f8a", "4096", " 0x10 ", "(nil)")] == [
        0x7F8A,
        0x7F8A,
        4096,
        16,
        0,
    ]
    assert _parse_pointer("0x" + "0" * 24 + "1") == 1
    assert _parse_pointer(hex(1 << 64)) is None


def test_the_device_chosen_is_a_gpu_by_what_its_import_holds(tmp_path: Path) -> None:
    # 2 GiB of weights loaded on cuda:0 before the profiler started (their free is in
    # the trace), 8 MiB of activity after; 400 MiB on the CPU. The import holds 2 GiB
    # on cuda:0 at its start, and a GPU goes before the CPU whatever their peaks.
    gib, mib = 1 << 30, 1 << 20
    late = [
        mem(1.0, 0x100, 400 * mib),  # cpu
        mem(2.0, 0x2000, 8 * mib, 1, 0),
        mem(3.0, 0x9000, -2 * gib, 1, 0),  # weights loaded before the recording
        mem(4.0, 0x2000, -8 * mib, 1, 0),
    ]
    path = write_json(tmp_path / "late.json", profiler_doc(late))
    chosen = import_trace(path)
    assert chosen.header["source"].endswith("device cuda:0)")
    assert "the only GPU, a GPU going before the CPU (cuda:0's blocks peak at 2.0 GiB" in (
        chosen.dropped.device_choice
    )
    assert chosen.trace.peak_live == 2 * gib + 8 * mib
    # Started empty, the weights are not held: cuda:0 peaks at 8 MiB, still before the CPU.
    empty = import_trace(path, live_before=False)
    assert "(cuda:0's blocks peak at 8.0 MiB, the CPU's at 400.0 MiB)" in (
        empty.dropped.device_choice
    )
    # Only the CPU: the CPU.
    cpu_only = write_json(tmp_path / "cpu.json", profiler_doc([mem(1.0, 0x100, 64)]))
    assert import_trace(cpu_only).dropped.device_choice == ""


def test_a_snapshot_without_history_lists_and_selects_its_streams(tmp_path: Path) -> None:
    blocks = [{"address": 1 << 32, "size": 4096, "state": "active_allocated"}]
    path = write_pickle(tmp_path / "bare.pickle", [_live_segment(0, blocks)])
    assert list_devices(path) == [DeviceInfo("cuda:0", (0,), 0, 0)]
    assert import_trace(path, stream=0).events == [(0, "alloc", 0, 4096)]
    with pytest.raises(TraceSelectionError, match="streams present: 0"):
        import_trace(path, stream=3)


def test_a_stream_of_blocks_live_at_the_dump_counts_only_where_they_are_imported(
    tmp_path: Path,
) -> None:
    # A snapshot whose history is on stream 0 and a block live at its dump on stream 5:
    # stream 5 holds something only where that block is imported (live_before).
    blocks = [{"address": 1 << 32, "size": 4096, "state": "active_allocated"}]
    segment = _live_segment(0, blocks) | {"stream": 5}
    doc = {"segments": [segment], "device_traces": [[snap_entry("alloc", 0x10, 8, time_us=0)]]}
    path = write_pickle(tmp_path / "s5.pickle", doc)
    assert import_trace(path, stream=5).events == [(0, "alloc", 0, 4096)]
    with pytest.raises(TraceSelectionError, match=r"streams present: 0$"):
        import_trace(path, stream=5, live_before=False)


def test_an_rmm_log_of_only_zero_byte_entries_says_so(tmp_path: Path) -> None:
    # Its allocate and free lines were all of 0 bytes; the error said the file had "no
    # allocate or free line".
    path = tmp_path / "zero.csv"
    path.write_text(
        f"{RMM_HEADER}\n"
        "1,00:00:00.000001,allocate,0x1000,0,0x0\n"
        "1,00:00:00.000002,free,0x1000,0,0x0\n"
    )
    with pytest.raises(TraceFormatError, match=r"its 2 block entries are all of 0 bytes"):
        import_trace(path)

"""Hostile and careless input gets a typed error that names the problem (issue 22).

Time order of traces, bounded imports, errors that name the argument or the file, and
the command line's handling of bad files: each behaviour the README's "Reliability"
section promises, checked here.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import cubepool
from cubepool import importers
from cubepool._errors import TraceFormatError
from cubepool.cli import main

HEADER = '{"format":"cubepool-trace","version":1,"workload":"w"}'


def v1(path: Path, *events: str) -> Path:
    path.write_text("\n".join([HEADER, *events]) + "\n")
    return path


def memory_event(ts: float, addr: int, nbytes: int) -> dict[str, Any]:
    return {
        "name": "[memory]",
        "ph": "i",
        "ts": ts,
        "args": {"Addr": addr, "Bytes": nbytes, "Device Type": 1, "Device Id": 0},
    }


def op_event(ts: float) -> dict[str, Any]:
    return {"name": "aten::mm", "ph": "X", "ts": ts, "dur": 1, "args": {"External id": 1}}


def profiler(path: Path, events: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def rmm(path: Path, rows: list[str]) -> Path:
    path.write_text("\n".join(["Thread,Time,Action,Pointer,Size,Stream", *rows]) + "\n")
    return path


# --------------------------------------------------------------------------- time order


def test_a_v1_trace_whose_time_goes_backwards_is_refused_at_its_line(tmp_path: Path) -> None:
    path = v1(
        tmp_path / "back.jsonl",
        '{"t":9,"op":"alloc","id":0,"size":8}',
        '{"t":5,"op":"free","id":0}',
    )
    with pytest.raises(TraceFormatError, match="time goes backwards") as info:
        cubepool.load_trace(path)
    assert (info.value.path, info.value.line) == (str(path), 3)


def test_from_events_refuses_time_going_backwards_naming_the_event() -> None:
    with pytest.raises(TraceFormatError, match=r"event 2: time goes backwards") as info:
        cubepool.Trace.from_events([(5, "alloc", 0, 8), (7, "alloc", 1, 8), (6, "free", 0, 0)])
    assert info.value.line is None
    # Equal times are in order.
    assert len(cubepool.Trace.from_events([(5, "alloc", 0, 8), (5, "free", 0, 0)])) == 2


def test_from_events_names_a_malformed_event() -> None:
    with pytest.raises(TraceFormatError, match=r"event 1: expected \(t_ns, op, id, size\)"):
        cubepool.Trace.from_events([(0, "alloc", 0, 8), (-1, "alloc", 1, 8)])
    with pytest.raises(TraceFormatError, match="event 0"):
        cubepool.Trace.from_events([(0, "alloc", 0, 2**64)])


@pytest.mark.parametrize(
    "command",
    [["plan"], ["report", "--out", "{tmp}/mem.html"], ["convert", "{trace}", "{tmp}/out.jsonl"]],
)
def test_the_cli_refuses_a_backwards_trace_in_one_line(
    tmp_path: Path, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    trace = v1(
        tmp_path / "back.jsonl",
        '{"t":9,"op":"alloc","id":0,"size":8}',
        '{"t":5,"op":"free","id":0}',
    )
    argv = [a.format(tmp=tmp_path, trace=trace) for a in command]
    if command[0] != "convert":
        argv.insert(1, str(trace))
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("cubepool: ") and "time goes backwards" in err and "back.jsonl:3" in err
    assert not (tmp_path / "out.jsonl").exists()


def test_importers_put_events_in_time_order_and_report_repairs(tmp_path: Path) -> None:
    log = rmm(
        tmp_path / "log.csv",
        [
            "1,10:00:00.000002,allocate,0x10,64,0",
            "1,10:00:00.000001,allocate,0x20,64,0",  # earlier than its predecessor
            "1,10:00:00.000003,free,0x10,64,0",
        ],
    )
    trace, report = cubepool.load_trace_with_report(log)
    assert report is not None and report.clamped_times == 1
    times = [e[0] for e in trace.events()]
    assert times == sorted(times)
    shuffled = profiler(
        tmp_path / "prof.json",
        [memory_event(3.0, 16, -64), memory_event(1.0, 16, 64), memory_event(2.0, 32, 8)],
    )
    events = cubepool.load_trace(shuffled).events()
    assert [e[1] for e in events] == ["alloc", "alloc", "free"]
    assert [e[0] for e in events] == [0, 1000, 2000]


def test_an_imported_event_that_does_not_fit_names_the_file_its_line_and_the_event(
    tmp_path: Path,
) -> None:
    big = 2**64 - 64
    log = rmm(
        tmp_path / "huge.csv", [f"1,1.0,allocate,0x10,{big},0", f"1,2.0,allocate,0x20,{big},0"]
    )
    with pytest.raises(TraceFormatError) as info:
        cubepool.load_trace(log)
    message = str(info.value)
    assert message.startswith(f"{log}:3: imported as rmm-csv: event 1: live bytes overflow 64 bits")


# --------------------------------------------------------------------------- arguments


def test_bad_arguments_name_themselves() -> None:
    mm = cubepool.MemoryManagement()
    h = mm.reserve(64)
    with pytest.raises(TypeError, match="size must be an int, got bool"):
        mm.reserve(True)
    with pytest.raises(cubepool.InvalidArgument, match="start is too large"):
        mm.write(h, start=2**64)
    with pytest.raises(cubepool.InvalidArgument, match="start must be non-negative"):
        mm.claim(h, -1)
    assert mm.claim(h) is None and mm.claim(h, 8) is None  # the default start is 0
    with pytest.raises(ValueError, match="device_type must fit in 32 bits"):
        cubepool.Device(2**40)
    with pytest.raises(ValueError, match="device_id must fit in 32 bits"):
        cubepool.Device("cpu", 2**40)
    with pytest.raises(TypeError, match="device_id must be an int"):
        cubepool.Device(1, "0")  # type: ignore[arg-type]
    trace = cubepool.Trace.from_events([(0, "alloc", 0, 8), (1, "free", 0, 0)])
    with pytest.raises(cubepool.InvalidArgument, match="events must be non-negative"):
        trace.prefix(-1)
    assert len(trace.prefix(2**64 - 1)) == 2
    with pytest.raises(cubepool.InvalidArgument, match="events is too large"):
        trace.prefix(2**70)
    with pytest.raises(cubepool.InvalidArgument, match="samples must be non-negative"):
        cubepool.replay(trace, samples=-1)
    assert len(cubepool.replay(trace, samples=2**64 - 1).timeline) == 2
    with pytest.raises(ValueError, match="max_storage_allocations must be positive"):
        cubepool.plan(trace, max_storage_allocations=-5)
    with pytest.raises(TypeError, match="max_storage_allocations must be an int"):
        cubepool.plan(trace, max_storage_allocations=1.5)  # type: ignore[arg-type]


def test_a_huge_bad_name_makes_a_short_message() -> None:
    with pytest.raises(cubepool.PoolConfigError) as info:
        cubepool.MemoryConfiguration.parse("x" * 1_000_000)
    assert len(str(info.value)) < 1000
    assert "(1000000 bytes)" in str(info.value)


# --------------------------------------------------------------------------- files


def test_a_non_utf8_cubepool_toml_names_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CUBEPOOL_MEMORY_POOLS", raising=False)
    (tmp_path / "cubepool.toml").write_bytes(b'[memory]\npools = "direct()"\n\xff\n')
    monkeypatch.chdir(tmp_path)
    with pytest.raises(cubepool.PoolConfigError, match=r"cubepool\.toml: not UTF-8 text") as info:
        cubepool.MemoryManagement()
    assert info.value.kind == "NotText"
    assert info.value.source == str(tmp_path / "cubepool.toml")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\xff\xfe not text", "not UTF-8 text"),
        (b'{"pools":[{"kind":["direct"]}]}', "unknown pool kind ['direct']"),
        (b'{"pools":[{"kind":"direct","dealloc_period":"5"}]}', "dealloc_period must be an int"),
        (b'{"pools":[{"kind":"direct","reclaim_at":-1}]}', "reclaim_at must be non-negative"),
        (b"[" * 100_000, "not a JSON layout"),
    ],
)
def test_the_cli_names_a_bad_config_file(
    tmp_path: Path, content: bytes, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    layout = tmp_path / "layout.json"
    layout.write_bytes(content)
    assert main(["replay", "--example", "gpt2-train", "--config", str(layout)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("cubepool: ") and "layout.json" in err and message in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("bad.txt", "sliced(page=8MiB\n", "expected ',' or ')' after a field"),
        ("bad.toml", '[memory]\npools = "sliced(page=8MiB"\n', "memory.pools: expected ',' or ')'"),
        ("bad.json", '{"layout": "sliced(page=8MiB"}', "expected ',' or ')' after a field"),
        (
            "bad3.json",
            '{"pools": [{"kind": "sliced_pages", "page_size": -1}]}',
            "sliced_pages: needs the field 'max_slice_size' (its fields: page_size,",
        ),
        (
            "bad4.json",
            '{"pools": [{"kind": "sliced_pages", "page_size": -1, "max_slice_size": 4}]}',
            "sliced_pages: page_size must be non-negative, got -1",
        ),
        ("bad5.json", '{"pools": [{"kind": "direct", "x": 1}]}', "direct: unknown field 'x'"),
    ],
)
def test_a_bad_layout_file_is_named_with_its_config(
    tmp_path: Path, name: str, content: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    layout = tmp_path / name
    layout.write_text(content)
    argv = ["compare", "--example", "gpt2-generate", "--config", "compact", "--config"]
    assert main([*argv, str(layout)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"cubepool: --config {layout}: {message}"), err
    assert err.count("\n") == 1 and "Python" not in err and "positional" not in err
    # Python names the file too (a PoolConfigError keeps its kind and position).
    with pytest.raises(ValueError) as info:
        cubepool.layouts.resolve_layout(layout)
    assert str(info.value).startswith(f"{layout}: {message}")
    assert getattr(info.value, "kind", "Syntax") == "Syntax"


def test_bad_layout_text_names_its_config(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["compare", "--example", "gpt2-generate", "--config", "sliced(page=8MiB"]
    with pytest.raises(SystemExit) as exited:
        main(argv)
    # Layout text that is no layout is an argument out of range: a usage error (exit 2).
    assert exited.value.code == 2
    err = capsys.readouterr().err
    prefix = "cubepool compare: error: --config sliced(page=8MiB: expected ',' or ')'"
    assert err.startswith(prefix), err


# --------------------------------------------------------------------------- bounded imports


def test_v1_traces_are_bounded_too(tmp_path: Path) -> None:
    lines = [f'{{"t":{i},"op":"alloc","id":{i},"size":8}}' for i in range(10)]
    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(gzip.compress(("\n".join([HEADER, *lines]) + "\n").encode()))
    with pytest.raises(TraceFormatError, match="more than max_events=5 events") as info:
        cubepool.load_trace(path, max_events=5)
    assert info.value.line == 7 and importers.MAX_EVENTS_ENV in str(info.value)
    with pytest.raises(TraceFormatError, match="more than max_bytes=100 bytes") as info:
        cubepool.load_trace(path, max_bytes=100)
    assert importers.MAX_DOCUMENT_BYTES_ENV in str(info.value)
    assert len(cubepool.load_trace(path, max_events=10)) == 10


def test_profiler_imports_are_bounded_by_memory_events(tmp_path: Path) -> None:
    path = profiler(tmp_path / "p.json", [memory_event(i, 16 + i, 8) for i in range(50)])
    with pytest.raises(TraceFormatError) as info:
        importers.import_trace(path, max_events=10)
    message = str(info.value)
    assert message.startswith(str(path))
    assert "max_events=10 " in message and importers.MAX_EVENTS_ENV in message
    assert len(importers.import_trace(path, max_events=None).events) == 50


def test_profiler_operator_events_cost_nothing_against_the_bound(tmp_path: Path) -> None:
    events = [op_event(i) for i in range(5_000)]
    events += [memory_event(1.0, 16, 8), memory_event(2.0, 16, -8)]
    path = profiler(tmp_path / "ops.json", events)
    imported = importers.import_trace(path, max_events=4)
    assert [e[1] for e in imported.events] == ["alloc", "free"]


def test_gzip_expansion_is_bounded_after_decompression(tmp_path: Path) -> None:
    doc = json.dumps({"traceEvents": [op_event(0)] * 20_000}).encode()
    path = tmp_path / "bomb.json.gz"
    path.write_bytes(gzip.compress(doc, 9))
    assert path.stat().st_size < len(doc) // 50
    with pytest.raises(TraceFormatError, match="larger than max_bytes=100,000 bytes") as info:
        cubepool.load_trace(path, max_bytes=100_000)
    assert importers.MAX_DOCUMENT_BYTES_ENV in str(info.value)


def test_rmm_logs_are_bounded_in_bytes_and_entries(tmp_path: Path) -> None:
    rows = [f"1,{i}.0,allocate,{0x1000 + i},8,0" for i in range(1, 200)]
    path = tmp_path / "log.csv.gz"
    path.write_bytes(
        gzip.compress(("Thread,Time,Action,Pointer,Size,Stream\n" + "\n".join(rows)).encode())
    )
    with pytest.raises(TraceFormatError, match="larger than max_bytes=1,000 bytes"):
        importers.import_trace(path, max_bytes=1_000)
    with pytest.raises(TraceFormatError, match="more than max_events=50 entries"):
        importers.import_trace(path, max_events=50)
    assert len(importers.import_trace(path, max_events=199).events) == 199


def _snapshot(path: Path, device_traces: list[list[dict[str, Any]]]) -> Path:
    path.write_bytes(pickle.dumps({"device_traces": device_traces}, protocol=4))
    return path


def test_snapshots_sharing_a_device_trace_are_refused_at_once(tmp_path: Path) -> None:
    entry = {"action": "alloc", "addr": 16, "size": 8, "stream": 0}
    shared = [entry] * 2_000
    path = _snapshot(tmp_path / "square.pickle", [shared] * 2_000)  # 4 M entries
    assert path.stat().st_size < 16_000
    with pytest.raises(TraceFormatError, match=r"device_traces\[1\] is the same list"):
        cubepool.load_trace(path)


def test_snapshots_sharing_an_entry_are_refused(tmp_path: Path) -> None:
    entry = {"action": "alloc", "addr": 16, "size": 8, "stream": 0}
    path = _snapshot(tmp_path / "flat.pickle", [[entry] * 100_000])
    with pytest.raises(TraceFormatError, match=r"device_traces\[0\]\[1\] is the same dict"):
        importers.list_devices(path)


def test_snapshot_entries_count_against_max_events(tmp_path: Path) -> None:
    entries = [{"action": "alloc", "addr": 16 * i, "size": 8, "stream": 0} for i in range(1, 101)]
    path = _snapshot(tmp_path / "s.pickle", [entries])
    with pytest.raises(TraceFormatError, match=r"more than max_events=99 entries \(it holds 100\)"):
        importers.import_trace(path, max_events=99)
    assert len(importers.import_trace(path, max_events=100).events) == 100


def test_bounds_are_checked(tmp_path: Path) -> None:
    path = rmm(tmp_path / "log.csv", ["1,1.0,allocate,0x10,8,0"])
    with pytest.raises(ValueError, match="max_events must be positive"):
        importers.import_trace(path, max_events=0)
    with pytest.raises(TypeError, match="max_bytes must be an int or None"):
        importers.import_trace(path, max_bytes="1")  # type: ignore[arg-type]


def test_running_out_of_memory_is_a_typed_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = profiler(tmp_path / "p.json", [memory_event(1.0, 16, 8)])

    loads = json.loads

    def exhausted(data: bytes, **hooks: Any) -> object:
        if hooks:  # the document itself, not the format sniffing of its first line
            raise MemoryError
        return loads(data)

    monkeypatch.setattr(importers.profiler.json, "loads", exhausted)
    with pytest.raises(TraceFormatError, match="ran out of memory importing the file") as info:
        importers.import_trace(path)
    assert info.value.path == str(path)


def _import_bounds(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    code = "import cubepool.importers as i; print(i.MAX_EVENTS, i.MAX_DOCUMENT_BYTES)"
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_environment_sets_the_default_bounds() -> None:
    done = _import_bounds(
        {"CUBEPOOL_MAX_IMPORT_EVENTS": "123", "CUBEPOOL_MAX_IMPORT_BYTES": "4_096"}
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["123", "4096"]
    # A bad value does not stop the import of cubepool: the bound keeps its default and
    # every import of a trace refuses, naming the variable (test_face.py has the rest).
    bad = _import_bounds({"CUBEPOOL_MAX_IMPORT_EVENTS": "lots"})
    assert bad.returncode == 0, bad.stderr
    assert bad.stdout.split() == ["4000000", str(1 << 30)]


# --------------------------------------------------------------------------- cache bound


def test_direct_pools_and_persistent_mode_bound_their_caches() -> None:
    """5,000 reserve/drop cycles of random sizes up to 1 MiB: each size is cached once
    and never comes back, so an unbounded cache would keep about 2.5 GiB."""
    rng = random.Random(0)
    sizes = [rng.randint(1, 1 << 20) for _ in range(5_000)]
    direct = cubepool.MemoryManagement(cubepool.MemoryConfiguration.parse("direct()"))
    for size in sizes:
        direct.reserve(size).release()
    persistent = cubepool.MemoryManagement()
    with persistent.persistent():
        for size in sizes:
            persistent.reserve(size).release()
    for mm in (direct, persistent):
        usage = mm.memory_usage()
        assert usage.bytes_in_use == 0
        # At most twice the largest reservation, plus the one just made.
        assert usage.bytes_reserved <= 3 << 20, usage

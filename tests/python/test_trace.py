"""Loading and replaying traces, and the CLI's main job."""

from __future__ import annotations

import gzip
import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

import cubepool
from cubepool.cli import main

# Peak live bytes from the traces' README.
PEAK_LIVE = {
    "gpt2-train": 356_502_840,
    "gpt2-generate": 29_677_568,
    "transformer-train": 575_271_436,
}


def test_examples_are_bundled() -> None:
    assert cubepool.examples.names() == sorted(PEAK_LIVE)
    with pytest.raises(LookupError, match="choose one of"):
        cubepool.examples.path("nope")


@pytest.mark.parametrize("name", sorted(PEAK_LIVE))
def test_replay_reaches_peak_live(name: str) -> None:
    trace = cubepool.load_trace(cubepool.examples.path(name))
    assert trace.peak_live == PEAK_LIVE[name]
    assert trace.workload == name
    result = cubepool.replay(trace)
    assert result.peak_in_use == PEAK_LIVE[name]
    assert result.peak_reserved >= PEAK_LIVE[name]
    assert result.utilization == pytest.approx(PEAK_LIVE[name] / result.peak_reserved)
    assert result.events == len(trace)
    assert result.failed_reserves == 0


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


HEADER = json.dumps({"format": "cubepool-trace", "version": 1, "workload": "tiny"})


def test_load_plain_and_gzip(tmp_path: Path) -> None:
    lines = [
        HEADER,
        '{"t": 0, "op": "alloc", "id": 0, "size": 100}',
        '{"t": 1, "op": "alloc", "id": 1, "size": 50}',
        '{"t": 2, "op": "free", "id": 0}',
    ]
    plain = write(tmp_path / "t.jsonl", lines)
    gz = tmp_path / "t.jsonl.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    for path in (plain, gz):
        trace = cubepool.load_trace(path)
        assert (len(trace), trace.peak_live, trace.allocations) == (3, 150, 2)


def test_a_v1_file_that_starts_with_a_utf8_bom_loads(tmp_path: Path) -> None:
    # Editors on Windows (and PowerShell's Out-File) start UTF-8 text with a BOM; the
    # format is told from the content past it, as profiler traces and RMM logs are read.
    lines = [HEADER, '{"t": 0, "op": "alloc", "id": 0, "size": 100}']
    plain = write(tmp_path / "t.jsonl", lines)
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    gz = tmp_path / "bom.jsonl.gz"
    gz.write_bytes(gzip.compress(bom.read_bytes()))
    for path in (bom, gz):
        assert cubepool.load_trace(path).to_jsonl() == cubepool.load_trace(plain).to_jsonl()
    # Only at the start of the file: a BOM before an event line is no event.
    inner = tmp_path / "inner.jsonl"
    inner.write_bytes(plain.read_bytes().replace(b'{"t"', b'\xef\xbb\xbf{"t"'))
    with pytest.raises(cubepool.TraceFormatError, match="not an event") as raised:
        cubepool.load_trace(inner)
    assert raised.value.line == 2


@pytest.mark.parametrize(
    ("body", "line", "needle"),
    [
        (['{"t": 0, "op": "alloc", "id": 0}'], 2, "without a size"),
        (['{"t": 0, "op": "free", "id": 4}'], 2, "not live"),
        (['{"t": 0, "op": "alloc", "id": 0, "size": 1}', "{oops"], 3, "not an event"),
        (['{"t": 0, "op": "alloc", "id": 0, "size": -3}'], 2, "not an event"),
    ],
)
def test_malformed_lines_name_the_line(
    tmp_path: Path, body: list[str], line: int, needle: str
) -> None:
    path = write(tmp_path / "bad.jsonl", [HEADER, *body])
    with pytest.raises(cubepool.TraceFormatError, match=needle) as info:
        cubepool.load_trace(path)
    assert info.value.line == line
    assert info.value.path == str(path)


def test_bad_header_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(cubepool.TraceFormatError, match="format"):
        cubepool.load_trace(write(tmp_path / "h.jsonl", ['{"format": "other", "version": 1}']))
    with pytest.raises(FileNotFoundError):
        cubepool.load_trace(tmp_path / "missing.jsonl")


def test_replay_with_limit_counts_failures() -> None:
    trace = cubepool.load_trace(cubepool.examples.path("gpt2-train"))
    result = cubepool.replay(trace, limit=64 * 2**20)
    assert result.failed_reserves > 0
    assert result.peak_reserved <= 64 * 2**20


def test_trace_from_events_round_trips() -> None:
    events = [(0, "alloc", 10, 64), (1, "alloc", 11, 32), (2, "free", 10, 0)]
    trace = cubepool.Trace.from_events(events, {"workload": "w"})
    assert trace.events() == [(0, "alloc", 0, 64), (1, "alloc", 1, 32), (2, "free", 0, 0)]
    assert trace.peak_live == 96
    with pytest.raises(cubepool.TraceFormatError, match="not live"):
        cubepool.Trace.from_events([(0, "free", 1, 0)])


def test_times_are_the_events_times_in_order() -> None:
    trace = cubepool.load_trace(cubepool.examples.path("gpt2-train"))
    assert trace.times() == [event[0] for event in trace.events()]
    assert cubepool.Trace.from_events([(5, "alloc", 0, 8), (9, "free", 0, 0)]).times() == [5, 9]
    assert cubepool.Trace.from_events([]).times() == []


def test_a_header_of_megabytes_writes_loads_and_pickles(tmp_path: Path) -> None:
    # A profiler trace of 40,000 steps converts to a header of about 2 MiB of phases,
    # over the 1 MiB an event line may have.
    steps = 40_000
    events = [(t, "alloc", t, 64) for t in range(steps)]
    phases = [{"name": f"ProfilerStep#{t}", "first_event": t} for t in range(steps)]
    trace = cubepool.Trace.from_events(events, {"workload": "steps", "phases": phases})
    path = tmp_path / "steps.jsonl"
    trace.write(path)
    assert len(path.read_bytes().split(b"\n", 1)[0]) > 1 << 20
    for loaded in (cubepool.load_trace(path), pickle.loads(pickle.dumps(trace))):
        assert loaded.events() == trace.events()
        assert len(loaded.phases) == steps
    # A header no reader would read back is refused, and nothing is written.
    huge = cubepool.Trace.from_events(events[:1], {"notes": "n" * (16 << 20)})
    with pytest.raises(OSError, match="no reader would read it back"):
        huge.write(tmp_path / "huge.jsonl")
    assert not (tmp_path / "huge.jsonl").exists()


def test_cli_replay_prints_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--example", "gpt2-train"]) == 0
    out = capsys.readouterr().out
    assert "peak reserved" in out and "utilization" in out and "default" in out
    assert main(["replay", "--example", "gpt2-train", "--preset", "sub_slices"]) == 0
    assert "sub_slices" in capsys.readouterr().out


def test_cli_replay_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--example", "transformer-train", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["peak_in_use"] == PEAK_LIVE["transformer-train"]


def test_cli_reports_errors_without_traceback(tmp_path: Path) -> None:
    bad = write(tmp_path / "bad.jsonl", [HEADER, "{"])
    proc = subprocess.run(
        [sys.executable, "-m", "cubepool.cli", "replay", str(bad)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1
    assert "bad.jsonl:2:" in proc.stderr and "Traceback" not in proc.stderr

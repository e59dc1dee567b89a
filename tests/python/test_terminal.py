"""What the command line prints shows control characters as escapes: names from a trace
(its workload, phases and frames) cannot drive the terminal, nor fill it: a long name is
cut (``cubepool._terminal``)."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from cubepool._terminal import MAX_NAME_CHARS, NAME_TAIL_CHARS, ShownControls, short_name, shown
from cubepool.cli import main

# An OSC that sets the window's title (ended by BEL), a CSI that clears the screen, the
# 8-bit CSI (a C1 control) and DEL.
WORKLOAD = "w\x1b]0;PWNED\x07x"
PHASE = "step\x1b[2J"
FRAME = "grad\x9b31m (evil.py:1)\x7f"


def test_shown_writes_controls_as_escapes_and_keeps_the_rest() -> None:
    assert shown(WORKLOAD) == "w\\x1b]0;PWNED\\x07x"
    assert shown(FRAME) == "grad\\x9b31m (evil.py:1)\\x7f"
    assert shown("a\tb\nc é 😀") == "a\tb\nc é 😀"
    assert shown("50%\r") == "50%\\x0d"
    assert shown("50%\r", carriage_return=True) == "50%\r"


def test_a_shown_stream_counts_what_it_was_given_and_passes_the_rest_on() -> None:
    inner = io.StringIO()
    stream = ShownControls(inner)
    assert stream.write("\x1b[2J") == 4
    stream.flush()
    assert inner.getvalue() == "\\x1b[2J"
    assert stream.isatty() is False
    stream.writelines(["a\x1b[2Jb\n", "\x07"])
    assert inner.getvalue() == "\\x1b[2J" + "a\\x1b[2Jb\n\\x07"


def hostile_trace(tmp_path: Path) -> Path:
    header = {
        "format": "cubepool-trace",
        "version": 1,
        "workload": WORKLOAD,
        "phases": [{"name": PHASE, "first_event": 0, "t": 0}],
    }
    lines = [
        header,
        {"t": 0, "op": "alloc", "id": 0, "size": 1 << 20, "frames": [FRAME]},
        {"t": 1, "op": "alloc", "id": 1, "size": 1 << 21, "frames": [FRAME]},
        {"t": 2, "op": "free", "id": 0},
        {"t": 3, "op": "free", "id": 1},
    ]
    path = tmp_path / "evil.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.mark.parametrize("command", [["report", "--no-plan"], ["replay", "--at-peak"]])
def test_names_from_a_trace_print_without_their_controls(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = hostile_trace(tmp_path)
    code = main([command[0], str(trace), *command[1:]])
    out, err = capsys.readouterr()
    assert code == 0, err
    for text in (out, err):
        assert not any(c in text for c in "\x1b\x07\x9b\x7f"), text
    assert "w\\x1b]0;PWNED\\x07x" in out
    assert "grad\\x9b31m (evil.py:1)" in out


@pytest.mark.parametrize(
    ("command", "status"),
    [
        (["report"], 0),
        (["compare"], 0),
        (["sweep"], 0),
        (["sweep", "--limit", "1KiB"], 3),
        (["plan"], 0),
        (["replay", "--at-peak"], 0),
    ],
)
def test_a_name_from_a_trace_begins_no_line_of_its_own(
    command: list[str], status: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A newline in a workload's, a phase's or a frame's name was printed raw: the name
    # went on on a line of its own, which could pass for the command's own output.
    path = tmp_path / "lines.jsonl"
    header = {
        "format": "cubepool-trace",
        "version": 1,
        "workload": "w\nFORGED: all layouts failed",
        "phases": [
            {"name": f"{name}\tq\nFORGED", "first_event": first, "t": first}
            for name, first in [("setup", 0), ("s0", 2), ("s1", 4)]
        ],
    }
    frames = ["f\nFORGED frame (a.py:1)"]
    events = [
        {"t": t, "op": "alloc", "id": t, "size": (t + 1) << 20, "frames": frames}
        for t in range(0, 6, 2)
    ]
    events = [
        e
        for alloc in events
        for e in (alloc, {"t": alloc["t"] + 1, "op": "free", "id": alloc["id"]})
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in [header, *events]), "utf-8")
    code = main([command[0], str(path), *command[1:]])
    out, err = capsys.readouterr()
    assert code == status, err
    assert "FORGED" in out
    assert not any(line.lstrip().startswith("FORGED") for line in out.splitlines()), out


def test_main_puts_the_streams_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = sys.stdout, sys.stderr
    main(["replay", str(hostile_trace(tmp_path))])
    assert (sys.stdout, sys.stderr) == before
    # A command that writes a file wraps stdout once more, and puts that back too.
    main(["plot", str(hostile_trace(tmp_path)), "--out", str(tmp_path / "mem.svg")])
    assert (sys.stdout, sys.stderr) == before
    with pytest.raises(SystemExit):
        main(["replay", "--no-such-flag"])
    assert (sys.stdout, sys.stderr) == before
    capsys.readouterr()


def test_a_closed_stdout_is_left_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """With stdout closed (``>&-``: Python makes it None) the output goes nowhere and
    the command succeeds, as before the streams were wrapped."""
    monkeypatch.setattr(sys, "stdout", None)
    trace = str(hostile_trace(tmp_path))
    assert main(["replay", trace]) == 0
    assert sys.stdout is None
    # A command that writes a file still writes it (it wrapped None, and failed).
    for command in (["plot", trace], ["report", trace, "--no-plan"]):
        out = tmp_path / f"{command[0]}.svg"
        assert main([*command, "--out", str(out)]) == 0
        assert sys.stdout is None and out.read_text(encoding="utf-8").startswith("<svg")


def cut(c: str) -> str:
    """A name of ``c`` repeated past the bound, as shown."""
    return f"{c * (MAX_NAME_CHARS - NAME_TAIL_CHARS)}...{c * NAME_TAIL_CHARS}"


def test_a_name_is_shown_whole_up_to_the_bound_and_cut_past_it() -> None:
    assert short_name("x" * MAX_NAME_CHARS) == "x" * MAX_NAME_CHARS
    assert short_name("x" * (MAX_NAME_CHARS + 1)) == cut("x")
    # Characters, not bytes nor UTF-16 units, as a trace cuts a frame.
    assert short_name("\U0001f600" * 300) == cut("\U0001f600")
    assert short_name("") == ""
    # Cut in the middle: two long names that differ at their end still differ (paths of
    # two runs, layouts whose last pool differs), where a cut keeping the start showed
    # one name twice.
    a, b = "/data/" + "d" * 300 + "/run_a/t.jsonl", "/data/" + "d" * 300 + "/run_b/t.jsonl"
    assert short_name(a) != short_name(b) and short_name(a).endswith("/run_a/t.jsonl")


def test_long_names_from_a_trace_print_cut(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A workload of 10 MiB and phases of 2 MiB were printed whole: a report wrote a
    # line of 14.7 MB (the trace's) and one of 4 MB (what the plan was derived on), and
    # a page of 36 MB.
    long = 1 << 20
    header = {
        "format": "cubepool-trace",
        "version": 1,
        "workload": "W" * long,
        "phases": [
            {"name": name, "first_event": first, "t": first}
            for name, first in [("setup", 0), ("S" * long, 2), ("T" * long, 4), ("u", 6)]
        ],
    }
    events = [
        e
        for t in range(0, 8, 2)
        for e in (
            {"t": t, "op": "alloc", "id": t, "size": (t + 1) << 20},
            {"t": t + 1, "op": "free", "id": t},
        )
    ]
    path = tmp_path / "long.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in [header, *events]), "utf-8")
    page = tmp_path / "long.html"
    code = main(["report", str(path), "--out", str(page)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert len(out) < 20_000, len(out)
    lines = out.splitlines()
    cuts = [cut(c) for c in "WST"]
    assert lines[0].startswith(f"trace {cuts[0]}: 8 events, 4 allocations")
    assert lines[0].endswith(f"; phases setup, {cuts[1]}, {cuts[2]}, u")
    (derived,) = [line for line in lines if line.startswith("derived on ")]
    assert derived.startswith(f"derived on the setup, {cuts[1]} and {cuts[2]} as recorded")
    assert page.stat().st_size < 200_000
    # sweep's table names each trace by its workload: cut too (a 31 MB table before).
    code = main(["sweep", str(path), "--workers", "1"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert len(out) < 20_000 and f"{cuts[0]} " in out, len(out)


def test_a_carriage_return_in_an_error_shows_as_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """stderr kept carriage returns for the progress bar, so an error quoting a trace's
    text with one (serde's "unknown variant" quotes the op) wrote made-up text over its
    own line, the file's name and the problem hidden behind it (helper-137's find)."""
    spoof = "x\rcubepool: wrote cr.html: memory over time" + " " * 40
    path = tmp_path / "cr.jsonl"
    lines = [
        {"format": "cubepool-trace", "version": 1, "workload": "w"},
        {"t": 0, "op": spoof, "id": 1, "size": 5},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    code = main(["report", str(path), "--out", str(tmp_path / "cr.html")])
    _, err = capsys.readouterr()
    assert code == 1
    assert "\r" not in err
    assert err.startswith(f"cubepool: {path}:2: not an event: unknown variant `x\\x0dcubepool")


def test_the_progress_bar_still_draws_with_carriage_returns(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The bar keeps its carriage returns (on the stream the command's stderr gives it),
    and a plain stderr's text still shows them as escapes."""
    from cubepool._progress import ProgressBar

    inner = io.StringIO()
    err = ShownControls(inner)
    real = sys.stderr
    sys.stderr = err  # type: ignore[assignment]
    try:
        bar = ProgressBar(enabled=True)
        bar(1, 2, "replaying")
        err.write("a\rb")
    finally:
        sys.stderr = real
    text = inner.getvalue()
    assert text.startswith("\rreplaying") and text.endswith("a\\x0db")


def test_the_pages_title_and_heading_show_a_names_controls_as_replacements(
    tmp_path: Path,
) -> None:
    """The interactive page wrote the workload's name into its title and heading with
    its control bytes (an OSC that sets the window's title, a BEL), where its SVG and
    data replaced or escaped them: ``cat mem.html`` ran them (helper-137's find)."""
    import cubepool

    path = hostile_trace(tmp_path)
    # DEL and the 8-bit CSI too, which XML allows (helper-139's find: they stayed).
    path.write_text(path.read_text().replace("PWNED", "PWNED\\u009b2J\\u007f"))
    out = cubepool.plot(str(path), "default", tmp_path / "evil.html")
    page = out.read_text(encoding="utf-8")
    assert not any(c in page for c in "\x1b\x07\x9b\x7f")
    shown = "w\ufffd]0;PWNED\ufffd2J\ufffd\ufffdx"
    assert f"<title>{shown}" in page and f"<h1>{shown}" in page

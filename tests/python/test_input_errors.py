"""Inputs the Python side refuses, or takes, with a message that says what is wrong.

Each test is named for the behaviour it checks: a picture whose writer fails is one line
naming the file and leaves nothing behind; ``describe`` takes what every layout argument
takes; a trace file whose name is not UTF-8 imports; a plan skips (and reports) the
perturbed replicas that make no trace; options are refused at parsing, by their own
names and limits; paths that name no file, a folder or a device are refused as such.
"""

from __future__ import annotations

import errno
import gzip
import io
import json
import os
import pickle
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import cubepool
from cubepool import cli
from cubepool._files import check_output_path
from cubepool.cli import main
from cubepool.importers import limits
from cubepool.layouts import config_from_arg, describe
from cubepool.plot import output_path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``cubepool ARGV``: its exit status, stdout and stderr."""
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The stderr of ``cubepool ARGV``, which must be a usage error (exit status 2)."""
    with pytest.raises(SystemExit) as exited:
        main(list(argv))
    assert exited.value.code == 2
    return capsys.readouterr().err


def small_trace(tmp_path: Path) -> str:
    """A cubepool trace v1 file of two small allocations."""
    events = [(1, "alloc", 0, 4096), (2, "alloc", 1, 1 << 20), (3, "free", 1, 0), (4, "free", 0, 0)]
    path = tmp_path / "small.jsonl"
    cubepool.Trace.from_events(events, {"workload": "small"}).write(str(path))
    return str(path)


def no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make reading a trace in the command line fail the test: what is checked must be
    checked before any work."""

    def load(args: Any) -> Any:
        raise AssertionError("the trace was read before the arguments were checked")

    monkeypatch.setattr(cli, "_load", load)


# --------------------------------------------------------------------------- pictures


def test_pgf_without_latex_is_one_line_naming_the_file_before_any_work(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("matplotlib")
    trace = small_trace(tmp_path)
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # no xelatex, wherever the tests run
    no_work(monkeypatch)
    out = tmp_path / "mem.pgf"
    for command in ("plot", "report"):
        code, _, err = run(capsys, command, trace, "--out", str(out))
        assert code == 1, command
        assert err.startswith(f"cubepool: {out}: writing .pgf needs LaTeX") and err.count("\n") == 1
        assert "xelatex" in err
    assert sorted(os.listdir(tmp_path)) == ["bin", "small.jsonl"]


def test_a_failing_matplotlib_save_is_one_line_naming_the_file_and_leaves_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    def fail(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("'xelatex' not found; install it\nand a second line")

    monkeypatch.setattr(Figure, "savefig", fail)
    trace = small_trace(tmp_path)
    out = tmp_path / "mem.png"
    code, _, err = run(capsys, "plot", trace, "--out", str(out))
    assert code == 1
    assert (
        err
        == f"cubepool: {out}: matplotlib could not write .png: 'xelatex' not found; install it\n"
    )
    # Neither the picture nor its temporary.
    assert os.listdir(tmp_path) == ["small.jsonl"]
    with pytest.raises(OSError, match=r"mem\.png: matplotlib could not write \.png") as raised:
        cubepool.plot(trace, "default", out)
    assert isinstance(raised.value.__cause__, OSError)
    assert isinstance(raised.value.__cause__.__cause__, RuntimeError)


def test_a_name_that_is_a_form_suffix_alone_is_not_given_another(tmp_path: Path) -> None:
    assert output_path(tmp_path / ".html") == tmp_path / ".html"
    assert output_path(tmp_path / ".SVG") == tmp_path / ".SVG"
    assert output_path(tmp_path / "mem") == tmp_path / "mem.html"
    written = cubepool.plot(small_trace(tmp_path), "default", tmp_path / ".svg")
    assert written == tmp_path / ".svg"
    assert written.read_text(encoding="utf-8").startswith("<svg")


def test_a_name_ending_in_a_dot_gets_html_after_that_dot(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``x.`` is a name whose suffix was begun and left empty: it becomes ``x.html``,
    not ``x..html``, in plot() and in both commands that draw (they share output_path)."""
    assert output_path(tmp_path / "mem.") == tmp_path / "mem.html"
    assert output_path(str(tmp_path / "mem.")) == tmp_path / "mem.html"
    trace = small_trace(tmp_path)
    assert cubepool.plot(trace, "default", tmp_path / "p.") == tmp_path / "p.html"
    code, out, _ = run(capsys, "plot", trace, "--out", str(tmp_path / "x."))
    assert code == 0 and out.strip() == f"wrote {tmp_path / 'x.html'}"
    code, _, _ = run(capsys, "report", trace, "--no-plan", "--out", str(tmp_path / "r."))
    assert code == 0
    assert sorted(os.listdir(tmp_path)) == ["p.html", "r.html", "small.jsonl", "x.html"]


def test_a_picture_is_not_written_over_a_fifo_nor_beside_it_with_a_suffix(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = small_trace(tmp_path)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    no_work(monkeypatch)
    code, _, err = run(capsys, "plot", trace, "--out", str(fifo))
    assert code == 1 and err == f"cubepool: {fifo}: a FIFO, not a regular file\n"
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert not (tmp_path / "pipe.html").exists()


def test_check_output_path_refuses_an_empty_path_and_a_device(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="an empty path names no file"):
        check_output_path("")
    with pytest.raises(FileNotFoundError, match="an empty path names no file"):
        cubepool.plot(small_trace(tmp_path), "default", "")
    with pytest.raises(OSError, match="a character device, not a regular file") as raised:
        check_output_path(os.devnull)
    assert raised.value.errno == errno.EINVAL and raised.value.filename == os.devnull
    fifo = tmp_path / "plan.json"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="a FIFO, not a regular file"):
        check_output_path(fifo)


@pytest.mark.parametrize(
    ("command", "option"),
    [("plot", "--out"), ("report", "--out"), ("place", "--out"), ("plan", "--save")],
)
def test_an_empty_output_path_is_refused_naming_the_option(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str, option: str
) -> None:
    source = small_trace(tmp_path)
    if command == "place":
        source = str(tmp_path / "buffers.csv")
        Path(source).write_text("id,lower,upper,size\n0,0,2,64\n", encoding="utf-8")
    err = usage_error(capsys, command, source, option, "")
    assert f"argument {option}: an empty path names no file to write" in err


# --------------------------------------------------------------------------- layouts


def test_describe_takes_what_every_layout_argument_takes(tmp_path: Path) -> None:
    assert describe("sub_slices") == describe(cubepool.MemoryConfiguration.sub_slices())
    assert describe("sub_slices") == "SubSlices"
    assert describe("compact") == describe(cubepool.MemoryConfiguration.compact())
    assert describe("torch_expandable").endswith("(expandable segments)")
    text = "sliced(page=8MiB, max_slice=1MiB); exclusive(max_alloc=1TiB)"
    file = tmp_path / "layout.pools"
    file.write_text(text, encoding="utf-8")
    parsed = cubepool.MemoryConfiguration.parse(text)
    assert describe(text) == describe(str(file)) == describe(file) == describe(parsed)
    assert cubepool.describe("exclusive-pages") == "ExclusivePages"


@pytest.mark.parametrize("value", [None, 3, 1.5])
def test_describe_refuses_what_is_no_layout_naming_its_argument(value: object) -> None:
    with pytest.raises(TypeError, match=f"describe's config: .*got {type(value).__name__}"):
        describe(value)


def test_describe_of_an_unknown_name_says_what_a_layout_is() -> None:
    with pytest.raises(cubepool.InvalidArgument, match="unknown layout 'no_such_preset'"):
        describe("no_such_preset")


@pytest.mark.parametrize(
    ("name", "body", "message"),
    [
        # Read by the automatic search's TOML reader, whose recursion is bounded.
        ("deep.toml", "a = " + "[" * 100_000 + "]" * 100_000 + "\n", "max recursion depth"),
        ("deep_tables.toml", "a = " + "{b=" * 50_000 + "1" + "}" * 50_000 + "\n", "recursion"),
        # A dotted key of 40,000 parts took Python's tomllib 40 s and 6.3 GB (helper-145).
        ("dotted.toml", ".".join(["a"] * 40_000) + " = 1\n", "recursion"),
        # Past Python's int-from-string limit of 4,300 digits: a ValueError of json's.
        ("huge.json", '{"layout": ' + "1" * 5000 + "}", "not a JSON layout: Exceeds the limit"),
        ("huge.toml", "a = " + "1" * 5000 + "\n", "not valid TOML: integer number overflowed"),
    ],
)
def test_a_layout_file_too_deep_or_too_long_to_parse_is_refused_by_name(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str, body: str, message: str
) -> None:
    path = tmp_path / name
    path.write_text(body)
    # A JSON layout's is InvalidArgument; a TOML file's, the configuration reader's.
    expected = cubepool.PoolConfigError if name.endswith(".toml") else cubepool.InvalidArgument
    with pytest.raises(expected, match=message):
        config_from_arg(str(path))
    code, _, err = run(capsys, "replay", "--example", "gpt2-generate", "--config", str(path))
    assert code == 1 and "Traceback" not in err and message.split(": ")[-1] in err


def test_a_layout_file_over_a_mebibyte_that_is_no_plan_says_it_is_too_large(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A layout file over 1 MiB is read only as a plan file; one that cannot be a plan
    (no JSON object) is refused for its size, where the plan reader said it did not
    parse as a plan (helper-132's find); one that starts as a plan is still read as
    one."""
    text = tmp_path / "big.txt"
    text.write_text("virtual(granule=2MiB)\n" + "#" * (2 << 20) + "\n")
    message = "larger than 1048576 bytes, too large for a layout file"
    with pytest.raises(cubepool.InvalidArgument, match=message):
        config_from_arg(str(text))
    code, _, err = run(capsys, "replay", "--example", "gpt2-generate", "--config", str(text))
    assert code == 1 and err == (
        f"cubepool: --config {text}: {message} (a larger one is read only as a plan file, "
        "which is a JSON object, and this one does not start with '{')\n"
    )
    plan = tmp_path / "big.json"
    plan.write_text("  {" + " " * (2 << 20) + "}")
    code, _, err = run(capsys, "replay", "--example", "gpt2-generate", "--config", str(plan))
    assert code == 1 and "is not a plan" in err and message not in err


_KNOWN_FIELDS = "(a JSON layout has one of the fields layout, preset, model, pools)"


@pytest.mark.parametrize(
    ("body", "unknown"),
    [
        ('{"layout": "compact", "pool": "direct()"}', "pool"),
        ('{"layuot": "compact"}', "layuot"),
        ('{"preset": "compact", "comment": "mine"}', "comment"),
        ('{"pools": [{"kind": "direct"}], "dealloc_period": 5}', "dealloc_period"),
    ],
)
def test_a_json_layout_with_an_unknown_field_is_refused_naming_it_and_the_known_ones(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    body: str,
    unknown: str,
) -> None:
    # The field was passed over unsaid: the layout read was not the one meant.
    trace = small_trace(tmp_path)
    file = tmp_path / "layout.json"
    file.write_text(body, encoding="utf-8")
    with pytest.raises(cubepool.InvalidArgument) as raised:
        config_from_arg(str(file))
    assert str(raised.value) == f"{file}: unknown field {unknown!r} {_KNOWN_FIELDS}"
    no_work(monkeypatch)
    # A --config file's content is an input's error (exit 1); its JSON given as the value
    # itself, an argument out of range (a usage error, exit 2).
    code, _, err = run(capsys, "replay", trace, "--config", str(file))
    assert (code, err) == (
        1,
        f"cubepool: --config {file}: unknown field {unknown!r} {_KNOWN_FIELDS}\n",
    )
    err = usage_error(capsys, "replay", trace, "--config", body)
    assert f"error: --config {body}: unknown field {unknown!r} {_KNOWN_FIELDS}\n" in err


def test_a_json_layout_of_two_forms_at_once_is_refused() -> None:
    # {"layout": ..., "preset": ...} was read as its layout, the preset passed over.
    with pytest.raises(cubepool.InvalidArgument) as raised:
        config_from_arg('{"layout": "compact", "preset": "sub_slices"}')
    assert str(raised.value).endswith(
        "a JSON layout has one of the fields layout, preset, model, pools, not layout and preset"
    )


@pytest.mark.parametrize(
    "spec",
    [
        {"layout": "sliced(page=8MiB, max_slice=4MiB); exclusive(max_alloc=1TiB)"},
        {"layout": "torch_expandable(max_split_size_mb=128)"},
        {"preset": "sub_slices"},
        {"model": "torch"},
        {"pools": [{"kind": "direct", "reclaim_at": 1024, "dealloc_period": 5}]},
        [{"kind": "exclusive_pages", "max_alloc_size": 1 << 30}],
    ],
    ids=["layout", "layout-model", "preset", "model", "pools", "list"],
)
def test_every_documented_json_layout_form_still_loads_from_a_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, spec: Any
) -> None:
    # README: {"layout": text}, and the forms of earlier versions' --save files.
    file = tmp_path / "layout.json"
    file.write_text(json.dumps(spec), encoding="utf-8")
    assert config_from_arg(str(file))[0] == "layout.json"
    code, out, _ = run(capsys, "replay", small_trace(tmp_path), "--config", str(file))
    assert code == 0 and "layout layout.json (from --config)" in out


def test_a_layout_path_naming_a_directory_or_a_device_says_so(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "layouts"
    folder.mkdir()
    with pytest.raises(IsADirectoryError, match="a directory, not a layout file"):
        config_from_arg(str(folder))
    with pytest.raises(IsADirectoryError, match="a directory, not a layout file"):
        cubepool.MemoryManagement(str(folder))
    with pytest.raises(OSError, match="a character device, not a regular file") as raised:
        config_from_arg(os.devnull)
    assert raised.value.errno == errno.EINVAL
    fifo = tmp_path / "layout.json"
    os.mkfifo(fifo)  # never opened: reading it would block
    with pytest.raises(OSError, match="a FIFO, not a regular file"):
        config_from_arg(str(fifo))
    trace = small_trace(tmp_path)
    no_work(monkeypatch)
    code, _, err = run(capsys, "replay", trace, "--config", str(folder))
    assert code == 1 and err == f"cubepool: --config {folder}: a directory, not a layout file\n"
    code, _, err = run(capsys, "compare", trace, "--config", os.devnull)
    assert (
        code == 1
        and err == f"cubepool: --config {os.devnull}: a character device, not a regular file\n"
    )
    # A bare word naming a folder is not read as one, but the error says what it names.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(cubepool.InvalidArgument, match="layouts is a directory, not a layout"):
        cubepool.MemoryManagement("layouts")


# --------------------------------------------------------------------------- imports


def test_a_snapshot_whose_file_name_is_not_utf8_imports(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    entries = [
        {"action": "alloc", "addr": 1 << 32, "size": 512, "stream": 0, "time_us": 1},
        {"action": "free_completed", "addr": 1 << 32, "size": 512, "stream": 0, "time_us": 2},
    ]
    doc = {"segments": [], "device_traces": [entries]}
    path = tmp_path / os.fsdecode(b"\xff.pickle")
    path.write_bytes(pickle.dumps(doc, protocol=4))
    trace = cubepool.load_trace(path)
    assert trace.workload == "\ufffd" and trace.allocations == 1
    # The header is valid text: the trace goes to v1 and back.
    assert cubepool.Trace.from_jsonl(trace.to_jsonl()).workload == "\ufffd"
    code, out, err = run(capsys, "replay", str(path))
    assert code == 0 and out.startswith("trace \ufffd: 2 events")
    assert "\udcff" not in out + err


def test_an_import_bound_too_large_says_so_and_names_the_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(limits, "ENVIRONMENT_ERRORS", [])
    monkeypatch.setenv("CUBEPOOL_MAX_IMPORT_BYTES", "99999999999999999999")
    assert limits._limit_from_env("CUBEPOOL_MAX_IMPORT_BYTES", 1 << 30) == 1 << 30
    monkeypatch.setenv("CUBEPOOL_MAX_IMPORT_EVENTS", "9" * 5000)
    assert limits._limit_from_env("CUBEPOOL_MAX_IMPORT_EVENTS", 10) == 10
    monkeypatch.setenv("CUBEPOOL_MAX_IMPORT_EVENTS", "0")
    assert limits._limit_from_env("CUBEPOOL_MAX_IMPORT_EVENTS", 10) == 10
    bytes_error, events_error, zero_error = limits.ENVIRONMENT_ERRORS
    assert bytes_error == (
        "CUBEPOOL_MAX_IMPORT_BYTES='99999999999999999999' is too large: the bound is at "
        "most 999,999,999,999,999,999 (unset it for the default, 1,073,741,824)"
    )
    assert "is too large: the bound is at most 999,999,999,999,999,999" in events_error
    assert "'0' is not a positive integer" in zero_error
    with pytest.raises(cubepool.InvalidArgument, match=r"CUBEPOOL_MAX_IMPORT_BYTES=.* too large"):
        limits.check_environment()
    # The limit itself is taken.
    monkeypatch.setattr(limits, "ENVIRONMENT_ERRORS", [])
    monkeypatch.setenv("CUBEPOOL_MAX_IMPORT_EVENTS", f"{limits.LARGEST_BOUND}")
    assert limits._limit_from_env("CUBEPOOL_MAX_IMPORT_EVENTS", 10) == limits.LARGEST_BOUND
    assert limits.ENVIRONMENT_ERRORS == []


# --------------------------------------------------------------------------- plans


def test_a_plan_skips_replicas_that_make_no_trace_and_says_how_many_and_why(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Valid (peak live 2**63), but a replica that moves the second allocation before
    # the first's free, or twins one, holds 2**64 bytes live: no trace.
    half = 1 << 63
    events = [(0, "alloc", 0, half), (1, "free", 0, 0), (2, "alloc", 1, half), (3, "free", 1, 0)]
    trace = cubepool.Trace.from_events(events, {"workload": "seqbig"})
    planned = cubepool.plan(trace, workers=1)
    assert planned.replicas == 5
    assert 1 <= len(planned.skipped_replicas) < planned.replicas
    for replica, why in planned.skipped_replicas:
        assert replica.startswith("events moved up to ")
        assert why.startswith("the variant is not a valid trace: live bytes overflow 64 bits")
    # A twin of an allocation live at the peak makes 2**64 bytes live: every twinned
    # replica is skipped; with its seed, the one moving events up to 4 places is not.
    skipped = [replica for replica, _ in planned.skipped_replicas]
    assert any("3 % more bytes" in replica for replica in skipped)
    assert not any(replica.startswith("events moved up to 4 places") for replica in skipped)
    note = next(note for note in planned.notes() if "could not be built" in note)
    count = len(planned.skipped_replicas)
    assert note.startswith(f"{count} of 5 perturbed replicas could not be built")
    assert f"derivation trace and {5 - count} other replica" in note
    data = planned.to_dict()
    assert data["replicas"] == 5 and len(data["skipped_replicas"]) == count
    # The sizes add up past 2**64: no static placement, and the plan says why.
    assert planned.static is None and "2^64" in planned.static_skipped
    assert "static placement of the whole trace: not made" in planned.summary()
    path = tmp_path / "seqbig.jsonl"
    trace.write(str(path))
    code, out, _ = run(capsys, "plan", str(path))
    assert code == cli.INCOMPLETE  # 2**63 bytes is too big for every pool
    assert "could not be built" in out


def test_plan_refuses_a_budget_past_64_bits_by_its_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"max_storage_allocations must be at most .*65-bit"):
        cubepool.plan(small_trace(tmp_path), max_storage_allocations=1 << 64)


@pytest.mark.parametrize(
    ("argv", "option", "shown"),
    [
        (["plan", "--max-storage-allocations", "9" * 23], "--max-storage-allocations", "9" * 23),
        (["replay", "--at-peak", "--top", str(1 << 64)], "--top", str(1 << 64)),
        (["sweep", "--workers", "9" * 5000], "--workers", "a 5,000-digit number"),
    ],
)
def test_count_options_are_refused_at_parsing_by_their_name_and_limit(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    option: str,
    shown: str,
) -> None:
    no_work(monkeypatch)
    command, *flags = argv
    err = usage_error(capsys, command, small_trace(tmp_path), *flags)
    if shown.isdigit():
        shown = f"{int(shown):,}"
    assert (
        f"argument {option}: must be at most 18,446,744,073,709,551,615 (64 bits), not {shown}\n"
        in err
    )


# --------------------------------------------------------------------------- compare


@pytest.mark.parametrize("objective", ["storage_alocations", "bytes", ""])
def test_compare_refuses_an_unknown_objective_by_its_name(objective: str) -> None:
    # A typo ranked by reserved bytes and put the typo in the result's objective.
    trace = cubepool.Trace.from_events([(0, "alloc", 0, 1024), (1, "free", 0)])
    with pytest.raises(cubepool.InvalidArgument, match=f"objective must be .*{objective!r}"):
        cubepool.compare(trace, objective=objective)  # type: ignore[arg-type]


def test_compare_of_no_layout_is_an_invalid_argument() -> None:
    trace = cubepool.Trace.from_events([])
    with pytest.raises(cubepool.InvalidArgument, match="at least one layout"):
        cubepool.compare(trace, [])


# --------------------------------------------------------------------------- convert, sweep


def test_convert_refuses_an_upper_case_gz_it_would_not_compress(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    trace = small_trace(tmp_path)
    for name in ("o.jsonl.GZ", "o.JSONL.Gz"):
        err = usage_error(capsys, "convert", trace, str(tmp_path / name))
        assert "write the suffix .gz in lower case" in err
        assert not (tmp_path / name).exists()
    # A lower-case .gz is compressed, whatever the case before it.
    out = tmp_path / "o.JSONL.gz"
    code, _, _ = run(capsys, "convert", trace, str(out))
    assert code == 0 and gzip.decompress(out.read_bytes()).startswith(b"{")


def test_sweep_says_device_and_stream_change_nothing_for_v1_files(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    trace = small_trace(tmp_path)
    argv = ["sweep", trace, "--config", "default", "--workers", "1", "--no-progress"]
    code, _, err = run(capsys, *argv, "--stream", "5")
    assert code == 0
    assert "--device and --stream pick what to import" in err and "change nothing" in err
    code, _, err = run(capsys, *argv)
    assert code == 0 and "--stream" not in err


@pytest.mark.parametrize("workers", [1.5, True, "2"])
def test_sweep_refuses_max_workers_that_is_no_int(tmp_path: Path, workers: Any) -> None:
    with pytest.raises(
        TypeError, match=f"max_workers must be an int or None, got {type(workers).__name__}"
    ):
        cubepool.sweep(small_trace(tmp_path), "default", max_workers=workers)


# --------------------------------------------------------------------------- read errors

# A file that opens but whose read fails (EIO): reading /proc/self/mem from its start.
_UNREADABLE = "/proc/self/mem"


@pytest.mark.skipif(not os.path.exists(_UNREADABLE), reason="needs Linux's /proc/self/mem")
@pytest.mark.parametrize(
    "argv",
    [
        ["replay", _UNREADABLE],
        ["convert", _UNREADABLE, "OUT.jsonl"],
        ["sweep", _UNREADABLE, "--workers", "1", "--no-progress"],
        ["place", _UNREADABLE, "--out", "OUT.csv"],
        ["compare", "--example", "gpt2-train", "--config", _UNREADABLE],
    ],
)
def test_a_file_whose_read_fails_is_named_in_the_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str]
) -> None:
    argv = [a.replace("OUT", str(tmp_path / "out")) for a in argv]
    code, _, err = run(capsys, *argv)
    assert code == 1
    flag = "--config " if "--config" in argv else ""  # a --config value is named as one
    assert err == f"cubepool: {flag}{_UNREADABLE}: Input/output error\n"


@pytest.mark.skipif(not os.path.exists(_UNREADABLE), reason="needs Linux's /proc/self/mem")
def test_load_trace_names_a_file_whose_read_fails() -> None:
    with pytest.raises(OSError) as raised:
        cubepool.load_trace(_UNREADABLE)
    assert raised.value.errno == errno.EIO
    assert raised.value.filename == _UNREADABLE


# --------------------------------------------------------------------------- device flags


@pytest.mark.parametrize(
    "argv",
    [
        ["replay", "--config", "torch"],
        ["compare", "--config", "torch", "--config", "torch_expandable"],
        ["plot", "--config", "torch", "--out", "OUT.html"],
        ["sweep", "--config", "torch", "--workers", "1", "--no-progress"],
    ],
)
def test_device_flags_that_no_layout_takes_are_not_ignored_unsaid(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str]
) -> None:
    # The models of PyTorch's caching allocator have no pages or alignment to take
    # from the device: with no pool layout beside them the flags change nothing.
    trace = small_trace(tmp_path)
    argv = [a.replace("OUT", str(tmp_path / "out")) for a in argv]
    argv.insert(1, trace)
    code, _, quiet = run(capsys, *argv)
    assert code == 0 and "change nothing" not in quiet
    code, _, err = run(capsys, *argv, "--max-page-size", "1GiB", "--alignment", "4KiB")
    assert code == 0
    assert "--max-page-size and --alignment" in err and "change nothing" in err
    # Beside a pool layout they shape it, and nothing is said.
    if argv[0] != "replay":
        code, _, err = run(capsys, *argv, "--config", "compact", "--max-page-size", "1GiB")
        assert code == 0 and "change nothing" not in err


# --------------------------------------------------------------------------- long names


@pytest.mark.parametrize(
    ("argv", "suffix"),
    [
        (["place", "CSV", "--out", "OUT"], ".csv"),  # written from Python
        (["convert", "TRACE", "OUT"], ".jsonl"),  # written from Rust
        (["plan", "TRACE", "--no-progress", "--candidates", "few", "--save", "OUT"], ".json"),
    ],
)
def test_an_output_of_a_long_legal_name_is_written(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str], suffix: str
) -> None:
    # A name of 250 bytes is legal (255 is the most), but its temporary, the name with
    # a dot before it and the pid, count, host and .tmp after it, was not: the write
    # failed with "File name too long", after the work.
    out = tmp_path / ("b" * (250 - len(suffix)) + suffix)
    csv = tmp_path / "in.csv"
    csv.write_text("id,lower,upper,size\n0,0,1,10\n")
    values = {"CSV": str(csv), "TRACE": small_trace(tmp_path), "OUT": str(out)}
    code, _, err = run(capsys, *[values.get(a, a) for a in argv])
    assert code == 0, err
    assert out.is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_a_device_flag_not_given_is_named_as_the_default_not_blamed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--max-page-size 1`` alone was refused as "--alignment (64 B) is larger than
    --max-page-size (1 B)", blaming a flag the user never gave."""
    err = usage_error(capsys, "replay", "--example", "gpt2-train", "--max-page-size", "1")
    assert "--alignment (64 B, the default) is larger than --max-page-size (1 B)" in err
    err = usage_error(
        capsys,
        "replay",
        "--example",
        "gpt2-train",
        "--max-page-size",
        "1MiB",
        "--alignment",
        "1GiB",
    )
    assert "--alignment (1 GiB) is larger than --max-page-size (1 MiB)" in err


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("unbuffered", ["", "1"])
@pytest.mark.parametrize("flag", ["--help", "--version"])
def test_help_that_cannot_be_written_fails_saying_so(flag: str, unbuffered: str) -> None:
    """``cubepool --help > /dev/full`` exited 0 unsaid: argparse drops the error of its
    write (unbuffered stdout) or exits before the flush that would fail (buffered)."""
    env = {**os.environ, "PYTHONUNBUFFERED": unbuffered}
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "cubepool.cli", flag],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )
    assert (
        done.returncode == 1
        and done.stderr == "cubepool: writing the output (stdout): No space left on device\n"
    )
    # A reader that stops early (`| head -1`) is no error.
    reader = subprocess.Popen(
        [sys.executable, "-m", "cubepool.cli", flag],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert reader.stdout is not None and reader.stderr is not None
    reader.stdout.close()
    with reader.stderr:
        assert reader.wait(60) == 0 and reader.stderr.read() == b""


def test_a_bytes_path_loads_a_trace_as_open_takes_it(tmp_path: Path) -> None:
    """``load_trace(b"path")`` raised an internal ``TypeError`` ("startswith first arg
    must be bytes"): a bytes path is decoded as ``open()`` decodes it."""
    source = Path(cubepool.examples.path("gpt2-train"))
    assert len(cubepool.load_trace(os.fsencode(source))) == len(cubepool.load_trace(source))
    with pytest.raises(FileNotFoundError, match="no such trace file"):
        cubepool.load_trace(os.fsencode(tmp_path / "missing.jsonl"))


@pytest.mark.parametrize(
    "call",
    [
        lambda trace: cubepool.plot(trace, [], "never.html"),
        lambda trace: cubepool.plan(trace, workers=0),
        lambda trace: cubepool.plan(trace, call_cost=-1),
        lambda trace: cubepool.plan(trace, static_time_limit=0),
    ],
)
def test_a_wrong_argument_is_a_cubepool_error(call: Any) -> None:
    """_errors.py says every error cubepool raises on purpose is a CubepoolError; these
    raised a plain ValueError. They are InvalidArgument now, a ValueError still."""
    trace = cubepool.load_trace(cubepool.examples.path("gpt2-generate"))
    with pytest.raises(cubepool.InvalidArgument):
        call(trace)


_SEQUENCE_ARGUMENTS = """
import collections.abc
import cubepool
from cubepool import _cubepool as C

trace = cubepool.Trace.from_events([(0, "alloc", 0, 10), (1, "free", 0)])
config = cubepool.MemoryConfiguration.compact()


class Liar(collections.abc.Sequence):
    # Says it holds 2**40 items; holds two.
    def __len__(self):
        return 2**40

    def __getitem__(self, index):
        if index >= 2:
            raise IndexError(index)
        return 1


calls = {
    "draws": lambda s: trace.reordered(0, 1.0, s),
    "state": lambda s: trace.reordered_from_state(0, 1.0, s),
    "groups": lambda s: trace.range_live_peaks(s),
    "groups[0]": lambda s: trace.range_live_peaks([s]),
    "sizes": lambda s: C.replay_until(trace, config, sizes=s),
    "size_ranges": lambda s: C.replay_until(trace, config, size_ranges=s),
    "sizes ": lambda s: C.pool_routes(config, s),
    "frames": lambda s: cubepool.TraceBuilder().alloc(0, 0, 10, s),
}
for name, call in calls.items():
    for argument in (range(2**60), range(2**64), Liar()):
        try:
            call(argument)
        except MemoryError as exc:
            assert str(exc).startswith(name.strip() + " has more items than memory holds"), exc
        else:
            raise AssertionError(name)
print("refused", len(calls) * 3)
"""


def test_a_sequence_argument_longer_than_memory_is_a_memory_error_not_an_abort() -> None:
    # PyO3's own Vec extraction reserved len() items up front, infallibly: range(2**60),
    # or a __len__ that lies, aborted the interpreter (SIGABRT) or raised a
    # PanicException. range(2**64) has no len() (OverflowError): it was read item by
    # item until memory ran out. In a child process, so that a regression fails this test alone.
    child = subprocess.run(
        [sys.executable, "-c", _SEQUENCE_ARGUMENTS], capture_output=True, text=True, check=False
    )
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "refused 24"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda t: t.reordered(0, 1.0, [0.5, "x"]), r"draws\[1\] must be a float, got str"),
        (lambda t: t.range_live_peaks([[(1, 2, 3)]]), r"groups\[0\]\[0\] must be a \(low, high\)"),
        (lambda t: t.range_live_peaks([[(1, -2)]]), r"groups\[0\]\[0\]\[1\] must be non-negative"),
        (lambda t: cubepool.TraceBuilder().alloc(0, 0, 10, ["f", 3]), r"frames\[1\] must be a str"),
        (lambda t: cubepool.TraceBuilder().alloc(-1, 0, 10), r"^t must be non-negative"),
        (lambda t: cubepool.TraceBuilder().alloc(0, 2**64, 10), r"^id is too large"),
        (lambda t: cubepool.TraceBuilder().free(0, -1), r"^id must be non-negative"),
    ],
)
def test_an_item_of_a_sequence_argument_is_named_by_its_place(call: Any, message: str) -> None:
    trace = cubepool.Trace.from_events([(0, "alloc", 0, 10), (1, "free", 0)])
    with pytest.raises((TypeError, ValueError), match=message):
        call(trace)


def test_ctrl_c_is_one_line_and_the_status_of_sigint(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # It printed a traceback of 13 to 70 lines.
    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.importers, "check_environment", interrupted)
    code, out, err = run(capsys, "replay", "--example", "gpt2-generate")
    assert (code, out, err) == (130, "", "cubepool: interrupted\n")


def _shell(command: str) -> subprocess.CompletedProcess[str]:
    """``command`` run by the shell (for its redirections), its output captured."""
    return subprocess.run(command, shell=True, capture_output=True, text=True, check=False)


def test_help_stdout_closed_and_plan_or_json_with_stderr_closed_still_work() -> None:
    # --help with stdout closed ended in AttributeError ('NoneType' object has no
    # attribute 'flush'); a plan with --progress and stderr closed exited 1 with nothing
    # on stdout, the bar writing to None.
    helped = _shell("exec cubepool --help >&-")
    assert helped.returncode == 0 and "Traceback" not in helped.stderr, helped.stderr
    planned = _shell("exec cubepool plan --example gpt2-generate --progress --candidates few 2>&-")
    assert planned.returncode == 0 and "plan" in planned.stdout.lower(), planned.stdout
    # With stderr closed, --lenient's note went to stdout, into --json's document.
    replayed = _shell("exec cubepool replay --example gpt2-generate --json --lenient 2>&-")
    assert replayed.returncode == 0
    assert isinstance(json.loads(replayed.stdout), (dict, list))


def test_a_progress_bar_that_cannot_be_drawn_stops_and_the_run_goes_on() -> None:
    from cubepool._progress import ProgressBar

    class Full:
        def write(self, text: str) -> int:
            raise OSError(28, "No space left on device")

        def flush(self) -> None:
            pass

        def isatty(self) -> bool:
            return True

    bar = ProgressBar(True, Full())  # type: ignore[arg-type]
    bar(1, 2, "replays")
    assert not bar.enabled


@pytest.mark.parametrize(
    "command",
    [
        ["replay", "{fifo}"],
        ["convert", "{fifo}", "{dir}/out.jsonl"],
        ["place", "{fifo}", "--out", "{dir}/out.csv"],
        ["replay", "--example", "gpt2-generate", "--config", "planned(file={fifo})"],
        # Every other command that reads a trace, and every --config file.
        ["compare", "{fifo}"],
        ["plan", "{fifo}", "--no-progress"],
        ["plot", "{fifo}", "--out", "{dir}/m.html"],
        ["report", "{fifo}", "--no-plan", "--out", "{dir}/m.html"],
        ["sweep", "{fifo}", "--workers", "1", "--no-progress"],
        ["replay", "--example", "gpt2-generate", "--config", "{fifo}"],
        ["compare", "--example", "gpt2-generate", "--config", "{fifo}"],
        ["plan", "--example", "gpt2-generate", "--no-progress", "--config", "{fifo}"],
        ["plot", "--example", "gpt2-generate", "--config", "{fifo}", "--out", "{dir}/m.html"],
        ["report", "--example", "gpt2-generate", "--config", "{fifo}", "--out", "{dir}/m.html"],
        ["sweep", "gpt2-generate", "--config", "{fifo}", "--workers", "1", "--no-progress"],
        # The cubepool.toml the default layout is looked up in.
        ["replay", "--example", "gpt2-generate", "{toml}"],
    ],
)
def test_a_fifo_as_an_input_is_refused_not_waited_on(tmp_path: Path, command: list[str]) -> None:
    # Opening a FIFO to read blocks until a writer comes: each of these waited forever.
    fifo = tmp_path / "in"
    os.mkfifo(fifo)
    argv = [part.format(fifo=fifo, dir=tmp_path, toml="") for part in command]
    if "{toml}" in command:
        os.mkfifo(tmp_path / "cubepool.toml")
        argv = argv[:-1]
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from cubepool.cli import main; sys.exit(main())",
            *argv,
        ],
        capture_output=True,
        text=True,
        timeout=60,  # what waited on the FIFO fails here, not hangs the suite
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 1, done.stderr
    assert "a FIFO, not a regular file" in done.stderr and "Traceback" not in done.stderr
    named = tmp_path / "cubepool.toml" if "{toml}" in command else fifo
    assert str(named) in done.stderr, done.stderr


@pytest.mark.parametrize(
    "command",
    [
        ["replay", "{file}"],
        ["convert", "{file}", "{dir}/out.jsonl"],
        ["place", "{file}", "--out", "{dir}/out.csv"],
        ["sweep", "{file}", "--workers", "1", "--no-progress"],
        ["plot", "{file}", "--out", "{dir}/m.html"],
        ["replay", "--example", "gpt2-generate", "--config", "{file}"],
    ],
)
def test_a_stream_with_nothing_to_read_is_refused_not_waited_on(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    command: list[str],
) -> None:
    # `cubepool replay /proc/kmsg` waited forever: a file stat calls regular whose read
    # waits for the kernel to write more. Such a file's open is asked (poll, which reads
    # nothing) whether a read would wait; a file on disk is told here that it would.
    from cubepool import _files

    file = tmp_path / "kmsg.jsonl"
    file.write_text("not read\n", encoding="utf-8")
    monkeypatch.setattr(_files, "_waits", lambda fd: True)
    argv = [part.format(file=file, dir=tmp_path) for part in command]
    code, _, err = run(capsys, *argv)
    flag = "--config " if "--config" in argv else ""
    assert (code, err) == (
        1,
        f"cubepool: {flag}{file}: a stream that would keep a read waiting, not a regular file\n",
    )
    assert sorted(os.listdir(tmp_path)) == ["kmsg.jsonl"]  # nothing written


def test_a_file_on_disk_is_not_taken_for_a_stream(tmp_path: Path) -> None:
    from cubepool import _files

    file = tmp_path / "t.jsonl"
    file.write_bytes(b"")  # empty: poll says ready (its read ends at once), no wait
    _files.refuse_non_regular(file, "trace file")
    with _files.open_regular(file, "trace file") as opened:
        assert opened.read() == b""


def test_a_stream_read_to_its_end_is_refused_not_waited_on() -> None:
    # /proc/kmsg holding a few lines when opened: its read past them waited forever.
    # Opened without waiting, its reads do not wait either: a pipe stands in for it.
    from cubepool._files import _NoWaitFile

    for read in (lambda f: f.read(), lambda f: f.read(1 << 20), lambda f: f.readline() + f.read()):
        reader, writer = os.pipe()
        os.set_blocking(reader, False)
        os.write(writer, b"<6>kernel: a line\n")
        with (
            io.BufferedReader(_NoWaitFile(reader, "/proc/kmsg", "trace file")) as stream,
            pytest.raises(OSError, match="a stream that would keep a read waiting") as raised,
        ):
            read(stream)
        os.close(writer)
        assert raised.value.filename == "/proc/kmsg"
    # One whose writer has left ends, as a file does.
    reader, writer = os.pipe()
    os.set_blocking(reader, False)
    os.write(writer, b"all of it")
    os.close(writer)
    with io.BufferedReader(_NoWaitFile(reader, "p", "trace file")) as stream:
        assert stream.read() == b"all of it"


def test_a_placement_input_past_the_import_bound_is_refused_before_it_is_read(
    tmp_path: Path,
) -> None:
    # Its lines are held in memory: 2 GB of a sparse file took 4.3 GB and 20 s to refuse.
    big = tmp_path / "big.csv"
    big.write_bytes(b"id,lower,upper,size\n" + b"0,0,1,8\n" * 300)
    done = subprocess.run(
        [sys.executable, "-m", "cubepool.cli", "place", str(big), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        env={**os.environ, "CUBEPOOL_MAX_IMPORT_BYTES": "1000"},
        check=False,
    )
    assert done.returncode == 1
    assert "more than an input may (1,000; raise CUBEPOOL_MAX_IMPORT_BYTES)" in done.stderr


def test_a_plan_that_keeps_the_planned_layout_leaves_no_temporary_file(tmp_path: Path) -> None:
    # The planned layout follows a temporary plan file, which every `cubepool report` and
    # `cubepool plan` that kept it left in the temporary folder (459 of them here).
    done = subprocess.run(
        [sys.executable, "-m", "cubepool.cli", "plan", "--example", "gpt2-train"],
        capture_output=True,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "planned layout: planned arena of a temporary plan file" in done.stdout
    assert list(tmp_path.glob("cubepool-plan-*")) == []


@pytest.mark.parametrize("name", [" lead.json", "trail.json ", "  "])
def test_a_plan_path_with_outer_spaces_is_refused_before_the_search(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    # The pools language strips a value's spaces, so planned(file= lead.json) named
    # another file: the plan was written, then could not be read back ("No such file").
    monkeypatch.chdir(tmp_path)
    no_work(monkeypatch)
    err = usage_error(capsys, "plan", "--example", "gpt2-generate", "--save", name)
    assert "argument --save: a plan file's path may not start or end with spaces" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["a,b.json", "a(1).json", "x;y.json", "k=v.json", "#.json"])
def test_a_plan_path_a_layout_cannot_name_is_a_usage_error_naming_save(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    # `--save a,b.json` exited 1, as an error of the inputs or the work, where a bad
    # argument is a usage error (exit status 2) naming its option.
    monkeypatch.chdir(tmp_path)
    no_work(monkeypatch)
    err = usage_error(capsys, "plan", "--example", "gpt2-generate", "--save", name)
    assert (
        f"argument --save: a plan file's path may not hold , ( ) ; = # or a new line: {name!r}"
        in err
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("name", "argv"),
    [
        ("t.jsonl.gz", ("plan", "{trace}", "--save", "{out}")),
        ("t.jsonl.gz", ("convert", "{trace}", "{out}")),
        # A picture's suffix is one of its forms, so only a trace named so can be hit.
        ("t.html", ("plot", "{trace}", "--out", "{out}")),
        ("t.svg", ("report", "{trace}", "--no-plan", "--out", "{out}")),
    ],
    ids=["plan --save", "convert OUTPUT", "plot --out", "report --out"],
)
def test_an_output_naming_the_input_trace_is_refused_before_the_work(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str, argv: tuple[str, ...]
) -> None:
    # `plan T --save T` replaced the trace with a layout file, and the others with a
    # picture or a converted copy; the output may name it through a link too.
    trace = tmp_path / name
    trace.write_bytes(cubepool.examples.path("gpt2-generate").read_bytes())
    before = trace.read_bytes()
    link = tmp_path / f"link-{name}"
    link.symlink_to(trace)
    for out in (trace, link):
        err = usage_error(capsys, *(a.format(trace=trace, out=out) for a in argv))
        assert f"{out} names the input trace" in err, err
        assert trace.read_bytes() == before


def test_a_reader_leaving_early_does_not_cancel_the_picture(tmp_path: Path) -> None:
    # `cubepool report --out mem.html | head -1` exited 0 without writing mem.html: the
    # broken pipe of a later print stopped the command before its picture.
    out = tmp_path / "mem.html"
    command = [sys.executable, "-m", "cubepool.cli", "report", "--example", "gpt2-generate"]
    reader = subprocess.Popen(
        [*command, "--no-plan", "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert reader.stdout is not None and reader.stderr is not None
    assert reader.stdout.readline().startswith(b"trace gpt2-generate:")
    reader.stdout.close()
    with reader.stderr:
        assert reader.wait(120) == 0 and reader.stderr.read() == b""
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


def test_an_int_like_size_is_asked_once_and_what_it_raises_is_raised() -> None:
    # size_arg read `__index__` twice where the first answer did not fit, and put a
    # TypeError in place of whatever it raised (a Ctrl-C inside it was lost).
    mm = cubepool.MemoryManagement()
    calls: list[int] = []

    class Index:
        def __init__(self, value: int) -> None:
            self.value = value

        def __index__(self) -> int:
            calls.append(self.value)
            return self.value

    handle = mm.reserve(as_int(Index(4096)))
    assert handle.size == 4096 and calls == [4096]
    calls.clear()
    with pytest.raises(cubepool.InvalidArgument, match="must be non-negative, got -5"):
        mm.reserve(as_int(Index(-5)))
    assert calls == [-5]

    class Interrupted:
        def __index__(self) -> int:
            raise KeyboardInterrupt("inside __index__")

    with pytest.raises(KeyboardInterrupt, match="inside __index__"):
        mm.reserve(as_int(Interrupted()))
    with pytest.raises(KeyboardInterrupt, match="inside __index__"):
        mm.write(handle, as_int(Interrupted()))
    with pytest.raises(TypeError, match="size must be an int, got str"):
        mm.reserve(as_int("4096"))

    # A TypeError of __index__'s own names the argument, with the original as cause.
    class Text:
        def __index__(self) -> int:
            return "4096"  # type: ignore[return-value]

    with pytest.raises(TypeError, match=r"size must be an int, got Text \(__index__ returned") as e:
        mm.reserve(as_int(Text()))
    assert isinstance(e.value.__cause__, TypeError)
    with pytest.raises(TypeError, match="limit must be an int or a size such as") as e:
        cubepool.replay(cubepool.load_trace("gpt2-generate"), "default", limit=as_int(Text()))
    assert isinstance(e.value.__cause__, TypeError)
    # A byte size reads what __index__ raises as it is, as a size does.
    with pytest.raises(KeyboardInterrupt, match="inside __index__"):
        cubepool.replay(
            cubepool.load_trace("gpt2-generate"), "default", limit=as_int(Interrupted())
        )

    handle.release()


def as_int(value: object) -> int:
    """``value`` typed as the int it stands for (or, for the test, does not)."""
    return value  # type: ignore[return-value]


@pytest.mark.parametrize(
    "call",
    [
        "cubepool.load_trace(path)",
        "cubepool._cubepool.load_trace_v1(path)",
        "cubepool.load_tensor(path)",
        "cubepool.load_tensor_from_file(path)",
        "cubepool.load_param_dict(path)",
        "cubepool.load_param_dict_from_file(path)",
        "cubepool._cubepool.place_csv(path, path + '.out')",
    ],
)
def test_a_fifo_given_to_the_python_readers_is_refused_not_waited_on(
    tmp_path: Path, call: str
) -> None:
    # These opened the path with a plain open, which waits for a FIFO's writer forever.
    fifo = tmp_path / "in"
    os.mkfifo(fifo)
    script = (
        "import sys, cubepool\n"
        f"path = {str(fifo)!r}\n"
        "try:\n"
        f"    {call}\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n"
        "    sys.exit(3)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,  # what waited on the FIFO fails here, not hangs the suite
        check=False,
    )
    assert done.returncode == 3, done.stderr
    assert "a FIFO, not a regular file" in done.stdout, done.stdout
    assert str(fifo) in done.stdout, done.stdout


@pytest.mark.parametrize(
    "argv",
    [
        ["replay", ""],
        ["convert", "", "o.jsonl"],
        ["convert", "--example", "gpt2-generate", ""],
        ["place", "", "--out", "o.csv"],
        ["sweep", ""],
    ],
)
def test_an_empty_path_is_a_usage_error_naming_its_argument(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    # The readers said "no such trace file" or "No such file or directory" of nothing,
    # naming no argument (helper-142's find).
    err = usage_error(capsys, *argv)
    assert "an empty path names no file" in err
    # The argument named is the one left empty (with --example, convert's one
    # positional is OUTPUT: helper-148's find).
    named = {"replay": "argument trace", "place": "argument input", "sweep": "argument traces"}
    empty = "OUTPUT" if "--example" in argv else "INPUT"
    assert named.get(argv[0], empty) in err

"""The Python face (issue 20): one rule for layouts and traces, one size grammar, honest
figures under limits, the command line as a shell user meets it."""

from __future__ import annotations

import dataclasses
import errno
import io
import json
import math
import os
import re
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import cubepool
from cubepool._files import host_tag
from cubepool.cli import main
from cubepool.compare import failure_text
from cubepool.layouts import resolve_layout

MIB = 1 << 20
EXAMPLE = "gpt2-generate"


@pytest.fixture(scope="module")
def trace() -> cubepool.Trace:
    return cubepool.load_trace(cubepool.examples.path(EXAMPLE))


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_big(size: int) -> cubepool.Trace:
    """A trace of one allocation of ``size`` bytes, then a small one."""
    events = [(1, "alloc", 0, size), (2, "alloc", 1, 4096), (3, "free", 1, 0), (4, "free", 0, 0)]
    return cubepool.Trace.from_events(events, {"workload": "big"})


# --------------------------------------------------------------------------- layouts


def test_every_layout_argument_is_taken_everywhere(trace: cubepool.Trace, tmp_path: Path) -> None:
    sub = cubepool.MemoryConfiguration.sub_slices()
    expected = cubepool.replay(trace, sub).peak_reserved
    saved = tmp_path / "layout.json"
    saved.write_text(json.dumps({"preset": "sub_slices"}))
    text_file = tmp_path / "layout.txt"
    text_file.write_text("sub_slices\n")
    toml_file = tmp_path / "cubepool.toml"
    toml_file.write_text('[memory]\npools = "sub_slices"\n')
    planned = cubepool.plan(trace, derive=200, workers=1)
    for layout in (sub, "sub_slices", "SubSlices", str(saved), saved, text_file, toml_file):
        assert cubepool.replay(trace, layout).peak_reserved == expected, layout
        comparison = cubepool.compare(trace, layout)
        assert len(comparison.rows) == 1, layout  # one layout, never its letters
        assert comparison.rows[0].result.peak_reserved == expected
    assert cubepool.replay(trace, planned).peak_reserved == planned.result.peak_reserved
    assert cubepool.compare(trace, planned).rows[0].label == "planned"
    text = "sliced(page=8MiB, max_slice=4MiB); exclusive(max_alloc=2GiB)"
    assert len(cubepool.compare(trace, text).rows) == 1


def test_memory_management_takes_names_plans_and_files(tmp_path: Path) -> None:
    saved = tmp_path / "layout.json"
    saved.write_text(json.dumps({"preset": "exclusive_pages"}))
    assert cubepool.MemoryConfiguration.parse("default") == cubepool.default_configuration()
    for config in ("default", str(saved), saved):
        mm = cubepool.MemoryManagement(config)
        assert mm.reserve(1000).size == 1000
    planned = cubepool.plan(one_big(MIB), workers=1)
    mm = cubepool.MemoryManagement(planned)
    assert mm.reserve(MIB).size == MIB
    with pytest.raises(FileNotFoundError, match="no such layout file"):
        cubepool.MemoryManagement("missing.json")
    with pytest.raises(cubepool.PoolConfigError, match="torch"):
        cubepool.MemoryManagement("torch")


def test_unknown_layouts_and_missing_layout_files_are_told_apart() -> None:
    with pytest.raises(cubepool.InvalidArgument, match="unknown layout 'best'"):
        cubepool.compare(one_big(MIB), "best")
    with pytest.raises(FileNotFoundError, match="no such layout file"):
        cubepool.compare(one_big(MIB), "plans/best.json")
    with pytest.raises(TypeError, match="a layout is"):
        cubepool.compare(one_big(MIB), [3])  # type: ignore[list-item]
    # A word with a dot names a file that is not there; the advice names every form.
    with pytest.raises(cubepool.InvalidArgument, match="no file of that name") as info:
        cubepool.compare(one_big(MIB), "layout.jsn")
    assert "pools-language text" in str(info.value) and "cubepool.toml" in str(info.value)


def test_a_cubepool_toml_given_as_a_layout_reads_as_the_search_reads_it(tmp_path: Path) -> None:
    toml = tmp_path / "layout.toml"
    toml.write_text('memory.pools = ["exclusive(max_alloc=1KiB)", "direct()"]\n')
    layout = resolve_layout(str(toml))[1]
    assert str(layout) == "exclusive(max_alloc=1KiB); direct()"
    wrong = {
        "memory.pools = 5\n": "must be a string or an array of strings, found an integer$",
        'memory.pools = ["direct()", 5]\n': "array of strings, found an integer$",
        "memory.pools = []\n": "the pool list is empty",
        "memory = 5\n": "memory must be a table, found an integer$",
        "[tool]\nx = 1\n": "no layout: write it as pools = ",
    }
    for body, message in wrong.items():
        toml.write_text(body)
        # The automatic search's reader (PoolConfigError) or the layout's (no pools).
        with pytest.raises(ValueError, match=f"^{re.escape(str(toml))}: .*{message}"):
            resolve_layout(str(toml))
    # Each entry of the array read alone, as the search reads them: a `#` in one ends
    # that entry, not the ones after it (helper-145's find: they were joined and lost).
    toml.write_text('memory.pools = ["direct() # the fallback", "exclusive(max_alloc=1GiB)"]\n')
    assert str(resolve_layout(str(toml))[1]) == "direct(); exclusive(max_alloc=1GiB)"


def test_layout_text_too_long_for_a_file_name_is_read_as_text() -> None:
    # Over 255 characters on one line: longer than a file name may be (is_file() raised).
    text = "; ".join(f"sliced(page={8 << i}MiB, max_slice={1 << i}MiB)" for i in range(8))
    assert 255 < len(text) < 4096
    assert resolve_layout(text)[1] == cubepool.MemoryConfiguration.parse(text)
    assert cubepool.replay(one_big(MIB), text).complete


# --------------------------------------------------------------------------- traces


def test_every_trace_argument_is_taken_everywhere(trace: cubepool.Trace) -> None:
    path = cubepool.examples.path(EXAMPLE)
    expected = cubepool.replay(trace).peak_reserved
    for ref in (trace, path, str(path), EXAMPLE, f"example:{EXAMPLE}"):
        assert cubepool.replay(ref).peak_reserved == expected, ref
    assert cubepool.compare(EXAMPLE, "default").trace == EXAMPLE
    assert cubepool.plan(EXAMPLE, derive=200, workers=1).result.peak_reserved > 0
    with pytest.raises(cubepool.InvalidArgument, match="already loaded"):
        cubepool.replay(trace, device="cuda:0")
    with pytest.raises(FileNotFoundError):
        cubepool.replay("no-such-trace.jsonl")


def test_a_folder_named_as_an_example_does_not_hide_it_and_a_file_of_that_name_is_said(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A folder `gpt2-generate` here made `cubepool replay gpt2-generate` fail ("a
    # directory, not a trace file"): the bundled example was hidden by what no trace is.
    monkeypatch.chdir(tmp_path)
    example = str(cubepool.examples.path(EXAMPLE))
    (tmp_path / EXAMPLE).mkdir()
    passed_over = (
        f"cubepool: {EXAMPLE} here is a directory, not a trace file: reading the bundled "
        f"example {EXAMPLE}\n"
    )
    code, out, err = run(capsys, "replay", EXAMPLE)
    assert (code, err) == (0, passed_over) and out.startswith(f"trace {EXAMPLE}: 30,427 events")
    code, out, err = run(capsys, "sweep", EXAMPLE, "--workers", "1", "--no-progress")
    assert (code, err) == (0, passed_over) and EXAMPLE in out
    assert cubepool.load_trace(EXAMPLE).to_jsonl() == cubepool.load_trace(example).to_jsonl()
    # A regular file of that name is the user's trace: it is read, and that is said.
    (tmp_path / EXAMPLE).rmdir()
    mine = cubepool.Trace.from_events([(1, "alloc", 0, 4096), (2, "free", 0, 0)], {})
    mine.write(str(tmp_path / EXAMPLE))
    code, out, err = run(capsys, "replay", EXAMPLE, "--json")
    assert code == 0 and json.loads(out)["events"] == 2
    assert err == (
        f"cubepool: {EXAMPLE} names a file here and a bundled example: reading the file "
        f"(--example {EXAMPLE} reads the example)\n"
    )
    assert len(cubepool.load_trace(EXAMPLE)) == 2
    # sweep has no --example: its note names example:NAME, which it takes.
    code, out, err = run(capsys, "sweep", EXAMPLE, "--workers", "1", "--no-progress")
    assert code == 0 and err == (
        f"cubepool: {EXAMPLE} names a file here and a bundled example: reading the file "
        f"(example:{EXAMPLE} reads the example)\n"
    )
    # --example NAME and example:NAME are the example, without a word.
    for argv in (["--example", EXAMPLE], [f"example:{EXAMPLE}"]):
        code, out, err = run(capsys, "replay", *argv)
        assert (code, err) == (0, "") and out.startswith(f"trace {EXAMPLE}: 30,427 events")
    # What --help says of it.
    code, out, _ = run(capsys, "replay", "--help")
    assert code == 0 and "a regular file of that name here is read instead" in " ".join(out.split())


def test_sweep_takes_one_trace_one_layout_and_device(tmp_path: Path) -> None:
    from test_experiments import profiler_file

    result = cubepool.sweep(EXAMPLE, "sub_slices", max_workers=1)
    assert [(r.trace, r.layout) for r in result.rows] == [(EXAMPLE, "sub_slices")]
    prof = profiler_file(tmp_path / "prof.json")
    with pytest.raises(cubepool.TraceSelectionError):
        cubepool.sweep([prof], "default", max_workers=1, device="cuda:5")
    picked = cubepool.sweep([prof], "default", max_workers=1, device="cuda:0")
    # The 64 B block live before the recording is allocated at its start: 5 events.
    assert picked.rows[0].result["events"] == 5
    empty = cubepool.sweep([prof], "default", max_workers=1, device="cuda:0", live_before=False)
    assert empty.rows[0].result["events"] == 3
    with pytest.raises(cubepool.InvalidArgument, match="max_workers"):
        cubepool.sweep(EXAMPLE, max_workers=0)


def test_plan_progress_true_draws_a_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    cubepool.plan(one_big(3 * MIB), progress=True, workers=1)
    assert "/" in err.getvalue() and "[" in err.getvalue()


# --------------------------------------------------------------------------- sizes


def test_one_size_grammar() -> None:
    assert cubepool.parse_size("64KB") == 64_000
    assert cubepool.parse_size("64KiB") == 64 * 1024
    assert cubepool.parse_size("1.5 GiB") == 3 << 29
    assert cubepool.parse_size(4096) == 4096
    for bad in ("2g", "lots", "1.5B"):
        with pytest.raises(cubepool.InvalidArgument):
            cubepool.parse_size(bad)
    # The pools language and every size argument read sizes the same way.
    parsed = cubepool.MemoryConfiguration.parse("exclusive(max_alloc=64KB)")
    assert parsed.pool_options[0].pool_type == cubepool.PoolType.exclusive_pages("64KB")
    assert cubepool.MemoryDeviceProperties("1GiB", "256B").max_page_size == 1 << 30
    limited = cubepool.replay(one_big(2 * MIB), limit="1MiB")
    assert limited.failed_reserves == cubepool.replay(one_big(2 * MIB), limit=MIB).failed_reserves
    with pytest.raises(TypeError, match="int"):
        cubepool.MemoryManagement().reserve("12")  # type: ignore[arg-type]


def test_a_fraction_of_any_length_reads_exactly() -> None:
    """Past 38 digits after the point a fraction's digits, read as one 128-bit integer,
    overflowed and the size was refused as past 64 bits: now a fraction is read exactly
    however long, a fraction of a byte is said to be one, and only a size past 64 bits
    says so."""
    tiny = "0." + "0" * 39 + "1"
    for text in (tiny, tiny + " KiB", "1." + "0" * 38 + "1", "3." + "3" * 60 + "TB"):
        with pytest.raises(cubepool.InvalidArgument) as refused:
            cubepool.parse_size(text)
        assert str(refused.value).endswith("is not a whole number of bytes"), text
    with pytest.raises(cubepool.InvalidArgument, match="is not a whole number of bytes"):
        cubepool.parse_size("0." + "0" * 100_000 + "1", "limit")
    # Whole, however many digits after the point.
    assert cubepool.parse_size("1." + "0" * 40) == 1
    assert cubepool.parse_size("0.0000000000009094947017729282379150390625 TiB") == 1
    assert cubepool.parse_size("18446744073709551615." + "0" * 40) == (1 << 64) - 1
    # Past 64 bits, however written.
    for text in ("99999999999TiB", "1" * 45, "18446744073709551616." + "0" * 40):
        with pytest.raises(cubepool.InvalidArgument, match="does not fit in 64 bits"):
            cubepool.parse_size(text)
    assert cubepool.parse_size("0.5 KiB") == 512
    with pytest.raises(cubepool.InvalidArgument, match=r'size: "0\.5" is not a whole number'):
        cubepool.parse_size("0.5")


def test_integer_arguments_are_named_in_their_errors(trace: cubepool.Trace) -> None:
    # Each call takes a negative, a 65-bit and a non-int value of one argument: the
    # error names the argument (PyO3's own said "can't convert negative int to
    # unsigned"). Strings and bools are no ints either.
    backing = cubepool.empty((64,), "uint8")
    pool = cubepool.TensorMemoryPool()
    calls: dict[str, Callable[[Any], object]] = {
        "keep": lambda v: cubepool.PoolType.virtual_pages(4096, keep=v),
        "max_split_size_mb": lambda v: cubepool.TorchAllocatorModel(max_split_size_mb=v),
        "roundup_power2_divisions": lambda v: cubepool.TorchAllocatorModel(
            roundup_power2_divisions=v
        ),
        "page_size": lambda v: cubepool.TensorMemoryPool(page_size=v),
        "max_cached_bytes": lambda v: cubepool.TensorMemoryPool(max_cached_bytes=v),
        "byte_offset": lambda v: pool.create_view(backing, (1,), "uint8", v),
        "relative_byte_offset": lambda v: cubepool.create_view(backing, (1,), "uint8", v),
        "nbytes": lambda v: pool.alloc_backing(v, 64, "cpu"),
        "alignment": lambda v: pool.alloc_backing(64, v, "cpu"),
        "elem_size": lambda v: cubepool.optimal_align(4, v, 64),
        "bytes_in_use": lambda v: cubepool.MemoryUsage(0, v),
        "start": lambda v: trace.with_step_repeated(v, 2, "again"),
        "limits[1]": lambda v: trace.live_peaks([0, v]),
        "groups[0][0]": lambda v: trace.group_peaks([[v]]),
        "ids[0]": lambda v: trace.with_twins([v]),
    }
    for name, call in calls.items():
        for value in (-1, 2**64):
            with pytest.raises(cubepool.InvalidArgument, match=re.escape(name)):
                call(value)
        for value in ("12", True):
            with pytest.raises(TypeError, match=re.escape(name)):
                call(value)
    with pytest.raises(cubepool.InvalidArgument, match=re.escape("ids[0] is too large")):
        trace.with_twins([2**32])
    # A device type past 32 bits is an unknown device type, as any other.
    with pytest.raises(cubepool.TensorError, match="unknown type = 1099511627776"):
        cubepool.device_type_to_str(2**40)
    assert cubepool.device_type_to_str(1) == "cpu"

    class Index:  # anything with __index__, as a numpy integer
        def __index__(self) -> int:
            return 2

    assert cubepool.device_type_to_str(Index()) == "cuda"  # type: ignore[arg-type]
    # A set is no sequence: its order is none (limits must ascend).
    with pytest.raises(TypeError, match="limits must be a sequence"):
        trace.live_peaks({64, 32})  # type: ignore[arg-type]
    # None still means what it meant where it is allowed.
    assert cubepool.PoolType.virtual_pages(4096, keep=None).kind == "virtual_pages"


# --------------------------------------------------------------------------- honesty


def test_incomplete_replays_say_so_everywhere(trace: cubepool.Trace) -> None:
    result = cubepool.replay(trace, limit="16MiB")
    assert not result.complete and result.failed_reserves > 0
    assert math.isnan(result.utilization)
    assert result.failures == {"too_big": 0, "pools_full": 0, "over_limit": result.failed_reserves}
    data = result.to_dict()
    assert data["complete"] is False and data["utilization"] is None
    json.dumps(data, allow_nan=False)
    assert "incomplete" in repr(result)
    whole = cubepool.replay(trace)
    assert whole.complete and 0 < whole.utilization <= 1
    assert whole.to_dict()["complete"] is True


def test_failures_say_why() -> None:
    # compact's largest page is 2 GiB; the default (a virtual pool) serves 5 GiB.
    assert cubepool.replay(one_big(5 << 30)).complete
    too_big = cubepool.replay(one_big(5 << 30), cubepool.MemoryConfiguration.compact())
    assert too_big.failures["too_big"] == 1 and not too_big.complete
    assert failure_text(too_big.failures) == "1 too big for every pool"
    over = cubepool.replay(one_big(64 * MIB), limit="16MiB")
    assert over.failures["over_limit"] == 1 and over.limit == 16 * MIB
    assert failure_text(over.failures, over.limit) == "1 over the memory limit"
    assert cubepool.ReplayResult.from_dict(over.to_dict()).limit == 16 * MIB
    # Without a limit, what the storage refuses is not said to be over one.
    assert too_big.limit is None
    assert failure_text({"over_limit": 2}, too_big.limit) == "2 refused by the storage"


def test_compare_ranks_complete_replays_first_and_marks_the_rest(trace: cubepool.Trace) -> None:
    # Under 40 MiB (peak live 28.3 MiB) the default layout fits and SubSlices (which
    # needs about 59 MiB) does not: a complete replay ranks above an incomplete one,
    # whatever their peaks (an incomplete replay's peak is capped by the limit).
    comparison = cubepool.compare(trace, limit="40MiB")
    done = [row.result.complete for row in comparison.rows]
    assert True in done and False in done
    assert done == sorted(done, reverse=True)
    text = comparison.table()
    for row in comparison.rows:
        if not row.result.complete:
            assert "incomplete" in text and row.label in text.split("failed reservations")[1]


def test_sweep_table_marks_incomplete_cells() -> None:
    result = cubepool.sweep(EXAMPLE, ["default"], limit="16MiB", max_workers=1)
    assert not result.complete
    assert "incomplete" in result.table() and "over the memory limit" in result.table()
    assert math.isnan(result.rows[0].utilization)
    with pytest.raises(cubepool.InvalidArgument, match="unknown metric 'utilisation'"):
        result.table("utilisation")


def test_short_reprs(trace: cubepool.Trace) -> None:
    result = cubepool.sweep([EXAMPLE], ["default", "sub_slices"], max_workers=1)
    assert repr(result) == "<Sweep 1 traces x 2 layouts: 2 replays>"
    planned = cubepool.plan(trace, derive=200, workers=1)
    assert len(repr(planned)) < 300 and repr(planned).startswith("<Plan ")
    mm = cubepool.MemoryManagement()
    empty, used = mm.reserve(0), mm.reserve(64)
    assert "pool=None, storage_id=None" in repr(mm.resource(empty))
    text = repr(mm.resource(used))
    assert "Some(" not in text and "pool=0," in text


# --------------------------------------------------------------------------- fidelity


def test_can_mut_answers_at_once_after_a_clone_goes() -> None:
    mm = cubepool.MemoryManagement()
    handle = mm.reserve(64)
    clone = handle.clone()
    assert not handle.can_mut
    del clone
    assert handle.can_mut  # CubeCL answers at once, not after the next operation
    other = handle.clone()
    assert not handle.can_mut
    other.release()
    assert handle.can_mut


def test_a_tensor_file_of_another_device_is_refused_as_tvm_does(tmp_path: Path) -> None:
    data = bytearray(cubepool.save_tensor(cubepool.empty((2,), "float32")))
    struct.pack_into("<i", data, 16, 2)  # device type CUDA
    with pytest.raises(cubepool.TensorFormatError, match="can only save as CPU tensor"):
        cubepool.load_tensor(bytes(data))
    path = tmp_path / "cuda.bin"
    path.write_bytes(bytes(data))
    with pytest.raises(cubepool.TensorFormatError, match="Invalid DLTensor device"):
        cubepool.load_tensor_from_file(path)


# --------------------------------------------------------------------------- command line


def test_cli_version_and_refusals(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # Help and version return 0 as the commands do (once their output is flushed).
    assert main(["--version"]) == 0 and cubepool.__version__ in capsys.readouterr().out
    for argv in (
        ["sweep", EXAMPLE, "--workers", "0"],
        ["sweep", EXAMPLE, "--metric", "utilisation"],
        ["replay", "--example", EXAMPLE, "--limit", "2g"],
        # Numbers out of range are usage errors (exit 2) naming the flag, for every flag.
        ["plan", "--example", EXAMPLE, "--derive", "0"],
        ["plan", "--example", EXAMPLE, "--max-storage-allocations", "-1"],
        ["place", str(tmp_path / "in.csv"), "--capacity", "-1", "--out", "o.csv"],
    ):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2, argv
        flag = next((arg for arg in argv if arg.startswith("--") and arg != "--example"), "")
        assert f"argument {flag}:" in capsys.readouterr().err, argv
    capsys.readouterr()
    code, _, err = run(capsys, "replay", str(tmp_path / "missing.jsonl"))
    assert code == 1 and err == f"cubepool: {tmp_path / 'missing.jsonl'}: no such trace file\n"
    # A bare name is most likely an example's, mistyped: the examples are listed.
    code, _, err = run(capsys, "replay", "gpt3-train")
    assert code == 1 and err.startswith("cubepool: gpt3-train: no such trace file or bundled")
    assert EXAMPLE in err
    with pytest.raises(FileNotFoundError, match=f"bundled example .*{EXAMPLE}"):
        cubepool.load_trace("gpt3-train")
    code, _, err = run(capsys, "compare", "--example", EXAMPLE, "--config", "x/best.json")
    assert code == 1 and "x/best.json: no such layout file" in err


def test_cli_convert_refuses_a_csv_name(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as info:
        main(["convert", str(cubepool.examples.path(EXAMPLE)), str(tmp_path / "out.csv")])
    assert info.value.code == 2 and "name it .jsonl" in capsys.readouterr().err
    assert not (tmp_path / "out.csv").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["replay"], "cubepool replay: error: give a trace PATH or --example NAME"),
        (["replay", "x.jsonl", "--example", EXAMPLE], "PATH or --example NAME, not both"),
        (["replay", "--example", EXAMPLE, "--preset", "compact", "--config", "compact"], "one"),
        (["convert"], "cubepool convert: error: give INPUT OUTPUT"),
        (["convert", "in.jsonl"], "cubepool convert: error: give INPUT OUTPUT"),
        (["sweep"], "cubepool sweep: error: give at least one trace"),
        (["compare", "--example", EXAMPLE, "--alignment", "3"], "--alignment must be a power"),
        (["plot", "--example", EXAMPLE, "--out", "m.html", "--max-page-size", "0"], "--max-"),
    ],
)
def test_cli_usage_errors_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2 and message in err.splitlines()[0], err
    assert "Traceback" not in err


def test_cli_checks_the_picture_path_before_any_work(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[object] = []
    monkeypatch.setattr("cubepool.cli.replay", lambda *a, **k: calls.append(a))
    code, _, err = run(capsys, "plot", "--example", EXAMPLE, "--out", str(tmp_path / "x.txt"))
    # The path named, not the suffix alone (helper-142's find).
    assert code == 1 and f"cannot draw a picture as .txt ({tmp_path / 'x.txt'})" in err
    assert not calls
    code, _, err = run(capsys, "plot", "--example", EXAMPLE, "--out", str(tmp_path / "no/x.html"))
    assert code == 1 and err == f"cubepool: {tmp_path / 'no/x.html'}: No such file or directory\n"
    assert not calls
    monkeypatch.undo()
    code, out, _ = run(capsys, "plot", "--example", EXAMPLE, "--out", str(tmp_path / "x"))
    assert code == 0 and out.strip() == f"wrote {tmp_path / 'x.html'}"
    assert (tmp_path / "x.html").exists()


def test_cli_checks_every_output_path_before_any_work(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[object] = []
    monkeypatch.setattr("cubepool.cli._load", lambda *a, **k: calls.append(a))
    monkeypatch.setattr("cubepool.cli.load_trace_with_report", lambda *a, **k: calls.append(a))
    monkeypatch.setattr(sys.modules["cubepool.place"], "_place_csv", lambda *a: calls.append(a))
    (tmp_path / "dir.html").mkdir()
    (tmp_path / "dir.json").mkdir()
    (tmp_path / "dir.csv").mkdir()
    (tmp_path / "dir.jsonl").mkdir()
    (tmp_path / "folder").mkdir()
    csv = tmp_path / "in.csv"
    csv.write_text("id,lower,upper,size\n0,0,1,8\n")
    example = ["--example", EXAMPLE]
    for argv, out in (
        (["report", *example, "--out"], "dir.html"),
        (["plot", *example, "--out"], "dir.html"),
        # A folder without a suffix is not given one (it wrote folder.html beside it),
        # nor is a name that ends in a separator.
        (["report", *example, "--out"], "folder"),
        (["plot", *example, "--out"], "dir-to-be/"),
        (["place", str(csv), "--out"], "dir-to-be/"),
        (["plan", *example, "--save"], "dir.json"),
        (["plan", *example, "--save"], "no/l.json"),
        (["place", str(csv), "--out"], "dir.csv"),
        (["place", str(csv), "--out"], "no/o.csv"),
        (["convert", str(cubepool.examples.path(EXAMPLE))], "dir.jsonl"),
        (["convert", str(cubepool.examples.path(EXAMPLE))], "no/o.jsonl"),
    ):
        path = f"{tmp_path}{os.sep}{out}"  # as given (a Path drops a final separator)
        code, stdout, err = run(capsys, *argv, path)
        why = "No such file or directory" if out.startswith("no/") else "Is a directory"
        assert (code, stdout, err) == (1, "", f"cubepool: {path}: {why}\n"), argv
    assert sorted(p.name for p in tmp_path.iterdir() if not p.is_dir()) == ["in.csv"]
    # A path a layout cannot name is a usage error of --save (exit status 2).
    with pytest.raises(SystemExit) as exited:
        main(["plan", *example, "--save", str(tmp_path / "run(1).json")])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "argument --save: a plan file's path may not hold" in err
    assert not calls


@pytest.mark.parametrize(
    ("argv", "out"),
    [
        (["plot", "--example", EXAMPLE, "--out"], "m.html"),
        (["report", "--example", EXAMPLE, "--no-plan", "--out"], "m.svg"),
        (["plan", "--example", EXAMPLE, "--derive", "200", "--no-progress", "--save"], "l.json"),
        (["place", "in.csv", "--out"], "o.csv"),
    ],
)
def test_a_failed_write_names_the_file_and_leaves_nothing(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    out: str,
) -> None:
    (tmp_path / "in.csv").write_text("id,lower,upper,size\n0,0,1,8\n1,0,2,8\n")
    (tmp_path / out).write_text("the last run's\n")

    from cubepool import _files

    sync = _files._sync

    def full(path: Path) -> None:  # the disk fills up as `out` is written
        if path.name.startswith(f".{out}."):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        sync(path)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(_files, "_sync", full)
    code, _, err = run(capsys, *argv, out)
    assert code == 1 and err == f"cubepool: {out}: No space left on device\n"
    # The file is as it was, and no temporary is left beside it.
    assert (tmp_path / out).read_text() == "the last run's\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted({"in.csv", out})


def test_cli_under_a_limit_exits_3_and_marks_the_replay(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(capsys, "replay", "--example", EXAMPLE, "--limit", "16MiB")
    assert code == 3 and "incomplete" in out and "INCOMPLETE" in out
    assert "over the memory limit" in out and "exit status 3" in err
    code, out, _ = run(capsys, "replay", "--example", EXAMPLE, "--limit", "16MiB", "--json")
    data = json.loads(out)
    assert code == 3 and data["complete"] is False and data["utilization"] is None
    code, out, _ = run(capsys, "compare", "--example", EXAMPLE, "--limit", "16MiB")
    assert code == 3 and "incomplete" in out
    code, _, _ = run(capsys, "replay", "--example", EXAMPLE)
    assert code == 0


def test_cli_header_matches_the_device(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "replay", "--example", EXAMPLE, "--config", "compact", "--max-page-size", "1MiB"
    )
    header = out.splitlines()[1]
    assert "sliced 1 MiB pages" in header and "8 MiB" not in header
    # Requests above the largest page fit no pool: the replay says so, and why.
    assert code == 3 and "too big for every pool" in out


def test_cli_honours_the_environment_and_says_so(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CUBEPOOL_MEMORY_POOLS", "exclusive_pages")
    code, out, _ = run(capsys, "replay", "--example", EXAMPLE)
    assert code == 0 and "layout configured (from CUBEPOOL_MEMORY_POOLS): ExclusivePages" in out
    code, out, err = run(capsys, "compare", "--example", EXAMPLE)
    assert "configured" in out and "CUBEPOOL_MEMORY_POOLS" in err
    monkeypatch.delenv("CUBEPOOL_MEMORY_POOLS")
    (tmp_path / "cubepool.toml").write_text('[memory]\npools = "sub_slices"\n')
    monkeypatch.chdir(tmp_path)
    code, out, _ = run(capsys, "replay", "--example", EXAMPLE)
    assert "layout configured (from" in out and "cubepool.toml" in out and "SubSlices" in out


def test_cli_speaks_shell(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from test_experiments import profiler_file

    prof = profiler_file(tmp_path / "p.json")
    code, _, err = run(capsys, "replay", str(prof), "--stream", "0")
    assert code == 1 and "leave out --stream" in err and "stream=" not in err
    # The import's account of a device it chose speaks shell too.
    code, _, err = run(capsys, "replay", str(prof))
    assert code == 0 and "choose another with --device" in err and "device=" not in err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"format":"cubepool-trace","version":1}\n[1, "alloc"]\n')
    code, _, err = run(capsys, "replay", str(bad))
    assert code == 1 and "strict=False" not in err


def test_sweep_cli_takes_device(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from test_experiments import profiler_file

    prof = profiler_file(tmp_path / "p.json")
    code, out, _ = run(capsys, "sweep", str(prof), "--device", "cuda:0", "--workers", "1")
    assert code == 0 and "p" in out
    args = ["sweep", str(prof), "--device", "cuda:0", "--workers", "1", "--metric", "events"]
    code, out, _ = run(capsys, *args)
    assert code == 0 and " 5" in out.splitlines()[-1]
    code, out, _ = run(capsys, *args, "--start-empty")
    assert code == 0 and " 3" in out.splitlines()[-1]


def test_rows_and_columns_of_one_name_do_not_merge(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for folder, size, preset in (("a", 100, "compact"), ("b", 5 * MIB, "sub_slices")):
        (tmp_path / folder).mkdir()
        trace = cubepool.Trace.from_events([(0, "alloc", 0, size)], {"workload": "workload"})
        trace.write(tmp_path / folder / "t.jsonl")
        (tmp_path / folder / "layout.json").write_text(json.dumps({"layout": preset}))
    layouts = ["--config", "a/layout.json", "--config", "b/layout.json"]
    argv = ["sweep", "a/t.jsonl", "b/t.jsonl", *layouts, "--workers", "1"]
    code, out, _ = run(capsys, *argv, "--json")
    rows = json.loads(out)["rows"]
    assert code == 0 and len(rows) == 4
    assert {(r["trace"], r["layout"]) for r in rows} == {
        (t, c) for t in ("a/t.jsonl", "b/t.jsonl") for c in ("a/layout.json", "b/layout.json")
    }
    code, out, _ = run(capsys, *argv)
    assert out.splitlines()[0].split()[-2:] == ["a/layout.json", "b/layout.json"]
    assert [line.split()[0] for line in out.splitlines()[2:]] == ["a/t.jsonl", "b/t.jsonl"]
    code, out, _ = run(capsys, "compare", "a/t.jsonl", *layouts, "--json")
    assert sorted(r["label"] for r in json.loads(out)["rows"]) == ["a/layout.json", "b/layout.json"]
    # The same layout twice is numbered.
    rows = cubepool.compare("a/t.jsonl", ["compact", "compact"]).rows
    assert sorted(row.label for row in rows) == ["compact", "compact #2"]


def rmm_log_with_a_malformed_time(tmp_path: Path, *more: str) -> Path:
    """An RMM log whose first line has a malformed time (refused, or skipped with
    ``--lenient``), then an allocation and ``more`` lines, which ``--lenient`` keeps."""
    log = tmp_path / "rmm.csv"
    lines = [
        "Thread,Time,Action,Pointer,Size,Stream",
        "1,25:00:00.000,allocate,0x1,1024,0x0",
        "1,00:00:00.001,allocate,0x2,1024,0x0",
        *more,
    ]
    log.write_text("".join(f"{line}\n" for line in lines))
    return log


def test_sweep_says_what_a_lenient_import_skipped(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    log = rmm_log_with_a_malformed_time(tmp_path, "1,00:00:00.002,free,0x2,1024,0x0")
    # As `replay --lenient` does, on stderr, once per trace whatever the layouts.
    argv = ["sweep", str(log), "--config", "compact", "--config", "default", "--workers", "1"]
    code, out, err = run(capsys, *argv, "--lenient")
    assert code == 0 and "rmm" in out
    said = [line for line in err.splitlines() if line.startswith("cubepool: imported rmm")]
    assert len(said) == 1 and "1 malformed entries skipped" in said[0], err
    code, out, _ = run(capsys, *argv, "--lenient", "--json")
    imports = json.loads(out)["imports"]
    assert list(imports) == ["rmm"] and imports["rmm"]["malformed"] == 1
    # From Python too, by the name the rows carry; a cubepool trace v1 file has none.
    swept = cubepool.sweep([str(log), EXAMPLE], "compact", max_workers=1, strict=False)
    assert {row.trace for row in swept.rows} == {"rmm", EXAMPLE}
    assert list(swept.imports) == ["rmm"] and swept.imports["rmm"].malformed == 1


def test_cli_advice_is_what_the_cli_can_follow(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    log = rmm_log_with_a_malformed_time(tmp_path)
    code, _, err = run(capsys, "sweep", str(log), "--workers", "1")
    assert code == 1 and "pass --lenient" in err
    code, out, _ = run(capsys, "sweep", str(log), "--workers", "1", "--lenient")
    assert code == 0 and "rmm" in out
    for argv in (
        ["place", str(log), "--out", str(tmp_path / "o.csv"), "--time-limit", "1e9"],
        ["plan", "--example", EXAMPLE, "--static-time-limit", "1e20"],
        ["plan", "--example", EXAMPLE, "--static-time-limit", "-1"],
    ):
        with pytest.raises(SystemExit) as info:
            main(argv)
        err = capsys.readouterr().err
        assert info.value.code == 2 and "time-limit: must be a positive number of seconds " in err
        assert "below 1,000,000,000" in err and "time_limit" not in err
    with pytest.raises(ValueError, match="static_time_limit must be a positive number"):
        cubepool.plan(EXAMPLE, static_time_limit=1e20)
    env = {**os.environ, "CUBEPOOL_MAX_IMPORT_EVENTS": "10"}
    done = subprocess.run(
        [sys.executable, "-m", "cubepool.cli", "replay", "--example", EXAMPLE],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1 and done.stderr.endswith(
        "the trace holds more than 10 events; raise the bound with the "
        "CUBEPOOL_MAX_IMPORT_EVENTS environment variable\n"
    ), done.stderr


def test_cli_flags_a_v1_trace_cannot_follow_are_never_silent(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    v1 = str(cubepool.examples.path(EXAMPLE))
    out = str(tmp_path / "o.jsonl")
    for argv in (["--device", "cuda:7"], ["--stream", "9"]):
        code, _, err = run(capsys, "convert", v1, out, *argv)
        assert code == 1 and "leave out --device and --stream" in err, argv
        code, _, err = run(capsys, "replay", v1, *argv)
        assert code == 1 and "leave out --device and --stream" in err, argv
    assert not os.path.exists(out)
    sweep = ["sweep", v1, "--config", "default", "--workers", "1"]
    for command in (["convert", v1, out], ["replay", v1], sweep):
        code, _, err = run(capsys, *command, "--start-empty")
        assert code == 0 and err.startswith("cubepool: --start-empty leaves out"), command
        assert "a cubepool trace v1 file is read as it is" in err
    # sweep's --device and --stream pick among the devices of imported files (its help
    # says so), so on a v1 file, which holds one, they change nothing.
    code, out_text, _ = run(capsys, *sweep, "--device", "cuda:7", "--stream", "9", "--json")
    assert code == 0 and len(json.loads(out_text)["rows"]) == 1


def test_an_os_error_message_names_the_file(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "sweep", "no-such-trace.jsonl")
    assert code == 1 and "[Errno" not in err and "no-such-trace.jsonl" in err
    assert os.path.basename("no-such-trace.jsonl") in err


# --------------------------------------------------------------------------- pictures


def page_payload(path: Path) -> dict[str, object]:
    text = path.read_text(encoding="utf-8")
    start = text.index('id="cubepool-data">') + len('id="cubepool-data">')
    data: dict[str, object] = json.loads(text[start : text.index("</script>", start)])
    return data


def test_the_html_picture_is_interactive_and_self_contained(tmp_path: Path) -> None:
    out = cubepool.plot(EXAMPLE, ["default", "sub_slices"], tmp_path / "m.html", limit="40MiB")
    text = out.read_text(encoding="utf-8")
    for needle in ("mousemove", "wheel", "dblclick", "resize", "cubepool-reset"):
        assert needle in text
    data = page_payload(out)
    panels = data["panels"]
    assert isinstance(panels, list) and [p["label"] for p in panels] == ["default", "sub_slices"]
    assert [p["complete"] for p in panels] == [True, False]
    assert "INCOMPLETE" in panels[1]["title"] and "over the memory limit" in panels[1]["title"]
    pool = panels[0]["pools"][0]
    assert len(pool["values"]) == len(pool["in_use"]) == len(panels[0]["x"])
    assert data["x_label"] == "time (s)" and data["by_event"] is False


def test_a_trace_timed_by_event_index_is_drawn_by_event(tmp_path: Path) -> None:
    events = [(i, "alloc", i, MIB) for i in range(50)]
    numbered = cubepool.Trace.from_events(events, {"workload": "numbered"})
    data = page_payload(cubepool.plot(numbered, "default", tmp_path / "n.html"))
    assert data["x_label"] == "event" and data["by_event"] is True and data["x_max"] == 49


HOSTILE = "<!--<script>x</script><img src=x onerror=alert(1)>&amp;\u2028"


def hostile_trace() -> cubepool.Trace:
    """A trace whose workload, phase and frames hold markup: what a trace someone else
    sent may hold."""
    builder = cubepool.TraceBuilder(
        {"workload": HOSTILE, "phases": [{"name": HOSTILE, "first_event": 0}]}
    )
    builder.alloc(0, 0, 1000, [HOSTILE])
    builder.alloc(1, 1, 5 * MIB, [HOSTILE])
    builder.free(2, 1)
    return builder.finish()


def test_strings_from_the_trace_cannot_break_out_of_the_pages_data(tmp_path: Path) -> None:
    out = cubepool.plot(hostile_trace(), ["torch"], tmp_path / "h.html", title=HOSTILE)
    text = out.read_text(encoding="utf-8")
    start = text.index('id="cubepool-data">') + len('id="cubepool-data">')
    raw = text[start : text.index("</script>", start)]
    # "<!--" then "<script" inside a script element make the HTML parser take the
    # element's own end tag as text, and the page's scripts with it: the data holds no
    # markup character at all, and the hostile strings come back whole from the JSON.
    assert not {"<", ">", "&"} & set(raw)
    data = json.loads(raw)
    assert data["heading"] == HOSTILE and data["phases"][0][0] == HOSTILE
    view = data["at_peak"][0]
    stack = view["stacks"][view["frames"]["0"]]
    assert [view["frame_texts"][i] for i in stack] == [HOSTILE]
    # Outside the data, the strings are escaped text: no markup of theirs is left.
    assert "<img" not in text and text.count("<script") == 3


def test_the_svg_stays_xml_whatever_characters_the_trace_names(tmp_path: Path) -> None:
    import xml.dom.minidom

    builder = cubepool.TraceBuilder(
        {"workload": "w\x01x", "phases": [{"name": "a\x0cb<&>", "first_event": 0}]}
    )
    builder.alloc(0, 0, 1000)
    trace = builder.finish()
    out = cubepool.plot(trace, ["torch"], tmp_path / "c.svg", title="t\x1b\ufffe")
    svg = xml.dom.minidom.parse(str(out))  # control characters are no XML, even escaped
    texts = [t.firstChild.data for t in svg.getElementsByTagName("text") if t.firstChild]
    assert "t\ufffd\ufffd" in texts and "a\ufffdb<&>" in texts


def test_pool_colours_are_distinct_for_any_number_of_pools() -> None:
    from cubepool.plot import pool_color

    colours = [pool_color(i) for i in range(64)]
    assert len(set(colours)) == 64
    assert all(len(c) == 7 and c.startswith("#") for c in colours)


def test_the_static_svg_makes_room_for_a_long_legend(tmp_path: Path) -> None:
    pools = "; ".join(
        f"sliced(page={1 << i}MiB, max_slice={1 << i}MiB, cap={1 << i}MiB)" for i in range(6)
    )
    layout = cubepool.MemoryConfiguration.parse(pools + "; exclusive(max_alloc=2GiB)")
    many = cubepool.Trace.from_events(
        [(i, "alloc", i, (1 << (i % 7)) * MIB - 1) for i in range(14)], {"workload": "many"}
    )
    svg = cubepool.plot(many, layout, tmp_path / "m.svg").read_text()
    height = float(svg.split('height="', 1)[1].split('"', 1)[0])
    legend_rows = svg.count('font-size="10">pool ')
    assert legend_rows == 7 and height >= 18 + (legend_rows + 3) * 15 + 28


def test_a_png_without_matplotlib_fails_before_any_replay(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "matplotlib" else real(name, *a),
    )
    calls: list[object] = []
    monkeypatch.setattr("cubepool.cli.replay", lambda *a, **k: calls.append(a))
    code, _, err = run(capsys, "plot", "--example", EXAMPLE, "--out", str(tmp_path / "m.png"))
    assert code == 1 and "needs matplotlib" in err and not calls
    with pytest.raises(ImportError, match="needs matplotlib"):
        cubepool.plot(EXAMPLE, out=tmp_path / "m.png")


def test_cli_plan_compares_under_the_limit_it_is_given(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, "plan", "--example", EXAMPLE, "--limit", "16MiB", "--no-progress")
    assert code == 3 and "incomplete" in out and "over the memory limit" in out


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("/dev/zero", "a character device, not a regular file"),
        ("/no/such/layout.json", "no such layout file"),
    ],
)
def test_a_config_file_that_cannot_be_read_is_named_as_the_flags_value(
    capsys: pytest.CaptureFixture[str], value: str, why: str
) -> None:
    # Every other --config error named the flag; a file's did not.
    code, _, err = run(capsys, "replay", "--example", EXAMPLE, "--config", value)
    assert code == 1 and err.strip() == f"cubepool: --config {value}: {why}"


def test_cli_plan_ranks_its_table_by_the_objective_it_is_given(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The table under the plan was ranked by bytes whatever --objective said.
    code, out, _ = run(
        capsys, "plan", "--example", EXAMPLE, "--objective", "storage_allocations", "--no-progress"
    )
    assert code == 0
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("layout "))
    rows = []
    for line in lines[head + 2 :]:
        if not line.strip():
            break
        rows.append(line)
    calls = [int(row.split()[7].replace(",", "")) for row in rows]
    assert len(rows) >= 3 and calls == sorted(calls), out


# --------------------------------------------------------------------------- rough edges
# (each rough edge a new user met, named for what is fixed)


def test_memory_summary_labels_cached_free_bytes_as_releasable() -> None:
    mm = cubepool.MemoryManagement()
    handles = [mm.reserve(MIB) for _ in range(64)]
    del handles
    mm.reserve(0)  # an operation: the dropped handles go back
    summary = mm.memory_summary()
    # PyTorch's "Non-releasable memory" is what empty_cache() cannot give back; these
    # bytes are free and cleanup() gives them back, so the row must not say that.
    assert "Non-releasable" not in summary
    row = next(line for line in summary.splitlines() if "Free cached memory" in line)
    assert row.split("|")[2].strip() == "65536 KiB"
    mm.cleanup()
    after = mm.memory_summary()
    row = next(line for line in after.splitlines() if "Free cached memory" in line)
    assert row.split("|")[2].strip() == "0 KiB"  # in the unit of the row's peak
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    assert "mm.cleanup()" in readme


def test_load_trace_takes_a_bundled_examples_name() -> None:
    by_name = cubepool.load_trace("transformer-train")
    by_path = cubepool.load_trace(cubepool.examples.path("transformer-train"))
    assert by_name.to_jsonl() == by_path.to_jsonl()
    assert cubepool.load_trace("example:gpt2-generate").workload == "gpt2-generate"
    with pytest.raises(FileNotFoundError):
        cubepool.load_trace("no-such-example")


def test_every_io_error_names_its_file(
    capsys: pytest.CaptureFixture[str], trace: cubepool.Trace, tmp_path: Path
) -> None:
    missing = tmp_path / "no" / "such"
    tensor = cubepool.empty((2,), "float32")
    calls = [
        lambda: trace.write(missing / "out.jsonl"),
        lambda: cubepool.save_tensor(tensor, missing / "t.bin"),
        lambda: cubepool.save_tensor_to_file(tensor, missing / "t.bin"),
        lambda: cubepool.save_param_dict_to_file({"w": tensor}, missing / "p.bin"),
        lambda: cubepool.load_tensor(missing / "t.bin"),
        lambda: cubepool.load_tensor_from_file(missing / "t.bin"),
        lambda: cubepool.load_param_dict(missing / "p.bin"),
        lambda: cubepool.load_param_dict_from_file(missing / "p.bin"),
    ]
    for call in calls:
        with pytest.raises(FileNotFoundError) as info:
            call()
        assert info.value.filename is not None and str(missing) in info.value.filename
        assert "os error" not in str(info.value)
    out = missing / "out.jsonl"
    code, _, err = run(capsys, "convert", "--example", EXAMPLE, str(out))
    assert code == 1 and err == f"cubepool: {out}: No such file or directory\n"


@pytest.mark.skipif(sys.platform != "linux", reason="file-size limits as Linux sets them")
def test_a_full_disk_names_the_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    # A file-size limit makes writes fail with EFBIG ("File too large"), as a full disk
    # fails them with ENOSPC: the same path through the code.
    script = (
        "import resource, signal, sys, cubepool\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))\n"
        "trace = cubepool.load_trace('gpt2-train')\n"
        "try:\n"
        "    trace.write(sys.argv[1])\n"
        "except OSError as error:\n"
        "    print(error.errno, error.filename, error.strerror)\n"
    )
    target = tmp_path / "big.jsonl"
    done = subprocess.run(
        [sys.executable, "-c", script, str(target)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    number, filename, strerror = done.stdout.strip().split(" ", 2)
    assert int(number) in (errno.EFBIG, errno.ENOSPC) and filename == str(target), done.stdout
    assert "os error" not in strerror
    assert os.listdir(tmp_path) == [], "neither the target nor a temporary is left"


@pytest.mark.skipif(sys.platform != "linux", reason="the check of a process id reads /proc")
def test_a_killed_write_leaves_nothing_after_the_next_write(tmp_path: Path) -> None:
    target = tmp_path / "out.jsonl"
    script = (
        "import sys, cubepool\n"
        "trace = cubepool.load_trace('transformer-train')\n"
        "print('ready', flush=True)\n"
        "while True:\n"
        "    trace.write(sys.argv[1])\n"
    )
    writer = subprocess.Popen(
        [sys.executable, "-c", script, str(target)], stdout=subprocess.PIPE, text=True
    )
    assert writer.stdout is not None and writer.stdout.readline() == "ready\n"
    time.sleep(0.5)
    writer.kill()  # SIGKILL: no handler runs, as when a job is killed
    writer.wait()
    writer.stdout.close()
    cubepool.load_trace("gpt2-generate").write(target)
    assert sorted(os.listdir(tmp_path)) == ["out.jsonl"]
    assert cubepool.load_trace(target).workload == "gpt2-generate"


def test_bad_bound_variables_give_a_one_line_error() -> None:
    for name, value in (
        ("CUBEPOOL_MAX_IMPORT_BYTES", "abc"),
        ("CUBEPOOL_MAX_IMPORT_EVENTS", "-1"),
        ("CUBEPOOL_MAX_IMPORT_EVENTS", "\u00b2"),  # a digit to str.isdigit, not to int()
    ):
        env = {**os.environ, name: value}
        python = (
            "import cubepool\n"
            "try:\n"
            "    cubepool.load_trace('gpt2-generate')\n"
            "except cubepool.InvalidArgument as error:\n"
            "    print(error)\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", python], env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0 and done.stderr == "", done.stderr
        assert done.stdout == f"{name}={value!r} is not a positive integer (unset it for the " + (
            "default, 1,073,741,824)\n" if name.endswith("BYTES") else "default, 4,000,000)\n"
        )
        cli = subprocess.run(
            [sys.executable, "-m", "cubepool.cli", "replay", "--example", EXAMPLE],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert cli.returncode == 1 and "Traceback" not in cli.stderr
        assert cli.stderr.count("\n") == 1 and name in cli.stderr


def test_long_numbers_are_cut_in_error_messages() -> None:
    digits = "9" * 100_000
    with pytest.raises(cubepool.PoolConfigError) as config:
        cubepool.MemoryConfiguration.parse(f"sliced(page={digits}, max_slice=1MiB)")
    with pytest.raises(cubepool.InvalidArgument) as text:
        cubepool.parse_size(digits)
    with pytest.raises(cubepool.InvalidArgument) as number:
        cubepool.parse_size(10**100_000)
    for info in (config, text, number):
        assert len(str(info.value)) < 300, len(str(info.value))
    assert "(100000 bytes)" in str(text.value)
    assert "332193-bit integer" in str(number.value)
    with pytest.raises(cubepool.InvalidArgument, match="non-negative"):
        cubepool.parse_size(-(10**100))


@pytest.mark.skipif(sys.platform != "linux", reason="address-space limits as Linux sets them")
def test_the_capacity_error_quotes_the_address_space_granted() -> None:
    script = (
        "import resource\n"
        "resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))\n"
        "import cubepool\n"
        "mm = cubepool.MemoryManagement()\n"
        "try:\n"
        "    mm.reserve(6 << 30)\n"
        "except cubepool.PoolCapacityExceeded as error:\n"
        "    print(error.capacity)\n"
        "    print(error)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    capacity, message = done.stdout.strip().split("\n", 1)
    assert int(capacity) < 4 << 30, "what the host granted, under the 4 GiB limit"
    assert "TiB" not in message and ("GiB in use" in message or "MiB in use" in message)


def test_a_granule_the_storage_cannot_map_is_refused_when_built() -> None:
    layout = cubepool.MemoryConfiguration.custom(
        [cubepool.MemoryPoolOptions(cubepool.PoolType.virtual_pages(1))]
    )
    with pytest.raises(cubepool.PoolConfigError) as info:
        cubepool.MemoryManagement(layout)
    assert info.value.kind == "GranuleNotOfStorage" and info.value.field == "granule"
    assert "granule (64 B)" in str(info.value) and "4 KiB" in str(info.value)
    mm = cubepool.MemoryManagement()
    with pytest.raises(cubepool.PoolConfigError, match="mapping granularity"):
        mm.install_pools(layout)


def test_lenient_says_it_does_not_apply_to_v1_traces(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run(capsys, "replay", "--example", EXAMPLE, "--lenient")
    assert code == 0 and "--lenient" in err and "read strictly" in err
    code, _, err = run(capsys, "replay", "--example", EXAMPLE)
    assert "--lenient" not in err


def test_an_unsupported_trace_version_is_named_plainly(tmp_path: Path) -> None:
    path = tmp_path / "v2.jsonl"
    path.write_text('{"format":"cubepool-trace","version":2}\n')
    with pytest.raises(cubepool.TraceFormatError) as info:
        cubepool.load_trace(path)
    assert "unsupported trace version 2:" in str(info.value) and "Some(" not in str(info.value)


def test_size_errors_speak_the_users_units() -> None:
    with pytest.raises(cubepool.PoolConfigError) as info:
        cubepool.MemoryConfiguration.parse("sliced(page=8MiB, max_slice=16MiB)")
    assert "max_slice_size (16 MiB) is larger than page_size (8 MiB)" in str(info.value)
    with pytest.raises(cubepool.BufferTooBig) as too_big:
        cubepool.MemoryManagement("exclusive(max_alloc=1MiB)").reserve(3 * MIB)
    assert "3.0 MiB (3145728 bytes)" in str(too_big.value) and "1.0 MiB" in str(too_big.value)


def test_import_reports_give_human_sizes(tmp_path: Path) -> None:
    from test_experiments import profiler_file

    _, report = cubepool.load_trace_with_report(profiler_file(tmp_path / "p.json"), device=0)
    assert report is not None
    assert "(64 B)" in report.summary() and " B)" in report.summary()
    big = dataclasses.replace(report, live_before_bytes=226_512_384)
    assert "(216.0 MiB)" in big.summary() and "226512384" not in big.summary()
    big = dataclasses.replace(report, unmatched_frees=1, unmatched_free_bytes=3 << 30)
    assert "dropped 1 frees without a live allocation (3.0 GiB)" in big.summary()


def test_usage_errors_print_the_error_first_and_a_short_hint(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["replay", "--example", EXAMPLE, "--bogus"])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert err.splitlines() == [
        "cubepool: error: unrecognized arguments: --bogus",
        "(see 'cubepool --help')",
    ]


def test_a_negative_limit_is_refused_as_a_size(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["replay", "--example", EXAMPLE, "--limit", "-5MiB"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "expected one argument" not in err
    assert err.startswith('cubepool replay: error: argument --limit: size: "-5MiB" is not a size')


def test_the_cli_takes_device_0_as_python_takes_device_0(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from test_experiments import profiler_file

    prof = profiler_file(tmp_path / "p.json")
    python = cubepool.load_trace(prof, device=0)
    assert python.to_jsonl() == cubepool.load_trace(prof, device="cuda:0").to_jsonl()
    code, numbered, _ = run(capsys, "replay", str(prof), "--device", "0", "--json")
    code_named, named, _ = run(capsys, "replay", str(prof), "--device", "cuda:0", "--json")
    assert code == code_named == 0
    assert json.loads(numbered)["events"] == json.loads(named)["events"] == len(python)


def test_convert_takes_an_example(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "g.jsonl.gz"
    code, printed, _ = run(capsys, "convert", "--example", EXAMPLE, str(out))
    assert code == 0 and printed.startswith(f"wrote {out}")
    assert cubepool.load_trace(out).to_jsonl() == cubepool.load_trace(EXAMPLE).to_jsonl()


def test_from_events_takes_a_three_tuple_free() -> None:
    three = cubepool.Trace.from_events([(1, "alloc", 7, 64), (2, "free", 7)], {"workload": "w"})
    four = cubepool.Trace.from_events([(1, "alloc", 7, 64), (2, "free", 7, 0)], {"workload": "w"})
    assert three.to_jsonl() == four.to_jsonl()
    with pytest.raises(cubepool.TraceFormatError, match="an alloc needs a size"):
        cubepool.Trace.from_events([(1, "alloc", 7)])


def test_virtual_pools_count_mapped_runs_not_pages(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "replay", "--example", EXAMPLE, "--config", "virtual_pages")
    row = next(line for line in out.splitlines() if line.lstrip().startswith("0  virtual"))
    assert code == 0 and row.endswith(" mapped runs")
    code, out, _ = run(capsys, "replay", "--example", EXAMPLE, "--config", "compact")
    assert code == 0 and "mapped runs" not in out


def test_tables_keep_the_utilization_column_aligned_when_a_row_is_incomplete() -> None:
    from cubepool._format import table

    text = table(["layout", "utilization"], [["a", "0.971"], ["b", "incomplete"]])
    rows = text.splitlines()[2:]
    assert [len(row) for row in rows] == [len(rows[1])] * 2, text
    assert rows[0].endswith("0.971") and rows[1].endswith("incomplete")


def _panel_tops(svg: str) -> list[str]:
    """The top y tick label of each panel of a static picture."""
    tops = []
    for chunk in svg.split('fill="none" stroke="#999"')[1:]:
        labels = re.findall(r'text-anchor="end">([^<]*)<', chunk.split("<polygon")[0])
        tops.append(labels[-1])
    return tops


def test_each_panel_has_its_own_y_scale_unless_shared(tmp_path: Path) -> None:
    layouts = ["default", "exclusive_pages"]
    own = cubepool.plot(EXAMPLE, layouts, tmp_path / "own.svg").read_text(encoding="utf-8")
    shared = cubepool.plot(EXAMPLE, layouts, tmp_path / "s.svg", y_scale="shared")
    tops = _panel_tops(own)
    assert len(tops) == 2 and tops[0] != tops[1], tops
    assert len(set(_panel_tops(shared.read_text(encoding="utf-8")))) == 1
    data = page_payload(cubepool.plot(EXAMPLE, layouts, tmp_path / "own.html"))
    panels = data["panels"]
    assert isinstance(panels, list) and panels[0]["y_max"] != panels[1]["y_max"]
    with pytest.raises(cubepool.InvalidArgument, match="y_scale"):
        cubepool.plot(EXAMPLE, layouts, tmp_path / "x.svg", y_scale="log")


def test_report_and_plot_take_shared_y(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # The README says --shared-y of the report's picture; report refused the flag.
    two = ["--config", "default", "--config", "exclusive_pages"]
    for command, extra in (("report", ["--no-plan", "--no-progress"]), ("plot", two)):
        out = tmp_path / f"{command}.svg"
        code, _, _ = run(
            capsys, command, "--example", EXAMPLE, *extra, "--out", str(out), "--shared-y"
        )
        assert code == 0
        tops = _panel_tops(out.read_text(encoding="utf-8"))
        assert len(tops) >= 2 and len(set(tops)) == 1, (command, tops)


def test_phase_labels_do_not_overlap(tmp_path: Path) -> None:
    events = [(i, "alloc", i, MIB) for i in range(400)]
    phases = [
        {"name": "setup", "first_event": 0, "t": 0},
        {"name": "reserve", "first_event": 2, "t": 2},
        {"name": "step0", "first_event": 200, "t": 200},
    ]
    short = cubepool.Trace.from_events(events, {"workload": "short", "phases": phases})
    svg = cubepool.plot(short, "default", tmp_path / "p.svg").read_text(encoding="utf-8")
    placed = {
        name: (float(x), float(y))
        for x, y, name in re.findall(
            r'<text x="([\d.]+)" y="([\d.]+)" fill="#555" font-size="9">([^<]*)<', svg
        )
    }
    assert set(placed) == {"setup", "reserve", "step0"}
    # "setup" and "reserve" start 2 events apart: one goes a row up.
    assert placed["setup"][1] != placed["reserve"][1]
    assert placed["setup"][1] == placed["step0"][1]


def test_an_empty_traces_axis_shows_whole_bytes(tmp_path: Path) -> None:
    empty = cubepool.Trace.from_events([], {"workload": "empty"})
    svg = cubepool.plot(empty, "default", tmp_path / "e.svg").read_text(encoding="utf-8")
    y_labels = re.findall(r'text-anchor="end">([^<]*)<', svg)
    x_labels = re.findall(r'text-anchor="middle" font-size="9">([^<]*)<', svg)
    assert y_labels == ["0", "1"] and all("." not in label for label in x_labels), svg


def test_a_trace_has_one_name_in_the_cli_and_in_python(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # A file whose name is not its workload (a converted or renamed trace) goes by its
    # workload everywhere once read: the command line, compare, plot and sweep.
    renamed = tmp_path / "renamed.jsonl"
    cubepool.load_trace(EXAMPLE).write(renamed)
    code, out, _ = run(capsys, "replay", str(renamed))
    assert code == 0 and out.startswith(f"trace {EXAMPLE}:")
    assert cubepool.compare(renamed, "default").trace == EXAMPLE
    assert cubepool.compare(cubepool.load_trace(renamed), "default").trace == EXAMPLE
    swept = cubepool.sweep([renamed], ["default"], max_workers=1)
    assert [row.trace for row in swept.rows] == [EXAMPLE]
    assert "__workload__" not in swept.rows[0].result
    heading = page_payload(cubepool.plot(renamed, "default", tmp_path / "r.html"))["heading"]
    assert heading == f"{EXAMPLE}: memory over time"
    # A name the caller gives wins.
    assert cubepool.sweep({"mine": renamed}, ["default"], max_workers=1).rows[0].trace == "mine"


def test_cli_describes_a_layout_as_the_device_replays_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Pages past the device's largest are shrunk to it in the replay, and said so in the
    layout's line (it said the pages asked for, beside a pool table of the smaller)."""
    layout = "sliced(page=4GiB, max_slice=1KiB)"
    _, out, _ = run(capsys, "replay", "--example", EXAMPLE, "--config", layout)
    assert f"layout {layout} (from --config): sliced 2 GiB pages" in out
    _, out, _ = run(
        capsys, "replay", "--example", EXAMPLE, "--config", layout, "--max-page-size", "8GiB"
    )
    assert f"layout {layout} (from --config): sliced 4 GiB pages" in out


@pytest.mark.skipif(sys.platform != "linux", reason="stale temporaries are told by /proc")
def test_a_killed_python_write_is_cleaned_by_the_next_save_on_this_host_only(
    trace: cubepool.Trace, tmp_path: Path
) -> None:
    # A Python write killed inside `atomic_path` leaves its temporary, named with this
    # host as the Rust side names its own; the next save of that path (Rust's) removes
    # it, and leaves one of the same pid from another host sharing the folder.
    target = tmp_path / "out.jsonl"
    killed = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, sys\n"
            "from cubepool._files import atomic_path\n"
            "with atomic_path(sys.argv[1]) as temporary:\n"
            "    temporary.write_text('half a trace')\n"
            "    os._exit(0)\n",
            str(target),
        ],
        check=True,
    )
    assert killed.returncode == 0
    (left,) = tmp_path.iterdir()
    assert left.name.endswith(f".{host_tag()}.tmp"), left.name
    elsewhere = left.with_name(left.name.replace(f".{host_tag()}.tmp", f".{host_tag()}x.tmp"))
    elsewhere.write_text("another host's save in progress")
    trace.write(target)
    assert sorted(path.name for path in tmp_path.iterdir()) == [elsewhere.name, "out.jsonl"]
    assert cubepool.load_trace(target).to_jsonl() == trace.to_jsonl()


def test_a_progress_that_is_no_callable_is_refused_by_name_before_the_work() -> None:
    # plan(progress=5) and sweep(progress=5) ran their first wave or job and then failed
    # with "'int' object is not callable", naming nothing (helper-143's find).
    trace = one_big(3 * MIB)
    for run in (
        lambda: cubepool.plan(trace, progress=5, workers=1),  # type: ignore[arg-type]
        lambda: cubepool.sweep([trace], ["default"], progress=5),  # type: ignore[arg-type]
    ):
        with pytest.raises(TypeError, match="progress must be True, False, None or a callable"):
            run()

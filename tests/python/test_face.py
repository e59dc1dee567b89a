"""The Python face (issue 20): one rule for layouts and traces, one size grammar, honest
figures under limits, the command line as a shell user meets it."""

from __future__ import annotations

import io
import json
import math
import os
import struct
import sys
from pathlib import Path

import pytest

import cubepool
from cubepool.cli import main
from cubepool.compare import failure_text

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


def test_sweep_takes_one_trace_one_layout_and_device(tmp_path: Path) -> None:
    from test_experiments import profiler_file

    result = cubepool.sweep(EXAMPLE, "sub_slices", max_workers=1)
    assert [(r.trace, r.layout) for r in result.rows] == [(EXAMPLE, "sub_slices")]
    prof = profiler_file(tmp_path / "prof.json")
    with pytest.raises(cubepool.TraceSelectionError):
        cubepool.sweep([prof], "default", max_workers=1)
    picked = cubepool.sweep([prof], "default", max_workers=1, device="cuda:0")
    assert picked.rows[0].result["events"] > 0
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
    assert over.failures["over_limit"] == 1
    assert "over the memory limit" in failure_text(over.failures)


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
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and cubepool.__version__ in capsys.readouterr().out
    for argv in (
        ["sweep", EXAMPLE, "--workers", "0"],
        ["sweep", EXAMPLE, "--metric", "utilisation"],
        ["replay", "--example", EXAMPLE, "--limit", "2g"],
    ):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2, argv
    capsys.readouterr()
    code, _, err = run(capsys, "replay", str(tmp_path / "missing.jsonl"))
    assert code == 1 and err == f"cubepool: {tmp_path / 'missing.jsonl'}: no such trace file\n"
    code, _, err = run(capsys, "compare", "--example", EXAMPLE, "--config", "x/best.json")
    assert code == 1 and "x/best.json: no such layout file" in err


def test_cli_convert_refuses_a_csv_name(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"name it \.jsonl"):
        main(["convert", str(cubepool.examples.path(EXAMPLE)), str(tmp_path / "out.csv")])
    assert not (tmp_path / "out.csv").exists()


def test_cli_checks_the_picture_path_before_any_work(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[object] = []
    monkeypatch.setattr("cubepool.cli.replay", lambda *a, **k: calls.append(a))
    code, _, err = run(capsys, "plot", "--example", EXAMPLE, "--out", str(tmp_path / "x.txt"))
    assert code == 1 and "cannot draw a picture as .txt" in err and not calls
    code, _, err = run(capsys, "plot", "--example", EXAMPLE, "--out", str(tmp_path / "no/x.html"))
    assert code == 1 and "no such folder" in err and not calls
    monkeypatch.undo()
    code, out, _ = run(capsys, "plot", "--example", EXAMPLE, "--out", str(tmp_path / "x"))
    assert code == 0 and out.strip() == f"wrote {tmp_path / 'x.html'}"
    assert (tmp_path / "x.html").exists()


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
    code, _, err = run(capsys, "replay", str(prof))
    assert code == 1 and "--device" in err and "device=" not in err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"format":"cubepool-trace","version":1}\n[1, "alloc"]\n')
    code, _, err = run(capsys, "replay", str(bad))
    assert code == 1 and "strict=False" not in err


def test_sweep_cli_takes_device(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from test_experiments import profiler_file

    prof = profiler_file(tmp_path / "p.json")
    code, out, _ = run(capsys, "sweep", str(prof), "--device", "cuda:0", "--workers", "1")
    assert code == 0 and "p" in out


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

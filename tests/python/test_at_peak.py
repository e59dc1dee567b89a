"""Why reserved exceeds live (``ReplayResult.at_peak()``, ``cubepool replay --at-peak``,
the report's section and the HTML page's view), and ``ReplayResult`` pickling.

The view of a small trace through the model of PyTorch's caching allocator is checked
against values worked out by hand from the allocator's rules (requests of at most 1 MiB
rounded up to 512 B in 2 MiB segments; larger ones under 10 MiB in 20 MiB segments).
"""

from __future__ import annotations

import json
import math
import pickle
import re
from pathlib import Path
from typing import Any

import pytest

import cubepool
from cubepool import InvalidArgument, ReplayResult, Trace, load_trace, replay
from cubepool.cli import main

MiB = 1 << 20


def hand_trace() -> Trace:
    """a0 = 1000 B, a1 = 3000 B, a2 = 5 MiB, free a2, a3 = a4 = 1 MiB."""
    return Trace.from_events(
        [
            (0, "alloc", 0, 1000),
            (1, "alloc", 1, 3000),
            (2, "alloc", 2, 5 * MiB),
            (3, "free", 2),
            (4, "alloc", 3, MiB),
            (5, "alloc", 4, MiB),
        ]
    )


def test_at_peak_of_the_torch_model_is_the_gap_worked_out_by_hand() -> None:
    # a0 and a1 round to 1024 and 3072 B in a 2 MiB small segment; a2 takes a 20 MiB
    # segment, which stays cached (idle) once freed; a3 fits in the first segment's
    # 2 MiB - 4 KiB free bytes, a4 no longer does: a second 2 MiB segment, the peak of
    # 2 + 20 + 2 = 24 MiB after event 5.
    trace = hand_trace()
    result = replay(trace, "torch")
    assert (result.peak_reserved, result.peak_reserved_event) == (24 * MiB, 5)
    view = result.at_peak()
    assert (view.event, view.reserved, view.replayed) == (5, 24 * MiB, "torch")
    assert view.requested == 1000 + 3000 + 2 * MiB
    assert view.live == 1024 + 3072 + 2 * MiB
    assert view.rounding == 24 + 72
    assert view.idle == 20 * MiB
    # First segment: 2 MiB - 1 MiB - 4 KiB free; second: 1 MiB free.
    assert view.free_in_pinned == (MiB - 4096) + MiB
    assert (
        view.gap
        == view.reserved - view.requested
        == (view.free_in_pinned + view.rounding + view.idle)
    )
    assert (view.pinned_segments, view.idle_segments) == (2, 1)
    sizes = sorted((s.size, s.live, s.free, len(s.blocks)) for s in view.segments)
    assert sizes == [
        (2 * MiB, MiB, MiB, 1),
        (2 * MiB, MiB + 4096, MiB - 4096, 3),
        (20 * MiB, 0, 20 * MiB, 0),
    ]
    blocks = sorted((b.id, b.size, b.requested) for s in view.segments for b in s.blocks)
    assert blocks == [(0, 1024, 1000), (1, 3072, 3000), (3, MiB, MiB), (4, MiB, MiB)]
    assert all(b.frames is None for s in view.segments for b in s.blocks)
    text = view.text(top=1)
    assert "24.0 MiB in 3 segments" in text
    assert "1 idle segments" in text and "(1 of 2)" in text


@pytest.mark.parametrize("layout", ["default", "sub_slices", "exclusive_pages", "torch_expandable"])
def test_at_peak_adds_up_for_every_layout_on_a_bundled_trace(layout: str) -> None:
    trace = load_trace("gpt2-train")
    result = replay(trace, layout)
    view = result.at_peak()
    d = view.to_dict()
    assert d["reserved"] == result.peak_reserved == sum(s["size"] for s in d["segments"])
    assert d["event"] == result.peak_reserved_event
    # Every live block at the peak is in the view, once (blocks spanning runs of a
    # virtual range are split, their requests too).
    live = sum(b["requested"] for s in d["segments"] for b in s["blocks"])
    assert live == d["requested"]
    assert d["reserved"] - d["requested"] == d["free_in_pinned"] + d["rounding"] + d["idle"]
    for s in d["segments"]:
        assert s["live"] + s["free"] == s["size"]
        assert s["live"] == sum(b["size"] for b in s["blocks"])


@pytest.mark.parametrize("layout", ["default", "sub_slices", "exclusive_pages", "compact"])
def test_at_peak_rounding_is_the_pools_padding_at_the_peak(layout: str) -> None:
    # The bytes live blocks span beyond their requests are rounding, as the pools book
    # them (``bytes_padding``): the view read each block's request as its size, so every
    # layout of cubepool's showed 0 B rounding and counted the padding free (helper-143's
    # find). The same events through memory management, up to the peak, give the figure.
    trace = load_trace("gpt2-train")
    view = replay(trace, layout).at_peak()
    mm = cubepool.MemoryManagement(layout)
    held = {}
    for _, kind, id_, size in trace.events()[: view.event + 1]:
        if kind == "alloc":
            held[id_] = mm.reserve(size)
        elif kind == "free":
            del held[id_]
    padding = mm.memory_usage().bytes_padding
    assert padding > 0
    assert view.rounding == padding
    assert view.live == view.requested + padding


def test_at_peak_counts_a_block_of_an_exclusive_page_padded_to_the_alignment() -> None:
    # 100 B on a page of its own spans 128 B at the default alignment: 28 B rounding, the
    # rest of the page free.
    trace = Trace.from_events([(0, "alloc", 1, 100)])
    view = replay(trace, "exclusive_pages").at_peak()
    assert (view.requested, view.live, view.rounding) == (100, 128, 28)
    assert view.free_in_pinned == view.reserved - 128


def test_at_peak_refuses_a_partial_replay_and_another_trace() -> None:
    trace = hand_trace()
    config = cubepool.MemoryConfiguration.parse("default")
    partial, _ = cubepool._cubepool.replay_until(trace, config)
    with pytest.raises(InvalidArgument, match="partial replay"):
        partial.at_peak()
    # A dict saved without what it replayed (as results were saved before) reads back,
    # and at_peak says what it lacks.
    saved = {k: v for k, v in replay(trace, "torch").to_dict().items() if k != "replayed"}
    with pytest.raises(InvalidArgument, match='without "replayed"'):
        ReplayResult.from_dict(saved).at_peak(trace)
    result = replay(trace, "torch")
    with pytest.raises(InvalidArgument, match="not the one replayed"):
        result.at_peak(load_trace("gpt2-train"))
    # Same events and peak live bytes, other sizes: the replay tells it apart.
    other = Trace.from_events(
        [
            (0, "alloc", 0, 1000),
            (1, "alloc", 1, 3000),
            (2, "alloc", 2, 5 * MiB),
            (3, "free", 2),
            (4, "alloc", 3, MiB + 4000 - 3000 + 1000),
            (5, "alloc", 4, MiB - 1000),
        ]
    )
    assert (len(other), other.peak_live) == (len(trace), trace.peak_live)
    with pytest.raises(InvalidArgument, match="the trace is not the one replayed"):
        result.at_peak(other)


def dicts_equal(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal, NaN included."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


@pytest.mark.parametrize(
    ("layout", "limit"),
    [("default", None), ("torch", None), ("sub_slices", "200MiB"), ("torch_expandable", "100MiB")],
)
def test_replay_result_pickles_and_reads_back_from_its_dict(layout: str, limit: str | None) -> None:
    trace = load_trace("gpt2-train")
    result = replay(trace, layout, limit=limit)
    back = pickle.loads(pickle.dumps(result))
    assert isinstance(back, ReplayResult)
    assert dicts_equal(back.to_dict(), result.to_dict())
    assert back.complete == result.complete
    assert math.isnan(back.utilization) == math.isnan(result.utilization)
    if result.complete:
        assert back.utilization == result.utilization
    assert [p.kind for p in back.pools] == [p.kind for p in result.pools]
    assert back.timeline.reserved_max == result.timeline.reserved_max
    # From JSON text too, as a result saved to a file is read back.
    again = ReplayResult.from_dict(json.loads(json.dumps(result.to_dict())))
    assert dicts_equal(again.to_dict(), result.to_dict())
    # The pickle holds no trace: at_peak takes it, and gives the same view.
    with pytest.raises(InvalidArgument, match="without its trace"):
        back.at_peak()
    assert back.at_peak(trace).to_dict() == result.at_peak().to_dict()


def test_replay_result_from_dict_names_what_is_wrong() -> None:
    good = replay(hand_trace(), "default").to_dict()
    with pytest.raises(TypeError):
        ReplayResult.from_dict([1, 2])  # type: ignore[arg-type]
    missing = {k: v for k, v in good.items() if k != "peak_live"}
    with pytest.raises(InvalidArgument, match="peak_live"):
        ReplayResult.from_dict(missing)
    with pytest.raises(InvalidArgument, match="failures add up"):
        ReplayResult.from_dict({**good, "failed_reserves": 3})
    # Counts that add up past 2^64 - 1 (a PanicException: attempt to add with overflow).
    huge = {"too_big": 2**64 - 1, "pools_full": 1, "over_limit": 0}
    with pytest.raises(InvalidArgument, match="failures add up to more than 2"):
        ReplayResult.from_dict({**good, "failures": huge})
    short = json.loads(json.dumps(good))
    short["timeline"]["reserved_end"] = short["timeline"]["reserved_end"][:-1]
    with pytest.raises(InvalidArgument, match="columns differ"):
        ReplayResult.from_dict(short)
    wrong = json.loads(json.dumps(good))
    wrong["pools"][0]["options"] = "exclusive(max_alloc=1MiB)"
    with pytest.raises(InvalidArgument, match="kind"):
        ReplayResult.from_dict(wrong)
    bad_layout = {**good, "replayed": {"layout": "sliced(page=0)"}}
    with pytest.raises(InvalidArgument, match="not a ReplayResult dict"):
        ReplayResult.from_dict(bad_layout)


def test_replay_result_from_dict_refuses_figures_that_do_not_add_up() -> None:
    # A peak_reserved of 1 B read back as a utilization of 356 million, and frees past
    # allocations, a negative time, pools past the whole passed (helper-143's find).
    good = replay(load_trace("gpt2-train"), "default").to_dict()
    pools = json.loads(json.dumps(good["pools"]))
    pools[0]["final_usage"]["bytes_reserved"] += 1
    edits = {
        "peak_reserved": ({"peak_reserved": 1}, "exceeds peak_reserved"),
        "storage_frees": ({"storage_frees": good["storage_allocations"] + 1}, "storage_frees"),
        "seconds": ({"seconds": -1.0}, "seconds must be a time of at least 0"),
        "pools": ({"pools": pools}, "the pools' final usages add up to"),
    }
    for name, (edit, message) in edits.items():
        with pytest.raises(InvalidArgument, match=message):
            ReplayResult.from_dict({**good, **edit})
        assert name in edit
    # Every layout's and model's own dict reads back, complete or not.
    trace = load_trace("gpt2-train")
    for layout in ("default", "sub_slices", "exclusive_pages", "compact", "torch"):
        for limit in (None, "300MiB"):
            result = replay(trace, layout, limit=limit)
            assert ReplayResult.from_dict(result.to_dict()).peak_reserved == result.peak_reserved


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().out


def test_cli_replay_at_peak_prints_the_gap_and_the_pinning_segments(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out = run(
        capsys, "replay", "--example", "gpt2-train", "--config", "torch", "--at-peak", "--top", "2"
    )
    assert code == 0
    view = replay(load_trace("gpt2-train"), "torch").at_peak()
    assert view.text(top=2) in out
    assert f"At its peak (after event {view.event:,}), torch reserves" in out
    assert re.search(r"Pinned segments with the most free bytes \(2 of \d+\)", out)
    code, out = run(capsys, "replay", "--example", "gpt2-train", "--at-peak", "--json")
    data = json.loads(out)
    assert code == 0
    at_peak = data["at_peak"]
    assert at_peak["reserved"] == data["peak_reserved"]
    assert sum(s["size"] for s in at_peak["segments"]) == at_peak["reserved"]


def test_cli_report_has_the_at_peak_section(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(capsys, "report", "--example", "gpt2-train", "--no-plan")
    assert code == 0
    assert "reserves more than is live, at its peak:" in out
    assert "The gap, " in out


def test_html_page_draws_the_address_space_at_the_peak(tmp_path: Path) -> None:
    trace = hand_trace()
    written = cubepool.plot(trace, ["torch", "default"], out=tmp_path / "mem.html")
    text = written.read_text(encoding="utf-8")
    assert 'id="cubepool-peak"' in text and "Why reserved exceeds live" in text
    payload = json.loads(
        text.split('id="cubepool-data">', 1)[1].split("</script>", 1)[0].replace("<\\/", "</")
    )
    views = {v["label"]: v for v in payload["at_peak"]}
    assert set(views) == {"torch (model)", "default"}
    torch = views["torch (model)"]
    assert (torch["reserved"], torch["idle"], torch["rounding"]) == (24 * MiB, 20 * MiB, 96)
    assert sorted(s[2] for s in torch["segments"]) == [2 * MiB, 2 * MiB, 20 * MiB]
    # Blocks are drawn at their offsets inside their segment.
    for _group, _start, size, blocks in torch["segments"]:
        for offset, block_size, requested, _id in blocks:
            assert 0 <= offset and offset + block_size <= size and requested <= block_size


def test_bad_arguments_get_errors_that_name_them(capsys: pytest.CaptureFixture[str]) -> None:
    trace = hand_trace()
    view = replay(trace, "torch").at_peak()
    with pytest.raises(InvalidArgument, match="top must be non-negative"):
        view.text(top=-1)
    assert view.text(top=0) == "\n".join(view.text().splitlines()[:2]) + "\n"
    with pytest.raises(InvalidArgument, match="id must be non-negative"):
        trace.frames(-1)
    with pytest.raises(InvalidArgument, match="past the trace's 5 allocations"):
        trace.frames(1 << 40)
    with pytest.raises(SystemExit) as refused:
        main(["replay", "--example", "gpt2-train", "--at-peak", "--top", "0"])
    assert refused.value.code == 2
    assert "--top: must be at least 1" in capsys.readouterr().err
    # A flag that would change nothing is refused, not ignored.
    for argv, needs in (
        (["--top", "3"], "give --at-peak"),
        (["--at-peak", "--json", "--top", "3"], "without --json"),
        (["--timeline"], "give --json too"),
    ):
        with pytest.raises(SystemExit) as refused:
            main(["replay", "--example", "gpt2-train", *argv])
        assert refused.value.code == 2 and needs in capsys.readouterr().err, argv


def test_a_copied_result_keeps_what_it_replayed() -> None:
    # copy.copy and copy.deepcopy went through the dict, which has no trace: at_peak()
    # on the copy raised (helper-143's find). A result never changes: its copy is itself.
    import copy

    trace = hand_trace()
    result = replay(trace, "default")
    for copied in (copy.copy(result), copy.deepcopy(result)):
        assert copied is result
        assert copied.at_peak().reserved == result.peak_reserved

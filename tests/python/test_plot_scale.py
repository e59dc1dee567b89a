"""Pictures of traces with many phases, events, frames or segments, or with long names:
their size and the work to draw them grow with what is shown, not with its square, nor
with the trace."""

from __future__ import annotations

import html
import itertools
import json
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import cubepool
import cubepool.plot
from cubepool._interactive_peak import (
    MAX_BLOCK_ROWS,
    MAX_BLOCKS_PER_SEGMENT,
    MAX_FRAME_TEXTS,
    MAX_FRAMES_SHOWN,
    MAX_SEGMENTS_SHOWN,
)
from cubepool._terminal import MAX_NAME_CHARS, NAME_TAIL_CHARS, short_name

PLOT = sys.modules["cubepool.plot"]  # the module: cubepool.plot is also the function
ROWS = PLOT._PHASE_LABEL_ROWS
GAP = PLOT._PHASE_LINE_GAP
MIB = 1 << 20
NEEDS_NODE = pytest.mark.skipif(
    shutil.which("node") is None, reason="needs node for the page's scripts"
)
LABEL = re.compile(r'<text x="([\d.]+)" y="([\d.]+)" fill="#555" font-size="9">([^<]*)<')


def crowded(phases: int, *, at_one_time: bool = True) -> cubepool.Trace:
    """A trace of ``phases`` events, each a phase of its own: all starting at event 0
    (``at_one_time``) or one an event."""
    events = [(i, "alloc", i, MIB) for i in range(phases)]
    header = [{"name": f"phase{i}", "first_event": 0 if at_one_time else i} for i in range(phases)]
    return cubepool.Trace.from_events(events, {"workload": "crowded", "phases": header})


def first_fit(xs: list[float], names: list[str], char_px: float) -> list[int]:
    """The placement before rows were capped: the lowest row that has room, however
    many rows that takes (a look at each row a label)."""
    ends: list[float] = []
    rows = []
    for x, name in zip(xs, names, strict=True):
        row = next((r for r, end in enumerate(ends) if x >= end), len(ends))
        if row == len(ends):
            ends.append(0.0)
        ends[row] = x + (len(name) + 1) * char_px
        rows.append(row)
    return rows


def test_phase_rows_are_those_of_first_fit_while_they_fit() -> None:
    rng = random.Random(5)
    for _ in range(200):
        count = rng.randrange(1, 40)
        xs = sorted(rng.uniform(0, 300) for _ in range(count))
        names = ["x" * rng.randrange(1, 12) for _ in range(count)]
        expected = first_fit(xs, names, 5.0)
        rows = PLOT._label_rows(xs, [(len(name) + 1) * 5.0 for name in names], 20)
        if max(expected) < 20:
            assert rows == expected
        else:  # a label with no room in 20 rows is left out, the others as they were
            assert all(r is None or r < 20 for r in rows) and None in rows


def test_phase_labels_look_at_a_bounded_number_of_rows(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # 8,000 phases at one time took a row each, every label looking at every row below
    # it: 32 million looks (0.76 s), and the rows past about 20 were drawn above the
    # panel. Now a label looks at no more than the rows that fit (20 in the SVG), a
    # count of looks that grows with the phases, not their square (2 million before
    # for these 2,000).
    looks = 0
    real = enumerate

    def counting(items: Any, start: int = 0) -> Any:
        nonlocal looks
        for item in real(items, start):
            looks += 1
            yield item

    monkeypatch.setattr(PLOT, "enumerate", counting, raising=False)
    count = 2_000
    cubepool.plot(crowded(count), "default", tmp_path / "p.svg")
    assert looks <= 21 * count, looks


def test_a_crowd_of_phases_keeps_its_labels_in_the_panel(tmp_path: Path) -> None:
    count = 8_000
    svg = cubepool.plot(crowded(count), "default", tmp_path / "p.svg").read_text("utf-8")
    labels = LABEL.findall(svg)
    rows = {float(y) for _, y, _ in labels}
    frame = re.search(r'<rect x="62" y="([\d.]+)" width="\d+" height="([\d.]+)"', svg)
    assert frame is not None
    top, bottom = float(frame[1]), float(frame[1]) + float(frame[2])
    assert len(labels) == len(rows) == ROWS and all(top < y < bottom for y in rows)
    assert f"+{count - ROWS:,} phase names not shown (no room)" in svg
    # One phase line for the one time, not one a phase.
    assert svg.count('stroke-dasharray="4,3"') == 1
    # Phases one an event: as many labels as have room, the rest counted.
    svg = cubepool.plot(crowded(count, at_one_time=False), "default", tmp_path / "q.svg")
    text = svg.read_text("utf-8")
    shown = len(LABEL.findall(text))
    assert ROWS <= shown < count and f"+{count - shown:,} phase names not shown" in text
    # A line every GAP pixels at most (the plot is 682 pixels wide), not one a phase:
    # 8,000 lines 0.09 pixels apart made the SVG of five panels 4 MB, and a line a pixel
    # washed the plot grey.
    line = r'<line x1="([\d.]+)"[^>]*stroke-dasharray="4,3"'
    lines = [float(x) for x in re.findall(line, text)]
    assert 682 / (GAP + 1) < len(lines) <= 682 / GAP + 1
    assert all(b - a >= GAP - 0.05 for a, b in itertools.pairwise(lines))


def test_the_static_picture_of_a_few_phases_has_no_note(tmp_path: Path) -> None:
    svg = cubepool.plot(crowded(ROWS), "default", tmp_path / "p.svg").read_text("utf-8")
    assert len(LABEL.findall(svg)) == ROWS and "not shown" not in svg


def test_phase_names_take_a_few_rows_at_most_in_every_picture() -> None:
    """A crowd of phase names covered the picture with rows of names up to the panel's
    top (20 rows in the static picture, 18 in the page's): at most ROWS now, in both."""
    script = (Path(PLOT.__file__).parent / "_interactive.js").read_text("utf-8")
    assert f"var PHASE_LABEL_ROWS = {ROWS};" in script
    assert f"var PHASE_LINE_GAP = {GAP};" in script


_FAKE_DOM = r"""
// Just enough of a browser to run the page's scripts under node: node fake.js DATA
// SCRIPT... runs each script on the payload in DATA, then moves the pointer over the
// first block of the view at the peak, and prints each panel's SVG and legend texts and
// the tooltip's text.
var all = [];
function el(tag) {
  var node = {tag: tag, style: {}, attrs: {}, children: [], handlers: {}, innerHTML: "",
    textContent: "", clientWidth: 900, className: "",
    appendChild: function (c) { this.children.push(c); return c; },
    addEventListener: function (kind, f) { this.handlers[kind] = f; },
    setAttribute: function (k, v) { this.attrs[k] = v; },
    querySelector: function () { return null; }};
  all.push(node);
  return node;
}
var fs = require("fs");
var ids = {"cubepool-data": el("script"), "cubepool-figure": el("div"),
  "cubepool-static": el("div"), "cubepool-peak": el("div")};
ids["cubepool-data"].textContent = fs.readFileSync(process.argv[2], "utf8");
global.document = {getElementById: function (id) { return ids[id] || null; },
  createElement: el, createElementNS: function (ns, tag) { return el(tag); }, body: el("body")};
global.window = {addEventListener: function () {}, innerWidth: 1000, innerHeight: 800};
process.argv.slice(3).forEach(function (script) { eval(fs.readFileSync(script, "utf8")); });
var out = ids["cubepool-figure"].children.map(function (box) {
  return {svg: box.children[1].innerHTML, legend: box.children[2].children.map(function (c) {
    return c.textContent; })};
});
var hit = all.filter(function (n) { return n.attrs.fill === "transparent"; })[0];
if (hit) hit.handlers.mousemove({clientX: 0, clientY: 0});
var tip = document.body.children[0];
// Each view at the peak: its title and the bars of its picture (their fills, and
// whether dashed).
var peak = ids["cubepool-peak"].children.filter(function (box) {
  return box.className === "peak";
}).map(function (box) {
  var bars = box.children[1].children.map(function (g) {
    return g.tag === "rect" ? "dashed " + g.attrs.fill : "segment";
  });
  return {title: box.children[0].innerHTML, bars: bars};
});
process.stdout.write(JSON.stringify({panels: out, tip: tip ? tip.innerHTML : "", peak: peak}));
"""


def run_page(page: str, tmp_path: Path, *scripts: str) -> dict[str, Any]:
    """What the page's ``scripts`` (file names in the package) draw, run by node on
    ``page``'s payload (see :data:`_FAKE_DOM`)."""
    data = re.search(r'id="cubepool-data">(.*?)</script>', page, re.S)
    assert data is not None
    (tmp_path / "data.json").write_text(data[1], "utf-8")
    (tmp_path / "fake.js").write_text(_FAKE_DOM, "utf-8")
    package = Path(PLOT.__file__).parent
    ran = subprocess.run(
        ["node", str(tmp_path / "fake.js"), str(tmp_path / "data.json")]
        + [str(package / script) for script in scripts],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result: dict[str, Any] = json.loads(ran.stdout)
    return result


@NEEDS_NODE
def test_the_pages_script_keeps_a_crowd_of_phase_labels_in_rows_that_fit(
    tmp_path: Path,
) -> None:
    # The page's script placed each label in a row of its own on every redraw (zoom,
    # pan, resize): 8,000 phases at one time made 8,000 rows, 32 million looks a draw.
    count = 8_000
    page = cubepool.plot(crowded(count), "default", tmp_path / "p.html").read_text("utf-8")
    (panel,) = run_page(page, tmp_path, "_interactive.js")["panels"]
    labels = LABEL.findall(panel["svg"])
    assert len(labels) == len({y for _, y, _ in labels}) == ROWS
    assert all(float(y) > 10 for _, y, _ in labels)  # below the panel's top (10)
    assert panel["svg"].count('stroke-dasharray="4,3"') == 1
    assert f"+{count - ROWS:,} phase names not shown (no room; zoom in)" in panel["legend"]


def shared_stack(blocks: int, frame_chars: int) -> cubepool.Trace:
    """A trace of ``blocks`` allocations, all live at the end, all from one stack of 40
    frames of ``frame_chars`` characters each."""
    frames = [f"model.py:{k}:in layer_{k}_".ljust(frame_chars, "x") for k in range(40)]
    builder = cubepool.TraceBuilder({"workload": "stacks"})
    for i in range(blocks):
        builder.alloc(i, i, 1000 + i % 7, frames)
    return builder.finish()


def test_a_stack_shared_by_many_blocks_is_written_once(tmp_path: Path) -> None:
    # Each block of the view at the peak carried its own copy of its frames: 20,000
    # blocks from one stack of long frames made a 40 MB page (exclusive pages: a segment
    # a block, none merged). Now each distinct frame and stack is written once (for the
    # MAX_SEGMENTS_SHOWN segments drawn of the 2,000).
    blocks = 2_000
    page = cubepool.plot(shared_stack(blocks, 350), "exclusive_pages", tmp_path / "p.html")
    text = page.read_text("utf-8")
    payload = json.loads(re.search(r'id="cubepool-data">(.*?)</script>', text, re.S)[1])
    (view,) = payload["at_peak"]
    assert len(view["frames"]) == min(blocks, MAX_SEGMENTS_SHOWN) and len(view["stacks"]) == 1
    assert len(view["frame_texts"]) == MAX_FRAMES_SHOWN
    assert text.count("in layer_0_") == 1
    assert len(text) < 500_000, len(text)  # 4,161,856 bytes before


@NEEDS_NODE
def test_the_hover_text_of_a_block_shows_its_frames(tmp_path: Path) -> None:
    page = cubepool.plot(shared_stack(3, 40), "exclusive_pages", tmp_path / "p.html")
    tip = run_page(page.read_text("utf-8"), tmp_path, "_interactive.js", "_interactive_peak.js")
    frames = re.findall(r"&nbsp;&nbsp;(model\.py:\d+:in layer_\d+_x*)", tip["tip"])
    assert frames == [f"model.py:{k}:in layer_{k}_".ljust(40, "x") for k in range(8)], tip


def test_the_command_line_names_ten_phases_of_a_trace(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # The line that opens replay, compare, plan and report listed every phase: 10,000
    # phases made one line of 108,964 characters.
    from cubepool.cli import main

    path = tmp_path / "crowded.jsonl"
    crowded(10_000, at_one_time=False).write(path)
    assert main(["replay", str(path)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.endswith(
        "; phases phase0, phase1, phase2, phase3, phase4, phase5, phase6, "
        "phase7, phase8, phase9 and 9,990 more"
    ), first
    few = tmp_path / "few.jsonl"
    crowded(3).write(few)
    assert main(["replay", str(few)]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith("; phases phase0, phase1, phase2")


def page_panel(trace: cubepool.Trace, tmp_path: Path) -> dict[str, Any]:
    """The one panel the page's script draws of ``trace`` (its SVG and legend texts)."""
    page = cubepool.plot(trace, "default", tmp_path / "p.html").read_text("utf-8")
    (panel,) = run_page(page, tmp_path, "_interactive.js")["panels"]
    return panel


Box = tuple[str, float, float, float, float]
"""A text's box on the page: (text, left, right, top, bottom)."""


def name_boxes(svg: str) -> list[Box]:
    """Each phase name the page drew: (name, left, right, top, bottom), by the width
    estimate (at or over DejaVu Sans', see test_plot_layout)."""
    boxes = []
    for x, y, name in LABEL.findall(svg):
        name = html.unescape(name)
        left, base = float(x), float(y)
        boxes.append((name, left, left + PLOT._text_px(name, 9), base - 0.76 * 9, base + 0.24 * 9))
    return boxes


def plot_frame(svg: str) -> tuple[float, float]:
    """The left and right ends of the page's plot."""
    frame = re.search(r'<rect x="([\d.]+)" y="[\d.]+" width="([\d.]+)"[^>]*stroke="#999"', svg)
    assert frame is not None
    return float(frame[1]), float(frame[1]) + float(frame[2])


def overlap(a: Box, b: Box) -> bool:
    return a[1] < b[2] and b[1] < a[2] and a[3] < b[4] and b[3] < a[4]


@NEEDS_NODE
def test_the_pages_text_widths_are_the_static_pictures(tmp_path: Path) -> None:
    """The page's script estimates text widths with a port of plot._char_em's table:
    the two agree on every printable ASCII character (and a few others)."""
    script = (Path(PLOT.__file__).parent / "_interactive.js").read_text("utf-8")
    part = re.search(r"// <char-em>.*?// </char-em>", script, re.S)
    assert part is not None
    probe = tmp_path / "widths.js"
    probe.write_text(
        part[0] + "\nvar text = JSON.parse(process.argv[2]);\n"
        "process.stdout.write(JSON.stringify({em: chars(text).map(charEm), "
        "px: textPx(text, 9)}));\n",
        "utf-8",
    )
    text = "".join(chr(c) for c in range(32, 127)) + "\u00c9\u00e9\u03a9\u03c9\u2026\U00010400"
    ran = subprocess.run(
        ["node", str(probe), json.dumps(text)], capture_output=True, text=True, check=True
    )
    widths = json.loads(ran.stdout)
    assert dict(zip(text, widths["em"], strict=True)) == {c: PLOT._char_em(c) for c in text}
    assert widths["px"] == pytest.approx(PLOT._text_px(text, 9), abs=1e-9)


@NEEDS_NODE
def test_the_pages_names_near_the_right_end_stay_inside_the_plot(tmp_path: Path) -> None:
    # A name near the plot's right end was drawn rightwards from its line, past the
    # plot's end (cut off by the plot's clip); the static picture draws it leftwards.
    events = [(i, "alloc", i, MIB) for i in range(400)]
    phases = [
        {"name": "start", "first_event": 0},
        {"name": "a-long-phase-name-near-the-end", "first_event": 395},
        {"name": "END", "first_event": 399},
    ]
    trace = cubepool.Trace.from_events(events, {"workload": "end", "phases": phases})
    panel = page_panel(trace, tmp_path)
    left, right = plot_frame(panel["svg"])
    boxes = name_boxes(panel["svg"])
    assert [b[0] for b in boxes] == [p["name"] for p in phases]
    outside = [b for b in boxes if not (left <= b[1] and b[2] <= right + 0.05)]
    assert outside == [], (left, right)
    assert not overlap(boxes[1], boxes[2])


@NEEDS_NODE
def test_the_pages_names_stay_clear_of_the_peak_label_and_are_counted(tmp_path: Path) -> None:
    # Names stacked in rows up the panel were drawn over the peak's label (here low in
    # the panel, under a recording four times as high); the static picture leaves them
    # out and counts them in its note.
    count = 400
    events = [(i, "alloc", i, MIB) for i in range(count)]
    phases = [{"name": f"p{i}", "first_event": i} for i in range(count)]
    high = {
        "source": "test",
        "device": "cuda:0",
        "covers": "start",
        "points": [(1, 0, 4 * count * MIB)],
    }
    header = {"workload": "crowd", "phases": phases, "recorded": high}
    panel = page_panel(cubepool.Trace.from_events(events, header), tmp_path)
    svg = panel["svg"]
    peak_at = re.search(
        r'<text x="([\d.]+)" y="([\d.]+)" text-anchor="(\w+)" font-size="10">(peak[^<]*)<', svg
    )
    assert peak_at is not None
    x, y, text = float(peak_at[1]), float(peak_at[2]), peak_at[4]
    width = PLOT._text_px(text, 10)
    x0 = x - width if peak_at[3] == "end" else x
    peak = (text, x0, x0 + width, y - 0.76 * 10, y + 0.24 * 10)
    boxes = name_boxes(svg)
    # The label lies among the rows of names (so that they could run into it).
    assert min(b[3] for b in boxes) < peak[4] and peak[3] < max(b[4] for b in boxes)
    assert len(boxes) > 100
    assert [b[0] for b in boxes if overlap(b, peak)] == []
    assert f"+{count - len(boxes):,} phase names not shown (no room; zoom in)" in panel["legend"]


@NEEDS_NODE
def test_the_pages_names_do_not_run_into_each_other(tmp_path: Path) -> None:
    # Rows were packed at five pixels a character while names are drawn wider, so
    # upper-case names ran into the next one in their row.
    events = [(i, "alloc", i, MIB) for i in range(400)]
    phases = [{"name": "BACKWARD" if k % 2 else "WARMUP", "first_event": 9 * k} for k in range(40)]
    trace = cubepool.Trace.from_events(events, {"workload": "names", "phases": phases})
    panel = page_panel(trace, tmp_path)
    boxes = name_boxes(panel["svg"])
    assert len(boxes) > 10
    assert [
        (a[0], a[1], b[1]) for i, a in enumerate(boxes) for b in boxes[i + 1 :] if overlap(a, b)
    ] == []
    note = [t for t in panel["legend"] if "not shown" in t]
    assert note == (
        [f"+{40 - len(boxes)} phase names not shown (no room; zoom in)"] if len(boxes) < 40 else []
    )


LONG = 1 << 20  # characters of each long name below


def long_named() -> cubepool.Trace:
    """A trace of three events whose workload and phase are named with 1 MiB each."""
    header = {"workload": "W" * LONG, "phases": [{"name": "P" * LONG, "first_event": 0}]}
    events = [(0, "alloc", 0, MIB), (1, "alloc", 1, 2 * MIB), (2, "free", 0)]
    return cubepool.Trace.from_events(events, header)


def test_long_names_are_cut_in_every_picture(tmp_path: Path) -> None:
    # The names were copied whole: a workload of 10 MiB and phases of 2 MiB made a page
    # of 36 MB (the name in its <title>, its <h1> and its data), and the SVG measured
    # the name a character at a time (6.8 s for three events).
    trace = long_named()
    label = "L" * LONG
    result = cubepool.replay(trace, "default")
    html_text = cubepool.plot(trace, out=tmp_path / "p.html", results=[(label, result)])
    text = html_text.read_text("utf-8")
    assert len(text) < 100_000, len(text)
    cut = short_name("W" * LONG)
    assert cut == "W" * (MAX_NAME_CHARS - NAME_TAIL_CHARS) + "..." + "W" * NAME_TAIL_CHARS
    assert f"<title>{cut}: memory over time</title>" in text and f"<h1>{cut}: " in text
    payload = json.loads(re.search(r'id="cubepool-data">(.*?)</script>', text, re.S)[1])
    assert payload["heading"] == f"{cut}: memory over time"
    assert payload["phases"][0][0] == short_name("P" * LONG)
    (panel,) = payload["panels"]
    (view,) = payload["at_peak"]
    assert panel["label"] == view["label"] == short_name("L" * LONG)
    svg = cubepool.plot(trace, out=tmp_path / "p.svg", results=[(label, result)])
    assert svg.stat().st_size < 20_000
    # A name at the bound is shown whole.
    whole = cubepool.Trace.from_events([(0, "alloc", 0, MIB)], {"workload": "w" * MAX_NAME_CHARS})
    page = cubepool.plot(whole, out=tmp_path / "w.html").read_text("utf-8")
    assert f"<h1>{'w' * MAX_NAME_CHARS}: memory over time</h1>" in page


def many_segments(small: int, large: int) -> cubepool.Trace:
    """``small`` live blocks of 512 bytes and ``large`` of 8 MiB spread among them, each
    block with three frames of its own (under exclusive pages, a segment a block)."""
    builder = cubepool.TraceBuilder({"workload": "segments"})
    spread = (small + large) // large
    for i in range(small + large):
        size = 8 * MIB if i % spread == spread // 2 else 512
        builder.alloc(i, i, size, [f"model.py:{i}", f"layer_{i}.py:1", f"f{i}"])
    return builder.finish()


def test_the_view_at_the_peak_draws_a_bounded_number_of_segments(tmp_path: Path) -> None:
    # Every segment was drawn and every block's frames written: 1,000,000 live blocks
    # under exclusive pages made a page of 148 MB (1,000,000 segments, 1,977,000 frame
    # texts). Now a view draws MAX_SEGMENTS_SHOWN of them (the largest among them) and
    # counts the others.
    small, large = 100_000, 20
    trace = many_segments(small, large)
    page = cubepool.plot(trace, "exclusive_pages", tmp_path / "p.html").read_text("utf-8")
    assert len(page) < 2_000_000, len(page)
    payload = json.loads(re.search(r'id="cubepool-data">(.*?)</script>', page, re.S)[1])
    (view,) = payload["at_peak"]
    drawn = view["segments"]
    assert view["segment_count"] == small + large
    assert len(drawn) == MAX_SEGMENTS_SHOWN
    left = view["left_out"]
    assert left["segments"] == small + large - MAX_SEGMENTS_SHOWN
    assert left["reserved"] + sum(s[2] for s in drawn) == view["reserved"]
    assert sum(s[2] >= 8 * MIB for s in drawn) == large  # the largest are all drawn
    assert [s[:2] for s in drawn] == sorted(s[:2] for s in drawn)  # by place
    assert sum(len(s[3]) for s in drawn) <= MAX_BLOCK_ROWS
    assert len(view["frame_texts"]) <= MAX_FRAME_TEXTS
    # Three frames a block: the stacks of the first blocks fill the frame texts, and
    # the blocks past them are counted.
    assert len(view["frames"]) == MAX_FRAME_TEXTS // 3
    assert view["stacks_left_out"] == MAX_SEGMENTS_SHOWN - MAX_FRAME_TEXTS // 3


def test_a_segment_of_many_scattered_blocks_is_drawn_in_a_bounded_number_of_bars(
    tmp_path: Path,
) -> None:
    # Past MAX_BLOCKS_PER_SEGMENT blocks a segment's touching blocks were merged, and
    # nothing more: blocks apart (every other one freed) stayed a bar each, however many.
    count = 20_000
    builder = cubepool.TraceBuilder({"workload": "scattered"})
    for i in range(count):
        builder.alloc(i, i, 1000)
    for i in range(0, count, 2):
        builder.free(count + i, i)
    builder.alloc(2 * count, count, 64 * MIB)  # the peak, after the frees
    page = cubepool.plot(builder.finish(), "torch", tmp_path / "p.html").read_text("utf-8")
    payload = json.loads(re.search(r'id="cubepool-data">(.*?)</script>', page, re.S)[1])
    (view,) = payload["at_peak"]
    rows = [row for segment in view["segments"] for row in segment[3]]
    assert view["merged"]
    assert max(len(segment[3]) for segment in view["segments"]) <= MAX_BLOCKS_PER_SEGMENT
    # A merged bar's id is minus the blocks it holds: every live block is in one bar.
    assert sum(-row[3] if row[3] < 0 else 1 for row in rows) == count // 2 + 1
    assert sum(row[2] for row in rows) == view["requested"]
    for _group, _start, size, bars in view["segments"]:
        for offset, bar, requested, _id in bars:
            assert 0 <= offset and offset + bar <= size and requested <= bar


@NEEDS_NODE
def test_the_page_says_which_segments_it_left_out(tmp_path: Path) -> None:
    trace = many_segments(3_000, 2)
    page = cubepool.plot(trace, "exclusive_pages", tmp_path / "p.html").read_text("utf-8")
    (view,) = run_page(page, tmp_path, "_interactive.js", "_interactive_peak.js")["peak"]
    assert "reserved in 3,002 segments" in view["title"]
    assert (
        f"Drawn: the {MAX_SEGMENTS_SHOWN:,} segments with the most free bytes and the "
        f"largest; {3_002 - MAX_SEGMENTS_SHOWN:,} more segments, "
    ) in view["title"], view["title"]
    assert view["bars"] == ["segment"] * MAX_SEGMENTS_SHOWN + ["dashed #fafafa"]
    # A view that draws every segment has no dashed bar.
    page = cubepool.plot(many_segments(200, 2), "exclusive_pages", tmp_path / "q.html")
    scripts = ("_interactive.js", "_interactive_peak.js")
    (view,) = run_page(page.read_text("utf-8"), tmp_path, *scripts)["peak"]
    assert view["bars"] == ["segment"] * 202 and "not drawn" not in view["title"]

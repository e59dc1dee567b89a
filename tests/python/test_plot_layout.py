"""The static SVG's layout, checked by its geometry: every text inside the picture,
legend rows inside their panel, phase names inside the plot and clear of the peak's
label, legend keys drawn as their lines are. Text extents are estimated the way DejaVu
Sans (the sans-serif most renderers fall back on, and among the widest) sets them."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import cubepool

NS = "{http://www.w3.org/2000/svg}"
MIB = 1 << 20
# DejaVu Sans' advance widths in ems, printable ASCII from " " to "~" (read from the
# font's hmtx table with fontTools: the regular and the bold face matplotlib bundles).
_ASCII = "".join(chr(c) for c in range(32, 127))
# fmt: off
_REGULAR = dict(zip(_ASCII, [
    0.318, 0.401, 0.46, 0.838, 0.636, 0.95, 0.78, 0.275, 0.39, 0.39, 0.5, 0.838,
    0.318, 0.361, 0.318, 0.337, 0.636, 0.636, 0.636, 0.636, 0.636, 0.636, 0.636, 0.636,
    0.636, 0.636, 0.337, 0.337, 0.838, 0.838, 0.838, 0.531, 1.0, 0.684, 0.686, 0.698,
    0.77, 0.632, 0.575, 0.775, 0.752, 0.295, 0.295, 0.656, 0.557, 0.863, 0.748, 0.787,
    0.603, 0.787, 0.695, 0.635, 0.611, 0.732, 0.684, 0.989, 0.685, 0.611, 0.685, 0.39,
    0.337, 0.39, 0.838, 0.5, 0.5, 0.613, 0.635, 0.55, 0.635, 0.615, 0.352, 0.635,
    0.634, 0.278, 0.278, 0.579, 0.278, 0.974, 0.634, 0.612, 0.635, 0.635, 0.411, 0.521,
    0.392, 0.634, 0.592, 0.818, 0.592, 0.592, 0.525, 0.636, 0.337, 0.636, 0.838,
], strict=True))
_BOLD = dict(zip(_ASCII, [
    0.348, 0.456, 0.521, 0.838, 0.696, 1.002, 0.872, 0.306, 0.457, 0.457, 0.523, 0.838,
    0.38, 0.415, 0.38, 0.365, 0.696, 0.696, 0.696, 0.696, 0.696, 0.696, 0.696, 0.696,
    0.696, 0.696, 0.4, 0.4, 0.838, 0.838, 0.838, 0.58, 1.0, 0.774, 0.762, 0.734,
    0.83, 0.683, 0.683, 0.821, 0.837, 0.372, 0.372, 0.775, 0.637, 0.995, 0.837, 0.85,
    0.733, 0.85, 0.77, 0.72, 0.682, 0.812, 0.774, 1.103, 0.771, 0.724, 0.725, 0.457,
    0.365, 0.457, 0.838, 0.5, 0.5, 0.675, 0.716, 0.593, 0.716, 0.678, 0.435, 0.716,
    0.712, 0.343, 0.343, 0.665, 0.343, 1.042, 0.712, 0.687, 0.716, 0.716, 0.493, 0.595,
    0.478, 0.712, 0.652, 0.924, 0.645, 0.652, 0.582, 0.712, 0.365, 0.712, 0.838,
], strict=True))
# fmt: on


def text_px(text: str, size: float, *, bold: bool = False) -> float:
    """How wide ``text`` is in DejaVu Sans of ``size`` pixels (a character outside
    printable ASCII counted as wide as the widest letter)."""
    widths = _BOLD if bold else _REGULAR
    return sum(widths.get(c, 1.0) for c in text) * size


@dataclass(frozen=True)
class Box:
    text: str
    x0: float
    x1: float
    y0: float
    y1: float
    size: float
    fill: str
    cls: str

    def overlaps(self, other: Box) -> bool:
        return (
            self.x0 < other.x1 and other.x0 < self.x1 and self.y0 < other.y1 and other.y0 < self.y1
        )


def texts(svg: Path) -> tuple[ET.Element, list[Box]]:
    """The root and every text's box (the ascent above the baseline, the descent
    below it)."""
    root = ET.parse(svg).getroot()
    default_size = float(root.get("font-size", "11"))
    boxes = []
    for node in root.iter(f"{NS}text"):
        if node.get("transform"):  # the rotated unit label: left of the axis
            continue
        text = "".join(node.itertext())
        size = float(node.get("font-size", default_size))
        bold = node.get("font-weight") == "bold"
        width = text_px(text, size, bold=bold)
        x, y = float(node.get("x", "0")), float(node.get("y", "0"))
        anchor = node.get("text-anchor", "start")
        x0 = x - width if anchor == "end" else x - width / 2 if anchor == "middle" else x
        boxes.append(
            Box(
                text,
                x0,
                x0 + width,
                y - 0.76 * size,
                y + 0.24 * size,
                size,
                node.get("fill", ""),
                node.get("class", ""),
            )
        )
    return root, boxes


def frames(root: ET.Element) -> list[tuple[float, float, float, float]]:
    """Each panel's plot frame: (left, top, right, bottom)."""
    out = []
    for rect in root.iter(f"{NS}rect"):
        if rect.get("fill") == "none" and rect.get("stroke") == "#999":
            x, y = float(rect.get("x", "0")), float(rect.get("y", "0"))
            out.append(
                (x, y, x + float(rect.get("width", "0")), y + float(rect.get("height", "0")))
            )
    return out


def assert_inside_the_picture(root: ET.Element, boxes: list[Box]) -> None:
    width, height = float(root.get("width", "0")), float(root.get("height", "0"))
    for box in boxes:
        assert box.x0 >= 0 and box.x1 <= width, (box.text, box.x0, box.x1, width)
        assert box.y0 >= 0 and box.y1 <= height, (box.text, box.y0, box.y1, height)


def recorded(trace: cubepool.Trace, factor: float = 1.1) -> cubepool.Trace:
    """``trace`` with a recording: a step line a little over its live bytes."""
    live, most, points, sizes = 0, 0, [], {}
    for index, (t, kind, ident, size) in enumerate(trace.events()):
        if kind == "alloc":
            sizes[ident] = size
            live += size
        else:
            live -= sizes.pop(ident, 0)
        if live * factor > most or index % 500 == 0:
            most = max(most, int(live * factor))
            points.append((index + 1, t, most))
    header = dict(trace.header)
    header["recorded"] = {"source": "test", "device": "cuda:0", "covers": "start", "points": points}
    return cubepool.Trace.from_events(trace.events(), header)


def many_pools(phases: list[dict[str, object]] | None = None) -> tuple[cubepool.Trace, object]:
    """Twelve pools, eleven of them capped sliced pages: the longest pool labels
    ("pool 10: sliced 512 MiB pages (capped)"), a legend taller than the default panel."""
    pools = "; ".join(
        f"sliced(page={512 << i}KiB, max_slice={256 << i}KiB, cap={1 << i}GiB)" for i in range(11)
    )
    layout = cubepool.MemoryConfiguration.parse(pools + "; exclusive(max_alloc=2GiB)")
    header: dict[str, object] = {"workload": "legend"}
    if phases is not None:
        header["phases"] = phases
    trace = cubepool.Trace.from_events(
        [(i, "alloc", i, (1 << (i % 12)) * 200 * 1024) for i in range(40)], header
    )
    return trace, layout


def test_long_headings_titles_and_legend_labels_stay_in_the_picture(tmp_path: Path) -> None:
    # The heading, a panel's title and a pool's legend label were one line each however
    # long: a long workload name, a layout's description, an INCOMPLETE panel's title
    # (its end, "peak reserved ... covers only what was served", the part that matters)
    # and "pool 10: sliced 512 MiB pages (capped)" ran past the picture's right edge
    # and were cut off. Now they wrap onto more lines, each inside the picture.
    trace, layout = many_pools()
    header = dict(trace.header)
    header["workload"] = "a-very-long-workload-name-" * 6
    trace = cubepool.Trace.from_events(trace.events(), header)
    out = cubepool.plot(
        trace,
        {"a layout with a really long label, going on and on": layout, "default": "default"},
        tmp_path / "long.svg",
        limit="100MiB",
    )
    root, boxes = texts(out)
    assert_inside_the_picture(root, boxes)
    every = " ".join(box.text for box in boxes)
    # Both titles, incomplete, end in what their peak covers; the one whose layout's
    # description takes more than four lines has the description cut short, not that.
    assert every.count("covers only what was served") == 2
    assert "\u2026" in every
    assert "(capped)" in every
    # The wrapped lines of one title or heading do not run into each other.
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            if a.size == b.size and a.size >= 11 and a.x0 == b.x0:
                assert not a.overlaps(b), (a.text, b.text)


def test_legend_rows_lie_inside_their_panel_with_a_recording(tmp_path: Path) -> None:
    # The panel's height allowed for the pools and three more legend rows; the recorded
    # run's row is a fourth, so a legend taller than the default panel ran onto the
    # panel's foot, among the x ticks.
    trace, layout = many_pools()
    out = cubepool.plot(recorded(trace), {"many": layout}, tmp_path / "rec.svg")
    root, boxes = texts(out)
    ((_, top, right, bottom),) = frames(root)
    legend = [box for box in boxes if box.x0 > right + 10]
    assert any(box.text == "torch (recorded)" for box in legend)
    assert len([box for box in legend if box.text.startswith("pool ")]) >= 12
    for box in legend:
        assert top <= box.y0 and box.y1 <= bottom, (box.text, box.y1, bottom)
    assert_inside_the_picture(root, boxes)


def test_phase_names_stay_in_the_plot_and_clear_of_the_peak_label(tmp_path: Path) -> None:
    # A phase near the end had its name drawn rightwards from its line, out of the plot
    # and over the legend; and names stacked in rows up the panel were drawn over the
    # peak's label.
    trace, layout = many_pools([{"name": "a-long-phase-name-near-the-end", "first_event": 38}])
    out = cubepool.plot(recorded(trace), {"many": layout}, tmp_path / "end.svg")
    root, boxes = texts(out)
    ((left, _, right, _),) = frames(root)
    names = [b for b in boxes if b.size == 9 and b.fill == "#555" and not b.cls]
    assert [b.text for b in names] == ["a-long-phase-name-near-the-end"]
    for box in names:
        assert left <= box.x0 and box.x1 <= right, (box.x0, box.x1, right)
        assert not any(box.overlaps(other) for other in boxes if other is not box)

    events = [(i, "alloc", i, MIB) for i in range(400)]
    phases = [{"name": f"p{i}", "first_event": i} for i in range(400)]
    crowd = cubepool.Trace.from_events(events, {"workload": "crowd", "phases": phases})
    root, boxes = texts(cubepool.plot(crowd, "default", tmp_path / "crowd.svg"))
    (peak,) = [b for b in boxes if b.text.startswith("peak reserved")]
    names = [b for b in boxes if b.size == 9 and b.fill == "#555" and not b.cls]
    assert len(names) > 100
    assert not [b.text for b in names if b.overlaps(peak)]
    (note,) = [b for b in boxes if b.cls == "phase-note"]
    assert note.text == f"+{400 - len(names)} phase names not shown (no room)"


def test_the_recorded_runs_legend_key_is_dashed_as_its_line(tmp_path: Path) -> None:
    # The key was dotted like the peak-live line's (2,3) while the line itself is
    # dashed 5,3: the two keys looked alike.
    trace, _ = many_pools()
    root = ET.parse(cubepool.plot(recorded(trace), "default", tmp_path / "k.svg")).getroot()
    purple = [
        node
        for node in root.iter()
        if node.tag in (f"{NS}line", f"{NS}polyline") and node.get("stroke") == "#8e44ad"
    ]
    (line,) = [n for n in purple if n.tag == f"{NS}polyline"]
    (key,) = [n for n in purple if n.tag == f"{NS}line"]
    assert key.get("stroke-dasharray") == line.get("stroke-dasharray") == "5,3"


def test_tebibytes_are_drawn_in_tib(tmp_path: Path) -> None:
    # A y axis of 8 TiB read 0 to 8000 GiB.
    tib = 1 << 40
    trace = cubepool.Trace.from_events(
        [(0, "alloc", 1, 3 * tib), (1, "alloc", 2, 5 * tib), (2, "free", 1), (3, "free", 2)],
        {"workload": "huge"},
    )
    root, boxes = texts(cubepool.plot(trace, "default", tmp_path / "t.svg"))
    unit = [n.text for n in root.iter(f"{NS}text") if n.get("transform")]
    assert unit == ["TiB"]
    ticks = [float(b.text) for b in boxes if b.x1 <= 62 and b.text.replace(".", "").isdigit()]
    assert ticks and max(ticks) <= 10


def test_wrapped_lines_fit_and_keep_sizes_whole() -> None:
    import sys

    plot = sys.modules["cubepool.plot"]
    text = ", ".join(["pool 123: exclusive pages <= 356.6 KiB"] * 3)
    lines = plot._wrap(text, 120, 10, lines=10)
    assert " ".join(lines) == text
    assert all(plot._text_px(line, 10) <= 120 for line in lines)
    # A line breaks neither between a size and its unit nor after "<=".
    assert not any(line.endswith(("356.6", "<=")) for line in lines)
    cut = plot._wrap("x" * 500, 100, 10, lines=2)
    assert len(cut) == 2 and cut[-1].endswith("\u2026")
    assert all(plot._text_px(line, 10) <= 100 for line in cut)


def test_the_width_estimate_is_at_or_over_the_fonts() -> None:
    """The picture lays text out by an estimate of its width, which must not fall short
    of DejaVu Sans' (it fell short for braces, quotes, brackets and round letters: a
    name of them ran past its room)."""
    import sys

    plot = sys.modules["cubepool.plot"]
    short = [c for c in _ASCII if plot._text_px(c, 1.0) < _REGULAR[c]]
    short_bold = [c for c in _ASCII if plot._text_px(c, 1.0, bold=True) < _BOLD[c]]
    assert short == [] and short_bold == []


def test_phase_names_do_not_run_into_each_other(tmp_path: Path) -> None:
    """Rows were packed by five pixels a character while names were drawn wider, so
    upper-case names ran into the next one in their row."""
    events = [(i, "alloc", i, MIB) for i in range(400)]
    phases = [{"name": "BACKWARD" if k % 2 else "WARMUP", "first_event": 9 * k} for k in range(40)]
    trace = cubepool.Trace.from_events(events, {"workload": "names", "phases": phases})
    _, boxes = texts(cubepool.plot(trace, "default", tmp_path / "names.svg"))
    names = [b for b in boxes if b.size == 9 and b.fill == "#555" and not b.cls]
    assert len(names) > 10
    assert not [
        (a.text, a.x0, b.x0) for i, a in enumerate(names) for b in names[i + 1 :] if a.overlaps(b)
    ]


def saved_figures(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The matplotlib figures saved from now on in this test (each still written)."""
    from matplotlib.figure import Figure

    saved: list[Any] = []
    real_savefig = Figure.savefig

    def keep(fig: Figure, *args: object, **kwargs: object) -> None:
        saved.append(fig)
        real_savefig(fig, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Figure, "savefig", keep)
    return saved


def stub_latex(monkeypatch: pytest.MonkeyPatch) -> None:
    """No LaTeX here: matplotlib's measuring of text for ``.pgf`` answers a fixed box,
    and the check that its TeX program is on PATH finds one; the rest of the real path
    writes the file."""
    import shutil

    import matplotlib.backends.backend_pgf as pgf

    class Measure:
        def get_width_height_descent(self, text: str, prop: object) -> tuple[float, ...]:
            return (10.0, 5.0, 1.0)

    monkeypatch.setattr(pgf.LatexManager, "_get_cached_or_new", classmethod(lambda _: Measure()))
    real_which = shutil.which
    monkeypatch.setattr(
        shutil, "which", lambda name, *a, **k: "/bin/true" if "latex" in name else real_which(name)
    )


def test_the_matplotlib_pictures_names_stay_apart_inside_the_plot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The PNG and PDF pictures (matplotlib, the optional `plot` extra) packed names by
    4.5 pixels a character, so names ran into each other and past the plot's right end
    into the legend, and drew them at the top, over the peak's label; now their rows
    are packed by their drawn widths at the foot, and the note of names left out is a
    line of the legend."""
    pytest.importorskip("matplotlib")

    saved = saved_figures(monkeypatch)
    events = [(i, "alloc", i, MIB) for i in range(3000)]
    phases = [{"name": f"phase{i}", "first_event": i} for i in range(3000)]
    trace = cubepool.Trace.from_events(events, {"workload": "crowd", "phases": phases})
    cubepool.plot(trace, "default", tmp_path / "crowd.png")
    (fig,) = saved
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    (ax,) = fig.axes
    plot_box = ax.get_window_extent(renderer)
    names = [t for t in ax.texts if t.get_text().startswith(" phase")]
    boxes = [t.get_window_extent(renderer) for t in names]
    assert len(names) > 20
    assert all(plot_box.x0 <= b.x0 and b.x1 <= plot_box.x1 + 1 for b in boxes)
    overlapping = [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1 :] if a.overlaps(b)]
    assert not overlapping
    (peak,) = [t for t in ax.texts if t.get_text().startswith("peak reserved")]
    peak_box = peak.get_window_extent(renderer)
    assert not [b for b in boxes if b.overlaps(peak_box)]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert f"+{3000 - len(names):,} phase names not shown (no room)" in legend


def _dollar_trace(workload: str, phase: str) -> cubepool.Trace:
    events = [(i, "alloc", i, MIB) for i in range(10)]
    events += [(10 + i, "free", i, 0) for i in range(10)]
    phases = [{"name": "s", "first_event": 0}, {"name": phase, "first_event": 1}]
    return cubepool.Trace.from_events(events, {"workload": workload, "phases": phases})


def test_matplotlib_draws_a_traces_names_as_they_are_not_as_math(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """matplotlib reads text between two ``$`` as math: a phase ``load $5 and $6`` was
    drawn as italic "load 5and6", and a workload ``cost $\\foo$ x``, which it cannot
    parse as math, failed the picture after every table was printed (helper-137's
    find). The names are drawn as they are."""
    pytest.importorskip("matplotlib")

    saved = saved_figures(monkeypatch)
    trace = _dollar_trace("cost $\\foo$ x", "load $5 and $6")
    out = cubepool.plot(trace, "default", tmp_path / "dollars.png")
    assert out.stat().st_size > 0
    (fig,) = saved
    (ax,) = fig.axes
    drawn = [t for t in ax.texts if "load" in t.get_text()]
    assert [t.get_text() for t in drawn] == [" load $5 and $6"]
    assert not drawn[0].get_parse_math()
    assert fig.get_suptitle().startswith("cost $\\foo$ x")


def test_a_pgf_picture_holds_a_traces_names_as_latex_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """matplotlib writes a ``.pgf`` picture's text into LaTeX as it is: a workload
    ``W}\\input{/etc/hostname}`` closed matplotlib's group and ran its commands wherever
    the picture was included (helper-137's find). Its specials are escaped now. There is
    no LaTeX here: its measuring of text is stubbed, as is the check that it is on PATH,
    and the rest of the real path writes the file."""
    pytest.importorskip("matplotlib")

    stub_latex(monkeypatch)
    hostile = "W}\\immediate\\write18{touch x}\\input{/etc/hostname} 50% $a_1^2$ & #~"
    out = cubepool.plot(_dollar_trace(hostile, "phase}\\def\\x{1}"), "default", tmp_path / "x.pgf")
    text = out.read_text()
    assert "\\input{/etc" not in text and "\\def\\x" not in text and "write18{" not in text
    escaped = (
        "W\\}\\textbackslash{}immediate\\textbackslash{}write18\\{touch x\\}\\textbackslash{}"
        "input\\{/etc/hostname\\} 50\\% \\$a\\_1\\textasciicircum{}2\\$ \\& \\#"
        "\\textasciitilde{}"
    )
    assert escaped in text
    assert "phase\\}\\textbackslash{}def\\textbackslash{}x\\{1\\}" in text


def test_the_tick_labels_keep_a_users_math_text_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Math text is off for the texts from the trace only: turned off for the whole
    picture, the tick labels that ``axes.formatter.use_mathtext`` writes as math were
    drawn as ``$\\mathdefault{0}$`` (helper-139's find)."""
    matplotlib = pytest.importorskip("matplotlib")

    saved = saved_figures(monkeypatch)
    with matplotlib.rc_context({"axes.formatter.use_mathtext": True}):
        cubepool.plot(_dollar_trace("w $x$", "p $y$"), "default", tmp_path / "ticks.png")
    (fig,) = saved
    (ax,) = fig.axes
    ticks = ax.get_yticklabels()
    assert ticks and all(t.get_parse_math() for t in ticks)
    assert "$" in ticks[0].get_text()
    names = [t for t in ax.texts if "$" in t.get_text()]
    assert names and not any(t.get_parse_math() for t in names)
    assert not any(t.get_parse_math() for t in ax.get_legend().get_texts())


def test_a_pgf_picture_fits_its_labels_by_the_names_not_their_escapes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The names were escaped before the labels were fitted, so ``\\textbackslash{}``
    was measured for each backslash and a .pgf picture hid names a .png drew
    (helper-139's find): both draw the same names now."""
    pytest.importorskip("matplotlib")

    stub_latex(monkeypatch)
    saved = saved_figures(monkeypatch)
    events = [(i, "alloc", i, MIB) for i in range(40)] + [(40 + i, "free", i, 0) for i in range(40)]
    phases = [{"name": f"C:\\run\\s{i}", "first_event": 2 * i} for i in range(40)]
    trace = cubepool.Trace.from_events(events, {"workload": "w", "phases": phases})
    for suffix in ("png", "pgf"):
        cubepool.plot(trace, "default", tmp_path / f"names.{suffix}")
    drawn = [[t for t in fig.axes[0].texts if "run" in t.get_text()] for fig in saved]
    assert len(drawn[0]) == len(drawn[1]) > 10
    assert drawn[1][0].get_text() == " C:\\textbackslash{}run\\textbackslash{}s0"

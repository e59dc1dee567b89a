"""Pictures of memory over time: what each pool layout reserves against what is in use.

:func:`plot` replays a trace through one or more layouts and draws one panel per layout
on shared axes: the bytes each pool reserves, stacked; the bytes in use (a band from the
least to the most of each sample, so short spikes show); the trace's peak live bytes (the
floor no allocator can go under); the header's phases; and the peak reservation,
annotated. ``.html`` (and ``.svg``) need nothing beyond cubepool: the page is
self-contained, with inline SVG; the page also draws the address space at each replay's
peak (live and free bytes of the reserved segments, see :meth:`ReplayResult.at_peak`; a
thousand of them at most, those that explain the gap, the others counted: see
:mod:`cubepool._interactive_peak`).
``.png``, ``.pdf`` and the like are drawn with matplotlib (``pip install
"cubepool[plot]"``): the time panels only; ``.pgf`` (a LaTeX picture) also needs the TeX
program matplotlib runs to measure text (``rcParams["pgf.texsystem"]``, ``xelatex`` by
default), checked with the path before any work.
"""

from __future__ import annotations

import bisect
import colorsys
import importlib.util
import math
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cubepool._cubepool import MemoryDeviceProperties, ReplayResult, Trace, pool_spec
from cubepool._errors import InvalidArgument
from cubepool._files import atomic_path, check_output_path, non_regular, write_text
from cubepool._format import counted, human_bytes
from cubepool._interactive import page
from cubepool._interactive_peak import peak_views
from cubepool._markup import markup_text, shown_text
from cubepool._terminal import short_name
from cubepool._trace import TraceLike, replay, resolve_trace, trace_name
from cubepool.compare import Layouts, _labelled, failure_text
from cubepool.layouts import describe
from cubepool.recorded import RECORDED_LABEL

__all__ = ["PALETTE", "output_path", "plot", "pool_color"]

PALETTE: Final = (
    "#4c78a8",
    "#72b7b2",
    "#54a24b",
    "#eeca3b",
    "#b279a2",
    "#ff9da6",
    "#9d755d",
    "#bab0ac",
    "#f58518",
    "#e45756",
)
"""Colours of the first pools, in routing order; :func:`pool_color` goes on from there."""


def pool_color(index: int) -> str:
    """The colour of pool ``index``: :data:`PALETTE` for the first ten, then hues a
    golden angle apart at alternating lightness, so any number of pools get distinct
    colours."""
    if index < len(PALETTE):
        return PALETTE[index]
    k = index - len(PALETTE)
    hue = (25 + k * 137.508) % 360 / 360
    lightness = (0.42, 0.58, 0.70)[k % 3]
    r, g, b = colorsys.hls_to_rgb(hue, lightness, 0.55 + 0.15 * (k % 2))
    return f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}"


_HEADROOM: Final = 1.12
"""How far above its peak a y axis reaches (room for the peak's label)."""
_Y_SCALES: Final = ("panel", "shared")
_IN_USE: Final = "#c0392b"
_RESERVED: Final = "#222222"
_RECORDED: Final = "#8e44ad"
"""The colour of what the recorded run's allocator reserved (``Trace.recording``)."""
_UNITS: Final = ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"), (1, "B"))


@dataclass(frozen=True)
class _Series:
    label: str
    color: str
    values: list[float]
    in_use: list[float]


@dataclass(frozen=True)
class _Panel:
    """What one panel draws, in plot units (x in seconds or events, y in ``unit``)."""

    title: str
    label: str
    complete: bool
    x: list[float]
    pools: list[_Series]
    reserved: list[float]
    in_use_low: list[float]
    in_use_high: list[float]
    peak: float
    peak_x: float
    peak_text: str
    y_max: float
    """The top of this panel's y axis: its own peak's (``y_scale="panel"``) or the
    figure's (``"shared"``)."""


@dataclass(frozen=True)
class _Figure:
    heading: str
    by_event: bool
    x_label: str
    unit: str
    y_max: float
    x_max: float
    floor: float
    phases: list[tuple[str, float]]
    panels: list[_Panel]
    recorded: tuple[list[float], list[float]] | None = None
    """What the recorded run's allocator reserved (``torch (recorded)``), as a step line
    (x, y) drawn on every panel; None when the trace has no recording."""


def _pool_label(result: ReplayResult, index: int, device_page: int) -> str:
    options = result.pools[index].options
    if options is None:  # a pool of the torch model
        small = result.pools[index].kind == "torch_small"
        return f"pool {index}: torch {'small' if small else 'large'} pool (model)"
    spec = pool_spec(options)
    kind = spec["kind"]

    def size(n: int) -> str:
        return human_bytes(n).replace(".0 ", " ")

    if kind == "sliced_pages":
        text = f"pool {index}: sliced {size(spec['page_size'])} pages"
        return text + (" (capped)" if spec["max_pool_size"] is not None else "")
    if kind == "exclusive_pages":
        limit = spec["max_alloc_size"]
        tail = "" if limit >= device_page else f" <= {size(limit)}"
        return f"pool {index}: exclusive pages{tail}"
    if kind == "virtual_pages":
        return f"pool {index}: virtual {size(spec['granule'])} granules"
    return f"pool {index}: direct buffers"


def _figure(
    trace: Trace,
    runs: Sequence[tuple[str, str, ReplayResult]],
    heading: str,
    device_page: int,
    y_scale: str = "panel",
) -> _Figure:
    times = trace.times()
    # A trace whose times are its event indices (some importers and generators number
    # events instead of timing them) is drawn by event, not as nanoseconds.
    by_time = (
        bool(times) and times[-1] > times[0] and any(t - times[0] != i for i, t in enumerate(times))
    )
    origin = times[0] if times else 0

    def at(event: int) -> float:
        if not times:
            return 0.0
        event = min(max(event, 0), len(times) - 1)
        return (times[event] - origin) / 1e9 if by_time else float(event)

    recording = trace.recording
    recorded_peak = recording.peak if recording is not None else 0
    top = (
        max([trace.peak_live, recorded_peak, *(r.peak_reserved for _, _, r in runs)], default=1)
        or 1
    )
    scale, unit = next((s, u) for s, u in _UNITS if top >= s)

    def y_top(result: ReplayResult) -> float:
        """The top of a panel's axis: room above its peak (or the figure's)."""
        if y_scale == "shared":
            return top / scale * _HEADROOM
        own = max(trace.peak_live, recorded_peak, result.peak_reserved, result.peak_in_use) or 1
        return own / scale * _HEADROOM

    panels = []
    for label, description, result in runs:
        timeline = result.timeline
        last = [
            first + count - 1
            for first, count in zip(timeline.first_event, timeline.events, strict=True)
        ]
        x = [at(e) for e in last]
        pools = [
            _Series(
                _pool_label(result, i, device_page),
                pool_color(i),
                [v / scale for v in values],
                [v / scale for v in in_use],
            )
            for i, (values, in_use) in enumerate(
                zip(timeline.pool_reserved, timeline.pool_in_use, strict=True)
            )
            if any(values)
        ]
        panels.append(
            _Panel(
                label=label,
                complete=result.complete,
                title=(
                    f"{label}{': ' + description if description else ''} | peak reserved "
                    f"{human_bytes(result.peak_reserved)}, utilization {result.utilization:.3f}, "
                    f"{counted(result.storage_allocations, 'storage allocation')}"
                    if result.complete
                    else f"{label}{': ' + description if description else ''} | INCOMPLETE: "
                    f"{result.failed_reserves:,} reservations failed "
                    f"({failure_text(result.failures, result.limit)}); peak reserved "
                    f"{human_bytes(result.peak_reserved)} covers only what was served"
                ),
                x=x,
                pools=pools,
                reserved=[v / scale for v in timeline.reserved_max],
                in_use_low=[v / scale for v in timeline.in_use_min],
                in_use_high=[v / scale for v in timeline.in_use_max],
                peak=result.peak_reserved / scale,
                # On the drawn line: the end of the sample that holds the peak event.
                peak_x=x[bisect.bisect_right(timeline.first_event, result.peak_reserved_event) - 1]
                if x
                else 0.0,
                peak_text=f"peak reserved {human_bytes(result.peak_reserved)}",
                y_max=y_top(result),
            )
        )
    phases = [(short_name(name), at(first)) for name, first in trace.phases]
    recorded = None
    if recording is not None and recording.points:
        # Each point is the bytes reserved after the trace's first `events` events: a
        # step that holds until the next point, drawn at the event that follows (the one
        # PyTorch reserved the segment for; the last event for a point after them all).
        xs: list[float] = []
        ys: list[float] = []
        for events, _t, reserved in recording.points:
            step = at(events)
            if ys:
                xs.append(step)
                ys.append(ys[-1])
            xs.append(step)
            ys.append(reserved / scale)
        end = at(len(times) - 1)
        if xs[-1] < end:
            xs.append(end)
            ys.append(ys[-1])
        recorded = (xs, ys)
    return _Figure(
        heading=heading,
        by_event=not by_time,
        x_label="time (s)" if by_time else "event",
        unit=unit,
        y_max=top / scale * _HEADROOM,
        x_max=max((p.x[-1] for p in panels if p.x), default=1.0) or 1.0,
        floor=trace.peak_live / scale,
        phases=phases,
        panels=panels,
        recorded=recorded,
    )


_DRAWN_HERE: Final = (".html", ".htm", ".svg")
_MATPLOTLIB: Final = (
    ".png",
    ".pdf",
    ".jpg",
    ".jpeg",
    ".ps",
    ".eps",
    ".tif",
    ".tiff",
    ".webp",
    ".svgz",
    ".pgf",
)


def _form(path: Path) -> str:
    """The suffix that picks a picture's form, lower case: the name's suffix, or the
    whole name where it is one of the forms (``.html``, a hidden file: Python gives it
    no suffix); '' for none."""
    name = path.name.lower()
    if not path.suffix and name in (*_DRAWN_HERE, *_MATPLOTLIB):
        return name
    return path.suffix.lower()


def output_path(out: str | os.PathLike[str]) -> Path:
    """The file a picture goes to, checked before any work: its suffix picks the form
    (``.html``, ``.svg``, or a matplotlib format such as ``.png``); no suffix means
    ``.html``, added to the name, and a name that ends in a dot (a suffix begun and left
    empty) gets ``html`` after that dot (``mem.`` is written as ``mem.html``, not
    ``mem..html``). A name that is a form's suffix alone (``.html``) is taken as it is,
    and a path that names a folder, a device or another file that is not a regular one
    (``/dev/null``) is refused as it is, not given a suffix.

    Raises:
        InvalidArgument: a suffix no form has.
        ImportError: a matplotlib format without matplotlib installed, or ``.pgf``
            without the TeX program matplotlib runs for it.
        OSError: the file cannot be written there (see
            :func:`cubepool._files.check_output_path`): an empty path, no such folder,
            a folder or a device in its place.
    """
    path = Path(out)
    # A folder (or a name ending in a separator), a device or a FIFO is refused as it
    # is, not given a suffix; so is an empty path (Path makes it ".").
    if (
        not os.fspath(out)
        or path.is_dir()
        or os.fspath(out).endswith((os.sep, "/"))
        or non_regular(path) is not None
    ):
        check_output_path(out)
    suffix = _form(path)
    if path.name.endswith("."):
        # Checked before the suffix: Python before 3.14 gives "mem." no suffix (so
        # ".html" would make "mem..html"), 3.14 the suffix ".".
        path = path.with_name(path.name + "html")
    elif not suffix:
        path = path.with_name(path.name + ".html")
    elif suffix in _MATPLOTLIB:
        if importlib.util.find_spec("matplotlib") is None:
            raise ImportError(
                f'writing {path} needs matplotlib: pip install "cubepool[plot]" '
                "(or write .html, which needs nothing more)"
            )
        if suffix == ".pgf":
            _check_tex(path)
    elif suffix not in _DRAWN_HERE:
        raise InvalidArgument(
            f"cannot draw a picture as {suffix} ({path}): write .html (interactive), .svg, "
            f"or with matplotlib {', '.join(_MATPLOTLIB)}"
        )
    return check_output_path(path)


def _check_tex(path: Path) -> None:
    """Raise ``ImportError`` (naming ``path``) where the TeX program matplotlib runs to
    write ``.pgf`` (``rcParams["pgf.texsystem"]``) is not on ``PATH``: matplotlib would
    fail only at the save, after the replays."""
    import matplotlib

    tex = str(matplotlib.rcParams["pgf.texsystem"])
    if shutil.which(tex) is None:
        raise ImportError(
            f"{path}: writing .pgf needs LaTeX: matplotlib runs {tex} "
            "(rcParams['pgf.texsystem']) to measure the text, and it is not on PATH; "
            "install a TeX distribution, or write .pdf, .svg or .html"
        )


def plot(
    trace: TraceLike,
    layouts: Layouts | None = None,
    out: str | os.PathLike[str] = "mem.html",
    properties: MemoryDeviceProperties | None = None,
    *,
    results: Sequence[tuple[str, ReplayResult]] | None = None,
    title: str | None = None,
    samples: int = 1024,
    limit: int | str | None = None,
    name: str | None = None,
    device: str | int | None = None,
    stream: int | None = None,
    y_scale: str = "panel",
) -> Path:
    """Draw memory over time for ``trace`` under each layout, one panel each, and write
    it to ``out``.

    The picture shows a name (the trace's, a phase's, a layout's, ``title``) of more
    than 240 characters cut, ending in ``...`` (:func:`cubepool._terminal.short_name`).

    Args:
        trace: the trace, a trace file's path (read with ``device`` and ``stream``) or a
            bundled example's name.
        layouts: one layout or several, as :func:`cubepool.compare` takes them (the
            default layout when None); ignored when ``results`` is given.
        out: the file to write; its suffix picks the form: ``.html`` (a self-contained
            interactive page: hover, zoom, pan) or ``.svg`` need nothing more; ``.png``,
            ``.pdf``, ... need matplotlib (``pip install "cubepool[plot]"``; ``.pgf``
            LaTeX too). Without a suffix, ``.html`` (a name ending in a dot gets
            ``html`` after it). Checked before any replay (:func:`output_path`).
        properties: the device (the default device when None).
        results: ``(label, result)`` replays of ``trace`` to draw instead of replaying
            (their timelines are drawn as they are).
        title: the figure's heading (the trace's workload by default).
        samples: timeline points per replay.
        limit: the device's memory, in bytes or as a size such as ``"300MiB"``; a
            replay whose reservations fail is marked incomplete in its panel.
        name: the trace's name in the heading (its file's or workload's by default).
        device: the device to read from a trace file that holds several.
        stream: the stream to read from a trace file that holds several.
        y_scale: ``"panel"`` (the default) gives each panel a y axis of its own, up to
            its own peak, so a layout that reserves far more does not flatten the
            others; ``"shared"`` draws every panel on one y axis, to compare heights.

    Returns:
        The path written (with ``.html`` added when ``out`` had no suffix, ``html``
        when it ended in a dot).

    Raises:
        ImportError: a matplotlib format without matplotlib installed (or ``.pgf``
            without LaTeX).
        InvalidArgument: a suffix that is no picture format, or an unknown ``y_scale``.
        OSError: ``out`` cannot be written (checked before any replay; a failed write,
            a full disk or matplotlib failing to save, names ``out`` and leaves nothing
            under its name).
    """
    if y_scale not in _Y_SCALES:
        raise InvalidArgument(f"y_scale is 'panel' or 'shared', not {y_scale!r}")
    path = output_path(out)
    ref = trace
    trace = resolve_trace(trace, device=device, stream=stream)
    if name is None:
        name = trace_name(trace, ref)
    runs: list[tuple[str, str, ReplayResult]]
    if results is not None:
        runs = [(label, "", result) for label, result in results]
    else:
        labelled = _labelled(layouts if layouts is not None else ["default"])
        runs = [
            (
                label,
                # A layout without a name is labelled by its description already.
                "" if label == describe(config) else describe(config),
                replay(trace, config, properties, limit=limit, samples=samples),
            )
            for label, config in labelled
        ]
    if not runs:
        raise InvalidArgument("nothing to plot: give at least one layout")
    # Names are cut once, before any text shows them: the layouts' and the heading's
    # here, the phases' in _figure (short_name).
    runs = [(short_name(label), description, result) for label, description, result in runs]
    heading = (
        short_name(title)
        if title
        else f"{short_name(name or trace.workload or 'trace')}: memory over time"
    )
    props = properties if properties is not None else MemoryDeviceProperties()
    figure = _figure(trace, runs, heading, props.max_page_size, y_scale)
    suffix = _form(path)
    if suffix in (".html", ".htm"):
        payload = _payload(figure)
        # Why each replay reserves more than is live, drawn under the panels.
        payload["at_peak"] = peak_views(trace, [(label, result) for label, _, result in runs])
        write_text(path, page(payload, _svg(figure), _ABOUT))
    elif suffix == ".svg":
        write_text(path, _svg(figure))
    else:
        with atomic_path(path) as temporary:
            _matplotlib(figure, temporary, suffix[1:])
    return path


# --------------------------------------------------------------------------- matplotlib


_TEX_SPECIALS: Final = {
    "\\": r"\textbackslash{}",
    "{": r"\{",
    "}": r"\}",
    "#": r"\#",
    "$": r"\$",
    "%": r"\%",
    "&": r"\&",
    "_": r"\_",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
}
_TEX_SPECIAL: Final = re.compile(r"[\\{}#$%&_~^]")


def _tex_text(text: str) -> str:
    """``text`` (a name from the trace, a layout's description) as LaTeX text that
    typesets as itself: its specials escaped, control characters shown as U+FFFD and
    line breaks as spaces. matplotlib's ``.pgf`` writes text into the LaTeX picture as
    it is, so a workload named ``W}\\input{/etc/hostname}`` closed matplotlib's group and
    ran its commands wherever the picture was included (helper-137's find)."""
    text = shown_text(text.replace("\r", " ").replace("\n", " "))
    return _TEX_SPECIAL.sub(lambda found: _TEX_SPECIALS[found.group()], text)


def _matplotlib(figure: _Figure, path: Path, form: str) -> None:
    """Draws ``figure`` with matplotlib into ``path`` as ``form``; a save that fails in
    matplotlib (LaTeX missing or failing for ``.pgf``) raises an ``OSError`` of one
    line, without a file name, which :func:`cubepool._files.atomic_path` gives it: the
    file being written.

    The text is drawn as it is: each text from the trace or a layout with matplotlib's
    math text off (a name with ``$``, such as ``load $5 and $6``, was drawn as math, and
    one matplotlib could not parse as math failed the picture; the tick labels are
    matplotlib's own and keep the user's settings), without ``text.usetex`` (which would
    send the trace's names to LaTeX), and for ``.pgf``, which LaTeX typesets, with
    LaTeX's specials escaped."""
    try:
        import matplotlib
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            f'writing .{form} needs matplotlib: pip install "cubepool[plot]" '
            "(or write .html, which needs nothing more)"
        ) from exc
    with matplotlib.rc_context({"text.usetex": False}):
        _draw(figure, path, form)


def _draw(figure: _Figure, path: Path, form: str) -> None:
    """:func:`_matplotlib`'s drawing, under its settings."""
    from matplotlib.figure import Figure

    # What a text says, as matplotlib draws it: LaTeX text for .pgf (escaped here, at
    # the draw, so that the widths the labels are fitted by are the names' own), and
    # never math (`parse_math=False` on each text from the trace, so that the tick
    # labels a user's `axes.formatter.use_mathtext` writes as math still are).
    tex = _tex_text if form == "pgf" else str
    n = len(figure.panels)
    fig = Figure(figsize=(11, 2.9 * n + 0.9), layout="constrained")
    axes = fig.subplots(n, 1, sharex=True, squeeze=False)[:, 0]
    # Phase labels in rows, so that short phases' names do not run into each other:
    # the plot area is about 77 % of the 11-inch figure at 110 dpi, 7-point text 10.7
    # pixels (drawn as " name"); rows of 7 % of the axis above its foot.
    plot_px = 11 * 110 * 0.77
    xs = [x / figure.x_max * plot_px for _, x in figure.phases]
    widths = [_text_px(f" {name} ", 7 * 110 / 72) for name, _ in figure.phases]
    # A name that would run past the plot's right end is left out (and counted).
    rows = [
        None if row is None or x + width > plot_px else row
        for row, x, width in zip(
            _label_rows(xs, widths, _PHASE_LABEL_ROWS), xs, widths, strict=True
        )
    ]
    fig.suptitle(tex(figure.heading), fontsize=12, x=0.01, ha="left", parse_math=False)
    for ax, panel in zip(axes, figure.panels, strict=True):
        if panel.pools:
            ax.stackplot(
                panel.x,
                *[s.values for s in panel.pools],
                labels=[tex(s.label) for s in panel.pools],
                colors=[s.color for s in panel.pools],
                alpha=0.6,
            )
        ax.plot(panel.x, panel.reserved, color=_RESERVED, lw=1.0, label="reserved")
        ax.fill_between(
            panel.x, panel.in_use_low, panel.in_use_high, color=_IN_USE, alpha=0.25, lw=0
        )
        ax.plot(panel.x, panel.in_use_high, color=_IN_USE, lw=1.0, label="in use")
        ax.axhline(figure.floor, color="#555555", ls=":", lw=0.9, label="peak live")
        if figure.recorded is not None:
            ax.plot(*figure.recorded, color=_RECORDED, lw=1.2, ls="--", label=RECORDED_LABEL)
        # The peak's label, which no name is drawn over (one that would be is left out
        # and counted): 8-point text 6 points above the peak, in pixels across and in
        # fractions of the axis' height (about 2.6 inches at 110 dpi) up.
        right = panel.peak_x > figure.x_max * 0.7
        peak_px = panel.peak_x / figure.x_max * plot_px
        peak_w = _text_px(panel.peak_text, 8 * 110 / 72)
        peak_x0 = peak_px - 12 - peak_w if right else peak_px - 4
        peak_x1 = peak_px + 4 if right else peak_px + 12 + peak_w
        peak_y0 = panel.peak / panel.y_max if panel.y_max else 0.0
        peak_y1 = peak_y0 + 0.1
        panel_rows = [
            None
            if row is None
            or (
                x < peak_x1
                and peak_x0 < x + width
                and 0.015 + 0.07 * row < peak_y1
                and peak_y0 < 0.015 + 0.07 * row + 0.05
            )
            else row
            for row, x, width in zip(rows, xs, widths, strict=True)
        ]
        note = _hidden_note(panel_rows)
        drawn = -math.inf  # the last phase line's pixel (see _PHASE_LINE_GAP)
        for (name, x), px, row in zip(figure.phases, xs, panel_rows, strict=True):
            if px - drawn >= _PHASE_LINE_GAP:
                drawn = px
                ax.axvline(x, color="#888888", ls="--", lw=0.7)
            if row is None:
                continue
            # At the foot of the panel, as in the SVG: the peak's label is mostly near the
            # top.
            ax.text(
                x,
                panel.y_max * (0.015 + 0.07 * row),
                f" {tex(name)}",
                fontsize=7,
                color="#555555",
                va="bottom",
                parse_math=False,
            )
        ax.plot([panel.peak_x], [panel.peak], marker="v", color=_RESERVED, ms=6)
        ax.annotate(
            tex(panel.peak_text),
            xy=(panel.peak_x, panel.peak),
            xytext=(-8 if right else 8, 6),
            textcoords="offset points",
            ha="right" if right else "left",
            fontsize=8,
            parse_math=False,
        )
        ax.set_title(tex(panel.title), fontsize=8.5, loc="left", parse_math=False)
        if note:  # a line of the legend, clear of the plot and its labels
            ax.plot([], [], " ", label=tex(note))
        ax.set_ylabel(tex(figure.unit), parse_math=False)
        ax.set_ylim(0, panel.y_max)
        if figure.unit == "B":  # whole bytes: an empty trace's axis has no 0.2 B
            ax.yaxis.get_major_locator().set_params(integer=True)
        if figure.by_event:  # and whole events
            ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_xlim(0, figure.x_max)
        ax.grid(axis="y", color="#eeeeee", lw=0.6)
        legend = ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)
        for text in legend.get_texts():  # pool labels are layouts' descriptions
            text.set_parse_math(False)
    axes[-1].set_xlabel(tex(figure.x_label), parse_math=False)
    try:
        fig.savefig(path, dpi=110, format=form)
    except (RuntimeError, ValueError) as exc:
        # matplotlib reports a TeX program missing as a RuntimeError, and LaTeX failing
        # on a text as a ValueError with its whole output: the first line says which.
        cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise OSError(f"matplotlib could not write .{form}: {cause}") from exc


# --------------------------------------------------------------------------- SVG / HTML


def _ticks(top: float, count: int = 5, *, whole: bool = False) -> list[float]:
    """Round tick values from 0 to about ``top`` (whole numbers only when ``whole``:
    an axis in bytes has no fraction of a byte)."""
    if top <= 0:
        return [0.0]
    raw = top / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    if whole:
        step = max(1.0, math.ceil(step))
    ticks = []
    value = 0.0
    while value <= top * 1.0001:
        ticks.append(value)
        value += step
    return ticks


_PHASE_LABEL_ROWS: Final = 6
"""The most rows of phase names at a plot's foot, in every picture (the page's script
has the same, ``PHASE_LABEL_ROWS``): a trace of thousands of phases would otherwise
cover the picture with names. The names that find no room are counted in a note; the
page shows them as one zooms in."""


_PHASE_LINE_GAP: Final = 6
"""The fewest pixels between two phase lines, in every picture (the page's script has
the same, ``PHASE_LINE_GAP``): a phase closer to the last line drawn gets none. Closer,
thousands of phases washed the plot grey (one a pixel made the SVG of five panels 4 MB);
the page draws them as one zooms in."""


def _label_rows(xs: Sequence[float], widths: Sequence[float], max_rows: int) -> list[int | None]:
    """The row of each label placed at ``xs`` (pixels, in time order), ``widths`` pixels
    wide: the lowest of the first ``max_rows`` rows where it does not run into the
    label before it, so that short phases' names stay apart ("setup" and "reserve"
    instead of "setuperve"); ``None`` for a label that fits in none of them (it is not
    drawn: :func:`_hidden_note` counts it). At most ``max_rows`` rows are looked at a
    label, so the work is linear in the labels (a row a label, with no cap, made 8,000
    phases at one time 32 million looks, and rows past the panel's height were drawn
    outside it)."""
    ends: list[float] = []  # the right end of the last label of each row
    rows: list[int | None] = []
    for x, width in zip(xs, widths, strict=True):
        row = next((r for r, end in enumerate(ends) if x >= end), len(ends))
        if row == max_rows:
            rows.append(None)
            continue
        if row == len(ends):
            ends.append(0.0)
        ends[row] = x + width
        rows.append(row)
    return rows


def _hidden_note(rows: Sequence[int | None]) -> str:
    """What a panel says of the phase names :func:`_label_rows` found no row for ('' for
    none): their lines are drawn, their names are not."""
    hidden = sum(row is None for row in rows)
    return f"+{counted(hidden, 'phase name')} not shown (no room)" if hidden else ""


def _fmt(value: float) -> str:
    return f"{value:.0f}" if value == int(value) else f"{value:.3g}"


_W: Final = 980
_PANEL_H: Final = 250
_LEFT: Final = 62
_RIGHT: Final = 236
"""Room right of the plot for the legend: a pool's label as long as
"pool 12: exclusive pages <= 10.2 MiB" fits on one line."""
_TOP: Final = 34
_BOTTOM: Final = 34


_LEGEND_ROW: Final = 15
"""From one legend entry to the next; a label wrapped onto more lines goes on
:data:`_LEGEND_LINE` lower a line."""
_LEGEND_LINE: Final = 12
_LEGEND_TEXT_X: Final = _W - _RIGHT + 12 + 17
"""Where the legend's labels start: right of the plot and their keys."""
_HEADING_LINE: Final = 18
_TITLE_LINE: Final = 13

_NARROW: Final = frozenset(" .,:;'|ilIj-/")
_MEDIUM: Final = frozenset('!()[]"`')
_WIDE: Final = frozenset("mwMW@%")
_SYMBOL: Final = frozenset("<>=+~^#$*_&{}")


def _char_em(c: str) -> float:
    """About how wide ``c`` is, in ems: at or over DejaVu Sans' advance for every
    printable ASCII character, and its bold's at 1.15 times this (``{`` 0.64, a lowercase
    ``b`` 0.635, an uppercase ``O`` 0.79, a digit 0.64; ``tests/python/test_plot_layout.py``
    holds the font's table and checks it). The page's script has the same table
    (``charEm`` in ``_interactive.js``): change the two together (``test_plot_scale``
    checks they agree on printable ASCII)."""
    if c in _NARROW:
        return 0.37
    if c in _MEDIUM:
        return 0.5
    if c in "ftr":
        return 0.43
    if c in _WIDE:
        return 1.0
    if c in _SYMBOL:
        return 0.86
    return 0.65 if c.isdigit() else 0.8 if c.isupper() else 0.64


def _text_px(text: str, size: float, *, bold: bool = False) -> float:
    """About how wide ``text`` is in ``size``-pixel sans-serif: a few percent over what
    DejaVu Sans (the fallback of most renderers, and wider than the Arial or Helvetica
    of browsers) makes of the texts these pictures hold, so text laid out by it stays
    in its room."""
    return sum(_char_em(c) for c in text) * size * (1.15 if bold else 1.0)


_BREAK: Final = re.compile(r"(?<!<=) (?!(?:B|KiB|MiB|GiB|TiB)\b)")
"""The spaces a line may break at: not between a size and its unit ("32 KiB"), nor
after "<="."""


def _wrap(text: str, width: float, size: float, *, bold: bool = False, lines: int) -> list[str]:
    """``text`` in lines of at most ``width`` pixels (:func:`_text_px`), broken at
    spaces (a word wider than a line is cut), at most ``lines`` of them: the last ends
    in an ellipsis where more was left."""
    out: list[str] = []
    line = ""
    for word in _BREAK.split(text):
        candidate = f"{line} {word}" if line else word
        if _text_px(candidate, size, bold=bold) <= width:
            line = candidate
            continue
        if line:
            out.append(line)
        # A word wider than a line on its own is cut where it fills one.
        while _text_px(word, size, bold=bold) > width and len(out) <= lines:
            used, cut = 0.0, 0
            while cut < len(word) - 1:
                used += _text_px(word[cut], size, bold=bold)
                if used > width:
                    break
                cut += 1
            cut = max(cut, 1)
            out.append(word[:cut])
            word = word[cut:]
        line = word
        if len(out) > lines:
            break
    out.append(line)
    if len(out) > lines:
        last = out[lines - 1]
        while last and _text_px(last + "\u2026", size, bold=bold) > width:
            last = last[:-1]
        out = [*out[: lines - 1], last.rstrip() + "\u2026"]
    return out


def _heading_lines(figure: _Figure) -> list[str]:
    return _wrap(figure.heading, _W - 16, 15, bold=True, lines=2)


def _title_lines(panel: _Panel) -> list[str]:
    """The panel's title in lines across the picture. Where it takes more than four,
    the layout's description is cut short (ending in an ellipsis), never what follows
    its last " | ": the peak, utilization and allocations, or what an INCOMPLETE
    panel's peak covers."""
    width, bold = _W - _LEFT - 4, not panel.complete
    lines = _wrap(panel.title, width, 11, bold=bold, lines=4)
    head, bar, tail = panel.title.rpartition(" | ")
    if not lines[-1].endswith("\u2026") or not bar:
        return lines
    tail_lines = _wrap("| " + tail, width, 11, bold=bold, lines=3)
    return _wrap(head, width, 11, bold=bold, lines=max(1, 4 - len(tail_lines))) + tail_lines


def _legend(figure: _Figure, panel: _Panel) -> list[tuple[list[str], str, str, float]]:
    """The legend's entries: (label lines, colour, kind of key, the first line's
    baseline below the panel's top). A label too wide for the room right of the plot
    is wrapped onto more lines."""
    entries: list[tuple[str, str, str]] = [(s.label, s.color, "box") for s in panel.pools]
    entries += [
        ("reserved", _RESERVED, "line"),
        ("in use (min-max)", _IN_USE, "line"),
        ("peak live", "#555", "dash"),
    ]
    if figure.recorded is not None:
        entries.append((RECORDED_LABEL, _RECORDED, "recorded"))
    out = []
    y = 8.0
    for label, color, kind in entries:
        lines = _wrap(label, _W - _LEGEND_TEXT_X - 2, 10, lines=3)
        out.append((lines, color, kind, y))
        y += _LEGEND_ROW + _LEGEND_LINE * (len(lines) - 1)
    return out


def _panel_height(figure: _Figure, panel: _Panel) -> float:
    """A panel tall enough for its legend: every entry (the pools, the lines, the
    recorded run's where there is one) and a row to spare above the panel's foot."""
    lines, _, _, y = _legend(figure, panel)[-1]
    last = y + _LEGEND_LINE * (len(lines) - 1)
    return max(_PANEL_H, last + _LEGEND_ROW + 20)


def _svg(figure: _Figure) -> str:
    heights = [_panel_height(figure, panel) for panel in figure.panels]
    titles = [_title_lines(panel) for panel in figure.panels]
    heading = _heading_lines(figure)
    above = [_TITLE_LINE * (len(lines) - 1) for lines in titles]
    height = (
        _TOP
        + _HEADING_LINE * (len(heading) - 1)
        + sum(h + 26 + a for h, a in zip(heights, above, strict=True))
        + _BOTTOM
    )
    body = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{height}" '
        f'viewBox="0 0 {_W} {height}" font-family="sans-serif" font-size="11" '
        'style="max-width:100%;height:auto">',
        '<rect width="100%" height="100%" fill="white"/>',
    ]
    body += [
        f'<text x="8" y="{20 + _HEADING_LINE * i}" font-size="15" font-weight="bold">'
        f"{markup_text(line)}</text>"
        for i, line in enumerate(heading)
    ]
    top = _TOP + 18.0 + _HEADING_LINE * (len(heading) - 1)
    for index, (panel, panel_h) in enumerate(zip(figure.panels, heights, strict=True)):
        last = index == len(figure.panels) - 1
        top += above[index]
        body.append(_svg_panel(figure, panel, top, panel_h, titles[index], last=last))
        top += panel_h + 26
    body.append("</svg>")
    return "\n".join(body)


def _svg_panel(
    figure: _Figure, panel: _Panel, top: float, panel_h: float, title: list[str], *, last: bool
) -> str:
    plot_w = _W - _LEFT - _RIGHT
    plot_h = panel_h - 20

    def sx(x: float) -> float:
        return _LEFT + plot_w * x / figure.x_max

    def sy(y: float) -> float:
        return top + plot_h * (1 - y / panel.y_max)

    def points(xs: Sequence[float], ys: Sequence[float]) -> str:
        return " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(xs, ys, strict=True))

    colour = "" if panel.complete else ' fill="#b00020" font-weight="bold"'
    # The title's lines above the panel, the last just over it.
    out = [
        f'<text x="{_LEFT}" y="{top - 6 - _TITLE_LINE * (len(title) - 1 - i):.1f}" '
        f'font-size="11"{colour}>{markup_text(line)}</text>'
        for i, line in enumerate(title)
    ]
    out.append(
        f'<rect x="{_LEFT}" y="{top:.1f}" width="{plot_w}" height="{plot_h}" '
        'fill="none" stroke="#999" stroke-width="0.6"/>'
    )
    for tick in _ticks(panel.y_max / _HEADROOM, whole=figure.unit == "B"):
        y = sy(tick)
        out.append(
            f'<line x1="{_LEFT}" x2="{_LEFT + plot_w}" y1="{y:.1f}" y2="{y:.1f}" '
            'stroke="#eee" stroke-width="0.6"/>'
        )
        out.append(f'<text x="{_LEFT - 4}" y="{y + 3:.1f}" text-anchor="end">{_fmt(tick)}</text>')
    middle = top + plot_h / 2
    out.append(
        f'<text x="14" y="{middle:.1f}" transform="rotate(-90 14 {middle:.1f})" '
        f'text-anchor="middle">{figure.unit}</text>'
    )
    # Stacked pools.
    base = [0.0] * len(panel.x)
    for series in panel.pools:
        upper = [b + v for b, v in zip(base, series.values, strict=True)]
        polygon = points(panel.x, upper) + " " + points(panel.x[::-1], base[::-1])
        out.append(f'<polygon points="{polygon}" fill="{series.color}" fill-opacity="0.6"/>')
        base = upper
    band = points(panel.x, panel.in_use_high) + " " + points(panel.x[::-1], panel.in_use_low[::-1])
    out.append(f'<polygon points="{band}" fill="{_IN_USE}" fill-opacity="0.25"/>')
    out.append(
        f'<polyline points="{points(panel.x, panel.reserved)}" fill="none" '
        f'stroke="{_RESERVED}" stroke-width="1"/>'
    )
    out.append(
        f'<polyline points="{points(panel.x, panel.in_use_high)}" fill="none" '
        f'stroke="{_IN_USE}" stroke-width="1"/>'
    )
    floor = sy(figure.floor)
    out.append(
        f'<line x1="{_LEFT}" x2="{_LEFT + plot_w}" y1="{floor:.1f}" y2="{floor:.1f}" '
        'stroke="#555" stroke-dasharray="2,3" stroke-width="0.9"/>'
    )
    if figure.recorded is not None:
        out.append(
            f'<polyline points="{points(*figure.recorded)}" fill="none" stroke="{_RECORDED}" '
            'stroke-width="1.3" stroke-dasharray="5,3"/>'
        )
    # 9-pixel text as wide as _text_px says (5 pixels a character at least), 11 pixels
    # a row: up to _PHASE_LABEL_ROWS rows above the panel's foot. A name is drawn right
    # of its line,
    # or, where that would run out of the plot (a phase near the end), left of it; a
    # name wider than the plot is cut.
    right_edge = _LEFT + plot_w
    names = [
        n if _text_px(n, 9) <= plot_w - 6 else _wrap(n, plot_w - 6, 9, lines=1)[0]
        for n, _ in figure.phases
    ]
    widths = [max((len(n) + 1) * 5.0, 3 + _text_px(n, 9)) for n in names]
    starts = [
        sx(x) if sx(x) + w <= right_edge else max(_LEFT, min(sx(x) - 3, right_edge) - w)
        for (_, x), w in zip(figure.phases, widths, strict=True)
    ]
    fit = max(1, int((plot_h - 13) // 11) + 1)
    rows = _label_rows(starts, widths, min(fit, _PHASE_LABEL_ROWS))
    # The peak's marker and label, which no name is drawn over (one that would be is
    # left out, and counted with those that found no row).
    px, py = sx(panel.peak_x), sy(panel.peak)
    peak_right = panel.peak_x > figure.x_max * 0.7
    peak_w = _text_px(panel.peak_text, 10)
    peak_x0 = px - 10 - peak_w if peak_right else px - 6
    peak_x1 = px + 6 if peak_right else px + 10 + peak_w
    peak_y0, peak_y1 = py - 18, py + 2

    def over_peak(row: int, start: float, width: float) -> bool:
        baseline = top + plot_h - 4 - 11 * row
        return (
            start < peak_x1
            and peak_x0 < start + width
            and baseline - 9 * 0.8 < peak_y1
            and peak_y0 < baseline + 9 * 0.25
        )

    rows = [
        None if row is None or over_peak(row, start, width) else row
        for row, start, width in zip(rows, starts, widths, strict=True)
    ]
    drawn = -math.inf  # the last phase line's x (see _PHASE_LINE_GAP)
    for (_, x), name, start, row in zip(figure.phases, names, starts, rows, strict=True):
        px = sx(x)
        if px - drawn >= _PHASE_LINE_GAP:
            drawn = px
            out.append(
                f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{top:.1f}" y2="{top + plot_h:.1f}" '
                'stroke="#888" stroke-dasharray="4,3" stroke-width="0.7"/>'
            )
        if row is None:
            continue
        # At the foot of the panel, clear of the peak's label at the top; a label that
        # would run into the one before it goes a row up.
        out.append(
            f'<text x="{start + 3:.1f}" y="{top + plot_h - 4 - 11 * row:.1f}" fill="#555" '
            f'font-size="9">{markup_text(name)}</text>'
        )
    note = _hidden_note(rows)
    if note:
        # Under the axis, at the right: clear of the tick labels and the axis label.
        out.append(
            f'<text x="{_LEFT + plot_w}" y="{top + plot_h + 24:.1f}" text-anchor="end" '
            f'fill="#555" font-size="9" class="phase-note">{markup_text(note)}</text>'
        )
    px, py = sx(panel.peak_x), sy(panel.peak)  # the phases' loop took px
    out.append(
        f'<path d="M{px - 4:.1f},{py - 7:.1f} L{px + 4:.1f},{py - 7:.1f} '
        f'L{px:.1f},{py:.1f} Z" fill="{_RESERVED}"/>'
    )
    anchor, dx = ("end", -8) if peak_right else ("start", 8)
    out.append(
        f'<text x="{px + dx:.1f}" y="{py - 8:.1f}" text-anchor="{anchor}" font-size="10">'
        f"{markup_text(panel.peak_text)}</text>"
    )
    # X ticks on every panel, the label on the last.
    for tick in _ticks(figure.x_max, whole=figure.by_event):
        x = sx(tick)
        out.append(
            f'<text x="{x:.1f}" y="{top + plot_h + 13:.1f}" text-anchor="middle" '
            f'font-size="9">{_fmt(tick)}</text>'
        )
    if last:
        out.append(
            f'<text x="{_LEFT + plot_w / 2:.1f}" y="{top + plot_h + 28:.1f}" '
            f'text-anchor="middle">{figure.x_label}</text>'
        )
    # Legend.
    lx = _LEGEND_TEXT_X - 17
    for lines, color, kind, y in _legend(figure, panel):
        ly = top + y
        if kind == "box":
            out.append(
                f'<rect x="{lx}" y="{ly - 8:.1f}" width="12" height="9" fill="{color}" '
                'fill-opacity="0.6"/>'
            )
        else:
            # Each key dashed as its line is: the recorded run's 5,3, not peak live's 2,3.
            dash = {"dash": ' stroke-dasharray="2,3"', "recorded": ' stroke-dasharray="5,3"'}
            out.append(
                f'<line x1="{lx}" x2="{lx + 12}" y1="{ly - 4:.1f}" y2="{ly - 4:.1f}" '
                f'stroke="{color}" stroke-width="1.5"{dash.get(kind, "")}/>'
            )
        out += [
            f'<text x="{_LEGEND_TEXT_X}" y="{ly + _LEGEND_LINE * i:.1f}" font-size="10">'
            f"{markup_text(line)}</text>"
            for i, line in enumerate(lines)
        ]
    return "\n".join(out)


_ABOUT: Final = (
    "Each panel is one pool layout replaying the trace. Coloured areas: the bytes each pool "
    "holds from the device, stacked; black line: all bytes reserved; red: the bytes in use "
    "(the band spans the least and most of each sample, so the peaks are exact); dotted: "
    "the trace's peak live bytes, the floor no allocator can go under; dashed: the phases "
    "of the trace; purple dashes, where the trace has a recording: what the recorded run's "
    "own allocator reserved (torch (recorded)), on every panel. A panel titled INCOMPLETE "
    "is a replay whose reservations failed: its peak covers only what it served."
)


def _rounded(values: Sequence[float]) -> list[float]:
    return [float(f"{v:.5g}") for v in values]


def _payload(figure: _Figure) -> dict[str, object]:
    """What the interactive page draws, as JSON-ready data (values in ``unit``)."""
    return {
        "heading": figure.heading,
        "by_event": figure.by_event,
        "x_label": figure.x_label,
        "unit": figure.unit,
        "y_max": figure.y_max,
        "x_max": figure.x_max,
        "floor": figure.floor,
        "phases": [[name, x] for name, x in figure.phases],
        "recorded": None
        if figure.recorded is None
        else {
            "label": RECORDED_LABEL,
            "x": _rounded(figure.recorded[0]),
            "y": _rounded(figure.recorded[1]),
        },
        "panels": [
            {
                "title": panel.title,
                "label": panel.label,
                "complete": panel.complete,
                "x": _rounded(panel.x),
                "pools": [
                    {
                        "label": series.label,
                        "color": series.color,
                        "values": _rounded(series.values),
                        "in_use": _rounded(series.in_use),
                    }
                    for series in panel.pools
                ],
                "reserved": _rounded(panel.reserved),
                "in_low": _rounded(panel.in_use_low),
                "in_high": _rounded(panel.in_use_high),
                "peak": panel.peak,
                "peak_x": panel.peak_x,
                "peak_text": panel.peak_text,
                "y_max": panel.y_max,
            }
            for panel in figure.panels
        ],
    }

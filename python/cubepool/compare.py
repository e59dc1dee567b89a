"""Replaying one trace through several pool layouts, side by side."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final, Literal, cast

from cubepool._cubepool import (
    MemoryConfiguration,
    MemoryDeviceProperties,
    Recording,
    ReplayResult,
    TorchAllocatorModel,
)
from cubepool._errors import InvalidArgument
from cubepool._format import human_bytes, table, unique_labels
from cubepool._terminal import name_cell
from cubepool._trace import TraceLike, replay, resolve_trace, trace_name
from cubepool.layouts import PRESETS, Layout, LayoutLike, describe, resolve_layout, to_spec
from cubepool.recorded import RECORDED_LABEL, difference_percent, differences, recorded_dict

__all__ = ["COMPARE_DEFAULTS", "Comparison", "Row", "compare", "failure_text", "rank_key"]

COMPARE_DEFAULTS: Final = ("default", "sub_slices", "exclusive_pages")
"""The layouts :func:`compare` replays when given none."""

Objective = Literal["reserved", "storage_allocations"]

Layouts = Mapping[str, LayoutLike] | Iterable[LayoutLike | tuple[str, LayoutLike]] | LayoutLike
"""Layouts to compare: one layout argument (anything
:func:`cubepool.layouts.resolve_layout` takes: a layout, a :class:`cubepool.Plan`, a
preset or model name, pools-language text, a layout file), an iterable of them or of
``(label, layout)`` pairs, or a mapping of label to layout. A single string is one
layout, never a list of letters."""


def failure_text(failures: Mapping[str, int], limit: int | None = None) -> str:
    """Why a replay's reservations failed, in words, from its ``failures`` counts and
    the memory limit it ran under (``ReplayResult.limit``): ``"3 too big for every pool,
    12 over the memory limit"``; empty when none failed. Without a limit the storage
    refuses only what it cannot address, so ``over_limit`` reads "refused by the
    storage"."""
    refused = "over the memory limit" if limit is not None else "refused by the storage"
    causes = (
        ("too_big", "too big for every pool"),
        ("pools_full", "in full capped pools"),
        ("over_limit", refused),
    )
    return ", ".join(f"{failures[key]:,} {words}" for key, words in causes if failures.get(key))


def rank_key(result: ReplayResult, objective: Objective = "reserved") -> tuple[float, ...]:
    """The sort key that puts the better of two replays of one trace first.

    Complete replays (every reservation served) come first, then fewer failed
    reservations; then, for ``"reserved"``, fewer peak bytes reserved, then fewer storage
    allocations (cudaMalloc calls); for ``"storage_allocations"``, fewer storage
    allocations, then fewer bytes.
    """
    incomplete = 0 if result.complete else 1
    if objective == "storage_allocations":
        return (
            incomplete,
            result.failed_reserves,
            result.storage_allocations,
            result.peak_reserved,
        )
    return (incomplete, result.failed_reserves, result.peak_reserved, result.storage_allocations)


def over_floor_cell(result: ReplayResult) -> str:
    """A table cell of ``result``'s peak reserved bytes over the floor (the trace's peak
    live bytes): ``10.0 MiB``, or ``-`` for an incomplete replay (its peak covers only
    what it served, so its distance from the floor means nothing)."""
    over = result.reserved_over_floor
    return "-" if over is None else human_bytes(over)


@dataclass(frozen=True)
class Row:
    """One layout's replay of the trace.

    Attributes:
        label: the layout's name in the table.
        config: the layout.
        result: what it did with the trace.
    """

    label: str
    config: Layout
    result: ReplayResult

    def to_dict(self, *, timeline: bool = False) -> dict[str, Any]:
        """The row as JSON-ready data: label, layout (as :func:`cubepool.layouts.to_spec`
        and in words) and the replay's figures."""
        return {
            "label": self.label,
            "layout": to_spec(self.config),
            "description": describe(self.config),
            **self.result.to_dict(timeline=timeline),
        }


HEADERS: Final = [
    "layout",
    "peak reserved",
    "utilization",
    "over floor",
    "vs best",
    "storage allocs",
    "storage frees",
    "failed",
    "ns/event",
]


@dataclass(frozen=True)
class Comparison:
    """Several layouts replayed on one trace, best first.

    Attributes:
        trace: the trace's name.
        peak_live: the trace's peak live bytes (what a perfect allocator reserves).
        rows: one per layout, best first (see :func:`rank_key`).
        objective: what "best" meant.
        recorded: what PyTorch itself reserved in the recorded run, where the trace
            has it (``Trace.recording``); the table then shows it as a row
            ``torch (recorded)`` and each layout's difference from it.
    """

    trace: str
    peak_live: int
    rows: tuple[Row, ...]
    objective: Objective = "reserved"
    recorded: Recording | None = None

    @property
    def best(self) -> Row:
        """The best row."""
        return self.rows[0]

    @property
    def complete(self) -> bool:
        """Whether every layout served every reservation of the trace."""
        return all(row.result.complete for row in self.rows)

    def table(self) -> str:
        """The comparison as a plain-text table, one row per layout, best first. Each
        row's *over floor* is its peak reserved bytes less the trace's peak live bytes
        (the floor no allocator can beat). A layout whose reservations failed is marked
        ``incomplete`` (its peaks cover only what it served, so it has no utilization,
        no distance from the floor and no ratio to the best), and a note under the
        table says why its reservations failed. *vs best* is a row's peak reserved over
        the least any complete replay reserved, whatever ranks the rows."""
        # The least reserved of the complete replays: the first row under the default
        # objective, not under "storage_allocations" (which ranks by calls first).
        complete = [row.result.peak_reserved for row in self.rows if row.result.complete]
        best = min(complete, default=0)
        lines = []
        notes = []
        for row in self.rows:
            r = row.result
            done = r.complete
            lines.append(
                [
                    row.label,
                    human_bytes(r.peak_reserved),
                    f"{r.utilization:.3f}" if done else "incomplete",
                    over_floor_cell(r),
                    f"{r.peak_reserved / best:.2f}x" if best and done else "-",
                    f"{r.storage_allocations:,}",
                    f"{r.storage_frees:,}",
                    f"{r.failed_reserves:,}",
                    f"{r.ns_per_event:.0f}",
                ]
            )
            if not done:
                label = name_cell(row.label)
                notes.append(f"{label}: {failure_text(r.failures, r.limit)}")
        headers = HEADERS
        recorded = self.recorded
        if recorded is not None:
            # The recording first, as the row every layout is measured against.
            headers = [*HEADERS, "vs recorded"]
            for row, line in zip(self.rows, lines, strict=True):
                diff = difference_percent(row.result.peak_reserved, recorded)
                line.append("-" if diff is None or not row.result.complete else f"{diff:+.1f}%")
            # A recording of 0 B reserved has no utilization where bytes were live (and
            # a perfect one where none were), as a replay's.
            if recorded.peak:
                util = f"{self.peak_live / recorded.peak:.3f}"
            else:
                util = "-" if self.peak_live else f"{1.0:.3f}"
            lines.insert(
                0,
                [RECORDED_LABEL, human_bytes(recorded.peak), util]
                + ["-"] * (len(HEADERS) - 3)
                + ["0.0%"],
            )
        text = table(headers, lines)
        if recorded is not None:
            text += "\n\n" + "\n".join(
                differences(recorded, [(r.label, r.config, r.result) for r in self.rows])
            )
        if notes:
            text += "\n\nfailed reservations (peaks of these rows cover only what was served):"
            text += "".join(f"\n  {note}" for note in notes)
        return text

    def to_dict(self, *, timeline: bool = False) -> dict[str, Any]:
        """The comparison as JSON-ready data (rows best first)."""
        rows = [row.to_dict(timeline=timeline) for row in self.rows]
        recorded = None
        if self.recorded is not None:
            recorded = recorded_dict(self.recorded, timeline=timeline)
            for data, row in zip(rows, self.rows, strict=True):
                # An incomplete replay's peak covers only what was served (None, as
                # the table's "-").
                data["vs_recorded_percent"] = (
                    difference_percent(row.result.peak_reserved, self.recorded)
                    if row.result.complete
                    else None
                )
        return {
            "trace": self.trace,
            "peak_live": self.peak_live,
            "objective": self.objective,
            "recorded": recorded,
            "rows": rows,
        }

    def __str__(self) -> str:
        return self.table()


def _is_single(layouts: object) -> bool:
    """Whether a layouts argument is one layout rather than a collection of them."""
    return isinstance(layouts, str | os.PathLike | MemoryConfiguration | TorchAllocatorModel) or (
        isinstance(getattr(layouts, "config", None), MemoryConfiguration)
    )


def _labelled(layouts: Layouts | None) -> list[tuple[str, Layout]]:
    """``(label, layout)`` pairs, labels unique (:func:`unique_labels`: two layout files
    of one name are labelled by their paths)."""
    if layouts is None:
        return [(name, PRESETS[name]()) for name in COMPARE_DEFAULTS]
    if _is_single(layouts):
        return [resolve_layout(layouts)]
    if isinstance(layouts, Mapping):
        return [(label, resolve_layout(value)[1]) for label, value in layouts.items()]
    out: list[tuple[str, Layout]] = []
    given: list[str] = []
    for item in cast(Iterable[Any], layouts):
        if isinstance(item, tuple):
            label, value = item
            out.append((label, resolve_layout(value)[1]))
        else:
            out.append(resolve_layout(item))
        given.append(os.fspath(item) if isinstance(item, str | os.PathLike) else out[-1][0])
    labels = unique_labels([label for label, _ in out], given)
    return [(label, layout) for label, (_, layout) in zip(labels, out, strict=True)]


def compare(
    trace: TraceLike,
    layouts: Layouts | None = None,
    properties: MemoryDeviceProperties | None = None,
    *,
    limit: int | str | None = None,
    objective: Objective = "reserved",
    samples: int = 512,
    name: str | None = None,
    device: str | int | None = None,
    stream: int | None = None,
) -> Comparison:
    """Replay ``trace`` through each layout and rank them.

    Args:
        trace: the trace, a trace file's path or a bundled example's name.
        layouts: one layout or several (see :data:`Layouts`): layouts, plans, names (a
            preset, ``torch`` or ``torch_expandable`` for the models of PyTorch's
            caching allocator), pools-language text, layout files, ``(label, layout)``
            pairs or a mapping of label to layout; ``None`` compares the default layout
            with ``SubSlices`` and ``ExclusivePages``.
        properties: the device (the default device when None).
        limit: the device's memory, in bytes or as a size such as ``"300MiB"``;
            incomplete replays (failed reservations) rank after every complete one.
        objective: how rows are ranked, see :func:`rank_key`.
        samples: timeline points kept per replay.
        name: the trace's name in the comparison (its workload by default).
        device: the device to read from a trace file that holds several.
        stream: the stream to read from a trace file that holds several.

    Returns:
        A :class:`Comparison` whose rows are best first; ``str()`` of it is the table.

    Raises:
        InvalidArgument: ``objective`` is neither ``"reserved"`` nor
            ``"storage_allocations"``, or ``layouts`` names none.
    """
    if objective not in ("reserved", "storage_allocations"):
        raise InvalidArgument(
            f"objective must be 'reserved' or 'storage_allocations', not {objective!r}"
        )
    ref = trace
    trace = resolve_trace(trace, device=device, stream=stream)
    if name is None:
        name = trace_name(trace, ref)
    labelled = _labelled(layouts)
    if not labelled:
        raise InvalidArgument("compare needs at least one layout")

    def run(item: tuple[str, Layout]) -> Row:
        label, config = item
        return Row(label, config, replay(trace, config, properties, limit=limit, samples=samples))

    # Replays release the GIL, so threads run them in parallel.
    with ThreadPoolExecutor(max_workers=min(len(labelled), 8)) as pool:
        rows = list(pool.map(run, labelled))
    rows.sort(key=lambda row: rank_key(row.result, objective))
    return Comparison(
        trace=name if name is not None else (trace.workload or "trace"),
        peak_live=trace.peak_live,
        rows=tuple(rows),
        objective=objective,
        recorded=trace.recording,
    )

"""Replaying one trace through several pool layouts, side by side."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final, Literal

from cubepool._cubepool import (
    MemoryConfiguration,
    MemoryDeviceProperties,
    ReplayResult,
    TorchAllocatorModel,
    Trace,
)
from cubepool._format import human_bytes, table
from cubepool._trace import replay
from cubepool.layouts import PRESETS, Layout, config_from_arg, describe, layout_label, to_spec

__all__ = ["COMPARE_DEFAULTS", "Comparison", "Row", "compare", "rank_key"]

COMPARE_DEFAULTS: Final = ("default", "sub_slices", "exclusive_pages")
"""The layouts :func:`compare` replays when given none."""

Objective = Literal["reserved", "storage_allocations"]

Layouts = (
    Mapping[str, Layout]
    | Iterable[str | MemoryConfiguration | TorchAllocatorModel | tuple[str, Layout]]
)
"""Layouts to compare: a mapping of label to layout, or an iterable of layouts, preset or
``--config`` names (``torch`` and ``torch_expandable`` among them), or ``(label, layout)``
pairs."""


def rank_key(result: ReplayResult, objective: Objective = "reserved") -> tuple[float, ...]:
    """The sort key that puts the better of two replays of one trace first.

    ``"reserved"``: fewer failed reservations, then fewer peak bytes reserved, then fewer
    storage allocations (cudaMalloc calls). ``"storage_allocations"``: fewer failures,
    then fewer storage allocations, then fewer bytes.
    """
    if objective == "storage_allocations":
        return (result.failed_reserves, result.storage_allocations, result.peak_reserved)
    return (result.failed_reserves, result.peak_reserved, result.storage_allocations)


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
    """

    trace: str
    peak_live: int
    rows: tuple[Row, ...]
    objective: Objective = "reserved"

    @property
    def best(self) -> Row:
        """The best row."""
        return self.rows[0]

    def table(self) -> str:
        """The comparison as a plain-text table, one row per layout, best first."""
        best = self.rows[0].result.peak_reserved if self.rows else 0
        lines = []
        for row in self.rows:
            r = row.result
            lines.append(
                [
                    row.label,
                    human_bytes(r.peak_reserved),
                    f"{r.utilization:.3f}",
                    f"{r.peak_reserved / best:.2f}x" if best else "-",
                    f"{r.storage_allocations:,}",
                    f"{r.storage_frees:,}",
                    f"{r.failed_reserves:,}",
                    f"{r.ns_per_event:.0f}",
                ]
            )
        return table(HEADERS, lines)

    def to_dict(self, *, timeline: bool = False) -> dict[str, Any]:
        """The comparison as JSON-ready data (rows best first)."""
        return {
            "trace": self.trace,
            "peak_live": self.peak_live,
            "objective": self.objective,
            "rows": [row.to_dict(timeline=timeline) for row in self.rows],
        }

    def __str__(self) -> str:
        return self.table()


def _labelled(layouts: Layouts | None) -> list[tuple[str, Layout]]:
    if layouts is None:
        return [(name, PRESETS[name]()) for name in COMPARE_DEFAULTS]
    if isinstance(layouts, Mapping):
        return list(layouts.items())
    out: list[tuple[str, Layout]] = []
    for item in layouts:
        if isinstance(item, str):
            out.append(config_from_arg(item))
        elif isinstance(item, MemoryConfiguration | TorchAllocatorModel):
            out.append((layout_label(item), item))
        else:
            label, config = item
            out.append((label, config))
    return out


def compare(
    trace: Trace,
    layouts: Layouts | None = None,
    properties: MemoryDeviceProperties | None = None,
    *,
    limit: int | None = None,
    objective: Objective = "reserved",
    samples: int = 512,
    name: str | None = None,
) -> Comparison:
    """Replay ``trace`` through each layout and rank them.

    Args:
        trace: the trace.
        layouts: a mapping of label to layout, or an iterable of layouts, names (a preset,
            ``torch`` or ``torch_expandable`` for the models of PyTorch's caching
            allocator, or anything ``--config`` takes) or ``(label, layout)`` pairs;
            ``None`` compares the default layout with ``SubSlices`` and
            ``ExclusivePages``.
        properties: the device (the default device when None).
        limit: the device's memory in bytes (failed reservations rank last).
        objective: how rows are ranked, see :func:`rank_key`.
        samples: timeline points kept per replay.
        name: the trace's name in the comparison (its workload by default).

    Returns:
        A :class:`Comparison` whose rows are best first; ``str()`` of it is the table.
    """
    labelled = _labelled(layouts)
    if not labelled:
        raise ValueError("compare needs at least one layout")

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
    )

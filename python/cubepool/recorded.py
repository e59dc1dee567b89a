"""The recording beside the models: what PyTorch really reserved (``Trace.recording``)
against what each replay reserves, as the comparison, the report, ``replay --json`` and
the pictures show it.

A replay starts with the blocks live when the recording began (the import puts them at
the trace's start) but none of the cached free bytes PyTorch held then, and serves one
stream; the run that was recorded had more going on. Where a model of PyTorch's
allocator and the recording differ by more than :data:`MATCH_PERCENT`,
:func:`differences` says so and names what the model leaves out
(:data:`MODEL_LEAVES_OUT`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from cubepool._cubepool import Recording, ReplayResult, TorchAllocatorModel
from cubepool._format import human_bytes

__all__ = [
    "MATCH_PERCENT",
    "MODEL_LEAVES_OUT",
    "RECORDED_LABEL",
    "difference_percent",
    "differences",
    "matching_model",
    "recorded_dict",
]

RECORDED_LABEL: Final = "torch (recorded)"
"""The row or panel of the recording."""

MATCH_PERCENT: Final = 1.0
"""A model within this many percent of the recorded peak matches it."""

MODEL_LEAVES_OUT: Final = (
    "streams (a replay serves every stream of the trace as one)",
    "CUDA graphs' private pools",
    "empty_cache calls",
    "memory pressure (PyTorch frees its cache and retries when cudaMalloc fails)",
    "other processes and libraries on the device",
)
"""What a model of PyTorch's allocator does not see of the recorded run."""


def difference_percent(peak_reserved: int, recording: Recording) -> float | None:
    """How far ``peak_reserved`` is from the recorded peak, in percent of it (positive:
    more); ``None`` when the recording's peak is 0."""
    if recording.peak == 0:
        return None
    return (peak_reserved - recording.peak) / recording.peak * 100.0


def matching_model(recording: Recording | None) -> str | None:
    """The model of PyTorch's allocator with the recorded settings: the recording's
    ``settings`` where the file gave the run's allocator settings (a snapshot's
    ``allocator_settings``: ``"torch_expandable(max_split_size_mb=512)"``, say), else
    ``"torch_expandable"`` when the run used expandable segments, ``"torch"`` when it
    did not, ``None`` when the file does not say (or there is no recording)."""
    if recording is None:
        return None
    if recording.settings is not None:
        return recording.settings
    if recording.expandable_segments is None:
        return None
    return "torch_expandable" if recording.expandable_segments else "torch"


def recorded_dict(recording: Recording, *, timeline: bool = False) -> dict[str, Any]:
    """The recording as JSON-ready data: source,
    device, coverage, expandable segments, the allocator settings (the model's name, or
    ``None``), peak, the event of the peak, the bytes reserved when recording began and,
    with ``timeline``, the points (``[event, t_ns, reserved]``)."""
    data: dict[str, Any] = {
        "label": RECORDED_LABEL,
        "source": recording.source,
        "device": recording.device,
        "covers": recording.covers,
        "expandable_segments": recording.expandable_segments,
        "settings": recording.settings,
        "peak_reserved": recording.peak,
        "peak_reserved_event": recording.peak_event,
        "initial_reserved": recording.initial,
    }
    if timeline:
        data["points"] = [list(point) for point in recording.points]
    return data


def _window_start(recording: Recording) -> str:
    """What a window's first figure says: the bytes reserved before its first event
    where the figure comes before it (a snapshot's), else after as many events as it
    comes after (a profiler's "Total Reserved" is the bytes after its event, the
    event's own reservation among them)."""
    rest = (
        "; a replay starts with the blocks then live (where the import kept them) but no "
        "cached free bytes"
    )
    first = recording.points[0][0] if recording.points else 0
    if first == 0:
        return f"{human_bytes(recording.initial)} were already reserved when it began{rest}"
    events = "event" if first == 1 else f"{first:,} events"
    return (
        f"its first figure, {human_bytes(recording.initial)} reserved, is after its first "
        f"{events} (what was reserved before is not recorded){rest}"
    )


def _percent(value: float) -> str:
    return f"{value:+.1f} %"


def differences(
    recording: Recording,
    rows: Sequence[tuple[str, object, ReplayResult]],
) -> list[str]:
    """Lines saying how each replay's peak compares with the recorded one, and, for each
    model of PyTorch's allocator more than :data:`MATCH_PERCENT` away, what the model
    leaves out. ``rows`` are ``(label, layout, result)``."""
    peak = recording.peak
    expandable = {True: "used", False: "did not use", None: "does not say whether it used"}
    settings = "" if recording.settings is None else f" (settings: {recording.settings})"
    lines = [
        f"{RECORDED_LABEL}: peak reserved {human_bytes(peak)} ({recording.source}, "
        f"{recording.device}); the run {expandable[recording.expandable_segments]} "
        f"expandable segments{settings}"
    ]
    if recording.covers == "window":
        lines.append(f"  the recording covers a window: {_window_start(recording)}")
    for label, layout, result in rows:
        diff = difference_percent(result.peak_reserved, recording)
        if diff is None or not isinstance(layout, TorchAllocatorModel):
            continue
        if not result.complete:
            # Its peak covers only what was served: no figure to set beside the run's.
            lines.append(f"  {label} failed reservations: its peak is not the run's")
            continue
        if abs(diff) <= MATCH_PERCENT:
            lines.append(f"  {label} matches the recording ({_percent(diff)})")
        else:
            lines.append(
                f"  {label} differs from the recording by {_percent(diff)}: the model leaves "
                f"out {', '.join(MODEL_LEAVES_OUT)}"
            )
    return lines

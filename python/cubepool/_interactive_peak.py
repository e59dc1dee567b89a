"""The HTML page's view of the address space at the peak: why reserved exceeds live.

For each replay drawn, :func:`peak_views` takes :meth:`ReplayResult.at_peak` (the
segments reserved at the peak, their live blocks and what the gap is made of) into the
page's payload; ``_interactive_peak.js`` draws it under the panels, in the manner of
PyTorch memory_viz's segment view: one bar per segment, as wide as its bytes, laid out
in rows; live blocks coloured (what they asked for, and their rounding), free bytes of
pinned segments grey, idle segments pale red. Hovering a block shows its allocation, its
bytes and, where the trace has them, its stack frames.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from typing import Any, Final

from cubepool._cubepool import AtPeak, ReplayResult, Trace
from cubepool._errors import InvalidArgument

__all__ = ["peak_views", "script"]

MAX_BLOCKS_PER_SEGMENT: Final = 400
"""Past this many live blocks, a segment's contiguous blocks are drawn merged (one bar
per run of touching blocks), so a page stays small."""
MAX_FRAMES_SHOWN: Final = 8
"""Frames kept per block for the hover text (innermost first)."""


def script() -> str:
    """The view's script (``_interactive_peak.js``, shipped with the package)."""
    return (resources.files(__package__) / "_interactive_peak.js").read_text(encoding="utf-8")


def _blocks(segment: dict[str, Any]) -> tuple[list[list[int]], bool]:
    """A segment's blocks as ``[offset in segment, size, requested, id]`` rows (id -1
    for a merged run), and whether they were merged."""
    start = segment["start"]
    rows = [[b["start"] - start, b["size"], b["requested"], b["id"]] for b in segment["blocks"]]
    if len(rows) <= MAX_BLOCKS_PER_SEGMENT:
        return rows, False
    merged: list[list[int]] = []
    for row in rows:
        last = merged[-1] if merged else None
        if last is not None and last[0] + last[1] == row[0]:
            last[1] += row[1]
            last[2] += row[2]
            last[3] = -1
        else:
            merged.append(list(row))
    return merged, True


class _Stacks:
    """Blocks' stack frames written once each: the distinct frame texts
    (``frame_texts``), the distinct stacks as lists of their indices (``stacks``), and
    each block's stack by its id (``of_block``). A block's frames are its allocation's,
    and a model's allocations mostly share a few stacks (as the trace keeps them): written
    out for each block, one stack of long frames made a page of 40 MB for 20,000 blocks."""

    def __init__(self) -> None:
        self.frame_texts: list[str] = []
        self.stacks: list[list[int]] = []
        self.of_block: dict[str, int] = {}
        self._frame_index: dict[str, int] = {}
        self._stack_index: dict[tuple[int, ...], int] = {}

    def add(self, block: int, frames: Sequence[str]) -> None:
        """Note ``block``'s ``frames``, the first :data:`MAX_FRAMES_SHOWN` (a trace keeps
        a frame's first 240 characters)."""
        indices = []
        for frame in frames[:MAX_FRAMES_SHOWN]:
            index = self._frame_index.setdefault(frame, len(self.frame_texts))
            if index == len(self.frame_texts):
                self.frame_texts.append(frame)
            indices.append(index)
        key = tuple(indices)
        stack = self._stack_index.setdefault(key, len(self.stacks))
        if stack == len(self.stacks):
            self.stacks.append(indices)
        self.of_block[str(block)] = stack


def _view(label: str, view: AtPeak) -> dict[str, Any]:
    """One replay's view as JSON-ready data (bytes as ints). A block's frames are
    ``frame_texts[i]`` for each ``i`` of ``stacks[frames[str(id)]]``."""
    data = view.to_dict()
    stacks = _Stacks()
    segments = []
    merged_any = False
    for segment in data["segments"]:
        rows, merged = _blocks(segment)
        merged_any |= merged
        for b in segment["blocks"]:
            if b["frames"] and not merged:
                stacks.add(b["id"], b["frames"])
        segments.append([segment["group"], segment["start"], segment["size"], rows])
    return {
        "label": label,
        "event": data["event"],
        "reserved": data["reserved"],
        "live": data["live"],
        "requested": data["requested"],
        "free_in_pinned": data["free_in_pinned"],
        "rounding": data["rounding"],
        "idle": data["idle"],
        "pinned_segments": view.pinned_segments,
        "idle_segments": view.idle_segments,
        "merged": merged_any,
        "segments": segments,
        "frame_texts": stacks.frame_texts,
        "stacks": stacks.stacks,
        "frames": stacks.of_block,
    }


def peak_views(trace: Trace, runs: Sequence[tuple[str, ReplayResult]]) -> list[dict[str, Any]]:
    """The view at the peak of each of ``runs`` (replays of ``trace``) that can show
    one: a partial replay (``replay_until``) or one of another trace is passed over."""
    views = []
    for label, result in runs:
        try:
            view = result.at_peak(trace)
        except InvalidArgument:
            continue
        views.append(_view(label, view))
    return views

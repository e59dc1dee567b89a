"""The HTML page's view of the address space at the peak: why reserved exceeds live.

For each replay drawn, :func:`peak_views` takes :meth:`ReplayResult.at_peak` (the
segments reserved at the peak, their live blocks and what the gap is made of) into the
page's payload; ``_interactive_peak.js`` draws it under the panels, in the manner of
PyTorch memory_viz's segment view: one bar per segment, as wide as its bytes, laid out
in rows; live blocks coloured (what they asked for, and their rounding), free bytes of
pinned segments grey, idle segments pale red. Hovering a block shows its allocation, its
bytes and, where the trace has them, its stack frames.

What a view holds is bounded, whatever the trace, so that a page stays a few MB and a
browser draws it in a moment (1,000,000 live blocks, a segment each, made a page of
148 MB: 1,000,000 segments and 1,977,000 frame texts):

- :data:`MAX_SEGMENTS_SHOWN` segments a view: those that explain the gap, half of them
  the segments with the most free bytes (an idle segment's bytes are all free), the
  rest the largest of the others; the segments left out are counted, with their bytes,
  and the page says so and draws them as one bar. A thousand bars fill a few rows of a
  window at a pixel or two each; past that a reader cannot tell them apart, nor point
  at one.
- :data:`MAX_BLOCK_ROWS` block bars a view (:data:`MAX_BLOCKS_PER_SEGMENT` a segment
  where few segments are drawn, fewer where many are): past that a segment's touching
  blocks are drawn merged and, where that is not enough, neighbouring blocks in groups,
  each group's bytes together. A bar is up to three SVG elements and a listener:
  some 60,000 elements a view, about the most that keeps a redraw (a resize) quick in a
  browser, and more bars than a segment of a few pixels can show.
- :data:`MAX_FRAME_TEXTS` distinct frame texts a view (each at most 240 characters, as
  a trace keeps them), :data:`MAX_FRAMES_SHOWN` of them a block: the blocks of the
  segments with the most free bytes get their stacks first; blocks whose stacks would
  pass the bound get none, and the page counts them.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from importlib import resources
from typing import Any, Final

from cubepool._cubepool import AtPeak, ReplayResult, ReservedSegment, Trace
from cubepool._errors import InvalidArgument

__all__ = [
    "MAX_BLOCKS_PER_SEGMENT",
    "MAX_BLOCK_ROWS",
    "MAX_FRAMES_SHOWN",
    "MAX_FRAME_TEXTS",
    "MAX_SEGMENTS_SHOWN",
    "peak_views",
    "script",
]

MAX_SEGMENTS_SHOWN: Final = 1_000
"""The most segments a view draws (see the module's docstring); the others are counted."""
MAX_BLOCK_ROWS: Final = 20_000
"""The most block bars a view draws, all its segments together."""
MAX_BLOCKS_PER_SEGMENT: Final = 400
"""Past this many live blocks (or a share of :data:`MAX_BLOCK_ROWS`, where that is
fewer), a segment's blocks are drawn merged, so a page stays small."""
MAX_FRAMES_SHOWN: Final = 8
"""Frames kept per block for the hover text (innermost first)."""
MAX_FRAME_TEXTS: Final = 2_000
"""The most distinct frame texts a view holds (at most 240 characters each)."""


def script() -> str:
    """The view's script (``_interactive_peak.js``, shipped with the package)."""
    return (resources.files(__package__) / "_interactive_peak.js").read_text(encoding="utf-8")


def _merged(rows: list[list[int]], limit: int) -> list[list[int]]:
    """``rows`` (``[offset, size, requested, id]``, by offset) in at most ``limit``
    bars: runs of touching blocks as one, and where that leaves too many, consecutive
    runs in groups, each drawn at its first offset with the bytes of its blocks together
    (within the group's span: blocks do not overlap). A merged bar's id is minus the
    blocks it holds."""
    runs: list[list[int]] = []
    for offset, size, requested, block in rows:
        last = runs[-1] if runs else None
        if last is not None and last[0] + last[1] == offset:
            last[1] += size
            last[2] += requested
            last[3] = (last[3] if last[3] < 0 else -1) - 1
        else:
            runs.append([offset, size, requested, block])
    if len(runs) <= limit:
        return runs
    per = -(-len(runs) // limit)  # ceiling: at most `limit` groups
    groups = []
    for first in range(0, len(runs), per):
        group = runs[first : first + per]
        blocks = sum(-row[3] if row[3] < 0 else 1 for row in group)
        groups.append(
            [
                group[0][0],
                sum(row[1] for row in group),
                sum(row[2] for row in group),
                -blocks if blocks > 1 else group[0][3],
            ]
        )
    return groups


def _in_python(frame: str) -> bool:
    """Whether a frame's text (``name (file:line)``) names Python code (a ``.py`` file)."""
    return ".py:" in frame or frame.endswith(".py)")


class _Stacks:
    """Blocks' stack frames written once each: the distinct frame texts
    (``frame_texts``), the distinct stacks as lists of their indices (``stacks``), and
    each block's stack by its id (``of_block``). A block's frames are its allocation's,
    and a model's allocations mostly share a few stacks (as the trace keeps them): written
    out for each block, one stack of long frames made a page of 40 MB for 20,000 blocks.
    At most :data:`MAX_FRAME_TEXTS` frame texts are kept; ``left_out`` counts the blocks
    whose stacks would have passed that."""

    def __init__(self) -> None:
        self.frame_texts: list[str] = []
        self.stacks: list[list[int]] = []
        self.of_block: dict[str, int] = {}
        self.left_out = 0
        self._frame_index: dict[str, int] = {}
        self._stack_index: dict[tuple[int, ...], int] = {}

    def add(self, block: int, frames: Sequence[str]) -> None:
        """Note ``block``'s ``frames``, :data:`MAX_FRAMES_SHOWN` of them from the innermost
        in Python code (as the one-line view names a block: a snapshot recorded with
        ``stacks="all"`` starts with the allocator's and ATen's C++ frames, which filled
        the frames shown) or, without one, from the first (a trace keeps a frame's first
        240 characters); or count it left out where its new frames would pass
        :data:`MAX_FRAME_TEXTS`."""
        start = next((i for i, frame in enumerate(frames) if _in_python(frame)), 0)
        kept = frames[start : start + MAX_FRAMES_SHOWN]
        new = {frame for frame in kept if frame not in self._frame_index}
        if len(self.frame_texts) + len(new) > MAX_FRAME_TEXTS:
            self.left_out += 1
            return
        indices = []
        for frame in kept:
            index = self._frame_index.setdefault(frame, len(self.frame_texts))
            if index == len(self.frame_texts):
                self.frame_texts.append(frame)
            indices.append(index)
        key = tuple(indices)
        stack = self._stack_index.setdefault(key, len(self.stacks))
        if stack == len(self.stacks):
            self.stacks.append(indices)
        self.of_block[str(block)] = stack


def _chosen(segments: Sequence[ReservedSegment]) -> list[int]:
    """The indices of the segments a view draws, those that explain the gap first: all
    of them where they are at most :data:`MAX_SEGMENTS_SHOWN`, else half the most free
    bytes, the rest the largest of the others (ties to the first by place)."""
    count = len(segments)
    frees = [segment.free for segment in segments]
    sizes = [segment.size for segment in segments]

    def by_free(i: int) -> tuple[int, int, int]:
        return (frees[i], sizes[i], -i)

    if count <= MAX_SEGMENTS_SHOWN:
        return sorted(range(count), key=by_free, reverse=True)
    most_free = heapq.nlargest(MAX_SEGMENTS_SHOWN // 2, range(count), key=by_free)
    taken = set(most_free)
    largest = heapq.nlargest(
        MAX_SEGMENTS_SHOWN - len(most_free),
        (i for i in range(count) if i not in taken),
        key=lambda i: (sizes[i], frees[i], -i),
    )
    return most_free + largest


def _view(label: str, view: AtPeak) -> dict[str, Any]:
    """One replay's view as JSON-ready data (bytes as ints). A block's frames are
    ``frame_texts[i]`` for each ``i`` of ``stacks[frames[str(id)]]``; a block bar whose
    id is negative holds that many blocks, merged. ``segments`` are those drawn, by
    place; ``left_out`` counts the others and their bytes."""
    segments = view.segments
    chosen = _chosen(segments)
    limit = max(1, min(MAX_BLOCKS_PER_SEGMENT, MAX_BLOCK_ROWS // max(1, len(chosen))))
    stacks = _Stacks()
    drawn: dict[int, list[Any]] = {}
    merged_any = False
    for index in chosen:  # the most free bytes first: their blocks get stacks first
        segment = segments[index]
        blocks = segment.blocks
        start = segment.start
        rows = [[b.start - start, b.size, b.requested, b.id] for b in blocks]
        if len(rows) > limit:
            rows = _merged(rows, limit)
            merged_any = True
        else:
            for b in blocks:
                frames = b.frames
                if frames:
                    stacks.add(b.id, frames)
        drawn[index] = [segment.group, start, segment.size, rows]
    shown = set(drawn)
    left = [segment for i, segment in enumerate(segments) if i not in shown]
    return {
        "label": label,
        "event": view.event,
        "reserved": view.reserved,
        "live": view.live,
        "requested": view.requested,
        "free_in_pinned": view.free_in_pinned,
        "rounding": view.rounding,
        "idle": view.idle,
        "pinned_segments": view.pinned_segments,
        "idle_segments": view.idle_segments,
        "merged": merged_any,
        "segment_count": len(segments),
        "segments": [drawn[i] for i in sorted(drawn)],
        "left_out": {
            "segments": len(left),
            "reserved": sum(segment.size for segment in left),
            "live": sum(segment.live for segment in left),
        },
        "frame_texts": stacks.frame_texts,
        "stacks": stacks.stacks,
        "frames": stacks.of_block,
        "stacks_left_out": stacks.left_out,
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

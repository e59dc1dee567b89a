"""A cycle of two placements for the steps after a two-step plan: the second step as
recorded, and that step run once more as the next step runs it, placed together.

A block each step makes again while the last step's copy still lives (a step's input,
a loss scale: see :func:`cubepool.plan.planned._remade`) needs two regions, one per
copy. With one placement for every later step, both regions are held for the whole
step, its peak included (vit-train: 3 MiB over its peak, 58 granules of 2 MiB where
0.98 needs 57). With two placements that later steps follow in turn (the plan file's
``"cycle"``), each step's copy goes where the other placement leaves free, and neither
region is held longer than its copy lives.

The second placement is made by placing the derivation trace with one more step: the
second step run once more as the next step runs it (:func:`next_step`), so that it
follows the second step as recorded by construction. The step after it follows the
second step's placement again, which was made around the first step's blocks, not the
next step's: :func:`close_cycle` checks that each block the next step leaves (its
copies of the re-made blocks) is where the second step's placement leaves free while
it lives, and moves it where that is not so (its first-step copy's region first).
Where no place is free for one, there is no cycle.
"""

from __future__ import annotations

from typing import TypeAlias

Alloc: TypeAlias = tuple[int, int, int]
"""An allocation of the derivation trace: ``(alloc index, size, free index or the
trace's end)``."""


def next_step(
    allocs: list[Alloc], second: int, end: int
) -> tuple[list[Alloc], dict[int, int]] | None:
    """``allocs`` (the derivation trace's, whose second step starts at event ``second``
    and which ends at event ``end``) with one more step after them: the second step run
    once more as the next step runs it, its events at ``end`` on; and for each
    allocation that step leaves at its end, the alloc index of the allocation made
    before the second step whose place it takes when the second step is run after it.

    The next step makes every allocation of the second step again, at the same place
    in its order, and frees them where the second step frees its own; where the second
    step frees a block made before it (the first step's copy of a block made again),
    the next step frees the second step's copy of it instead, paired by size in request
    order (as the planned pool matches requests). Blocks alive at the derivation
    trace's end that were made before the second step (weights, optimizer state) stay
    alive to the new end. None where the second step leaves a block no earlier block
    of its size is freed for (a step that keeps more each time): no cycle of two steps
    repeats it.
    """
    length = end - second
    # Blocks made before the second step and freed in it, and the second step's blocks
    # alive at its end: paired by size in request order.
    freed_early: dict[int, list[Alloc]] = {}
    for alloc in allocs:
        if alloc[0] < second <= alloc[2] < end:
            freed_early.setdefault(alloc[1], []).append(alloc)
    role: dict[int, Alloc] = {}
    taken: dict[int, int] = {}
    for alloc in allocs:
        if alloc[0] >= second and alloc[2] == end:
            k = taken.get(alloc[1], 0)
            earlier = freed_early.get(alloc[1], [])
            if k >= len(earlier):
                return None
            taken[alloc[1]] = k + 1
            role[alloc[0]] = earlier[k]
    grown: list[Alloc] = []
    roles: dict[int, int] = {}
    for start, size, free in allocs:
        if start >= second:
            # The second step's block, and its copy in the next step.
            if start in role:
                grown.append((start, size, role[start][2] + length))
                roles[start + length] = role[start][0]
                grown.append((start + length, size, end + length))
            else:
                grown.append((start, size, free))
                grown.append((start + length, size, free + length))
        elif free == end:
            grown.append((start, size, end + length))
        else:
            grown.append((start, size, free))
    grown.sort()
    return grown, roles


def close_cycle(
    allocs: list[Alloc],
    offsets: dict[int, int],
    extent: dict[int, int],
    roles: dict[int, int],
    second: int,
    third: int,
    ceiling: int,
) -> bool:
    """Make the step after the next one able to follow the second step's placement:
    each block the next step leaves (``roles``: its alloc index -> that of the block
    made before the second step whose place it takes) must be where no block the second
    step's placement has live at the same time overlaps it (blocks made in the second
    step, and those made before it and never freed, while the earlier block lives).
    One that is not is moved (``offsets`` updated) to its earlier block's offset where
    that is free both then and while it lives in the next step, else to the lowest such
    offset below ``ceiling``. False where one has nowhere to go.

    ``allocs`` is :func:`next_step`'s (the derivation trace, whose second step starts
    at event ``second`` and ends at ``third``, and the next step); ``extent`` gives
    each allocation's bytes as placed.
    """
    end = 2 * third - second
    by_start = {alloc[0]: alloc for alloc in allocs}
    kept = [alloc for alloc in allocs if alloc[0] < second and alloc[2] == end]
    step = [alloc for alloc in allocs if second <= alloc[0] < third]
    for left, earlier in sorted(roles.items()):
        _, _, freed = by_start[earlier]
        # While the earlier block lives in the second step: the step's blocks and the
        # blocks never freed.
        then = [a for a in step if a[0] <= freed] + kept
        # While the next step's block lives: every block alive then.
        now = [a for a in allocs if a[0] != left and a[2] >= left]
        size = extent[left]
        if _free(offsets[left], size, then, offsets, extent):
            continue
        taken = sorted(
            (offsets[a[0]], offsets[a[0]] + extent[a[0]]) for a in then + now if extent[a[0]]
        )
        place = offsets[earlier]
        if not _clear(place, size, taken) or place + size > ceiling:
            lowest = _lowest_gap(taken, size)
            if lowest + size > ceiling:
                return False
            place = lowest
        offsets[left] = place
    return True


def _free(
    offset: int, size: int, blocks: list[Alloc], offsets: dict[int, int], extent: dict[int, int]
) -> bool:
    """Whether ``offset..offset + size`` meets none of ``blocks`` as placed."""
    return all(
        offsets[a[0]] + extent[a[0]] <= offset or offset + size <= offsets[a[0]] or not extent[a[0]]
        for a in blocks
    )


def _clear(offset: int, size: int, taken: list[tuple[int, int]]) -> bool:
    """Whether ``offset..offset + size`` meets none of the ``taken`` ranges."""
    return all(stop <= offset or offset + size <= start for start, stop in taken)


def _lowest_gap(taken: list[tuple[int, int]], size: int) -> int:
    """The lowest offset where ``size`` bytes meet none of the ``taken`` ranges
    (sorted by start)."""
    cursor = 0
    for start, stop in taken:
        if start - cursor >= size:
            return cursor
        cursor = max(cursor, stop)
    return cursor

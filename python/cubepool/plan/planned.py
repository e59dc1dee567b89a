"""The ``planned`` layout: a placement of the derivation trace's allocations, saved as a
plan file that the ``planned`` pool follows at run time.

The derivation trace (:func:`cubepool.plan.derivation_trace`: the setup and the first
two steps as recorded where the trace names three steps or more; else the setup and the
first step, run once more on the state it leaves) is placed offline
(:func:`cubepool.place`, sizes padded to the alignment). Each allocation's offset goes
into the plan under its phase (the part of the trace after ``p`` step boundaries, a
boundary being a phase that starts after event 0), in request order. At run time the
``planned`` pool matches the ``k``-th request of a size in a step to the ``k``-th planned
offset of that size in the plan's phase, where the request's position in the step agrees
with the entry's; the steps after the plan's last phase follow that one (the second step
as recorded, or the first run once more). Each entry carries its planned lifetime
(``"ends"``), so a request whose own bytes are still held may take another entry of its
size whose bytes the plan leaves free for as long as the request is planned to live; the
blocks alive at the derivation trace's end are the plan's ``"kept"`` regions, placed
once, which a later step's request of their size may take where they are free.

Two recorded steps tell apart what one cannot: the blocks the first step keeps for good
(optimizer state) and those each step makes again while the last step's copy still
lives (an input, a loss scale: see :func:`_remade`). Such a block's copies alternate
between two regions. Two plans are made for that: one where every later step follows
the second step's placement, which holds both regions for the whole second step (the
first step's copy's region is a kept region, which a later step's copy takes where its
own entry is held); and one whose later steps follow two placements in turn (the plan
file's ``"cycle"``: the second step, and the second step run once more as the next step
runs it, placed together; see :mod:`cubepool.plan.cycle`), where neither region is held
longer than its copy lives. The second is taken where it maps fewer bytes at its peak
(:data:`GRANULES`' first), which is where a re-made block's two copies would be held
through the step's peak (vit-train, mixtral-train). What the plan does
not cover, or whose bytes are still held with nothing to take instead, goes to a virtual
pool beside the arena. The plan file also gives the bytes of granules its blocks touch
at once (``"peaks"``, at each of :data:`GRANULES`): the pool keeps idle granules mapped up
to that from the start, since a run that follows the plan maps it anyway (measured on
the derivation trace: gpt2-train 134 maps without, 119 with, the same bytes).
:func:`planned_first` is the planner's hook that puts the planned
layout first where it is the better plan for the next run, with the arena granule that
keeps it within the budget of storage allocations.
"""

from __future__ import annotations

import atexit
import bisect
import contextlib
import json
import os
import tempfile
import time
from collections.abc import Sequence
from typing import Any, Final

from cubepool._cubepool import (
    MemoryConfiguration,
    MemoryDeviceProperties,
    MemoryManagement,
    ReplayResult,
    Trace,
    pool_spec,
)
from cubepool._errors import InvalidArgument
from cubepool._files import check_output_path, write_text
from cubepool._trace import replay
from cubepool.layouts import check_plan_path_text, planned_layout
from cubepool.place import place
from cubepool.plan.candidates import Derive
from cubepool.plan.cycle import close_cycle, next_step
from cubepool.plan.derivation import derivation_kind, derivation_trace

MIB: Final = 1 << 20
PLAN_FORMAT: Final = "cubepool-plan"
PLAN_VERSION: Final = 1
DEFAULT_TIME_LIMIT: Final = 5.0
"""Seconds the placement of the derivation trace may take."""
GRANULES: Final = (2 * MIB, 4 * MIB, 8 * MIB)
"""The arena granules :func:`planned_first` tries, smallest first (the first is the
layout language's default); the plan file gives its peak of mapped bytes at each."""


def _round_up(size: int, align: int) -> int:
    return -(-size // align) * align


def planned_plan(
    trace: Trace,
    *,
    derive: Derive = "first_step",
    properties: MemoryDeviceProperties | None = None,
    time_limit: float | None = DEFAULT_TIME_LIMIT,
) -> dict[str, Any]:
    """Return the plan file's content (a dict) for ``trace``: a placement of its
    derivation trace's allocations, phase by phase, in request order.

    Args:
        trace: the workload.
        derive: which part of the trace the plan is derived on (as :func:`cubepool.plan`).
        properties: the device (its alignment pads the sizes placed); the default one
            when None.
        time_limit: seconds the placements may take in all; a second placement (the
            cycle's, below) gets what the first left, and is not tried when nothing is
            left. None: each placement gets :func:`cubepool.place`'s default.
    """
    deadline = None if time_limit is None else time.monotonic() + time_limit
    how = derivation_kind(trace, derive)
    derived, _, what = derivation_trace(trace, derive)
    align = (properties if properties is not None else MemoryDeviceProperties()).alignment
    events = derived.events()
    allocs = _allocations(events)
    starts = sorted(derived.phases, key=lambda phase: phase[1])
    boundaries = [first for _, first in starts if first > 0]
    first_name = next((name for name, first in starts if first == 0), "start")
    names = [first_name, *(name for name, first in starts if first > 0)]
    old: set[int] = set()
    new: set[int] = set()
    if how == "two_steps" and boundaries:
        old, new = _remade(allocs, boundaries[-1], len(events))
    plan, offsets = _held_plan(
        allocs, len(events), boundaries, names, (old, new), align, time_limit
    )
    plan["source"] = f"cubepool.plan.planned: placement of {what}"
    if how == "one_step" and len(boundaries) >= 2:
        again = _steady_step(allocs, offsets, boundaries[-2], boundaries[-1])
        if again is not None:
            # The steady step's requests are the first step's, in its order: so are
            # their planned lifetimes.
            plan["phases"][-1]["requests"] = again
            plan["phases"][-1]["ends"] = plan["phases"][-2]["ends"]
    # Two placements in turn can only map less where holding both copies of the
    # re-made blocks raised the plan's peak above what the live bytes need (on most
    # traces it does not, and the second placement would cost seconds for nothing).
    if old and _peak(plan) > _round_up(_padded_peak(allocs, align), GRANULES[0]):
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        cycled = None
        if left is None or left > 0:
            cycled = _cycled_plan(allocs, len(events), boundaries, names, align, left)
        if cycled is not None and _peak(cycled) < _peak(plan):
            cycled["source"] = (
                f"cubepool.plan.planned: placement of {what} and of {names[-1]} run once "
                "more as the next step runs it, which later steps follow in turn"
            )
            return cycled
    return plan


def _allocations(events: list[tuple[int, str, int, int]]) -> list[tuple[int, int, int]]:
    """``(alloc index, size, free index or the end)`` of every allocation of a positive
    size in ``events`` (memory management serves zero bytes without a pool), in alloc
    order."""
    born: dict[int, tuple[int, int]] = {}
    allocs: list[tuple[int, int, int]] = []
    for index, (_, kind, ident, size) in enumerate(events):
        if kind == "alloc":
            if size > 0:
                born[ident] = (index, size)
        elif ident in born:
            start, size = born.pop(ident)
            allocs.append((start, size, index))
    allocs.extend((start, size, len(events)) for start, size in born.values())
    allocs.sort()
    return allocs


def _phases(
    allocs: list[tuple[int, int, int]],
    offsets: dict[int, int],
    boundaries: list[int],
    names: list[str],
) -> list[dict[str, Any]]:
    """The plan file's phases: each allocation's size and offset under its phase (the
    part of the run after ``p`` of the ``boundaries``), in request order, with their
    planned lifetimes."""
    phases: list[dict[str, Any]] = [{"name": name, "requests": []} for name in names]
    by_phase: list[list[tuple[int, int, int]]] = [[] for _ in names]
    for alloc in allocs:
        by_phase[bisect.bisect_right(boundaries, alloc[0])].append(alloc)
    for phase, members in zip(phases, by_phase, strict=True):
        phase["requests"] = [[size, offsets[start]] for start, size, _ in members]
        phase["ends"] = _ends(members)
    return phases


def _padded_peak(allocs: list[tuple[int, int, int]], align: int) -> int:
    """The most bytes ``allocs`` (``(alloc index, size, free index)``) have live at
    once, each padded to ``align``: no placement of them maps less."""
    changes = sorted(
        [(start, _round_up(size, align)) for start, size, _ in allocs]
        + [(free + 1, -_round_up(size, align)) for _, size, free in allocs]
    )
    live = peak = 0
    for _, change in changes:
        live += change
        peak = max(peak, live)
    return peak


def _peak(plan: dict[str, Any]) -> int:
    """The plan's peak of mapped bytes at the smallest of :data:`GRANULES`."""
    return int(dict(plan["peaks"])[GRANULES[0]])


def _held_plan(
    allocs: list[tuple[int, int, int]],
    end: int,
    boundaries: list[int],
    names: list[str],
    remade: tuple[set[int], set[int]],
    align: int,
    time_limit: float | None,
) -> tuple[dict[str, Any], dict[int, int]]:
    """The plan of one placement for every later step, and each allocation's offset:
    the derivation trace's allocations (ending at event ``end``) placed, the
    ``remade`` ones' two copies (see :func:`_remade`: ``(old, new)``) each holding its
    region for the whole second step."""
    old, new = remade
    offsets: dict[int, int] = {}
    height = 0
    if allocs:
        rows = [
            (
                boundaries[-1] if start in new else start,
                end + 1 if start in old else free + 1,
                _round_up(size, align),
            )
            for start, size, free in allocs
        ]
        placement = place(rows, time_limit=time_limit)
        height = placement.height
        offsets = {
            start: offset for (start, _, _), offset in zip(allocs, placement.offsets, strict=True)
        }
    # Blocks alive at the derivation trace's end (what the run keeps: weights,
    # optimizer state, the gradients a step leaves) are placed once: the placement
    # holds their regions from their request on, so a later step that makes such a
    # block again (or makes a step's block out of order) may take a free one of its
    # size instead of missing (see the plan file's "kept"). So are the regions of the
    # first step's copies of the blocks each step makes again (see _remade): the
    # placement holds them to the end, for every other later step's copy.
    kept = [[size, offsets[start]] for start, size, free in allocs if free == end or start in old]
    extents = [
        (start, free, offsets[start], _round_up(size, align)) for start, size, free in allocs
    ]
    plan = {
        "format": PLAN_FORMAT,
        "version": PLAN_VERSION,
        "height": height,
        "phases": _phases(allocs, offsets, boundaries, names),
        "kept": kept,
        "peaks": [[granule, _touched_peak(extents, granule)] for granule in GRANULES],
    }
    return plan, offsets


def _cycled_plan(
    allocs: list[tuple[int, int, int]],
    end: int,
    boundaries: list[int],
    names: list[str],
    align: int,
    time_limit: float | None,
) -> dict[str, Any] | None:
    """The plan whose later steps alternate two placements (the plan file's
    ``"cycle"`` of 2; see :mod:`cubepool.plan.cycle`): the derivation trace's
    allocations (ending at event ``end``) and those of its second step run once more
    as the next step runs it, placed together. None where the second step keeps more
    each time, or where a block the next step leaves has no place the second step's
    placement leaves free (then the plan of one placement stands).

    Measured (2026-12-02, vit-train): the placement is 118,339,200 bytes against
    118,334,664 live; three of the next step's blocks (128, 640 and 4 bytes) lie on the
    second step's live bytes and move above it, to 118,340,032 bytes, still 57 granules
    of 2 MiB; the replay of the whole trace is 0.990 of the floor with no miss, where
    the plan of one placement is 58 granules (0.973). On gpt2-train the cycle does not
    close (its eight 1 MiB blocks and its 32 MiB one have no room below the 170th
    granule), and that plan's one placement is at the floor already.
    """
    second = boundaries[-1]
    grown = next_step(allocs, second, end)
    if grown is None or not allocs:
        return None
    more, roles = grown
    rows = [(start, free + 1, _round_up(size, align)) for start, size, free in more]
    placement = place(rows, time_limit=time_limit)
    offsets = {start: offset for (start, _, _), offset in zip(more, placement.offsets, strict=True)}
    extent = {start: _round_up(size, align) for start, size, _ in more}
    ceiling = _round_up(placement.height, GRANULES[0])
    if not close_cycle(more, offsets, extent, roles, second, end, ceiling):
        return None
    final = 2 * end - second
    height = max((offsets[start] + extent[start] for start, _, _ in more), default=0)
    # Only the blocks made before the second step and never freed are kept for good:
    # the re-made blocks' regions are each free in one of the two placements.
    kept = [
        [size, offsets[start]] for start, size, free in more if free == final and start < second
    ]
    extents = [(start, free, offsets[start], extent[start]) for start, size, free in more]
    return {
        "format": PLAN_FORMAT,
        "version": PLAN_VERSION,
        "height": height,
        "phases": _phases(more, offsets, [*boundaries, end], [*names, f"{names[-1]} (next)"]),
        "cycle": 2,
        "kept": kept,
        "peaks": [[granule, _touched_peak(extents, granule)] for granule in GRANULES],
    }


def _touched_peak(blocks: list[tuple[int, int, int, int]], granule: int) -> int:
    """The most bytes of ``granule``-byte granules that ``blocks`` (``(start, end, offset,
    extent)``: alive from event ``start`` until event ``end``, at ``offset``) touch at
    once: what a run that follows the plan maps at its peak, at the least (a planned
    pool's arena maps the granules its live blocks touch)."""
    changes = sorted(
        [(start, 1, offset, extent) for start, _, offset, extent in blocks]
        + [(end, -1, offset, extent) for _, end, offset, extent in blocks]
    )
    touches: dict[int, int] = {}
    touched = peak = 0
    for _, step, offset, extent in changes:
        for g in range(offset // granule, -(-(offset + extent) // granule)):
            before = touches.get(g, 0)
            touches[g] = before + step
            touched += (before == 0) - (before + step == 0)
        peak = max(peak, touched)
    return peak * granule


def _ends(members: list[tuple[int, int, int]]) -> list[int]:
    """Where each of a phase's allocations (``(alloc index, size, free index)``, in
    request order) ends in the phase's request order: how many of the phase's requests
    come before its free (the phase's length where it outlives them all)."""
    starts = [start for start, _, _ in members]
    return [bisect.bisect_left(starts, end) for _, _, end in members]


def _remade(allocs: list[tuple[int, int, int]], second: int, end: int) -> tuple[set[int], set[int]]:
    """The blocks a step makes again while the last step's copies still live, as the
    recorded second step shows them: ``(old, new)``, the alloc indices of the copies
    made before the second step (at event ``second``) and freed in it, and of the second
    step's copies, made while the old ones live and alive at the derivation trace's end
    (event ``end``). An old copy and a new one pair up by size in request order (the
    ``k``-th such old copy of a size with the ``k``-th such new one), as the planned pool
    matches requests.

    Every later step follows the second step's placement, so its copy of such a block
    is requested while the last step's copy holds the entry: two regions must
    alternate. The placement holds both for the whole second step (the old copy's to
    the trace's end, the new copy's from the step's start), so each is free of the
    step's other blocks whenever a later step's copy may be there: a later step's copy
    takes its own entry where that is free, else the old copy's region (a kept region
    of its size). The cost is each such block's bytes once more over the parts of the
    step where one copy lives (gpt2-train: 11 blocks, 40 MiB, none at its peak;
    vit-train: 4, 3 MiB, at its peak). Blocks a step keeps for good (optimizer state)
    have no old copy freed in the second step, and those it frees before making them
    again (gradients set to None) none alive when made: neither is paired.

    Measured (2026-12-02): following the second step's placement as recorded, without
    holding both regions, the third step's copies find their entries held by the second
    step's and go beside: gpt2-train misses 13 requests and reserves 350 MiB on the
    whole trace (0.971, the default's figure), vit-train misses 4 (0.956); holding both,
    neither misses (1.000 and 0.973). Derived on the first step alone, the plan cannot
    tell these blocks from those kept for good (see :func:`_steady_step`).

    What holding both costs: on vit-train the 3 MiB block is each step's first request
    and its old copy is freed by the next one, so both regions are held through the
    step's peak: height 121,485,760 bytes against 118,334,664 live (58 granules of 2 MiB
    against 57; 0.973 where 0.98 needs 57). With one placement per step that is
    unavoidable (a later step's copy needs a region free for the whole step); two
    placements in turn do not pay it (:func:`_cycled_plan`: 57 granules, 0.990). Making
    the second placement by swapping the two copies' regions in the first was tried
    and does not work: blocks of the step straddle the regions' edges, and widening
    the regions to take them in grows them until they overlap each other or blocks
    kept for good (vit-train: the 3 MiB region pair grew to 28.4 MiB, its two sides
    overlapping); the second placement is made by the placer instead.
    """
    new_by_size: dict[int, list[tuple[int, int, int]]] = {}
    for alloc in allocs:
        if alloc[0] >= second and alloc[2] == end:
            new_by_size.setdefault(alloc[1], []).append(alloc)
    old: set[int] = set()
    new: set[int] = set()
    taken: dict[int, int] = {}
    for start, size, free in allocs:
        if start >= second or not second <= free < end:
            continue
        copies = new_by_size.get(size, [])
        k = taken.get(size, 0)
        if k < len(copies):
            taken[size] = k + 1
            if copies[k][0] < free:
                old.add(start)
                new.add(copies[k][0])
    return old, new


def _steady_step(
    allocs: list[tuple[int, int, int]], offsets: dict[int, int], start: int, cut: int
) -> list[list[int]] | None:
    """The requests of the step run once more (events ``cut`` on) as a later step makes
    them: the first step's requests in order, each at its repetition's offset where the
    step frees it (and so repeats it), and at its own offset where the step keeps it.

    A block the first step keeps (gradients freed at the next step's start, optimizer
    state kept for good) is not repeated in the derivation trace, but a later step may
    request it again, in its place in the order: without an entry, the requests of that
    size after it would take the wrong entries. Its own offset is free by then if the
    step that follows frees it first (the gradients); where it is not, the request
    misses. The derivation trace itself, which never requests these again, then matches
    its requests of those sizes one entry off: the plan is made for the run, not for
    the derivation trace. (Marking these entries optional in the plan file, so that the
    pool passes them over where held, makes the derivation trace match exactly but
    reserved 1-20 % more on the whole shared training traces: a later step's requests
    of those sizes then take the next request's entry.) None when the repetition does
    not match the first step (then the plan keeps the repetition's own requests).

    Why no plan matches both: a later step makes again some of the blocks the first
    step keeps, while the first step's copies are still live, and keeps the others for
    good, and a first step alone does not tell them apart. On gpt2-train the first step
    keeps 167 blocks: the next step makes 11 of them again (40 MiB: 1 MiB, 32 MiB, 8
    KiB and 4-byte blocks; the old copies are freed up to 420 events later) and
    none of the other 156 (never freed); vit-train keeps 220 and makes 4 again (the
    3 MiB block each step makes first among them). When such a request comes, the pool
    sees a request of a size and position that the derivation trace also makes (the
    next block of that size), with the first step's copy live in both. Measured (2026-12-02, with
    kept regions and the lifetime fallback): the steady step with only the requests the
    first step frees matches the derivation trace exactly (gpt2-train 340 MiB against
    the default's 342) but reserves 0.881 of the floor on the whole trace (the re-made
    blocks take the next blocks' entries), against 0.994 with these entries (which
    reserve 384 MiB on the derivation trace, so the guard passes over it there). Where
    the trace names a third step the plan is derived on two recorded steps instead,
    which tell the two kinds apart (see :func:`_remade`).
    """
    step = [a for a in allocs if start <= a[0] < cut]
    repeated = [a for a in allocs if a[0] >= cut]
    freed = [a for a in step if a[2] < cut]
    if [a[1] for a in freed] != [a[1] for a in repeated]:
        return None
    twin = {a[0]: b[0] for a, b in zip(freed, repeated, strict=True)}
    return [[size, offsets[twin.get(first, first)]] for first, size, _ in step]


def write_plan(plan: dict[str, Any], path: str | os.PathLike[str]) -> MemoryConfiguration:
    """Write a plan file's content (as :func:`planned_plan` returns it) to ``path`` and
    return the layout that follows it, ``planned(file=PATH)`` (with the plan's
    ``"granule"`` where it names one, see :func:`planned_layout`).

    The path is checked by :func:`check_plan_path`; the file is written whole or not at
    all (:func:`cubepool._files.atomic_path`).
    """
    path = check_plan_path(path)
    write_text(path, json.dumps(plan) + "\n")
    return planned_layout(path, plan.get("granule"))


def check_plan_path(path: str | os.PathLike[str]) -> str:
    """``path`` as a string, once it is known that a plan file can be written there: a
    layout can name it (:func:`cubepool.layouts.check_plan_path_text`) and a file can be
    written there (:func:`cubepool._files.check_output_path`).

    Raises:
        InvalidArgument: a character the configuration language cannot carry.
        OSError: the file cannot be written there.
    """
    path = check_plan_path_text(os.fspath(path))
    check_output_path(path)
    return path


def save_planned(
    trace: Trace,
    path: str | os.PathLike[str],
    *,
    derive: Derive = "first_step",
    properties: MemoryDeviceProperties | None = None,
    time_limit: float | None = DEFAULT_TIME_LIMIT,
) -> MemoryConfiguration:
    """Write the plan file of ``trace`` (see :func:`planned_plan`) to ``path`` and return
    the layout that follows it, ``planned(file=PATH)`` (see :func:`write_plan`)."""
    plan = planned_plan(trace, derive=derive, properties=properties, time_limit=time_limit)
    return write_plan(plan, path)


def follow(trace: Trace, layout: MemoryConfiguration) -> dict[str, int]:
    """Make ``trace``'s requests live through a new ``MemoryManagement(layout)`` (real
    memory), with ``mm.step()`` where each phase after the first starts, as a training
    loop would; return the planned pool's hits and misses (``mm.planned_stats()``).

    Raises:
        InvalidArgument: ``layout`` has no planned pool.
    """
    mm = MemoryManagement(layout)
    handles: dict[int, Any] = {}
    starts = {first for _, first in trace.phases if first > 0}
    for index, (_, kind, ident, size) in enumerate(trace.events()):
        if index in starts:
            mm.step()
        if kind == "alloc":
            handles[ident] = mm.reserve(size)
        elif ident in handles:
            handles.pop(ident).release()
    stats = mm.planned_stats()
    if stats is None:
        raise InvalidArgument(f"the layout {layout} has no planned pool")
    return stats


_TEMPORARY_PLANS: dict[str, int] = {}
"""The temporary plan files this process wrote and has not removed, with the process
that wrote them (a forked child that exits normally runs its parent's exit hooks)."""


def _remove_temporary_plans() -> None:
    """At exit, removes the temporary plan files this process wrote: a layout that
    follows one lives no longer than the process (``plan --save`` or ``Plan.save`` keeps
    a plan), and every ``cubepool report`` left one behind in the temporary folder."""
    for path, pid in list(_TEMPORARY_PLANS.items()):
        if pid == os.getpid():
            remove_temporary_plan(path)


atexit.register(_remove_temporary_plans)


def remove_temporary_plan(path: str) -> None:
    """Removes a plan file :func:`temporary_plan` wrote (one whose layout is not kept)."""
    _TEMPORARY_PLANS.pop(path, None)
    with contextlib.suppress(OSError):
        os.remove(path)


def temporary_plan_text(text: str) -> str:
    """Write a plan file's text, as it was read elsewhere, to a new temporary file and
    return its path (removed when the process exits, as :func:`temporary_plan`'s)."""
    handle, path = tempfile.mkstemp(prefix="cubepool-plan-", suffix=".json")
    _TEMPORARY_PLANS[path] = os.getpid()
    with os.fdopen(handle, "w", encoding="utf-8") as file:
        file.write(text)
    return path


def temporary_plan(plan: dict[str, Any]) -> tuple[MemoryConfiguration, str]:
    """Write a plan file's content to a new temporary file and return the layout that
    follows it, with the file's path (the caller removes it when the layout is not kept;
    one kept goes when the process exits)."""
    handle, path = tempfile.mkstemp(prefix="cubepool-plan-", suffix=".json")
    os.close(handle)
    _TEMPORARY_PLANS[path] = os.getpid()
    return write_plan(plan, path), path


PLANNED: Final = "planned"
"""The finalist's key of the planned layout in :func:`cubepool.plan`."""


def planned_first(
    order: Sequence[str],
    configs: dict[str, MemoryConfiguration],
    trace: Trace,
    derived: Trace,
    properties: MemoryDeviceProperties | None,
    budget: int,
    plan: dict[str, Any] | None = None,
) -> tuple[list[str], dict[str, ReplayResult], int]:
    """``order`` (finalist keys, best first) with the planned layout moved first where it
    is the better plan for the next run, the replays of the derivation trace it made (by
    key, for the guard, which would otherwise replay them again), and the replays that
    took.

    The planned layout is judged on what it is for: the run's later steps, which repeat
    the ones it was derived on, so its replay of the whole trace (it has not seen the
    later steps) must reserve less than the first finalist's, serve every reservation,
    and make at most ``budget`` storage allocations on the derivation trace. Its arena
    maps granules of the smallest of :data:`GRANULES` that keeps it within the budget
    (each map is a storage allocation; a larger granule maps fewer, larger runs): where
    that is not the first, ``configs[PLANNED]`` becomes the layout with that granule
    and ``plan`` (the plan file's content) names it as its ``"granule"``. The perturbed
    replicas the other finalists are ranked on move requests out of the order a step
    repeats, which is what the planned layout matches by, so they do not rank it. The
    guard (:func:`cubepool.plan.guard.first_not_worse`) still checks it like any other:
    never more than the default on the derivation trace.
    """
    if PLANNED not in configs or not order or order[0] == PLANNED:
        return list(order), {}, 0
    replays = 0
    for granule in GRANULES:
        config = _with_granule(configs[PLANNED], granule)
        derivation = replay(derived, config, properties, samples=0)
        replays += 1
        if derivation.storage_allocations <= budget:
            break
    if config is not configs[PLANNED]:
        configs[PLANNED] = config
        if plan is not None:
            plan["granule"] = granule
    planned = replay(trace, config, properties, samples=0)
    best = replay(trace, configs[order[0]], properties, samples=0)
    replays += 2
    better = (
        planned.complete
        and planned.peak_reserved < best.peak_reserved
        and derivation.storage_allocations <= budget
    )
    known = {PLANNED: derivation}
    if not better:
        return list(order), known, replays
    return [PLANNED, *(key for key in order if key != PLANNED)], known, replays


def _with_granule(config: MemoryConfiguration, granule: int) -> MemoryConfiguration:
    """``config`` (a planned layout, ``planned(file=PATH)``) itself where ``granule`` is
    the first of :data:`GRANULES`, else the layout following the same file with arena
    granule ``granule``."""
    if granule == GRANULES[0]:
        return config
    (pool,) = config.pool_options
    return planned_layout(pool_spec(pool)["file"], granule)

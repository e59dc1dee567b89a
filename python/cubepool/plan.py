"""Planning a pool layout for a workload by replaying its trace.

:func:`plan` searches layouts of the seed's vocabulary — one or two sliced pools (page
size, largest slice) in front of an exclusive-pages or direct tail that takes every
larger size — by replaying a *derivation trace* through each, and keeps the layout that
reserves least (or makes fewest storage allocations) within a budget of storage
allocations, so that it stays fast as well as small.

It must generalise: a plan is derived from what a workload shows early and judged on the
whole run. For a training trace whose header names its steps, the derivation trace is the
setup and the first step, with that step run once more on the state it leaves (the
optimizer state and whatever else it keeps), because the second step, not the first, is
where training settles and usually peaks. For other traces it is the whole trace. The best
layouts of the search are then replayed on *perturbed replicas* of the derivation trace
(events moved a few places at random, which a different batch or kernel order would do)
and the one that reserves least on average wins: a layout that is best only for one exact
order of events falls off a cliff (one more page) on the next run.
"""

from __future__ import annotations

import bisect
import os
import random
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from cubepool._cubepool import (
    MemoryConfiguration,
    MemoryDeviceProperties,
    MemoryPoolOptions,
    PoolType,
    ReplayResult,
    Trace,
    pool_spec,
)
from cubepool._format import human_bytes
from cubepool._progress import progress_callback
from cubepool._trace import TraceLike, replay, resolve_trace
from cubepool.compare import Objective
from cubepool.layouts import PRESETS, default_configuration, describe, to_spec

__all__ = [
    "Layout",
    "Plan",
    "Progress",
    "charged",
    "derivation_trace",
    "largest_page",
    "perturb",
    "plan",
]

KIB: Final = 1024
MIB: Final = 1024 * KIB
_ANY_SIZE: Final = 1 << 62
_MIN_PAGE: Final = 256 * KIB
_PAGE_STEP: Final = 64 * KIB
_MAX_THRESHOLDS: Final = 16
_FINALISTS_PER_SHAPE: Final = 12
_REPLICAS: Final = ((4, 0.0, 1), (16, 0.0, 2), (64, 0.0, 3), (16, 0.03, 4), (64, 0.03, 5))
"""(window in events, share of bytes doubled, seed) of each perturbed replica of the
derivation trace."""

Progress = Callable[[int, int, str], None]
"""Called as ``progress(done, total, stage)`` while a plan runs."""

Tail = Literal["exclusive_pages", "direct"]
Derive = Literal["first_step", "all"] | int


@dataclass(frozen=True)
class Layout:
    """One point of the planner's search: sliced pools, then a pool for the rest.

    Attributes:
        tiers: ``(page_size, max_slice_size, max_pool_size)`` of each sliced pool, in
            routing order; a capped pool (``max_pool_size`` not None) that is full passes
            requests on to the next pool that takes them.
        tail: the pool for sizes no sliced pool takes: ``"exclusive_pages"`` (one
            allocation per page, pages reused when they waste at most an eighth) or
            ``"direct"`` (one storage buffer per allocation, reused by exact size).
    """

    tiers: tuple[tuple[int, int, int | None], ...]
    tail: Tail = "exclusive_pages"

    def key(self) -> tuple[Any, ...]:
        """A total order of layouts, simplest first (fewer pools, smaller sizes)."""
        tiers = tuple((p, s, -1 if c is None else c) for p, s, c in self.tiers)
        return (len(tiers), tiers, self.tail)

    def config(self) -> MemoryConfiguration:
        """The layout as a :class:`MemoryConfiguration`."""
        pools = [MemoryPoolOptions(PoolType.sliced_pages(p, s, c)) for p, s, c in self.tiers]
        tail = (
            PoolType.exclusive_pages(_ANY_SIZE)
            if self.tail == "exclusive_pages"
            else PoolType.direct()
        )
        return MemoryConfiguration.custom([*pools, MemoryPoolOptions(tail)])


@dataclass(frozen=True)
class Plan:
    """A planned layout and how it does.

    Attributes:
        config: the layout.
        result: its replay of the whole trace.
        baseline: the default layout's replay of the whole trace.
        derivation: its replay of the derivation trace.
        derived_on: how the derivation trace was made, in words.
        objective: what the plan minimised.
        max_storage_allocations: the budget of storage allocations on the derivation trace.
        replays: how many replays the search ran.
        seconds: how long the search took.
        finalists: the layouts of the robustness round with their mean reserved bytes
            relative to peak live over the replicas (1.0 is perfect), best first.
    """

    config: MemoryConfiguration
    result: ReplayResult
    baseline: ReplayResult
    derivation: ReplayResult
    derived_on: str
    objective: Objective
    max_storage_allocations: int
    replays: int
    seconds: float
    finalists: tuple[tuple[str, float], ...] = field(default=())

    def __iter__(self) -> Any:
        """Unpack as ``config, result = plan(...)``."""
        return iter((self.config, self.result))

    def __repr__(self) -> str:
        r, b = self.result, self.baseline
        done = "" if r.complete else f", incomplete: {r.failed_reserves:,} failed"
        return (
            f"<Plan {describe(self.config)}: peak reserved {human_bytes(r.peak_reserved)}"
            f" (default layout {human_bytes(b.peak_reserved)}){done}; "
            f"{self.replays:,} replays in {self.seconds:.1f} s>"
        )

    def summary(self) -> str:
        """What was planned and how it does, in a few lines."""
        r, b = self.result, self.baseline
        return "\n".join(
            [
                f"planned layout: {describe(self.config)}",
                f"derived on {self.derived_on}; {self.replays:,} replays in {self.seconds:.1f} s",
                f"whole trace: peak reserved {human_bytes(r.peak_reserved)}, utilization "
                f"{r.utilization:.3f}, {r.storage_allocations:,} storage allocations "
                f"(default layout: {human_bytes(b.peak_reserved)}, {b.utilization:.3f}, "
                f"{b.storage_allocations:,})",
            ]
        )

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON-ready data."""
        return {
            "layout": to_spec(self.config),
            "description": describe(self.config),
            "derived_on": self.derived_on,
            "objective": self.objective,
            "max_storage_allocations": self.max_storage_allocations,
            "replays": self.replays,
            "seconds": self.seconds,
            "result": self.result.to_dict(timeline=False),
            "baseline": self.baseline.to_dict(timeline=False),
            "derivation": self.derivation.to_dict(timeline=False),
            "finalists": [{"layout": d, "mean_reserved_over_live": s} for d, s in self.finalists],
        }


# --------------------------------------------------------------------------- derivation


def _work_phases(trace: Trace) -> list[tuple[str, int]]:
    return [(name, first) for name, first in trace.phases if name.lower() != "setup"]


def derivation_trace(trace: Trace, derive: Derive = "first_step") -> tuple[Trace, int, str]:
    """Return the trace a plan is derived on, where its perturbable part starts, and how
    it was made in words.

    ``derive="first_step"``: when the header's phases name at least two steps (phases
    other than ``setup``), the events before the second step, with the first step run
    once more on the state it leaves (its allocations that it frees are repeated; those
    it keeps stay live); otherwise the whole trace. ``"all"``: the whole trace. An int
    ``n``: the first ``n`` events.
    """
    if isinstance(derive, bool) or not (isinstance(derive, int) or derive in ("first_step", "all")):
        raise ValueError(f"derive must be 'first_step', 'all' or an event count, got {derive!r}")
    if isinstance(derive, int):
        if derive <= 0:
            raise ValueError(f"derive must be a positive event count, got {derive}")
        cut = min(derive, len(trace))
        return trace.prefix(cut), 0, f"the first {cut:,} of {len(trace):,} events"
    work = _work_phases(trace)
    if derive == "all" or len(work) < 2:
        why = "" if derive == "all" else " (its header names no second step)"
        return trace, work[0][1] if work else 0, f"the whole trace{why}"
    (first_name, start), (_, cut) = work[0], work[1]
    events = trace.prefix(cut).events()
    step = events[start:]
    born = {e[2] for e in step if e[1] == "alloc"}
    transient = born & {e[2] for e in step if e[1] == "free"}
    shift = (events[-1][0] - step[0][0] + 1) if step else 0
    next_id = trace.prefix(cut).allocations
    renamed: dict[int, int] = {}
    repeat: list[tuple[int, str, int, int]] = []
    for t, op, ident, size in step:
        if ident not in transient:
            continue
        if op == "alloc":
            renamed[ident] = next_id
            next_id += 1
        repeat.append((t + shift, op, renamed[ident], size))
    header = dict(trace.header)
    header["phases"] = [
        *({"name": n, "first_event": f} for n, f in trace.phases if f < cut),
        {"name": f"{first_name} (again)", "first_event": len(events)},
    ]
    derived = Trace.from_events(events + repeat, header)
    what = (
        f"the setup and {first_name} (events 0-{cut - 1:,} of {len(trace):,}), with "
        f"{first_name} run once more on the state it leaves"
    )
    return derived, len(events), what


def perturb(trace: Trace, start: int, window: int, seed: int, extra: float = 0.0) -> Trace:
    """Return a perturbed replica of ``trace``.

    Each event from index ``start`` on moves up to ``window`` places at random (a free
    never before its allocation; times stay in order), and a share ``extra`` of the
    allocations, drawn at random, gets a twin of the same size that lives alongside it
    (a slightly larger model or batch: the sizes stay the workload's). Twins are drawn
    among the allocations live at the peak until they hold ``extra`` of the peak live
    bytes, so the replica's peak is at least that much higher: a layout whose pages fit
    the peak with less room to spare falls off its cliff here, not in production.
    """
    events = trace.events()
    rng = random.Random(seed)
    if extra > 0:
        twins = _live_at_peak(events, extra * trace.peak_live, rng)
        offset = trace.allocations
        doubled: list[tuple[int, str, int, int]] = []
        for event in events:
            doubled.append(event)
            if event[2] in twins:
                doubled.append((event[0], event[1], event[2] + offset, event[3]))
        events = doubled
    head, tail = events[:start], events[start:]
    order = sorted(range(len(tail)), key=lambda k: k + rng.uniform(-window, window))
    times = [e[0] for e in tail]
    placed = {e[2] for e in head if e[1] == "alloc"}
    waiting: dict[int, tuple[int, str, int, int]] = {}
    moved: list[tuple[int, str, int, int]] = []
    for k in order:
        event = tail[k]
        if event[1] == "free" and event[2] not in placed:
            waiting[event[2]] = event
            continue
        moved.append(event)
        if event[1] == "alloc":
            placed.add(event[2])
            if event[2] in waiting:
                moved.append(waiting.pop(event[2]))
    rebuilt = [(t, op, ident, size) for t, (_, op, ident, size) in zip(times, moved, strict=True)]
    return Trace.from_events(head + rebuilt, trace.header)


def _live_at_peak(
    events: list[tuple[int, str, int, int]], goal: float, rng: random.Random
) -> set[int]:
    """Allocations live at the first peak of live bytes, drawn at random until their
    bytes reach ``goal``."""
    sizes: dict[int, int] = {}
    live = peak = peak_at = 0
    for index, (_, op, ident, size) in enumerate(events):
        if op == "alloc":
            sizes[ident] = size
            live += size
            if live > peak:
                peak, peak_at = live, index
        else:
            live -= sizes[ident]
    alive: dict[int, int] = {}
    for _, op, ident, size in events[: peak_at + 1]:
        if op == "alloc":
            alive[ident] = size
        else:
            del alive[ident]
    ids = sorted(alive)
    rng.shuffle(ids)
    chosen: set[int] = set()
    total = 0
    for ident in ids:
        if total >= goal:
            break
        chosen.add(ident)
        total += alive[ident]
    return chosen


# --------------------------------------------------------------------------- candidates


def _round_up(value: int, step: int) -> int:
    return -(-value // step) * step


def _thresholds(sizes: Sequence[int]) -> list[int]:
    """At most ``_MAX_THRESHOLDS`` largest-slice limits among the distinct sizes: all of
    them when few, else log-spaced picks (always with the largest)."""
    if len(sizes) <= _MAX_THRESHOLDS:
        return list(sizes)
    picks = {round(i * (len(sizes) - 1) / (_MAX_THRESHOLDS - 1)) for i in range(_MAX_THRESHOLDS)}
    return sorted(sizes[i] for i in picks)


def _live_peaks(events: Iterable[tuple[int, str, int, int]], limits: list[int]) -> list[int]:
    """For each limit, the peak live bytes of the allocations of at most that size."""
    current = [0] * len(limits)
    peaks = [0] * len(limits)
    sizes: dict[int, int] = {}
    for _, op, ident, size in events:
        if op == "alloc":
            sizes[ident] = size
            sign = 1
        else:
            size = sizes.pop(ident)
            sign = -1
        for j in range(bisect.bisect_left(limits, size), len(limits)):
            current[j] += sign * size
            if current[j] > peaks[j]:
                peaks[j] = current[j]
    return peaks


def _pages(limit: int, live_peak: int | None, max_page: int, *, dense: bool) -> list[int]:
    """Page sizes worth trying for a sliced pool whose largest slice is ``limit``: powers
    of two and one and a half times them, multiples of ``limit``, and, given the live
    peak of the sizes the pool takes, fractions of that peak with a little room."""
    pages: set[int] = set()
    p = _MIN_PAGE
    while p <= max_page:
        pages.update((p, p + p // 2))
        p *= 2
    pages.update(limit * m for m in (1, 2, 3, 4, 6, 8, 12, 16))
    if live_peak is not None:
        slacks = (1.02, 1.05, 1.1) if dense else (1.05,)
        for k in range(1, 13 if dense else 9):
            for slack in slacks:
                pages.add(_round_up(int(live_peak * slack / k), _PAGE_STEP))
    floor = max(limit, _MIN_PAGE)
    return sorted(q for q in pages if floor <= q <= max_page)


# --------------------------------------------------------------------------- search


def largest_page(result: ReplayResult) -> int:
    """The largest page of the uncapped sliced pools that held pages during the replay
    (a capped pool does not grow: what does not fit goes to the pools after it)."""
    pages = []
    for pool in result.pools:
        if pool.options is None:  # a pool of the torch model: no pages
            continue
        spec = pool_spec(pool.options)
        if spec["kind"] == "sliced_pages" and spec["max_pool_size"] is None and pool.pages_peak:
            pages.append(spec["page_size"])
    return max(pages, default=0)


def charged(result: ReplayResult) -> float:
    """The bytes a plan is charged for a replay: its peak reserved plus half the largest
    page of an uncapped sliced pool.

    The plan cannot see what later steps do; a layout that needs one page more there
    pays a whole page, so half the largest page is the expected price of that risk. It
    keeps a plan from fitting a few huge pages to the peak it saw, which saves a few
    percent on the derivation trace and loses half the memory on the next run.
    """
    return result.peak_reserved + largest_page(result) / 2


@dataclass
class _Search:
    trace: Trace
    properties: MemoryDeviceProperties | None
    budget: int
    progress: Progress | None
    workers: int
    replays: int = 0
    seen: dict[Layout, ReplayResult] = field(default_factory=dict)

    def run(self, stage: str, layouts: Iterable[Layout]) -> None:
        todo = sorted({lay for lay in layouts if lay not in self.seen}, key=Layout.key)
        done = 0

        def one(layout: Layout) -> tuple[Layout, ReplayResult]:
            return layout, replay(self.trace, layout.config(), self.properties, samples=0)

        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            for layout, result in pool.map(one, todo):
                self.seen[layout] = result
                done += 1
                if self.progress is not None and (done % 16 == 0 or done == len(todo)):
                    self.progress(done, len(todo), stage)
        self.replays += len(todo)

    def ranked(self) -> list[tuple[Layout, ReplayResult]]:
        fits = [
            (lay, r)
            for lay, r in self.seen.items()
            if r.failed_reserves == 0 and r.storage_allocations <= self.budget
        ]
        fits.sort(
            key=lambda item: (
                charged(item[1]),
                item[1].storage_allocations,
                item[0].key(),
            )
        )
        # Layouts that behave alike on the derivation trace (a pool that never serves,
        # a page size no allocation tells apart) count once, in their simplest form.
        seen: set[tuple[int, ...]] = set()
        distinct = []
        for layout, result in fits:
            signature = (
                result.peak_reserved,
                result.storage_allocations,
                result.storage_frees,
                *(p.reservations for p in result.pools if p.reservations),
            )
            if signature not in seen:
                seen.add(signature)
                distinct.append((layout, result))
        return distinct


def plan(
    trace: TraceLike,
    objective: Objective = "reserved",
    properties: MemoryDeviceProperties | None = None,
    *,
    derive: Derive = "first_step",
    max_storage_allocations: int | None = None,
    progress: Progress | bool | None = None,
    workers: int | None = None,
    device: str | int | None = None,
    stream: int | None = None,
) -> Plan:
    """Search pool layouts for ``trace`` by replaying it, and return the best.

    Args:
        trace: the workload's allocation trace, a trace file's path (read with
            ``device`` and ``stream``) or a bundled example's name.
        objective: ``"reserved"`` keeps the layout with the fewest peak bytes reserved
            (on average over perturbed replicas, see the module's docs);
            ``"storage_allocations"`` the one with the fewest storage allocations among
            those within 5 % of the fewest bytes.
        properties: the device (the default device when None).
        derive: what the plan is derived on (see :func:`derivation_trace`); the result
            is always judged on the whole trace.
        max_storage_allocations: the most storage allocations (cudaMalloc calls) a layout
            may make on the derivation trace; by default 1 % of its allocations, at least
            64, so that a plan never buys bytes with an allocation per tensor.
        progress: called as ``progress(done, total, stage)`` during the search;
            ``True`` draws a progress bar on stderr.
        workers: threads replaying in parallel (replays release the GIL); the CPU count
            by default.

    Returns:
        A :class:`Plan`: ``plan.config`` is the layout, ``plan.result`` its replay of the
        whole trace (``config, result = plan(...)`` unpacks them).
    """
    if objective not in ("reserved", "storage_allocations"):
        raise ValueError(
            f"objective must be 'reserved' or 'storage_allocations', not {objective!r}"
        )
    trace = resolve_trace(trace, device=device, stream=stream)
    progress = progress_callback(progress)
    started = time.perf_counter()
    derived, perturb_from, derived_on = derivation_trace(trace, derive)
    budget = (
        max(64, derived.allocations // 100)
        if max_storage_allocations is None
        else max_storage_allocations
    )
    props = properties if properties is not None else MemoryDeviceProperties()
    align = props.alignment
    max_page = props.max_page_size
    search = _Search(derived, properties, budget, progress, workers or os.cpu_count() or 1)

    events = derived.events()
    sizes = sorted({_round_up(max(e[3], 1), align) for e in events if e[1] == "alloc"})
    limits = _thresholds([s for s in sizes if s <= max_page]) or [align]
    # Sizes fitted to the peak seen (pages that are fractions of it, pools capped at it)
    # only where the plan is judged on what it saw: a later step's peak moves, and a page
    # fitted to the old one costs a whole page more. Extrapolating plans use the sizes
    # the allocations imply (powers of two, multiples of allocation sizes).
    measured = derived is trace
    peaks: dict[int, int] = (
        dict(zip(limits, _live_peaks(events, limits), strict=True)) if measured else {}
    )
    tails: tuple[Tail, ...] = ("exclusive_pages", "direct")

    # Stage 1: one sliced pool in front of the tail.
    search.run(
        "one sliced pool",
        (
            Layout(((page, limit, None),), tail)
            for limit in limits
            for page in _pages(limit, peaks.get(limit), max_page, dense=True)
            for tail in tails
        ),
    )
    # Stage 2: a second sliced pool next to each of the best few.
    best = [lay for lay, _ in search.ranked()[:4]]
    search.run(
        "two sliced pools",
        (
            Layout(
                tuple(sorted(((page, limit, None), lay.tiers[0]), key=lambda t: (t[1], t[0]))),
                lay.tail,
            )
            for lay in best
            for limit in limits
            if limit != lay.tiers[0][1]
            for page in _pages(limit, peaks.get(limit), max_page, dense=False)
        ),
    )

    # Stage 3: measured caps. A pool that held pages is capped at its high-water mark
    # and followed by a pool of small pages for what does not fit any more, so that
    # needing more than the derivation trace showed costs a small page, not a big one.
    # Candidates: the best by charged bytes, and by bytes alone (the cap takes away the
    # risk the charge is for).
    ranked = search.ranked()
    by_bytes = sorted(ranked, key=lambda item: (item[1].peak_reserved, item[0].key()))
    if measured:
        search.run(
            "capped pools",
            (
                variant
                for lay, result in ranked[:12] + by_bytes[:12]
                for variant in _capped(lay, result)
            ),
        )

    # Stage 4: the finalists on perturbed replicas; the lowest mean charge wins. Each
    # shape (one pool, two pools, capped) sends its best, so no shape crowds out another.
    ranked = search.ranked()
    shapes: dict[str, list[Layout]] = {"one": [], "two": [], "capped": []}
    for lay, _ in ranked:
        shape = (
            "capped"
            if any(c is not None for _, _, c in lay.tiers)
            else ("one" if len(lay.tiers) == 1 else "two")
        )
        if len(shapes[shape]) < _FINALISTS_PER_SHAPE:
            shapes[shape].append(lay)
    finalists: list[tuple[str, MemoryConfiguration]] = [
        (repr(lay), lay.config()) for group in shapes.values() for lay in group
    ]
    finalists += [(name, PRESETS[name]()) for name in ("default", "sub_slices")]
    replicas = [derived] + [
        perturb(derived, perturb_from, window, seed, extra) for window, extra, seed in _REPLICAS
    ]
    scores = _robustness(finalists, replicas, properties, budget, search, progress)
    chosen = _choose(scores, objective)

    config = dict(finalists)[chosen[0]]
    result = replay(trace, config, properties)
    baseline = replay(trace, default_configuration(), properties)
    derivation = replay(derived, config, properties, samples=0)
    search.replays += 3
    return Plan(
        config=config,
        result=result,
        baseline=baseline,
        derivation=derivation,
        derived_on=derived_on,
        objective=objective,
        max_storage_allocations=budget,
        replays=search.replays,
        seconds=time.perf_counter() - started,
        finalists=tuple((describe(dict(finalists)[k]), s) for k, s, _ in scores),
    )


def _capped(layout: Layout, result: ReplayResult) -> Iterable[Layout]:
    """Variants of ``layout`` with one sliced pool capped at the pages it held on the
    derivation trace, followed by an overflow pool of 2 or 8 MiB pages."""
    for index, (page, limit, cap) in enumerate(layout.tiers):
        held = result.pools[index].pages_peak
        options = result.pools[index].options
        if cap is not None or held == 0 or options is None:
            continue
        effective = pool_spec(options)["page_size"]
        for small in (2 * MIB, 8 * MIB):
            if small >= page:
                continue
            overflow = (small, min(limit, small // 2), None)
            tiers = list(layout.tiers)
            tiers[index] = (page, limit, held * effective)
            tiers.insert(index + 1, overflow)
            yield Layout(tuple(tiers), layout.tail)


def _robustness(
    finalists: list[tuple[str, MemoryConfiguration]],
    replicas: list[Trace],
    properties: MemoryDeviceProperties | None,
    budget: int,
    search: _Search,
    progress: Progress | None,
) -> list[tuple[str, float, int]]:
    """Each finalist's mean of peak reserved / peak live over the replicas, and its most
    storage allocations, best first; finalists over budget or failing drop out (the
    presets never do, so the list is never empty)."""
    jobs = [(key, config, replica) for key, config in finalists for replica in replicas]
    total = len(jobs)
    done = 0

    def one(job: tuple[str, MemoryConfiguration, Trace]) -> tuple[str, ReplayResult, int]:
        key, config, replica = job
        return key, replay(replica, config, properties, samples=0), replica.peak_live

    ratios: dict[str, list[float]] = {}
    allocs: dict[str, int] = {}
    dropped: set[str] = set()
    with ThreadPoolExecutor(max_workers=search.workers) as pool:
        for key, result, live in pool.map(one, jobs):
            done += 1
            if progress is not None and (done % 8 == 0 or done == total):
                progress(done, total, "robustness")
            over = result.failed_reserves > 0 or result.storage_allocations > budget
            if over and key not in PRESETS:
                dropped.add(key)
            ratios.setdefault(key, []).append(charged(result) / max(live, 1))
            allocs[key] = max(allocs.get(key, 0), result.storage_allocations)
    search.replays += total
    scores = [
        (key, sum(values) / len(values), allocs[key])
        for key, values in ratios.items()
        if key not in dropped
    ]
    scores.sort(key=lambda s: (s[1], s[2], s[0]))
    return scores


def _choose(scores: list[tuple[str, float, int]], objective: Objective) -> tuple[str, float, int]:
    if objective == "storage_allocations":
        best = scores[0][1]
        near = [s for s in scores if s[1] <= best * 1.05]
        return min(near, key=lambda s: (s[2], s[1]))
    return scores[0]

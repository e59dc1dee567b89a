"""The search over candidate layouts: replays on the derivation trace, pool by pool,
each stopped once its layout is out of the running."""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from cubepool._cubepool import (
    MemoryConfiguration,
    MemoryDeviceProperties,
    MemoryPoolOptions,
    PoolType,
    ReplayResult,
    Trace,
    pool_spec,
    replay_until,
)
from cubepool.plan.candidates import _ANY_SIZE, Layout, Progress, Shape, _round_up, _shape

# --------------------------------------------------------------------------- search


def largest_page(result: ReplayResult) -> int:
    """The largest page of the uncapped sliced pools that held pages during the replay
    (a capped pool does not grow: what does not fit goes to the pools after it), or
    granule of the virtual pools that mapped any (one more costs a granule)."""
    pages = []
    for pool in result.pools:
        if pool.options is None:  # a pool of the torch model: no pages
            continue
        spec = pool_spec(pool.options)
        if spec["kind"] == "sliced_pages" and spec["max_pool_size"] is None and pool.pages_peak:
            pages.append(spec["page_size"])
        if spec["kind"] == "virtual_pages" and pool.pages_peak:
            pages.append(spec["granule"])
    return max(pages, default=0)


def charged(result: ReplayResult) -> float:
    """The bytes a plan is charged for a replay: its peak reserved plus half the largest
    page of an uncapped sliced pool (or granule of a virtual pool).

    The plan cannot see what later steps do; a layout that needs one page more there
    pays a whole page, so half the largest page is the expected price of that risk. It
    keeps a plan from fitting a few huge pages to the peak it saw, which saves a few
    percent on the derivation trace and loses half the memory on the next run.
    """
    return result.peak_reserved + largest_page(result) / 2


@dataclass(frozen=True)
class _Pool:
    """What one pool of a layout did on the derivation trace.

    Attributes:
        page: its effective page size when it is an uncapped sliced pool, its granule
            when it is a virtual pool, else None.
        pages_peak: the most pages it held at once.
        reservations: the reservations it served.
    """

    page: int | None
    pages_peak: int
    reservations: int


@dataclass(frozen=True)
class _Outcome:
    """What the search keeps of a layout's replay of the derivation trace: what
    :func:`charged` and the ranking read, for a replay of the whole layout or the sum
    of its pools' replays on the sizes routed to them."""

    peak_reserved: int
    storage_allocations: int
    storage_frees: int
    failed_reserves: int
    pools: tuple[_Pool, ...]

    @staticmethod
    def of(result: ReplayResult) -> _Outcome:
        pools = []
        for pool in result.pools:
            # The torch models' pools have no options: no layout's page to keep.
            spec = pool_spec(pool.options) if pool.options is not None else None
            uncapped = (
                spec is not None
                and spec["kind"] == "sliced_pages"
                and spec["max_pool_size"] is None
            )
            page = spec["page_size"] if spec is not None and uncapped else None
            if spec is not None and spec["kind"] == "virtual_pages":
                # Needing more later costs a virtual pool one granule, not a page.
                page = spec["granule"]
            pools.append(_Pool(page, pool.pages_peak, pool.reservations))
        return _Outcome(
            result.peak_reserved,
            result.storage_allocations,
            result.storage_frees,
            result.failed_reserves,
            tuple(pools),
        )

    def charged(self) -> float:
        """:func:`charged` of the replay this outcome is of (a virtual pool's granule
        counts as its page)."""
        pages = [p.page for p in self.pools if p.page is not None and p.pages_peak]
        return self.peak_reserved + max(pages, default=0) / 2

    def signature(self) -> tuple[int, ...]:
        """What tells two replays apart: layouts with equal signatures behave alike on
        the derivation trace (a pool that never serves, a page size no allocation tells
        apart)."""
        return (
            self.peak_reserved,
            self.storage_allocations,
            self.storage_frees,
            *(p.reservations for p in self.pools if p.reservations),
        )


@dataclass(frozen=True)
class _Reads:
    """The parts of the ranking the search reads next: its first ``top`` layouts, the
    first ``by_bytes`` of it ordered by peak reserved bytes, and the first ``per_shape``
    of each shape. Every layout that could be in one of them must be replayed to the end;
    any other needs only a bound that keeps it out."""

    top: int = 0
    by_bytes: int = 0
    per_shape: int = 0


@dataclass(frozen=True)
class _Bound:
    """What a layout that was not replayed to the end is known to cost at least."""

    charged: float
    reserved: int


@dataclass(frozen=True)
class _Cutoffs:
    """The bounds past which a layout stays out of every part of the ranking that is
    read: its charge above ``charged`` and its peak reserved above ``reserved``, unless
    it has a shape in ``open_shapes`` (whose part of the ranking is not full), or
    ``everything`` is open.

    A layout can enter only the parts of its own shape and the top, so a charge above
    ``by_shape[shape]`` (the last charge of those parts) keeps it out of them too,
    unless it could push a layout of another shape's part out as a twin: that takes
    an equal signature (the same peak reserved, as many pools serving) and a charge no
    higher, to sort first. ``twins`` holds each read layout's shape, pools serving,
    peak reserved and charge."""

    charged: float
    reserved: float
    open_shapes: frozenset[Shape]
    everything: bool
    by_shape: tuple[tuple[Shape, float], ...] = ()
    twins: tuple[tuple[Shape, int, int, float], ...] = ()

    def excludes(self, layout: Layout, bound: _Bound, serving: int | None) -> bool:
        """Whether ``layout``, costing at least ``bound``, stays out of every part read;
        ``serving`` is how many of its pools serve (None: unknown)."""
        shape = _shape(layout)
        if self.everything or shape in self.open_shapes or bound.reserved <= self.reserved:
            return False
        if bound.charged > self.charged:
            return True
        return bound.charged > self.shape_charged(shape) and bound.reserved > self.twin_reserved(
            shape, serving, bound.charged
        )

    def shape_charged(self, shape: Shape) -> float:
        """The last charge of the parts read that a layout of ``shape`` can enter."""
        return dict(self.by_shape).get(shape, self.charged)

    def twin_reserved(self, shape: Shape, serving: int | None, charged: float = -math.inf) -> float:
        """The most peak reserved bytes of a read layout of another shape that a layout
        of ``shape`` with ``serving`` pools serving, charged at least ``charged``,
        could be a twin of that sorts first."""
        return max(
            (
                reserved
                for other, count, reserved, charge in self.twins
                if other != shape and (serving is None or count == serving) and charge >= charged
            ),
            default=-math.inf,
        )


_Job = TypeVar("_Job")

_LOOKAHEAD: int = 8
"""How far past its size (in multiples of it) a wave looks for layouts that share no
missing pool with those it took (see :meth:`_Search.wave`)."""


PoolKey = tuple[Any, ...]
"""A pool of a layout, as data: ``("sliced_pages", page, max_slice)`` or the tail's kind."""


@dataclass(frozen=True, order=True)
class SizeGroup:
    """The distinct sizes of a trace that a layout routes to one of its pools, as
    inclusive ``(low, high)`` ranges of sizes: a few ranges however many sizes they
    hold, so that a group is cheap to hash, keep and pass to Rust
    (``Trace.range_live_peaks``, ``replay_until(..., size_ranges=...)``).

    Invariant: ``ranges`` ascend and are disjoint, each bounded by sizes of the trace
    it was made for (the derivation trace; its replicas have the same sizes), and
    ``count`` is how many distinct sizes of that trace they hold. Two groups of one
    trace are equal exactly when they hold the same sizes.
    """

    ranges: tuple[tuple[int, int], ...]
    count: int

    def __bool__(self) -> bool:
        return self.count > 0

    def sizes(self, distinct: Sequence[int]) -> list[int]:
        """The sizes of ``distinct`` (ascending) in the group."""
        out: list[int] = []
        for low, high in self.ranges:
            out += distinct[bisect.bisect_left(distinct, low) : bisect.bisect_right(distinct, high)]
        return out

    def clipped(self, low: int, high: int, distinct: Sequence[int]) -> SizeGroup:
        """The group's sizes from ``low`` to ``high`` (sizes of ``distinct``, ascending)."""
        ranges = tuple(
            (max(a, low), min(b, high)) for a, b in self.ranges if a <= high and b >= low
        )
        count = sum(
            bisect.bisect_right(distinct, b) - bisect.bisect_left(distinct, a) for a, b in ranges
        )
        return SizeGroup(ranges, count)


Part = tuple[PoolKey, SizeGroup]
"""A pool of a layout with the sizes routed to it: the key its replays are kept by."""


@dataclass
class _Kept:
    """The pools' replays that one evaluation in a wave made, kept apart from the
    search's until the wave ends (see :meth:`_Search.wave`): those run to the end
    (``parts``) and the furthest stopped one of each pool (``partial``)."""

    parts: dict[Part, _Outcome] = field(default_factory=dict)
    partial: dict[Part, _Outcome] = field(default_factory=dict)


def _keep_deepest(partial: dict[Part, _Outcome], key: Part, outcome: _Outcome) -> None:
    """Keep ``outcome`` as ``key``'s stopped replay unless one that went as far (as many
    bytes reserved) is kept: the furthest shows the most."""
    known = partial.get(key)
    if known is None or known.peak_reserved < outcome.peak_reserved:
        partial[key] = outcome


@dataclass
class _Search:
    """The candidates replayed so far: to the end (``seen``), or only until they were out
    of the running (``bounded``, with what they cost at least), or never (``bounded``
    too, from a lower bound of their pages).

    A layout whose pools have no cap is replayed pool by pool: routing is then by size
    alone, so each pool sees the allocations of the sizes routed to it whatever the
    others do, and a pool that never gives storage back reserves most at the end, so the
    layout's peak is the sum of its pools' peaks. Each pool's replay on its sizes is
    kept (``_parts``) and shared by every layout that has that pool with those sizes:
    the tail behind each size limit is replayed once, not once per page size, and a
    second sliced pool is replayed on the sizes between the two limits only."""

    trace: Trace
    properties: MemoryDeviceProperties | None
    budget: int
    progress: Progress | None
    workers: int
    replays: int = 0
    stopped: int = 0
    seen: dict[Layout, _Outcome] = field(default_factory=dict)
    bounded: dict[Layout, _Bound] = field(default_factory=dict)
    out: set[Layout] = field(default_factory=set)
    """Layouts over the budget of storage allocations, or failing: never in the ranking."""
    _order: dict[Layout, tuple[tuple[Any, ...], tuple[int, ...], Shape]] = field(
        default_factory=dict
    )
    """The sort key of each layout of ``seen`` that fits (charge, storage allocations,
    simplicity), with its signature and shape."""
    _charges: dict[Layout, float] = field(default_factory=dict)
    _parts: dict[Part, _Outcome] = field(default_factory=dict)
    _partial: dict[Part, _Outcome] = field(default_factory=dict)
    """Pools' replays that stopped early: what they show is a lower bound."""
    _sizes: list[int] = field(default_factory=list)
    """The trace's distinct sizes, ascending."""
    _groups: dict[Part, list[SizeGroup]] = field(default_factory=dict)
    """:meth:`_exclusive_groups` of each exclusive tail's part asked about."""
    _routes: dict[Layout, list[tuple[Part, Any]] | None] = field(default_factory=dict)
    """:meth:`_routed` of each layout asked about."""
    _live: dict[SizeGroup, tuple[int, int]] = field(default_factory=dict)
    """The live peaks (bytes, allocations) of each group of sizes a pool was routed,
    for :meth:`_low`."""
    live_peaks: dict[int, int] | None = None
    """The live peak under each size limit, for :meth:`guess`."""
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _local: threading.local = field(default_factory=threading.local)
    """Per thread: the :class:`_Kept` of the evaluation it runs in a wave, if any."""

    def __post_init__(self) -> None:
        self._sizes = self.trace.distinct_sizes()

    def run(
        self,
        stage: str,
        layouts: Iterable[Layout],
        reads: _Reads,
        floor: Callable[[Layout], _Bound] | None = None,
    ) -> None:
        """Replay ``layouts``, each only as far as it takes to keep it out of the parts
        of the ranking that ``reads`` names, as the ranking stands when it starts; a
        layout whose ``floor`` (a lower bound of its cost) already does is not replayed.
        Call :meth:`settle` before reading the ranking."""
        todo = {lay for lay in layouts if lay not in self.seen and lay not in self.out}
        todo -= self.bounded.keys()
        floors = {lay: floor(lay) for lay in todo} if floor is not None else {}
        self.measure(todo)
        # One tail after the other: layouts that differ only in their tail share their
        # sliced pools' replays, whole or stopped, and run apart in time.
        # The exclusive tail first: a direct tail often goes over the budget of storage
        # allocations, so the ranking (and the bounds it sets) fills from the others.
        order = sorted(
            todo,
            key=lambda lay: (lay.tail != "exclusive_pages", self.guess(lay), lay.key()),
        )
        self._replay(stage, order, reads, floors)

    def guess(self, layout: Layout) -> float:
        """A rough charge of ``layout``, to replay likely good layouts first (so that
        the bounds that stop the others are tight early): each sliced pool fills whole
        pages with the live peak of the sizes between its limit and the one before."""
        if self.live_peaks is None:
            return 0.0
        total, below, largest = 0.0, 0, 0
        for page, limit, _ in sorted(layout.tiers, key=lambda t: t[1]):
            live = self.live_peaks.get(limit, below)
            total += _round_up(max(live - below, 0), page)
            below, largest = max(below, live), max(largest, page)
        return total + max(self.trace.peak_live - below, 0) + largest / 2

    def settle(self, stage: str, reads: _Reads) -> None:
        """Replay to the end every bounded layout that could be in a part of the ranking
        that ``reads`` names, until none could: then those parts are exactly what
        replaying every candidate to the end would give."""
        while True:
            cutoffs = self._cutoffs(self._ranked_rows(), reads)
            needed = sorted(
                (
                    lay
                    for lay, bound in self.bounded.items()
                    if not cutoffs.excludes(lay, bound, self.serving(lay))
                ),
                key=Layout.key,
            )
            if not needed:
                return
            self.measure(needed)
            self._replay(stage, needed, None, {})

    def measure(self, layouts: Iterable[Layout]) -> None:
        """Measure the live peaks of the groups of sizes that the pools of ``layouts``
        are routed, for :meth:`_low`: those not known yet, in one pass over the trace
        (one pass per group would cost more than the replays it spares)."""
        groups = sorted(
            {
                sizes
                for lay in layouts
                for (_, sizes), _ in self._routed(lay) or ()
                if sizes not in self._live
            }
        )
        if groups:
            peaks = self.trace.range_live_peaks([list(group.ranges) for group in groups])
            self._live.update(zip(groups, peaks, strict=True))

    def _cutoffs(self, ranked: list[tuple[Layout, _Outcome, Shape]], reads: _Reads) -> _Cutoffs:
        """The cutoffs of the parts of ``ranked`` (:meth:`_ranked_rows`) that ``reads``
        names.

        A bounded layout beyond them cannot enter those parts, nor push one of their
        layouts out as a twin (equal signature): a twin that sorts first would need a
        charge no higher (so it would be in the part), and a twin by bytes would need
        the same peak reserved bytes."""
        read: list[tuple[Layout, _Outcome, Shape]] = []
        everything = False
        open_shapes: set[Shape] = set()
        top = -math.inf
        if reads.top:
            read += ranked[: reads.top]
            top = max((self._charges[lay] for lay, _, _ in read), default=-math.inf)
            everything |= len(ranked) < reads.top
        by_shape: dict[Shape, float] = {"one": top, "two": top, "capped": top}
        if reads.per_shape:
            counts: dict[Shape, int] = {"one": 0, "two": 0, "capped": 0}
            for row in ranked:
                lay, _, shape = row
                if counts[shape] < reads.per_shape:
                    counts[shape] += 1
                    read.append(row)
                    by_shape[shape] = max(by_shape[shape], self._charges[lay])
            open_shapes = {s for s, n in counts.items() if n < reads.per_shape}
        reserved = -math.inf
        if reads.by_bytes:
            if len(ranked) < reads.by_bytes:
                everything = True
            else:
                by_bytes = heapq.nsmallest(reads.by_bytes, (r.peak_reserved for _, r, _ in ranked))
                reserved = by_bytes[-1]
        return _Cutoffs(
            charged=max((self._charges[lay] for lay, _, _ in read), default=-math.inf),
            reserved=reserved,
            open_shapes=frozenset(open_shapes),
            everything=everything,
            by_shape=tuple(by_shape.items()),
            twins=tuple(
                (shape, len(outcome.signature()) - 3, outcome.peak_reserved, self._charges[lay])
                for lay, outcome, shape in read
            ),
        )

    def _replay(
        self,
        stage: str,
        order: Sequence[Layout],
        reads: _Reads | None,
        floors: dict[Layout, _Bound],
    ) -> None:
        """Replay ``order`` in waves of up to ``workers`` (see :meth:`wave`). With
        ``reads``, each replay stops once it is out of those parts of the ranking as it
        stands when its wave starts, and a layout whose floor already is out is not
        replayed; without, every layout is replayed to the end."""
        done = 0
        cutoffs: _Cutoffs | None = None
        fresh = 0  # results since the cutoffs were computed
        queue = list(order)
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            while queue:
                if reads is not None and (
                    cutoffs is None or fresh >= max(self.workers, len(self.seen) // 64)
                ):
                    # Fresh cutoffs every few results (the ranking is sorted anew).
                    cutoffs, fresh = self._cutoffs(self._ranked_rows(), reads), 0
                jobs: list[tuple[Layout, int | None]] = []
                for layout in self.wave(queue, _itself):
                    above: int | None = None
                    if cutoffs is not None:
                        floor = floors.get(layout)
                        serving = self.serving(layout)
                        if floor is not None and cutoffs.excludes(layout, floor, serving):
                            self.bounded[layout] = floor
                            done += 1
                            continue
                        above = _stop_reserved(layout, cutoffs, serving)
                    jobs.append((layout, above))
                for layout, outcome, stopped in self.evaluate_wave(pool, jobs):
                    self._record(layout, outcome, stopped)
                    done += 1
                    fresh += 1
                    if self.progress is not None and done % 16 == 0 and done < len(order):
                        self.progress(done, len(order), stage)
        if self.progress is not None and order:
            self.progress(len(order), len(order), stage)

    def wave(self, queue: list[_Job], layout_of: Callable[[_Job], Layout | None]) -> list[_Job]:
        """Take the next wave off ``queue``: its first job, then each of the next few
        whose layout (``layout_of(job)``; None for one replayed whole) has no pool
        missing from :attr:`_parts` that a job taken before replays, up to ``workers``
        jobs in all.

        A wave's layouts replay in parallel, each seeing only the pools' replays kept
        before the wave started (:meth:`evaluate_wave`): what a replay shows, whether it
        stops and how many replays it runs then follow from the order of the layouts
        alone, never from which thread finished first, so a plan's count of replays is
        the same from run to run. Layouts that share a missing pool go in different
        waves, so that the later one shares the earlier one's replay of it."""
        taken: list[int] = []
        claimed: set[Part] = set()
        for index, job in enumerate(queue[: _LOOKAHEAD * self.workers]):
            layout = layout_of(job)
            routed = () if layout is None else self._routed(layout) or ()
            missing = {key for key, _ in routed if key not in self._parts}
            if taken and missing & claimed:
                continue
            taken.append(index)
            claimed |= missing
            if len(taken) == self.workers:
                break
        out = [queue[index] for index in taken]
        for index in reversed(taken):
            del queue[index]
        return out

    def evaluate_wave(
        self, pool: ThreadPoolExecutor, jobs: Sequence[tuple[Layout, int | None]]
    ) -> list[tuple[Layout, _Outcome, bool]]:
        """:meth:`_evaluate` of each ``(layout, above)`` of ``jobs`` on ``pool``, in
        parallel, each seeing only the pools' replays kept before the call; what they
        keep is merged afterwards, in the order of ``jobs``. Results in that order."""
        futures = [pool.submit(self._evaluate_apart, layout, above) for layout, above in jobs]
        results = [future.result() for future in futures]
        for _, _, _, kept in results:
            self._merge(kept)
        return [(layout, outcome, stopped) for layout, outcome, stopped, _ in results]

    def _evaluate_apart(
        self, layout: Layout, above: int | None
    ) -> tuple[Layout, _Outcome, bool, _Kept]:
        """:meth:`_evaluate` on this thread, keeping the pools' replays it makes apart
        (returned, for :meth:`_merge`) instead of in the shared :attr:`_parts`."""
        kept = self._local.kept = _Kept()
        try:
            layout, outcome, stopped = self._evaluate(layout, above)
        finally:
            self._local.kept = None
        return layout, outcome, stopped, kept

    def _merge(self, kept: _Kept) -> None:
        """Keep the pools' replays of one evaluation (see :meth:`_evaluate_apart`)."""
        for key, outcome in kept.parts.items():
            self._parts.setdefault(key, outcome)
        for key, outcome in kept.partial.items():
            _keep_deepest(self._partial, key, outcome)

    def _kept(self) -> _Kept | None:
        """The pools' replays kept apart by the evaluation on this thread, if any."""
        kept: _Kept | None = getattr(self._local, "kept", None)
        return kept

    def _known(self, key: Part) -> _Outcome | None:
        """The replay to the end of a pool on its sizes, if one was kept."""
        kept = self._kept()
        if kept is not None and key in kept.parts:
            return kept.parts[key]
        return self._parts.get(key)

    def _keep(self, key: Part, outcome: _Outcome) -> None:
        """Keep a pool's replay to the end on its sizes."""
        kept = self._kept()
        (self._parts if kept is None else kept.parts)[key] = outcome

    def _known_partial(self, key: Part) -> _Outcome | None:
        """The furthest stopped replay of a pool on its sizes, if one was kept."""
        kept = self._kept()
        mine = None if kept is None else kept.partial.get(key)
        shared = self._partial.get(key)
        if mine is None or (shared is not None and shared.peak_reserved >= mine.peak_reserved):
            return shared
        return mine

    def _evaluate(self, layout: Layout, above: int | None) -> tuple[Layout, _Outcome, bool]:
        """Replay ``layout``, pool by pool where it can, until its reserved bytes pass
        ``above`` or its storage allocations the budget; says whether it stopped."""
        parts = self._routed(layout)
        if parts is None:
            result, stopped = self._count(
                replay_until(
                    self.trace,
                    layout.config(),
                    self.properties,
                    reserved_above=above,
                    storage_allocations_above=self.budget,
                )
            )
            return layout, _Outcome.of(result), stopped is not None
        # Pools replayed before are shared. Each missing one is replayed only until the
        # layout is out of the running, given what the others reserve at least (their
        # replays, else their floors: see :meth:`_low`). The tail goes first: a sliced
        # pool's floor (whole pages of its live bytes) is tight, a tail's (its live
        # bytes) is not, so where the layout is out the tail's replay shows it early.
        outcomes: list[_Outcome | None] = [self._known(key) for key, _ in parts]
        missing = [i for i, o in enumerate(outcomes) if o is None]
        lows = {i: self._low(parts[i]) for i in missing}
        stopped = False
        tail = len(parts) - 1
        for index in sorted(missing, key=lambda i: i != tail):
            others = [o if o is not None else lows[i] for i, o in enumerate(outcomes)]
            del others[index]
            held = sum(o.peak_reserved for o in others)
            made = sum(o.storage_allocations for o in others)
            room = None if above is None else max(0, above - held)
            low = lows[index]
            if (room is not None and low.peak_reserved > room) or (
                low.storage_allocations > self.budget - made
            ):
                # Out of the running on what it reserves at least: no replay.
                outcomes[index], stopped = low, True
            else:
                outcome, stopped = self._part(parts[index], room, max(0, self.budget - made))
                # A replay run to the end (shared, or in groups) may pass the bound too.
                stopped = stopped or (
                    (room is not None and outcome.peak_reserved > room)
                    or outcome.storage_allocations > self.budget - made
                )
                outcomes[index] = outcome
            if stopped:
                outcomes = [o if o is not None else lows[i] for i, o in enumerate(outcomes)]
                break
        done = [o for o in outcomes if o is not None]
        if not stopped and any(o.storage_frees for o in done):
            # A pool that gives storage back may peak before the end: peaks do not add.
            result, _ = self._count(replay_until(self.trace, layout.config(), self.properties))
            return layout, _Outcome.of(result), False
        return (
            layout,
            _Outcome(
                sum(o.peak_reserved for o in done),
                sum(o.storage_allocations for o in done),
                sum(o.storage_frees for o in done),
                sum(o.failed_reserves for o in done),
                tuple(o.pools[0] for o in done),
            ),
            stopped,
        )

    def serving(self, layout: Layout) -> int | None:
        """How many pools of ``layout`` serve on the trace, when routing tells (a pool
        serves when a size of the trace is routed to it): None for a layout replayed
        whole."""
        parts = self._routed(layout)
        return None if parts is None else sum(1 for (_, sizes), _ in parts if sizes)

    def _routed(self, layout: Layout) -> list[tuple[Part, Any]] | None:
        """Each pool of ``layout`` (as data, with the sizes routed to it) and its type,
        or None when the layout is replayed whole: a capped pool (a full one passes
        requests on) or a size no pool takes."""
        if layout not in self._routes:
            self._routes[layout] = self._route(layout)
        return self._routes[layout]

    def _route(self, layout: Layout) -> list[tuple[Part, Any]] | None:
        """:meth:`_routed`, worked out."""
        if any(c is not None for _, _, c in layout.tiers):
            return None
        # Runs of the distinct sizes (ascending) routed alike, asked in Rust with a
        # few routing questions per run: a layout costs the same whatever the number
        # of sizes (asking per size made planning grow with sizes times layouts).
        runs = self.trace.route_runs(layout.config(), self.properties)
        keys: list[PoolKey] = [("sliced_pages", p, s) for p, s, _ in layout.tiers]
        keys.append((layout.tail,))
        ranges: list[list[tuple[int, int]]] = [[] for _ in keys]
        counts = [0] * len(keys)
        for start, end, index in runs:
            if index is None:
                if self._sizes[end - 1]:  # only size 0 is served without a pool
                    return None
                continue
            ranges[index].append((self._sizes[start], self._sizes[end - 1]))
            counts[index] += end - start
        routed = [SizeGroup(tuple(r), n) for r, n in zip(ranges, counts, strict=True)]
        types = [PoolType.sliced_pages(p, s, None) for p, s, _ in layout.tiers]
        types.append(
            PoolType.exclusive_pages(_ANY_SIZE)
            if layout.tail == "exclusive_pages"
            else PoolType.direct()
        )
        return [((k, r), t) for k, r, t in zip(keys, routed, types, strict=True)]

    def _part(
        self, part: tuple[Part, Any], above: int | None, made: int | None
    ) -> tuple[_Outcome, bool]:
        """One pool's replay on its sizes; kept when it ran to the end. An exclusive
        tail is replayed group by group (see :meth:`_exclusive_groups`), each group's
        replay kept and shared, and run to the end: its figures are the sums."""
        key, pool_type = part
        groups = self._exclusive_groups(key)
        if len(groups) > 1:
            outcomes = []
            for group in groups:
                sub = (key[0], group)
                outcome = self._known(sub)
                if outcome is None:
                    outcome = self._part((sub, pool_type), None, None)[0]
                outcomes.append(outcome)
            if not any(o.storage_frees for o in outcomes):
                whole = _Outcome(
                    sum(o.peak_reserved for o in outcomes),
                    sum(o.storage_allocations for o in outcomes),
                    0,
                    sum(o.failed_reserves for o in outcomes),
                    (
                        _Pool(
                            None,
                            sum(o.pools[0].pages_peak for o in outcomes),
                            sum(o.pools[0].reservations for o in outcomes),
                        ),
                    ),
                )
                self._keep(key, whole)
                return whole, False
        config = MemoryConfiguration.custom([MemoryPoolOptions(pool_type)])
        result, stopped = self._count(
            replay_until(
                self.trace,
                config,
                self.properties,
                reserved_above=above,
                storage_allocations_above=made,
                size_ranges=list(key[1].ranges),
            )
        )
        outcome = _Outcome.of(result)
        if stopped is None:
            self._keep(key, outcome)
        else:
            kept = self._kept()
            if kept is None:
                with self._lock:
                    _keep_deepest(self._partial, key, outcome)
            else:
                _keep_deepest(kept.partial, key, outcome)
        return outcome, stopped is not None

    def _exclusive_groups(self, key: Part) -> list[SizeGroup]:
        """The sizes of an exclusive tail's part in groups that its pool serves apart:
        a page is as large as the request that made it (rounded to the alignment) and
        serves a later request only when it wastes at most an eighth of itself, so no
        page of a group ever serves a size of another, where consecutive rounded sizes
        lie more than that apart. Such a pool never gives storage back, so its figures
        are the sums of its groups'. One group for any other pool. Worked out once
        per part (it reads every size of the part)."""
        pool, group = key
        if pool != ("exclusive_pages",) or group.count < 2:
            return [group]
        known = self._groups.get(key)
        if known is not None:
            return known
        props = self.properties if self.properties is not None else MemoryDeviceProperties()
        sizes = group.sizes(self._sizes)  # ascending, and so are their extents
        cuts = [
            index
            for index, (low, high) in enumerate(itertools.pairwise(sizes), start=1)
            if (_round_up(max(high, 1), props.alignment) - _round_up(max(low, 1), props.alignment))
            * 8
            > _round_up(max(high, 1), props.alignment)
        ]
        bounds = [0, *cuts, len(sizes)]
        groups = [
            group.clipped(sizes[a], sizes[b - 1], self._sizes)
            for a, b in itertools.pairwise(bounds)
        ]
        with self._lock:
            self._groups[key] = groups
        return groups

    def _low(self, part: tuple[Part, Any]) -> _Outcome:
        """What one pool of a layout reserves and allocates at least on its sizes: its
        stopped replay's figures when it has one, and at least the live peak of its
        sizes (a pool holds every live byte it serves), which a sliced pool holds in
        whole pages, one storage allocation each (a tail makes one per live
        allocation). It bounds the pool's peak whatever the pool gives back, so the
        floors of a layout's pools add up to one of the layout's own wherever its
        pools' peaks do (see :meth:`_evaluate`)."""
        key, _ = part
        sizes = key[1]
        peaks = self._live.get(sizes)
        if peaks is None:
            peaks = self._live[sizes] = self.trace.range_live_peaks([list(sizes.ranges)])[0]
        live, count = peaks
        pool = key[0]
        if pool[0] == "sliced_pages" and live > 0:
            page = self._effective_page(pool[1])
            pages = -(-live // page)
            reserved, allocations, floor_pool = pages * page, pages, _Pool(page, pages, 0)
        else:
            # The tails keep a storage buffer (a page) per live allocation.
            reserved, allocations, floor_pool = live, count, _Pool(None, 0, 0)
        partial = self._known_partial(key)
        if partial is not None and partial.peak_reserved >= reserved:
            return partial
        return _Outcome(
            reserved,
            max(allocations, partial.storage_allocations if partial is not None else 0),
            0,
            0,
            (floor_pool,),
        )

    def least_charged(self, layout: Layout, live: dict[SizeGroup, int], peak: int) -> float:
        """The least a layout replayed pool by pool can be charged on a trace whose live
        peaks of the groups of sizes its pools are routed are ``live`` and whose peak
        live bytes are ``peak`` (0 for a layout replayed whole): its sliced pools never
        give storage back and hold their live peaks in whole pages, an exclusive tail
        holds its live peak too, and a direct tail at least leaves the peak live bytes
        to hold; the charge adds half the largest page of a sliced pool that serves."""
        parts = self._routed(layout)
        if parts is None:
            return 0.0
        held, largest, tail = 0, 0, 0
        for (pool, sizes), _ in parts:
            bytes_ = live[sizes] if sizes else 0
            if pool[0] == "sliced_pages":
                if bytes_ > 0:
                    page = self._effective_page(pool[1])
                    held += -(-bytes_ // page) * page
                    largest = max(largest, page)
            elif pool == ("exclusive_pages",):
                tail = bytes_
        return max(held + tail, peak) + largest / 2

    def _effective_page(self, page: int) -> int:
        """The page size a sliced pool of ``page`` resolves to (rounded to the
        alignment, at most the largest page)."""
        props = self.properties if self.properties is not None else MemoryDeviceProperties()
        align = props.alignment
        return min(_round_up(page, align), props.max_page_size // align * align)

    def _count(self, replayed: tuple[ReplayResult, int | None]) -> tuple[ReplayResult, int | None]:
        with self._lock:
            self.replays += 1
            self.stopped += replayed[1] is not None
        return replayed

    def _record(self, layout: Layout, outcome: _Outcome, stopped: bool) -> None:
        self.bounded.pop(layout, None)
        if not stopped:
            self.seen[layout] = outcome
            self._charges[layout] = charge = outcome.charged()
            if outcome.failed_reserves == 0 and outcome.storage_allocations <= self.budget:
                self._order[layout] = (
                    (charge, outcome.storage_allocations, layout.key()),
                    outcome.signature(),
                    _shape(layout),
                )
        elif outcome.failed_reserves > 0 or outcome.storage_allocations > self.budget:
            self.out.add(layout)
        else:
            self.bounded[layout] = _Bound(outcome.charged(), outcome.peak_reserved)

    def ranked(self) -> list[tuple[Layout, _Outcome]]:
        """The layouts replayed to the end that fit the budget, least charged first,
        each behaviour (signature) once, in its simplest form."""
        return [(layout, outcome) for layout, outcome, _ in self._ranked_rows()]

    def _ranked_rows(self) -> list[tuple[Layout, _Outcome, Shape]]:
        """:meth:`ranked`, each layout with its shape."""
        fits = sorted(self._order.items(), key=lambda item: item[1][0])
        # Layouts that behave alike on the derivation trace (a pool that never serves,
        # a page size no allocation tells apart) count once, in their simplest form.
        signatures: set[tuple[int, ...]] = set()
        distinct = []
        for layout, (_, signature, shape) in fits:
            if signature not in signatures:
                signatures.add(signature)
                distinct.append((layout, self.seen[layout], shape))
        return distinct


def _itself(layout: Layout) -> Layout:
    return layout


def _stop_reserved(layout: Layout, cutoffs: _Cutoffs, serving: int | None) -> int | None:
    """The reserved bytes past which a replay of ``layout`` (with ``serving`` pools
    serving, None when unknown) is out of the parts of the ranking that ``cutoffs``
    stand for (None: it must run to the end). The charge adds half the largest uncapped
    page once its pool holds one, which it does from the first allocation it serves;
    if it did not, the bound recorded is lower, and the search replays the layout to
    the end when that matters (:meth:`_Cutoffs.excludes` decides on what it shows)."""
    shape = _shape(layout)
    if cutoffs.everything or shape in cutoffs.open_shapes:
        return None
    page = max((p for p, _, c in layout.tiers if c is None), default=0)
    above = min(
        max(cutoffs.charged - page / 2, cutoffs.reserved),
        max(
            cutoffs.shape_charged(shape) - page / 2,
            cutoffs.reserved,
            cutoffs.twin_reserved(shape, serving),
        ),
    )
    if math.isinf(above):
        return None
    return max(0, math.floor(above))


def _floor(
    peak_live: int, live_peaks: dict[int, int], align: int, max_page: int
) -> Callable[[Layout], _Bound]:
    """A lower bound of what a layout costs, from the trace's peak live bytes and the
    live peaks under each size limit (``align``ed, as the candidates' limits are).

    Its first pool takes every size up to its limit (routing tries pools in order) and
    never gives a page back, so at the end it holds at least the pages its live peak
    fills; the layout reserves at least that, and at least the peak live bytes. The
    charge adds half that pool's page when the pool serves anything (``live_peaks``
    above 0); other pools may serve nothing, so they add nothing."""

    def floor(layout: Layout) -> _Bound:
        if not layout.tiers:
            return _Bound(peak_live, peak_live)
        page, limit, cap = layout.tiers[0]
        page = min(_round_up(page, align), max_page // align * align)  # as resolved
        live = live_peaks.get(limit, 0) if limit % align == 0 and limit <= page else 0
        pages = -(-live // page) * page if cap is None else 0
        reserved = max(peak_live, pages)
        charge = page / 2 if cap is None and live > 0 else 0.0
        return _Bound(reserved + charge, reserved)

    return floor

"""Planning a pool layout for a workload by replaying its trace.

:func:`plan` searches layouts of the seed's vocabulary — one or two sliced pools (page
size, largest slice) in front of an exclusive-pages or direct tail that takes every
larger size — by replaying a *derivation trace* through each, and keeps the layout that
reserves least (or makes fewest storage allocations) within a budget of storage
allocations, so that it stays fast as well as small. Virtual pools (granules mapped on
demand) join the finalists: alone, for each granule and release policy it tries, and
behind the sliced pool of the best one-pool layouts; ``call_cost`` weighs the finalists'
storage calls (maps and unmaps included) against their bytes.

It must generalise: a plan is derived from what a workload shows early and judged on the
whole run. For a training trace whose header names its steps, the derivation trace is the
setup and the first step, with that step run once more on the state it leaves (the
optimizer state and whatever else it keeps), because the second step, not the first, is
where training settles and usually peaks. For other traces it is the whole trace. The best
layouts of the search are then replayed on *perturbed replicas* of the derivation trace
(events moved a few places at random, which a different batch or kernel order would do)
and the one that reserves least on average wins: a layout that is best only for one exact
order of events falls off a cliff (one more page) on the next run.

It must scale to production traces of millions of events, so it replays no more than it
must, and no event crosses into Python:

- *Pool by pool.* A layout without capped pools routes by size alone and never gives
  storage back, so it reserves the sum of what each pool reserves on the sizes routed to
  it (``_cubepool.pool_routes``, ``replay_until(..., sizes=...)``). Each pool's replay is
  kept and shared by the layouts that have it: the tail behind a size limit is replayed
  once, not once per page size. A direct tail is replayed like the other pools: it gives
  its cache back when the cache outgrows the most it ever had in use (the cache bound of
  ``direct()``), so its figures come from a replay, not from live counts, and a layout
  with such a tail reserves at most the sum of its pools' peaks. An exclusive tail is
  replayed in groups of sizes it serves apart (a page serves only requests that waste
  at most an eighth of it), each group's replay kept: the tails behind different page
  sizes differ in the few sizes near the page that the sliced pool takes, and share
  the rest.
- *Bounds.* A candidate is replayed only as far as it takes to show that it is out of
  the running: a replay stops as soon as its reserved bytes pass those of enough better
  layouts (``_cubepool.replay_until``), and a layout whose first pool alone would reserve
  too much (the pages the live bytes under its size limit fill) is not replayed at all.
  Each pool of a layout has a floor: at least the live peak of the sizes routed to it
  (``Trace.group_live_peaks``), in whole pages for a sliced pool, and at least one
  storage allocation per page (per live allocation for a tail). A pool's replay stops
  once it passes the bound less the others' replays or floors, the tail's first (its
  floor is the loose one); a layout whose floors already pass it is not replayed.
  What was stopped is kept with its bound, and before the search reads its ranking (the
  best few, the best by bytes, the best per shape) every candidate whose bound could
  still place it there is replayed to the end: the plan is exactly the one that
  replaying every candidate to the end gives (``tests/python/test_plan_scale.py`` checks it).
  The live peaks behind the floors are measured for all of a stage's pools in one pass
  over the trace (``Trace.group_live_peaks`` takes many groups at once).
- *Finalists cut short.* The robustness round first replays the searched finalist best
  on the derivation trace (the reference) on every replica: the chosen finalist's mean
  is at most the reference's. A finalist whose ratios so far, plus the least each later
  replica can add (1.0, as a pool holds every live byte, or its pools' floors there; 0
  for a preset), pass that mean is not replayed any more, and its replay of a replica
  stops once its reserved bytes pass what it could still afford. It cannot be chosen; it is reported
  apart (``Plan.pruned``) with a lower bound of its mean, and the other finalists'
  means are exactly those of replaying every finalist on every replica.
- *Rust.* The per-event work of deriving and perturbing traces runs in Rust
  (``Trace.with_step_repeated``, ``Trace.with_twins``, ``Trace.reordered_from_state``,
  which draws Python's ``random()`` numbers from the generator's state, so a seed makes
  the same replica as before; ``Trace.live_peaks``), and the perturbed replicas are
  made one at a time.
"""

from __future__ import annotations

import heapq
import itertools
import math
import os
import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from cubepool._cubepool import (
    MemoryConfiguration,
    MemoryDeviceProperties,
    MemoryPoolOptions,
    PoolType,
    ReplayResult,
    Trace,
    pool_routes,
    pool_spec,
    replay_until,
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

_VIRTUAL_GRANULES: Final = (2 * MIB, 8 * MIB)
"""Granules of the virtual pools the plan tries: CUDA's granularity, and four of it
(fewer storage calls, more bytes held round live blocks)."""
_VIRTUAL_KEEPS: Final = (None, 64 * MIB)
"""Release policies of the virtual pools the plan tries: idle granules kept up to the
high-water mark of mapped bytes (None), or at most 64 MiB of them."""
_VIRTUAL_FRONTS: Final = 2
"""The virtual pool is also tried behind the sliced pool of this many of the best
one-pool layouts (small sizes sliced from pages, the rest mapped)."""

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
        replays: how many replays the search ran (of a whole layout, or of one of its
            pools on the sizes routed to it; those stopped early included).
        seconds: how long the search took.
        finalists: the layouts of the robustness round with their mean reserved bytes
            relative to peak live over the replicas (1.0 is perfect), best first.
        stopped: how many of the replays stopped early, once their layout was out of
            the running.
        pruned: the finalists cut short in the robustness round, once their replicas
            showed a mean above what the chosen layout's is at most (they could not be
            chosen), each with a lower bound of its mean (up to rounding: it is
            summed in another order), lowest first; ``finalists`` holds the others.
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
    stopped: int = 0
    pruned: tuple[tuple[str, float], ...] = field(default=())

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
                f"derived on {self.derived_on}; {self.replays:,} replays "
                f"({self.stopped:,} stopped early) in {self.seconds:.1f} s",
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
            "stopped": self.stopped,
            "seconds": self.seconds,
            "result": self.result.to_dict(timeline=False),
            "baseline": self.baseline.to_dict(timeline=False),
            "derivation": self.derivation.to_dict(timeline=False),
            "finalists": [{"layout": d, "mean_reserved_over_live": s} for d, s in self.finalists],
            "pruned": [
                {"layout": d, "mean_reserved_over_live_at_least": s} for d, s in self.pruned
            ],
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
    cut = min(cut, len(trace))
    derived = trace.with_step_repeated(min(start, cut), cut, f"{first_name} (again)")
    what = (
        f"the setup and {first_name} (events 0-{cut - 1:,} of {len(trace):,}), with "
        f"{first_name} run once more on the state it leaves"
    )
    return derived, cut, what


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
    # The events move in Rust; the randomness is Python's, drawn in the order the
    # event keys ask for it (``k + rng.uniform(-window, window)`` for the k-th event
    # from ``start`` on, ``uniform`` being ``a + (b - a) * random()``), so a seed gives
    # the same replica as ever. The twins are drawn here; the draws that move events
    # are ``rng.random()``'s next ones, made in Rust from the generator's state.
    rng = random.Random(seed)
    if extra > 0:
        twins = _live_at_peak(trace, extra * trace.peak_live, rng)
        trace = trace.with_twins(sorted(twins))
    start = min(start, len(trace))
    return trace.reordered_from_state(start, float(window), rng.getstate()[1])


def _live_at_peak(trace: Trace, goal: float, rng: random.Random) -> set[int]:
    """Allocations live at the first peak of live bytes, drawn at random until their
    bytes reach ``goal``."""
    alive = dict(trace.live_at_peak())
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


Shape = Literal["one", "two", "capped"]


def _shape(layout: Layout) -> Shape:
    """The shape a layout competes in for the robustness round."""
    if any(c is not None for _, _, c in layout.tiers):
        return "capped"
    return "one" if len(layout.tiers) == 1 else "two"


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


PoolKey = tuple[Any, ...]
"""A pool of a layout, as data: ``("sliced_pages", page, max_slice)`` or the tail's kind."""


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
    _parts: dict[tuple[PoolKey, tuple[int, ...]], _Outcome] = field(default_factory=dict)
    _partial: dict[tuple[PoolKey, tuple[int, ...]], _Outcome] = field(default_factory=dict)
    """Pools' replays that stopped early: what they show is a lower bound."""
    _sizes: list[int] = field(default_factory=list)
    _routes: dict[Layout, list[tuple[tuple[PoolKey, tuple[int, ...]], Any]] | None] = field(
        default_factory=dict
    )
    """:meth:`_routed` of each layout asked about."""
    _live: dict[tuple[int, ...], tuple[int, int]] = field(default_factory=dict)
    """The live peaks (bytes, allocations) of each group of sizes a pool was routed,
    for :meth:`_low`."""
    live_peaks: dict[int, int] | None = None
    """The live peak under each size limit, for :meth:`guess`."""
    _lock: threading.Lock = field(default_factory=threading.Lock)

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
            peaks = self.trace.group_live_peaks([list(group) for group in groups])
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
        """Replay ``order`` with ``workers`` in flight. With ``reads``, each replay
        stops once it is out of those parts of the ranking as it stands when the replay
        starts, and a layout whose floor already is out is not replayed; without, every
        layout is replayed to the end."""
        done = 0
        cutoffs: _Cutoffs | None = None
        fresh = 0  # results since the cutoffs were computed
        pending: set[Future[tuple[Layout, _Outcome, bool]]] = set()
        queue = iter(order)
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            while True:
                while len(pending) < self.workers:
                    layout = next(queue, None)
                    if layout is None:
                        break
                    above: int | None = None
                    if reads is not None:
                        # Fresh cutoffs every few results (the ranking is sorted anew).
                        if cutoffs is None or fresh >= max(self.workers, len(self.seen) // 64):
                            cutoffs, fresh = self._cutoffs(self._ranked_rows(), reads), 0
                        floor = floors.get(layout)
                        serving = self.serving(layout)
                        if floor is not None and cutoffs.excludes(layout, floor, serving):
                            self.bounded[layout] = floor
                            done += 1
                            continue
                        above = _stop_reserved(layout, cutoffs, serving)
                    pending.add(pool.submit(self._evaluate, layout, above))
                if not pending:
                    break
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    self._record(*future.result())
                    done += 1
                    fresh += 1
                    if self.progress is not None and done % 16 == 0 and done < len(order):
                        self.progress(done, len(order), stage)
        if self.progress is not None and order:
            self.progress(len(order), len(order), stage)

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
        outcomes: list[_Outcome | None] = [self._parts.get(key) for key, _ in parts]
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

    def _routed(self, layout: Layout) -> list[tuple[tuple[PoolKey, tuple[int, ...]], Any]] | None:
        """Each pool of ``layout`` (as data, with the sizes routed to it) and its type,
        or None when the layout is replayed whole: a capped pool (a full one passes
        requests on) or a size no pool takes."""
        if layout not in self._routes:
            self._routes[layout] = self._route(layout)
        return self._routes[layout]

    def _route(self, layout: Layout) -> list[tuple[tuple[PoolKey, tuple[int, ...]], Any]] | None:
        """:meth:`_routed`, worked out."""
        if any(c is not None for _, _, c in layout.tiers):
            return None
        routes = pool_routes(layout.config(), self._sizes, self.properties)
        keys: list[PoolKey] = [("sliced_pages", p, s) for p, s, _ in layout.tiers]
        keys.append((layout.tail,))
        routed: list[list[int]] = [[] for _ in keys]
        for size, index in zip(self._sizes, routes, strict=True):
            if index is None:
                if size:
                    return None
                continue
            routed[index].append(size)
        types = [PoolType.sliced_pages(p, s, None) for p, s, _ in layout.tiers]
        types.append(
            PoolType.exclusive_pages(_ANY_SIZE)
            if layout.tail == "exclusive_pages"
            else PoolType.direct()
        )
        return [((k, tuple(r)), t) for k, r, t in zip(keys, routed, types, strict=True)]

    def _part(
        self, part: tuple[tuple[PoolKey, tuple[int, ...]], Any], above: int | None, made: int | None
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
                outcome = self._parts.get(sub)
                if outcome is None:
                    outcome = self._part((sub, pool_type), None, None)[0]
                outcomes.append(outcome)
            if not any(o.storage_frees for o in outcomes):
                self._parts[key] = whole = _Outcome(
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
                return whole, False
        config = MemoryConfiguration.custom([MemoryPoolOptions(pool_type)])
        result, stopped = self._count(
            replay_until(
                self.trace,
                config,
                self.properties,
                reserved_above=above,
                storage_allocations_above=made,
                sizes=list(key[1]),
            )
        )
        outcome = _Outcome.of(result)
        if stopped is None:
            self._parts[key] = outcome
        else:
            with self._lock:
                known = self._partial.get(key)
                if known is None or known.peak_reserved < outcome.peak_reserved:
                    self._partial[key] = outcome
        return outcome, stopped is not None

    def _exclusive_groups(self, key: tuple[PoolKey, tuple[int, ...]]) -> list[tuple[int, ...]]:
        """The sizes of an exclusive tail's part in groups that its pool serves apart:
        a page is as large as the request that made it (rounded to the alignment) and
        serves a later request only when it wastes at most an eighth of itself, so no
        page of a group ever serves a size of another, where consecutive rounded sizes
        lie more than that apart. Such a pool never gives storage back, so its figures
        are the sums of its groups'. One group for any other pool."""
        pool, sizes = key
        if pool != ("exclusive_pages",) or len(sizes) < 2:
            return [sizes]
        props = self.properties if self.properties is not None else MemoryDeviceProperties()
        extents = sorted((_round_up(max(size, 1), props.alignment), size) for size in sizes)
        groups: list[list[int]] = [[extents[0][1]]]
        for (low, _), (high, size) in itertools.pairwise(extents):
            if (high - low) * 8 > high:
                groups.append([])
            groups[-1].append(size)
        return [tuple(sorted(group)) for group in groups]

    def _low(self, part: tuple[tuple[PoolKey, tuple[int, ...]], Any]) -> _Outcome:
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
            peaks = self._live[sizes] = self.trace.group_live_peaks([list(sizes)])[0]
        live, count = peaks
        pool = key[0]
        if pool[0] == "sliced_pages" and live > 0:
            page = self._effective_page(pool[1])
            pages = -(-live // page)
            reserved, allocations, floor_pool = pages * page, pages, _Pool(page, pages, 0)
        else:
            # The tails keep a storage buffer (a page) per live allocation.
            reserved, allocations, floor_pool = live, count, _Pool(None, 0, 0)
        partial = self._partial.get(key)
        if partial is not None and partial.peak_reserved >= reserved:
            return partial
        return _Outcome(
            reserved,
            max(allocations, partial.storage_allocations if partial is not None else 0),
            0,
            0,
            (floor_pool,),
        )

    def least_charged(self, layout: Layout, live: dict[tuple[int, ...], int], peak: int) -> float:
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


def plan(
    trace: TraceLike,
    objective: Objective = "reserved",
    properties: MemoryDeviceProperties | None = None,
    *,
    derive: Derive = "first_step",
    max_storage_allocations: int | None = None,
    call_cost: int = 0,
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
        call_cost: the bytes one storage call (an allocation or free, a map or unmap
            of a virtual pool) is worth: the finalists are ranked by their charged
            bytes plus ``call_cost`` times their storage calls. 0 (the default) weighs
            bytes alone. A GPU storage call costs tens of microseconds.
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
    if isinstance(call_cost, bool) or not isinstance(call_cost, int):
        raise TypeError(f"call_cost must be an int, got {type(call_cost).__name__}")
    if call_cost < 0:
        raise ValueError(f"call_cost must be at least 0, got {call_cost}")
    for name, value in (("max_storage_allocations", max_storage_allocations), ("workers", workers)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise TypeError(f"{name} must be an int or None, got {type(value).__name__}")
        if value is not None and value < 1:
            raise ValueError(f"{name} must be positive (None for the default), got {value}")
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

    sizes = sorted({_round_up(max(size, 1), align) for size in derived.distinct_sizes()})
    limits = _thresholds([s for s in sizes if s <= max_page]) or [align]
    # Sizes fitted to the peak seen (pages that are fractions of it, pools capped at it)
    # only where the plan is judged on what it saw: a later step's peak moves, and a page
    # fitted to the old one costs a whole page more. Extrapolating plans use the sizes
    # the allocations imply (powers of two, multiples of allocation sizes).
    measured = derived is trace
    live_peaks = dict(zip(limits, derived.live_peaks(limits), strict=True))
    peaks: dict[int, int] = live_peaks if measured else {}
    floor = _floor(derived.peak_live, live_peaks, align, max_page)
    search.live_peaks = live_peaks
    tails: tuple[Tail, ...] = ("exclusive_pages", "direct")
    # What the search reads of its ranking (see _Reads): the stages' replays stop by
    # the reads to come, and the ranking is settled before each read (which replays to
    # the end whatever a read turns out to need, e.g. where capped layouts push out the
    # layouts they cap).
    later = _Reads(
        top=_FINALISTS_PER_SHAPE,
        by_bytes=12 if measured else 0,
        per_shape=_FINALISTS_PER_SHAPE,
    )

    # Stage 1: one sliced pool in front of the tail.
    search.run(
        "one sliced pool",
        (
            Layout(((page, limit, None),), tail)
            for limit in limits
            for page in _pages(limit, peaks.get(limit), max_page, dense=True)
            for tail in tails
        ),
        later,
        floor,
    )
    # Stage 2: a second sliced pool next to each of the best few.
    search.settle("one sliced pool", _Reads(top=4))
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
        later,
        floor,
    )

    # Stage 3: measured caps. A pool that held pages is capped at its high-water mark
    # and followed by a pool of small pages for what does not fit any more, so that
    # needing more than the derivation trace showed costs a small page, not a big one.
    # Candidates: the best by charged bytes, and by bytes alone (the cap takes away the
    # risk the charge is for).
    if measured:
        search.settle("two sliced pools", _Reads(top=12, by_bytes=12))
        ranked = search.ranked()
        by_bytes = sorted(ranked, key=lambda item: (item[1].peak_reserved, item[0].key()))
        search.run(
            "capped pools",
            (
                variant
                for lay, result in ranked[:12] + by_bytes[:12]
                for variant in _capped(lay, result)
            ),
            later,
        )

    # Stage 4: the finalists on perturbed replicas; the lowest mean charge wins. Each
    # shape (one pool, two pools, capped) sends its best, so no shape crowds out another.
    search.settle("finalists", _Reads(per_shape=_FINALISTS_PER_SHAPE))
    ranked = search.ranked()
    shapes: dict[Shape, list[Layout]] = {"one": [], "two": [], "capped": []}
    for lay, _ in ranked:
        shape = _shape(lay)
        if len(shapes[shape]) < _FINALISTS_PER_SHAPE:
            shapes[shape].append(lay)
    finalists: list[tuple[str, MemoryConfiguration]] = [
        (repr(lay), lay.config()) for group in shapes.values() for lay in group
    ]
    finalists += [(name, PRESETS[name]()) for name in ("default", "sub_slices")]
    finalists += _virtual_finalists(shapes["one"][:_VIRTUAL_FRONTS])
    # The finalists' replays of the derivation trace are the search's own.
    known = {repr(lay): search.seen[lay] for group in shapes.values() for lay in group}

    def replica(index: int) -> Trace:
        if index == 0:
            return derived
        window, extra, seed = _REPLICAS[index - 1]
        return perturb(derived, perturb_from, window, seed, extra)

    searched = {repr(lay): lay for group in shapes.values() for lay in group}
    scores, pruned = _robustness(
        finalists,
        replica,
        1 + len(_REPLICAS),
        known,
        searched,
        properties,
        budget,
        search,
        progress,
        call_cost,
        objective,
    )
    chosen = _choose(scores, objective)

    configs = dict(finalists)
    config = configs[chosen[0]]
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
        stopped=search.stopped,
        seconds=time.perf_counter() - started,
        finalists=tuple((describe(configs[k]), s) for k, s, _ in scores),
        pruned=tuple((describe(configs[k]), low) for k, low in pruned),
    )


def _virtual_finalists(fronts: Sequence[Layout]) -> list[tuple[str, MemoryConfiguration]]:
    """The virtual kind's finalists: a virtual pool alone, for each granule and release
    policy the plan tries, and behind the sliced pool of each layout of ``fronts``
    (2 MiB granules, idle granules kept up to the high-water mark). Their ranges hold
    any size (the pool's range of address space, 1 TiB), so they take every request.
    They replay whole on each replica, like the presets."""
    finalists = []
    for granule in _VIRTUAL_GRANULES:
        for keep in _VIRTUAL_KEEPS:
            pool = MemoryPoolOptions(PoolType.virtual_pages(granule, keep, 0))
            config = MemoryConfiguration.custom([pool])
            finalists.append((str(config), config))
    for front in fronts:
        tiers = [MemoryPoolOptions(PoolType.sliced_pages(p, s, c)) for p, s, c in front.tiers]
        tail = MemoryPoolOptions(PoolType.virtual_pages(_VIRTUAL_GRANULES[0], None, 0))
        config = MemoryConfiguration.custom([*tiers, tail])
        finalists.append((str(config), config))
    return finalists


def _capped(layout: Layout, outcome: _Outcome) -> Iterable[Layout]:
    """Variants of ``layout`` with one sliced pool capped at the pages it held on the
    derivation trace, followed by an overflow pool of 2 or 8 MiB pages."""
    for index, (page, limit, cap) in enumerate(layout.tiers):
        held = outcome.pools[index].pages_peak
        if cap is not None or held == 0:
            continue
        effective = outcome.pools[index].page
        if effective is None:
            continue
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
    replica: Callable[[int], Trace],
    count: int,
    known: dict[str, _Outcome],
    layouts: dict[str, Layout],
    properties: MemoryDeviceProperties | None,
    budget: int,
    search: _Search,
    progress: Progress | None,
    call_cost: int = 0,
    objective: Objective = "reserved",
) -> tuple[list[tuple[str, float, int]], list[tuple[str, float]]]:
    """Each finalist's mean of charged bytes (plus ``call_cost`` per storage call) /
    peak live over the ``count`` replicas that ``replica(index)`` makes (the first is
    the derivation trace; one replica in memory at a time, one per worker while the
    reference replays), and its most storage allocations, best first;
    finalists over budget or failing drop out (the presets never do, so the list is
    never empty). ``known`` holds the finalists' replays of the first replica, the
    derivation trace, made already; ``layouts`` the searched finalists, which replay
    pool by pool (their outcome is the whole replay's, and a replay stopped at the
    budget drops them as a whole one over it would).

    Finalists that cannot be chosen are cut short, and returned apart with a lower
    bound of their mean: the searched finalist best on the derivation trace (the
    *reference*) is replayed on every replica first, and its mean is one that the
    chosen finalist's is at most (:func:`_to_beat`). A finalist whose ratios so far,
    with the least its later replicas can add (:func:`_least_ratio`), pass it is not
    replayed any more, and its replay of a replica stops once its reserved bytes do.
    The scores of the others are exactly those of replaying every finalist to the end.
    """
    total = len(finalists) * count - len(known)
    done = 0
    ratios: dict[str, list[float]] = {}
    allocs: dict[str, int] = {}
    dropped: set[str] = set()
    pruned: dict[str, float] = {}

    def ratio(outcome: _Outcome, live: int) -> float:
        calls = outcome.storage_allocations + outcome.storage_frees
        return (outcome.charged() + call_cost * calls) / max(live, 1)

    def count_in(key: str, outcome: _Outcome, live: int) -> None:
        over = outcome.failed_reserves > 0 or outcome.storage_allocations > budget
        if over and key not in PRESETS:
            dropped.add(key)
        ratios.setdefault(key, []).append(ratio(outcome, live))
        allocs[key] = max(allocs.get(key, 0), outcome.storage_allocations)

    def tick() -> None:
        nonlocal done
        done += 1
        if progress is not None and (done % 8 == 0 or done == total):
            progress(done, total, "robustness")

    first_live = replica(0).peak_live  # the derivation trace: not perturbed
    for key, _ in finalists:
        if key in known:
            count_in(key, known[key], first_live)
    reference = min(
        (key for key in known if key in layouts and key not in dropped),
        key=lambda key: (ratios[key][0], key),
        default=None,
    )
    beat = math.inf
    # The groups of sizes the searched finalists' pools are routed, for their floors.
    groups = sorted(
        {sizes for lay in layouts.values() for (_, sizes), _ in search._routed(lay) or ()}
    )
    floors: list[dict[str, float]] = [{}]
    measured: list[dict[tuple[int, ...], tuple[int, int]]] = [dict(search._live)]

    def least(key: str, index: int) -> float:
        """The least ratio of finalist ``key`` on replica ``index`` (:func:`_least_ratio`,
        or its pools' floors there where they are known and higher)."""
        bound = floors[index].get(key, 0.0) if index < len(floors) else 0.0
        return max(_least_ratio(key), bound)

    shared: list[dict[tuple[PoolKey, tuple[int, ...]], _Outcome]] = [{}]
    with ThreadPoolExecutor(max_workers=search.workers) as pool:
        if reference is not None:
            # The reference on every replica, a few replicas at a time (one per worker).
            # Its pools' replays are kept for the others on the same replica.
            # Each worker makes its replica: a few in memory at a time, one per worker.
            # It also measures the live peaks behind the searched finalists' floors there.
            def on(index: int, ref: Layout = layouts[reference]) -> tuple[Any, ...]:
                parts = _Search(replica(index), properties, budget, None, 1)
                outcome = parts._evaluate(ref, None)[1]
                peaks = parts.trace.group_live_peaks([list(group) for group in groups])
                return outcome, parts.trace.peak_live, parts.replays, parts._parts, peaks

            for outcome, live, replays, kept, peaks in pool.map(on, range(1, count)):
                tick()
                count_in(reference, outcome, live)
                search.replays += replays
                shared.append(kept)
                measured.append(dict(zip(groups, peaks, strict=True)))
                found = {group: peak for group, (peak, _) in measured[-1].items()}
                floors.append(
                    {
                        key: search.least_charged(lay, found, live) / max(live, 1)
                        for key, lay in layouts.items()
                    }
                )
            if reference not in dropped:
                beat = _to_beat(sum(ratios[reference]) / count, objective)

        for index in range(count):
            trace = replica(index)
            live = trace.peak_live
            jobs: list[tuple[tuple[str, MemoryConfiguration], int | None]] = []
            for job in finalists:
                key = job[0]
                if (index == 0 and key in known) or key == reference:
                    continue
                if key in pruned or key in dropped:
                    tick()
                    continue
                # The most this replica may add to the finalist's mean and leave it
                # within ``beat``: past it, the finalist cannot be chosen.
                rest = sum(least(key, later) for later in range(index + 1, count))
                room = beat * count - sum(ratios.get(key, ())) - rest
                if room < least(key, index) - _SLACK:
                    pruned[key] = (sum(ratios.get(key, ())) + least(key, index) + rest) / count
                    tick()
                    continue
                above = None if math.isinf(room) else int(room * max(live, 1)) + 1
                jobs.append((job, above))
            # Whole replays first (the longest), so that no worker waits on one at the end.
            jobs.sort(key=lambda item: item[0][0] in layouts)
            # The searched layouts replay pool by pool on the replica, sharing pools.
            parts = _Search(trace, properties, budget, None, search.workers)
            if index < len(shared):
                parts._parts.update(shared[index])
                parts._live.update(measured[index])
            else:
                parts.measure(layouts[job[0][0]] for job in jobs if job[0][0] in layouts)

            def one(
                item: tuple[tuple[str, MemoryConfiguration], int | None],
                trace: Trace = trace,
                parts: _Search = parts,
            ) -> tuple[str, _Outcome, bool]:
                (key, config), above = item
                layout = layouts.get(key)
                if layout is not None:
                    _, outcome, stopped = parts._evaluate(layout, above)
                    return key, outcome, stopped
                result, at = replay_until(trace, config, properties, reserved_above=above)
                with search._lock:
                    search.replays += 1
                return key, _Outcome.of(result), at is not None

            for key, outcome, stopped in pool.map(one, jobs):
                tick()
                over = outcome.failed_reserves > 0 or outcome.storage_allocations > budget
                if stopped and (not over or key in PRESETS):
                    # Stopped past its room: its mean is above ``beat``, at least this.
                    rest = sum(least(key, later) for later in range(index + 1, count))
                    pruned[key] = (sum(ratios.get(key, ())) + ratio(outcome, live) + rest) / count
                    continue
                count_in(key, outcome, live)
            search.replays += parts.replays
    scores = [
        (key, sum(values) / len(values), allocs[key])
        for key, values in ratios.items()
        if key not in dropped and key not in pruned
    ]
    scores.sort(key=lambda s: (s[1], s[2], s[0]))
    cut = sorted(pruned.items(), key=lambda s: (s[1], s[0]))
    return scores, cut


_SLACK: Final = 1e-9
"""Room for rounding when a finalist is cut without a replay: only where its mean
passes the one to beat by more."""


def _to_beat(reference: float, objective: Objective) -> float:
    """The mean past which a finalist cannot be chosen, given the mean of one that
    stays in (the ``reference``): the chosen one's is at most that, and with
    ``objective="storage_allocations"`` one within 5 % of the best may be chosen."""
    return reference * 1.05 if objective == "storage_allocations" else reference


def _least_ratio(key: str) -> float:
    """The least ratio a finalist can score on a replica it has not replayed yet: a
    pool holds every live byte in what it reserves, so a layout that serves every
    request (one that fails drops out) reserves at least the peak live bytes. A
    preset never drops out, failing or not: nothing is assumed of it."""
    return 0.0 if key in PRESETS else 1.0


def _choose(scores: list[tuple[str, float, int]], objective: Objective) -> tuple[str, float, int]:
    if objective == "storage_allocations":
        best = scores[0][1]
        near = [s for s in scores if s[1] <= best * 1.05]
        return min(near, key=lambda s: (s[2], s[1]))
    return scores[0]

"""The planner's candidate layouts: the search's points, the page sizes and size
limits it tries, and the variants of the finalists (capped pools, virtual pools)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

from cubepool._cubepool import (
    MemoryConfiguration,
    MemoryPoolOptions,
    PoolType,
)
from cubepool._errors import InvalidArgument
from cubepool._format import counted

if TYPE_CHECKING:
    from cubepool.plan.search import _Outcome

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
Derive = Literal["first_step", "two_steps", "one_step", "all"] | int
DERIVE_CHOICES: tuple[str, ...] = ("first_step", "two_steps", "one_step", "all")
"""The named parts of a trace a plan may be derived on (see
:func:`cubepool.plan.derivation_trace`); an event count is the other choice."""
DerivationKind = Literal["two_steps", "one_step", "all", "prefix"]


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


# --------------------------------------------------------------------------- candidates


def _round_up(value: int, step: int) -> int:
    return -(-value // step) * step


Candidates = Literal["auto", "full", "reduced", "few"]
"""How many candidate layouts the search tries (see :data:`SCOPES`): ``"full"`` all of
them, ``"reduced"`` about a quarter, ``"few"`` a tenth (what ``cubepool report`` uses
on long traces), ``"auto"`` the full set unless the derivation trace has more than
:data:`_FULL_UP_TO_EVENTS` events, the reduced set then."""


@dataclass(frozen=True)
class Scope:
    """How wide the search is: the size limits it tries, how many page sizes each
    (:func:`_pages`), whether it tries two sliced pools, the finalists each shape sends
    to the robustness round and the perturbed replicas there.

    Attributes:
        name: the scope's name (a :data:`Candidates` value other than ``"auto"``).
        thresholds: at most this many size limits (:func:`_thresholds`).
        few_pages: fewer page sizes per limit.
        two_pools: whether stage 2 (a second sliced pool) runs.
        finalists_per_shape: finalists of each shape in the robustness round.
        replicas: the perturbed replicas (a subset of :data:`_REPLICAS`).
    """

    name: str
    thresholds: int
    few_pages: bool
    two_pools: bool
    finalists_per_shape: int
    replicas: tuple[tuple[int, float, int], ...]

    def describe(self, limits: int, events: int) -> str:
        """What the scope cut, in words, for a search of ``limits`` size limits on a
        derivation trace of ``events`` events ('' for the full set)."""
        if self.name == "full":
            return ""
        full = SCOPES["full"]
        return (
            f"candidates {self.name}: {limits} size limits (of up to {full.thresholds}), "
            + ("fewer page sizes each, " if self.few_pages else "")
            + ("" if self.two_pools else "no second sliced pool, ")
            + f"{self.finalists_per_shape} finalists per shape (of "
            f"{full.finalists_per_shape}) on "
            f"{counted(len(self.replicas), 'perturbed replica')} (of "
            f"{len(full.replicas)}), for a derivation trace of {events:,} events "
            "(plan(..., candidates='full') searches them all)"
        )


SCOPES: Final = {
    "full": Scope("full", _MAX_THRESHOLDS, False, True, _FINALISTS_PER_SHAPE, _REPLICAS),
    "reduced": Scope("reduced", 8, True, True, 4, (_REPLICAS[1], _REPLICAS[4])),
    "few": Scope("few", 4, True, False, 2, (_REPLICAS[4],)),
}
"""The scopes by name. The reduced set keeps a short reordering window and a long one
with 3 % more bytes (the full set's second and last replicas); the few set the last."""

_FULL_UP_TO_EVENTS: Final = 50_000
"""The longest derivation trace ``candidates="auto"`` searches with the full set. A
replay's cost grows with the events, and the full set is some 4,000 replays of pools:
past this length the reduced set (about a quarter of them) keeps a plan within seconds
(issue 27: 120,000 events in 10 s; BENCHMARKS.md has the figures)."""


REPORT_FEW_FROM_EVENTS: Final = _FULL_UP_TO_EVENTS
"""``cubepool report`` plans traces longer than this with the few set (its plan is one
step of several, and the report is read in seconds), and the plan's summary says so."""


def scope(candidates: Candidates, events: int) -> Scope:
    """The scope of a search asked for ``candidates`` on a derivation trace of
    ``events`` events."""
    if candidates == "auto":
        return SCOPES["full" if events <= _FULL_UP_TO_EVENTS else "reduced"]
    if candidates not in SCOPES:
        raise InvalidArgument(
            f"candidates must be 'auto', 'full', 'reduced' or 'few', not {candidates!r}"
        )
    return SCOPES[candidates]


def _thresholds(sizes: Sequence[int], count: int = _MAX_THRESHOLDS) -> list[int]:
    """At most ``count`` largest-slice limits among the distinct sizes: all of them
    when few, else log-spaced picks (always with the largest)."""
    if len(sizes) <= count:
        return list(sizes)
    picks = {round(i * (len(sizes) - 1) / (count - 1)) for i in range(count)}
    return sorted(sizes[i] for i in picks)


def _pages(
    limit: int, live_peak: int | None, max_page: int, *, dense: bool, few: bool = False
) -> list[int]:
    """Page sizes worth trying for a sliced pool whose largest slice is ``limit``: powers
    of two and one and a half times them, multiples of ``limit``, and, given the live
    peak of the sizes the pool takes, fractions of that peak with a little room.
    ``few`` (the reduced candidate sets) keeps powers of two, four multiples and a
    third of the fractions, none past twice the live peak."""
    pages: set[int] = set()
    p = _MIN_PAGE
    while p <= max_page:
        pages.update((p,) if few else (p, p + p // 2))
        p *= 2
    pages.update(limit * m for m in ((1, 2, 4, 8) if few else (1, 2, 3, 4, 6, 8, 12, 16)))
    if live_peak is not None:
        slacks = (1.02, 1.05, 1.1) if dense and not few else (1.05,)
        for k in range(1, (7 if dense else 5) if few else (13 if dense else 9)):
            for slack in slacks:
                pages.add(_round_up(int(live_peak * slack / k), _PAGE_STEP))
    floor = max(limit, _MIN_PAGE)
    most = max_page
    if few and live_peak:
        # A page past twice the live peak of the pool's sizes holds that peak in one
        # page with more than half of it idle: never the best, and its replays cost.
        most = min(max_page, max(floor, 2 * live_peak))
    return sorted(q for q in pages if floor <= q <= most)


Shape = Literal["one", "two", "capped"]


def _shape(layout: Layout) -> Shape:
    """The shape a layout competes in for the robustness round."""
    if any(c is not None for _, _, c in layout.tiers):
        return "capped"
    return "one" if len(layout.tiers) == 1 else "two"


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

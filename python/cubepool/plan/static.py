"""The static placement of a whole trace: the second figure a plan reports.

A plan (:class:`cubepool.plan.Plan`) is a layout derived from the early part of a trace
and replayed on the whole of it: what the next run of the workload would reserve. The
static placement is another thing: :func:`cubepool.place` of the trace's allocations
(allocation ``i`` live from its alloc event to its free), what a runtime that knows this
exact run in advance (a compiled graph, a CUDA graph) would reserve. It is at least the
floor (peak live bytes), and no runtime that sees requests one at a time can count on
reaching it; so it is reported beside the plan, never as the plan. It is one contiguous
range of offsets found within a time limit, so on a long trace it can take more than a
plan whose virtual pool maps granules wherever they are free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cubepool._cubepool import Trace
from cubepool._errors import InvalidArgument
from cubepool.place import place

DEFAULT_TIME_LIMIT: float = 1.0
"""Seconds the planner gives the static placement by default: the heuristics finish
well within it on traces of a few hundred thousand allocations, and a longer search
only narrows a gap that is already small (see BENCHMARKS.md)."""


@dataclass(frozen=True)
class StaticPlacement:
    """What the static placement of a whole trace reaches.

    Attributes:
        height: the bytes it takes (the largest offset plus size).
        lower_bound: the trace's peak live bytes, the floor no placement beats.
        optimal: whether no placement is lower (the height is the floor, or the exact
            search showed one byte less does not fit).
        method: ``"heuristic"`` or ``"search"``: which placer made it.
        seconds: how long it took.
        time_limit: the seconds it was given.

    Invariant: ``lower_bound <= height``.
    """

    height: int
    lower_bound: int
    optimal: bool
    method: str
    seconds: float
    time_limit: float

    def __post_init__(self) -> None:
        if self.height < self.lower_bound:
            raise InvalidArgument(
                f"a placement's height ({self.height}) is below its lower bound "
                f"({self.lower_bound})"
            )

    @property
    def over_floor(self) -> int:
        """Bytes above the floor (the trace's peak live bytes)."""
        return self.height - self.lower_bound

    @property
    def utilization(self) -> float:
        """Peak live bytes over the height (1.0 for an empty trace)."""
        return self.lower_bound / self.height if self.height else 1.0

    def to_dict(self) -> dict[str, Any]:
        """The figures as JSON-ready data."""
        return {
            "height": self.height,
            "lower_bound": self.lower_bound,
            "over_floor": self.over_floor,
            "utilization": self.utilization,
            "optimal": self.optimal,
            "method": self.method,
            "seconds": self.seconds,
            "time_limit": self.time_limit,
        }


def static_placement(trace: Trace, time_limit: float = DEFAULT_TIME_LIMIT) -> StaticPlacement:
    """:func:`cubepool.place` of ``trace``'s allocations within ``time_limit`` seconds
    (the best placement found by then), as a :class:`StaticPlacement`.

    Raises:
        InvalidArgument: the trace's allocations cannot be placed: their sizes add up
            to more than 2**64 bytes (a valid trace may: only its live bytes must fit
            in 64 bits), or ``time_limit`` is out of range.
    """
    placed = place(trace, time_limit=time_limit)
    return StaticPlacement(
        height=placed.height,
        lower_bound=placed.lower_bound,
        optimal=placed.optimal,
        method=placed.method,
        seconds=placed.seconds,
        time_limit=time_limit,
    )

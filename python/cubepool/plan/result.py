"""The Plan object: a planned layout and how it does."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from cubepool._cubepool import (
    MemoryConfiguration,
    ReplayResult,
)
from cubepool._errors import InvalidArgument
from cubepool._format import human_bytes
from cubepool.compare import Objective
from cubepool.layouts import describe, to_spec
from cubepool.plan.planned import write_plan
from cubepool.plan.static import StaticPlacement
from cubepool.plan.summary import notes, summary


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
        replicas: how many perturbed replicas of the derivation trace the robustness
            round was to replay the finalists on (those skipped included).
        skipped_replicas: ``(replica in words, why)`` of each perturbed replica that
            could not be built (its events make no trace, e.g. live bytes past 64
            bits): the finalists' means are over the derivation trace and the others.
        passed_over: ``(layout in words, why)`` of each finalist ranked before the
            plan that :mod:`cubepool.plan.guard` passed over (it failed reservations
            the default serves, or reserved more than the default on the derivation
            trace).
        default_derivation: the default layout's replay of the derivation trace (what
            the plan is checked against), when the planner ran it.
        candidates: how the candidate set was cut down, in words ('' when it was
            not).
        planned: the plan file's content of the planned candidate (a placement of the
            derivation trace, see :mod:`cubepool.plan.planned`), whether it was chosen
            or not; None where the plan was derived on the whole trace (its header
            names fewer than two steps, or ``derive`` was ``"all"`` or an event count
            covering it): the planned layout is a candidate only where later steps can
            judge it.
        static: the static placement of the whole trace (:mod:`cubepool.plan.static`):
            what a runtime that knows this exact run in advance would reserve, beside
            the plan (``result``), which is what the next run would reserve; None when
            the planner was asked not to place, or could not (``static_skipped``).
        static_skipped: why the static placement was not made where it was asked for
            (the allocations' sizes add up past 2**64 bytes); '' otherwise.
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
    replicas: int = 0
    skipped_replicas: tuple[tuple[str, str], ...] = field(default=())
    passed_over: tuple[tuple[str, str], ...] = field(default=())
    default_derivation: ReplayResult | None = None
    candidates: str = ""
    planned: dict[str, Any] | None = None
    static: StaticPlacement | None = None
    static_skipped: str = ""

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
        """What was planned and how it does, in a few lines (each figure of reserved
        bytes with its distance from the floor), then notes on where it falls short
        (see :func:`cubepool.plan.summary.notes`)."""
        return summary(self)

    def notes(self) -> list[str]:
        """Where the plan falls short of what a user would assume, one line each: a
        better-ranked layout passed over, more reserved than the default on the whole
        trace, failed reservations, a budget of storage allocations not met, perturbed
        replicas that could not be built."""
        return notes(self)

    def is_planned(self) -> bool:
        """Whether the chosen layout is the planned one (a placement followed at run time)."""
        return str(self.config).startswith("planned(")

    def save_planned(self, path: str | os.PathLike[str]) -> MemoryConfiguration:
        """Write the planned candidate's plan file to ``path`` and return the layout that
        follows it, ``planned(file=PATH)`` (chosen or not: compare it yourself).

        Raises:
            InvalidArgument: the plan was derived on the whole trace, so no plan file
                was (see ``planned``).
        """
        if self.planned is None:
            raise InvalidArgument(
                "no planned layout was derived: the plan was derived on the whole trace "
                "(its header names fewer than two steps, or derive='all' or an event "
                "count that covers it); "
                "cubepool.plan.planned.save_planned(trace, path, derive=...) writes a plan "
                "file on its own"
            )
        return write_plan(self.planned, path)

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
            "default_derivation": (
                None
                if self.default_derivation is None
                else self.default_derivation.to_dict(timeline=False)
            ),
            "peak_live": self.result.peak_live,
            "reserved_over_floor": self.result.reserved_over_floor,
            "baseline_reserved_over_floor": self.baseline.reserved_over_floor,
            "passed_over": [{"layout": d, "why": w} for d, w in self.passed_over],
            "candidates": self.candidates,
            "static_placement": None if self.static is None else self.static.to_dict(),
            "static_placement_skipped": self.static_skipped,
            "notes": self.notes(),
            "finalists": [{"layout": d, "mean_reserved_over_live": s} for d, s in self.finalists],
            "pruned": [
                {"layout": d, "mean_reserved_over_live_at_least": s} for d, s in self.pruned
            ],
            "replicas": self.replicas,
            "skipped_replicas": [{"replica": r, "why": w} for r, w in self.skipped_replicas],
        }

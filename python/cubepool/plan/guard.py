"""The checks that keep a plan from being worse than the default layout.

The search and the robustness round rank layouts by what they reserve on the
derivation trace and its replicas. Before a layout becomes the plan it must also pass
what a user asks first, checked on real replays (not on the search's sums of pools):

1. it serves every reservation of the derivation trace that the default serves;
2. it reserves no more than the default on the derivation trace;
3. it serves every reservation of the whole trace that the default serves;
4. it reserves no more than the default on the whole trace.

Checks 3 and 4 use the whole trace as a check, not as a source: the plan is still
derived from the early part alone. They are there because an early part can show a
different workload than the rest: a generation trace whose first request is short, a
mixture of experts whose experts' loads change from step to step. A plan made for what
the early part showed then reserves more on what came after it than the default, which
was chosen to serve every workload; the rest of the recorded run is the best evidence
of the next run the planner has, so such a plan is passed over (for a trace of 5
requests of a small decoder, the first of them 37 tokens long, the planner's choice
reserved 89 MB where the default reserves 48 MB).

A finalist that fails one is passed over, with the reason, for the next in rank; the
default itself is the last in line, so a plan always exists and is never worse than
the default on what it was derived on nor on the whole trace. (Where the plan trades
bytes for storage calls, ``bytes_alone`` off, checks 2 and 4 do not apply, and where it
reserves more than the default on the whole trace :mod:`cubepool.plan.summary` says so.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cubepool._cubepool import MemoryConfiguration, MemoryDeviceProperties, ReplayResult, Trace
from cubepool._format import human_bytes
from cubepool._trace import replay
from cubepool.layouts import describe

DEFAULT: str = "default"
"""The finalist's key of the default layout (the ``default`` preset)."""


@dataclass(frozen=True)
class Guarded:
    """The finalist that passed the checks, and the replays that showed it.

    Attributes:
        key: the finalist's key.
        result: its replay of the whole trace.
        derivation: its replay of the derivation trace.
        default_derivation: the default layout's replay of the derivation trace.
        passed_over: ``(layout in words, why)`` of each better-ranked finalist that
            failed a check, in rank order.
        replays: how many replays the checks ran.
    """

    key: str
    result: ReplayResult
    derivation: ReplayResult
    default_derivation: ReplayResult
    passed_over: tuple[tuple[str, str], ...]
    replays: int


def first_not_worse(
    order: Sequence[str],
    configs: Mapping[str, MemoryConfiguration],
    trace: Trace,
    derived: Trace,
    baseline: ReplayResult,
    properties: MemoryDeviceProperties | None,
    *,
    bytes_alone: bool = True,
    default_derivation: ReplayResult | None = None,
    derivations: Mapping[str, ReplayResult] | None = None,
) -> Guarded:
    """The first finalist of ``order`` (keys of ``configs``, best first) that passes the
    module's checks against the default (``configs[DEFAULT]``, whose replay of the
    whole trace is ``baseline``); the default when it comes first, or when none of
    those before it (or, if it is not in ``order``, none at all) passes. Checks 2 and 4
    (no more bytes than the default on the derivation trace, on the whole trace) hold
    only where the plan weighs ``bytes_alone``: a plan asked to trade bytes for fewer storage calls
    (``call_cost``, ``objective="storage_allocations"``) may reserve more.
    ``default_derivation`` is the default's replay of ``derived`` where the caller has
    it (else it is replayed here); ``derivations`` the finalists' replays of ``derived``
    (``samples=0``) that the caller already made, by key."""
    replays = 0
    if default_derivation is None:
        default_derivation = replay(derived, configs[DEFAULT], properties, samples=0)
        replays = 1
    passed: list[tuple[str, str]] = []
    for key in order:
        if key == DEFAULT:
            break
        config = configs[key]
        derivation = (derivations or {}).get(key)
        if derivation is None:
            derivation = replay(derived, config, properties, samples=0)
            replays += 1
        why = _worse(
            derivation, default_derivation, on="the derivation trace", bytes_alone=bytes_alone
        )
        if not why:
            result = replay(trace, config, properties)
            replays += 1
            why = _worse(result, baseline, on="the whole trace", bytes_alone=bytes_alone)
            if not why:
                return Guarded(key, result, derivation, default_derivation, tuple(passed), replays)
        passed.append((describe(config), why))
    return Guarded(
        DEFAULT, baseline, default_derivation, default_derivation, tuple(passed), replays
    )


def _worse(ran: ReplayResult, default: ReplayResult, *, on: str, bytes_alone: bool) -> str:
    """Why ``ran``, a replay of ``on`` ("the derivation trace", "the whole trace"), is
    worse than the default layout's replay ``default`` of the same trace, or ''."""
    if not default.complete:
        return ""
    if not ran.complete:
        return (
            f"fails {ran.failed_reserves:,} reservations of {on}, which the default layout serves"
        )
    if bytes_alone and ran.peak_reserved > default.peak_reserved:
        more = human_bytes(ran.peak_reserved - default.peak_reserved)
        return f"reserves {more} more than the default layout on {on}"
    return ""

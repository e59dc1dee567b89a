"""The ``planned`` layout: a placement of the derivation trace's allocations, saved as a
plan file that the ``planned`` pool follows at run time.

The derivation trace (:func:`cubepool.plan.derivation_trace`: the setup and the first
step, with that step run once more on the state it leaves) is placed offline
(:func:`cubepool.place`, sizes padded to the alignment). Each allocation's offset goes
into the plan under its phase (the part of the trace after ``p`` step boundaries, a
boundary being a phase that starts after event 0), in request order. At run time the
``planned`` pool matches the ``k``-th request of a size in a step to the ``k``-th planned
offset of that size in the plan's phase (the steps after the plan's last phase follow
that one: the first step run once more is the steady step); what the plan does not
cover, or whose bytes are still held, goes to a virtual pool beside the arena.
"""

from __future__ import annotations

import bisect
import json
import os
from typing import Any, Final

from cubepool._cubepool import MemoryConfiguration, MemoryDeviceProperties, Trace
from cubepool.place import place
from cubepool.plan.candidates import Derive
from cubepool.plan.derivation import derivation_trace

PLAN_FORMAT: Final = "cubepool-plan"
PLAN_VERSION: Final = 1
DEFAULT_TIME_LIMIT: Final = 5.0
"""Seconds the placement of the derivation trace may take."""


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
        time_limit: seconds the placement may take.
    """
    derived, _, what = derivation_trace(trace, derive)
    align = (properties if properties is not None else MemoryDeviceProperties()).alignment
    events = derived.events()
    born: dict[int, tuple[int, int]] = {}
    rows: list[tuple[int, int, int]] = []
    order: list[tuple[int, int]] = []
    for index, (_, kind, ident, size) in enumerate(events):
        if kind == "alloc":
            if size > 0:  # memory management serves zero bytes without a pool
                born[ident] = (index, size)
        elif ident in born:
            start, size = born.pop(ident)
            rows.append((start, index + 1, _round_up(max(size, 1), align)))
            order.append((start, size))
    for ident, (start, size) in born.items():
        del ident
        rows.append((start, len(events) + 1, _round_up(max(size, 1), align)))
        order.append((start, size))
    boundaries = sorted(first for _, first in derived.phases if first > 0)
    names = [name for name, first in sorted(derived.phases, key=lambda p: p[1])]
    phases: list[dict[str, Any]] = [
        {"name": names[p] if p < len(names) else f"phase{p}", "requests": []}
        for p in range(len(boundaries) + 1)
    ]
    height = 0
    if rows:
        placement = place(rows, time_limit=time_limit)
        height = placement.height
        planned = sorted(zip(order, placement.offsets, strict=True))
        for (start, size), offset in planned:
            phase = bisect.bisect_right(boundaries, start)
            phases[phase]["requests"].append([size, offset])
    return {
        "format": PLAN_FORMAT,
        "version": PLAN_VERSION,
        "height": height,
        "phases": phases,
        "source": f"cubepool.plan.planned: placement of {what}",
    }


def save_planned(
    trace: Trace,
    path: str | os.PathLike[str],
    *,
    derive: Derive = "first_step",
    properties: MemoryDeviceProperties | None = None,
    time_limit: float | None = DEFAULT_TIME_LIMIT,
) -> MemoryConfiguration:
    """Write the plan file of ``trace`` (see :func:`planned_plan`) to ``path`` and return
    the layout that follows it, ``planned(file=PATH)``.

    The path may not hold ``,``, ``(``, ``)``, ``;``, ``=``, ``#`` or a new line (the
    configuration language ends a value there).
    """
    path = os.fspath(path)
    if any(c in path for c in ",();=#\n"):
        raise ValueError(f"a plan file's path may not hold , ( ) ; = # or a new line: {path!r}")
    plan = planned_plan(trace, derive=derive, properties=properties, time_limit=time_limit)
    with open(path, "w", encoding="utf-8") as out:
        json.dump(plan, out)
    return MemoryConfiguration.parse(f"planned(file={path})")

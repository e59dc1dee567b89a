"""A plan in words: the summary lines and the notes that say where a plan falls short.

Every figure of reserved bytes comes with its distance from the floor no allocator can
beat (the trace's peak live bytes). Two figures are named for what they are: the plan
for the next run (derived from the early part of the trace, replayed on the whole of
it) and the static placement of the whole trace (what a runtime that knows this exact
run in advance would reserve), which is never presented as the plan. A note says each
thing a user would otherwise have to find out: a better-ranked layout passed over (it
failed reservations, or reserved more than the default on the derivation trace or on the
whole trace), a plan that reserves more than the default on the whole trace (one that
trades bytes for storage calls), a budget of storage allocations it could not meet, and
perturbed replicas of the robustness round that could not be built (the finalists were
ranked on fewer runs than the plan's scope says).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cubepool._cubepool import ReplayResult
from cubepool._format import counted, human_bytes
from cubepool.layouts import describe
from cubepool.plan.derivation import WHOLE

if TYPE_CHECKING:
    from cubepool.plan.result import Plan
    from cubepool.plan.static import StaticPlacement

BUDGET_EXEMPT: tuple[str, ...] = ("default", "sub_slices")
"""The presets among the finalists that the budget of storage allocations does not
drop: a plan must exist when no layout fits the budget, so these stay in the running
whatever they allocate (and the summary says when the plan is over the budget)."""


def over_floor(result: ReplayResult) -> str:
    """``result``'s peak reserved bytes and their distance from the floor, in words:
    ``1.2 GiB (40.0 MiB over the floor)``, or ``(incomplete)`` when a reservation
    failed (its peak covers only what was served)."""
    over = result.reserved_over_floor
    if over is None:
        return f"{human_bytes(result.peak_reserved)} (incomplete)"
    return f"{human_bytes(result.peak_reserved)} ({human_bytes(over)} over the floor)"


def notes(plan: Plan) -> list[str]:
    """Where ``plan`` falls short of what a user would assume, one line each."""
    out = [f"passed over {layout}: it {why}" for layout, why in plan.passed_over]
    r, b = plan.result, plan.baseline
    if r.complete and b.complete and r.peak_reserved > b.peak_reserved:
        out.append(
            f"on the whole trace the plan reserves {human_bytes(r.peak_reserved - b.peak_reserved)}"
            " more than the default layout: the derivation trace did not show what the"
            " rest of the trace needs"
        )
    if not r.complete:
        out.append(f"the plan fails {r.failed_reserves:,} reservations of the whole trace")
    made = plan.derivation.storage_allocations
    if made > plan.max_storage_allocations:
        out.append(
            f"budget of {plan.max_storage_allocations:,} storage allocations not met: the"
            f" plan makes {made:,} on the derivation trace. No layout searched served it"
            " within the budget; the presets "
            + " and ".join(BUDGET_EXEMPT)
            + " are exempt from it, so that a plan always exists"
        )
    if plan.skipped_replicas:
        skipped = len(plan.skipped_replicas)
        kept = plan.replicas - skipped
        shown, why = plan.skipped_replicas[0]
        ranked = f"and {counted(kept, 'other replica')}" if kept else "alone"
        out.append(
            f"{skipped:,} of {counted(plan.replicas, 'perturbed replica')} could not be built"
            f" and {'was' if skipped == 1 else 'were'} left out of the robustness round (the"
            f" finalists were ranked on the derivation trace {ranked}): "
            + ("" if skipped == 1 else "the first, ")
            + f"{shown}: {why}"
        )
    return out


def summary(plan: Plan) -> str:
    """What was planned and how it does, in a few lines, then its notes."""
    r, b = plan.result, plan.baseline
    lines = [
        f"planned layout: {describe(plan.config)}",
        f"derived on {plan.derived_on}; {plan.replays:,} replays "
        f"({plan.stopped:,} stopped early) in {plan.seconds:.1f} s",
        (
            "the plan for the next run, replayed on the whole trace: peak reserved "
            if not plan.derived_on.startswith(WHOLE)
            # Nothing held out: it is judged on what it saw, fitted to those sizes.
            else "the plan for the next run, derived on the whole trace, so on its sizes (a"
            " run of larger tensors may need more): peak reserved "
        )
        + f"{human_bytes(r.peak_reserved)}, utilization "
        f"{_utilization(r)}, {counted(r.storage_allocations, 'storage allocation')} "
        f"(default layout: {human_bytes(b.peak_reserved)}, {_utilization(b)}, "
        f"{b.storage_allocations:,})",
        f"over the floor (peak live {human_bytes(r.peak_live)}): plan "
        + _over(r)
        + ", default layout "
        + _over(b),
    ]
    if plan.static is not None:
        lines.append(static_line(plan.static))
    elif plan.static_skipped:
        lines.append(f"static placement of the whole trace: not made ({plan.static_skipped})")
    if plan.candidates:
        lines.append(plan.candidates)
    return "\n".join(lines + [f"note: {note}" for note in notes(plan)])


def static_line(static: StaticPlacement) -> str:
    """The static placement of the whole trace in words, named as what it is: what a
    runtime that knows this exact run in advance would reserve, not the plan."""
    how = "optimal" if static.optimal else f"best in {static.time_limit:g} s"
    return (
        f"static placement of the whole trace (a runtime that knows this exact run in "
        f"advance; not a plan for the next run): {human_bytes(static.height)}, utilization "
        f"{static.utilization:.3f}, {human_bytes(static.over_floor)} over the floor ({how})"
    )


def _utilization(result: ReplayResult) -> str:
    """``result``'s utilization to three places, or ``incomplete`` where a reservation
    failed (its utilization is NaN then: the peak covers only what was served), as the
    tables write it."""
    return f"{result.utilization:.3f}" if result.complete else "incomplete"


def _over(result: ReplayResult) -> str:
    over = result.reserved_over_floor
    return "incomplete" if over is None else human_bytes(over)

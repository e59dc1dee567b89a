"""The trace a plan is derived on, and its perturbed replicas."""

from __future__ import annotations

import random

from cubepool._cubepool import (
    Trace,
)
from cubepool._errors import InvalidArgument
from cubepool._terminal import name_cell
from cubepool.plan.candidates import DERIVE_CHOICES, DerivationKind, Derive

# --------------------------------------------------------------------------- derivation


def _work_phases(trace: Trace) -> list[tuple[str, int]]:
    """The steps of ``trace`` (its phases but the setup) that hold an event: a phase
    that starts where the next one does, or at the trace's end, holds none, and a plan
    derived on it would be derived on no events."""
    phases = trace.phases
    ends = [first for _, first in phases[1:]] + [len(trace)] * bool(phases)
    return [
        (name, first)
        for (name, first), end in zip(phases, ends, strict=True)
        if name.lower() != "setup" and first < end
    ]


WHOLE = "the whole trace"
"""How a derivation on every event begins its words (no step is held out)."""


def derivation_trace(trace: Trace, derive: Derive = "first_step") -> tuple[Trace, int, str]:
    """Return the trace a plan is derived on, where its perturbable part starts, and how
    it was made in words.

    ``derive="first_step"`` (the default): ``"two_steps"`` where the header's phases name
    at least three steps (phases other than ``setup``), else ``"one_step"``.
    ``"two_steps"``: the events before the third step as recorded (the setup, the first
    step and the second), perturbable from the second step on; a header naming fewer
    steps gets ``"one_step"``'s derivation. ``"one_step"``: when the header names at
    least two steps, the events before the second step, with the first step run once more
    on the state it leaves (its allocations that it frees are repeated; those it keeps
    stay live), perturbable from the repetition on; otherwise the whole trace. ``"all"``:
    the whole trace. An int ``n``: the first ``n`` events (all of them: as ``"all"``).

    Why two recorded steps where there are: a first step alone cannot tell the blocks
    each later step makes again while the last step's copies still live (the step's
    input, the loss scale) from those kept for good (optimizer state); the second step
    shows which is which, so a plan derived on it follows what later steps do (see
    :func:`derivation_kind` and :mod:`cubepool.plan.planned`).
    """
    kind = derivation_kind(trace, derive)
    work = _work_phases(trace)
    if isinstance(derive, int) and derive < len(trace):
        return trace.prefix(derive), 0, f"the first {derive:,} of {len(trace):,} events"
    if isinstance(derive, int):
        # Every event: the whole trace, derived on as "all" is (the same object, which
        # is how the planner knows the plan is judged on what it saw).
        return trace, work[0][1] if work else 0, f"{WHOLE} (its {len(trace):,} events)"
    if kind == "all":
        why = "" if derive == "all" else " (its header names no second step)"
        return trace, work[0][1] if work else 0, f"{WHOLE}{why}"
    if kind == "two_steps":
        (first_name, _), (second_name, second), (_, cut) = work[0], work[1], work[2]
        cut = min(cut, len(trace))
        shown_first, shown_second = (name_cell(n) for n in (first_name, second_name))
        what = (
            f"the setup, {shown_first} and {shown_second} as recorded "
            f"(events 0-{cut - 1:,} of {len(trace):,})"
        )
        return trace.prefix(cut), min(second, cut), what
    (first_name, start), (_, cut) = work[0], work[1]
    cut = min(cut, len(trace))
    derived = trace.with_step_repeated(min(start, cut), cut, f"{first_name} (again)")
    shown = name_cell(first_name)
    what = (
        f"the setup and {shown} (events 0-{cut - 1:,} of {len(trace):,}), "
        f"with {shown} run once more on the state it leaves"
    )
    return derived, cut, what


def derivation_kind(trace: Trace, derive: Derive = "first_step") -> DerivationKind:
    """How :func:`derivation_trace` derives on ``trace`` for ``derive``: ``"two_steps"``
    (setup and two steps as recorded), ``"one_step"`` (the first step run once more),
    ``"all"`` (the whole trace) or ``"prefix"`` (the first ``derive`` events).

    Raises:
        InvalidArgument: ``derive`` is none of the choices, or a count below 1 (a
            ``ValueError``).
    """
    if isinstance(derive, bool) or not (isinstance(derive, int) or derive in DERIVE_CHOICES):
        choices = ", ".join(repr(choice) for choice in DERIVE_CHOICES)
        raise InvalidArgument(f"derive must be {choices} or an event count, got {derive!r}")
    if isinstance(derive, int):
        if derive <= 0:
            raise InvalidArgument(f"derive must be a positive event count, got {derive}")
        # Every event is the whole trace, derived on as "all" is (derivation_trace).
        return "prefix" if derive < len(trace) else "all"
    steps = len(_work_phases(trace))
    if derive == "all" or steps < 2:
        return "all"
    if derive in ("first_step", "two_steps") and steps >= 3:
        return "two_steps"
    return "one_step"


def perturb(trace: Trace, start: int, window: int, seed: int, extra: float = 0.0) -> Trace:
    """Return a perturbed replica of ``trace``.

    Each event from index ``start`` on moves up to ``window`` places at random (a free
    never before its allocation; times stay in order), and a share ``extra`` of the
    allocations, drawn at random, gets a twin of the same size that lives alongside it
    (a slightly larger model or batch: the sizes stay the workload's). Twins are drawn
    among the allocations live at the peak until they hold ``extra`` of the peak live
    bytes, so the replica's peak is at least that much higher: a layout whose pages fit
    the peak with less room to spare falls off its cliff here, not in production.

    Raises:
        InvalidArgument: the replica's events make no trace (live bytes past 64 bits,
            more than 2**32 allocations), or ``window`` is negative or not finite.
    """
    # The events move in Rust; the randomness is Python's, drawn in the order the
    # event keys ask for it (``k + rng.uniform(-window, window)`` for the k-th event
    # from ``start`` on, ``uniform`` being ``a + (b - a) * random()``), so a seed gives
    # the replica of the plain Python loops (``tests/python/test_plan_scale.py``). With
    # twins, ``start`` moves with the phase it starts (``_landing``). The twins are
    # drawn here; the draws that move events are ``rng.random()``'s next ones, made in
    # Rust from the generator's state.
    rng = random.Random(seed)
    if extra > 0:
        twins = _live_at_peak(trace, extra * trace.peak_live, rng)
        twinned = trace.with_twins(sorted(twins))
        start = _landing(trace, twinned, start)
        trace = twinned
    start = min(start, len(trace))
    return trace.reordered_from_state(start, float(window), rng.getstate()[1])


def replica_words(window: int, extra: float, seed: int) -> str:
    """The perturbed replica that :func:`perturb` makes with ``window``, ``extra`` and
    ``seed``, in words: ``events moved up to 16 places, 3 % more bytes live at the peak
    (seed 4)``."""
    more = f", {extra * 100:g} % more bytes live at the peak" if extra > 0 else ""
    return f"events moved up to {window} places{more} (seed {seed})"


def _landing(trace: Trace, twinned: Trace, start: int) -> int:
    """Where event ``start`` of ``trace`` (a phase's first event, or its end) is in
    ``twinned``, its copy with twins: each phase moves with the event it starts at
    (``Trace.with_twins``), so the perturbed part starts at the same event of the
    program. Any other index is kept."""
    if start >= len(trace):
        return len(twinned)
    for (_, first), (_, moved) in zip(trace.phases, twinned.phases, strict=True):
        if first == start:
            return moved
    return start


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

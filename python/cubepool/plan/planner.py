"""plan(): the search's stages, the robustness round, and the checks that keep a plan
from being worse than the default."""

from __future__ import annotations

import os
import time
from typing import Final

from cubepool._cubepool import (
    MemoryConfiguration,
    MemoryDeviceProperties,
    ReplayResult,
    Trace,
)
from cubepool._errors import InvalidArgument
from cubepool._progress import progress_callback
from cubepool._trace import TraceLike, replay, resolve_trace
from cubepool.compare import Objective
from cubepool.layouts import PRESETS, default_configuration, describe
from cubepool.place import MAX_TIME_LIMIT
from cubepool.plan.candidates import (
    _VIRTUAL_FRONTS,
    Candidates,
    Derive,
    Layout,
    Progress,
    Shape,
    Tail,
    _capped,
    _pages,
    _round_up,
    _shape,
    _thresholds,
    _virtual_finalists,
    scope,
)
from cubepool.plan.derivation import derivation_trace, perturb, replica_words
from cubepool.plan.guard import first_not_worse
from cubepool.plan.planned import (
    planned_first,
    planned_plan,
    remove_temporary_plan,
    temporary_plan,
)
from cubepool.plan.result import Plan
from cubepool.plan.robustness import _choose, _robustness
from cubepool.plan.search import _floor, _Reads, _Search
from cubepool.plan.static import DEFAULT_TIME_LIMIT as STATIC_TIME_LIMIT
from cubepool.plan.static import StaticPlacement, static_placement


def default_budget(allocations: int, default_calls: int) -> int:
    """The budget of storage allocations :func:`plan` sets when given none, for a
    derivation trace of ``allocations`` allocations on which the default layout makes
    ``default_calls`` storage allocations: 1 % of the allocations, at least 64, and at
    least ``default_calls``.

    The budget keeps the search from buying bytes with an allocation per tensor; a
    budget below what the default layout itself makes would say "not met" of the
    default (as the report did on gpt2-train: 64 against the default's 67 maps), which
    is no news: the default is what a plan is measured against, so it always fits."""
    return max(64, allocations // 100, default_calls)


_MOST_ALLOCATIONS: Final = (1 << 64) - 1
"""The largest budget of storage allocations: the replays count them in 64 bits."""


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
    static: bool = True,
    static_time_limit: float = STATIC_TIME_LIMIT,
    candidates: Candidates = "auto",
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
            is always judged on the whole trace, and a finalist that reserves more than
            the default there is passed over (:mod:`cubepool.plan.guard`).
        max_storage_allocations: the most storage allocations (cudaMalloc calls) a layout
            may make on the derivation trace; by default :func:`default_budget`: 1 % of
            its allocations, at least 64, so that a plan never buys bytes with an
            allocation per tensor, and at least what the default layout makes there.
            The presets ``default`` and ``sub_slices`` are exempt from the budget (they
            stay in the running whatever they allocate, so that a plan always exists);
            a plan over the budget says so in its summary and notes. At most
            ``2**64 - 1`` (replays count storage allocations in 64 bits).
        call_cost: the bytes one storage call (an allocation or free, a map or unmap
            of a virtual pool) is worth: the finalists are ranked by their charged
            bytes plus ``call_cost`` times their storage calls. 0 (the default) weighs
            bytes alone. A GPU storage call costs tens of microseconds.
        progress: called as ``progress(done, total, stage)`` during the search;
            ``True`` draws a progress bar on stderr.
        workers: threads replaying in parallel (replays release the GIL); the CPU count
            by default. The plan, and its count of replays, do not depend on it.
        static: also place the whole trace's allocations statically
            (:mod:`cubepool.plan.static`), ``Plan.static``: what a runtime that knows
            this exact run in advance would reserve, reported beside the plan. Where
            the allocations cannot be placed (their sizes add up past 2**64 bytes),
            ``Plan.static`` is None and ``Plan.static_skipped`` says why.
        static_time_limit: seconds that placement may take (the best found by then).
        candidates: ``"full"`` searches every candidate layout, ``"reduced"`` fewer
            size limits, page sizes, finalists and replicas (about a quarter of the
            replays), ``"few"`` fewer still, ``"auto"`` the full set on derivation
            traces of up to 50,000 events and the reduced set on longer ones (see
            :data:`cubepool.plan.candidates.SCOPES`); ``Plan.candidates`` says when the
            set was cut.

    Returns:
        A :class:`Plan`: ``plan.config`` is the layout, ``plan.result`` its replay of the
        whole trace (``config, result = plan(...)`` unpacks them).
    """
    if objective not in ("reserved", "storage_allocations"):
        raise InvalidArgument(
            f"objective must be 'reserved' or 'storage_allocations', not {objective!r}"
        )
    if isinstance(call_cost, bool) or not isinstance(call_cost, int):
        raise TypeError(f"call_cost must be an int, got {type(call_cost).__name__}")
    if call_cost < 0:
        raise InvalidArgument(f"call_cost must be at least 0, got {call_cost}")
    if isinstance(static_time_limit, bool) or not isinstance(static_time_limit, int | float):
        raise TypeError(
            f"static_time_limit must be a number, got {type(static_time_limit).__name__}"
        )
    if not 0 < static_time_limit < MAX_TIME_LIMIT:
        raise InvalidArgument(
            f"static_time_limit must be a positive number of seconds below {MAX_TIME_LIMIT:,.0f}, "
            f"got {static_time_limit}"
        )
    for name, value in (("max_storage_allocations", max_storage_allocations), ("workers", workers)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise TypeError(f"{name} must be an int or None, got {type(value).__name__}")
        if value is not None and value < 1:
            raise InvalidArgument(f"{name} must be positive (None for the default), got {value}")
    if max_storage_allocations is not None and max_storage_allocations > _MOST_ALLOCATIONS:
        # Refused here, by its name: the replays would refuse it by an internal one.
        raise InvalidArgument(
            f"max_storage_allocations must be at most {_MOST_ALLOCATIONS:,} (64 bits), "
            f"got a {max_storage_allocations.bit_length()}-bit integer"
        )
    trace = resolve_trace(trace, device=device, stream=stream)
    progress = progress_callback(progress)
    started = time.perf_counter()
    derived, perturb_from, derived_on = derivation_trace(trace, derive)
    width = scope(candidates, len(derived))
    few = width.few_pages
    per_shape = width.finalists_per_shape
    replicas = width.replicas
    props = properties if properties is not None else MemoryDeviceProperties()
    # The default layout's replay of the derivation trace: the guard checks the plan
    # against it, and the default budget is at least what it allocates (see below).
    default_derivation = replay(derived, default_configuration(), properties, samples=0)
    budget = (
        default_budget(derived.allocations, default_derivation.storage_allocations)
        if max_storage_allocations is None
        else max_storage_allocations
    )
    align = props.alignment
    max_page = props.max_page_size
    search = _Search(derived, properties, budget, progress, workers or os.cpu_count() or 1)

    sizes = sorted({_round_up(max(size, 1), align) for size in derived.distinct_sizes()})
    limits = _thresholds([s for s in sizes if s <= max_page], width.thresholds) or [align]
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
        top=per_shape,
        by_bytes=12 if measured else 0,
        per_shape=per_shape,
    )

    # Stage 1: one sliced pool in front of the tail.
    search.run(
        "one sliced pool",
        (
            Layout(((page, limit, None),), tail)
            for limit in limits
            for page in _pages(limit, peaks.get(limit), max_page, dense=True, few=few)
            for tail in tails
        ),
        later,
        floor,
    )
    # Stage 2: a second sliced pool next to each of the best few.
    search.settle("one sliced pool", _Reads(top=4))
    best = [lay for lay, _ in search.ranked()[:4]] if width.two_pools else []
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
            for page in _pages(limit, peaks.get(limit), max_page, dense=False, few=few)
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
    search.settle("finalists", _Reads(per_shape=per_shape))
    ranked = search.ranked()
    shapes: dict[Shape, list[Layout]] = {"one": [], "two": [], "capped": []}
    for lay, _ in ranked:
        shape = _shape(lay)
        if len(shapes[shape]) < per_shape:
            shapes[shape].append(lay)
    finalists: list[tuple[str, MemoryConfiguration]] = [
        (repr(lay), lay.config()) for group in shapes.values() for lay in group
    ]
    finalists += [(name, PRESETS[name]()) for name in ("default", "sub_slices")]
    finalists += _virtual_finalists(shapes["one"][:_VIRTUAL_FRONTS])
    # The planned layout (a placement of the derivation trace followed at run time) where
    # the trace names steps: it joins the finalists and is chosen only where it wins on
    # the replicas and passes the guard like any other.
    planned_content = None
    planned_file = None
    if derived is not trace:
        planned_content = planned_plan(trace, derive=derive, properties=properties)
        planned_config, planned_file = temporary_plan(planned_content)
        finalists.append(("planned", planned_config))
    # The finalists' replays of the derivation trace are the search's own.
    known = {repr(lay): search.seen[lay] for group in shapes.values() for lay in group}

    def replica(index: int) -> Trace:
        if index == 0:
            return derived
        window, extra, seed = replicas[index - 1]
        return perturb(derived, perturb_from, window, seed, extra)

    searched = {repr(lay): lay for group in shapes.values() for lay in group}
    scores, pruned, failed, skipped = _robustness(
        finalists,
        replica,
        1 + len(replicas),
        known,
        searched,
        properties,
        budget,
        search,
        progress,
        call_cost,
        objective,
    )
    chosen = _choose(scores, objective, failed)

    # The chosen finalist, else the next in rank, else the default: the first that is
    # not worse than the default (see cubepool.plan.guard).
    configs = dict(finalists)
    baseline = replay(trace, default_configuration(), properties)
    order = [chosen[0], *(key for key, _, _ in scores if key != chosen[0])]
    derivations: dict[str, ReplayResult] = {}
    if objective == "reserved" and call_cost == 0:
        order, derivations, planned_replays = planned_first(
            order, configs, trace, derived, properties, budget, planned_content
        )
        search.replays += planned_replays
    guarded = first_not_worse(
        order,
        configs,
        trace,
        derived,
        baseline,
        properties,
        bytes_alone=objective == "reserved" and call_cost == 0,
        default_derivation=default_derivation,
        derivations=derivations,
    )
    # The default layout on the whole trace and on the derivation trace, and the guard's.
    search.replays += 2 + guarded.replays
    seconds = time.perf_counter() - started
    if planned_file is not None and guarded.key != "planned":
        # Not chosen: its temporary plan file goes now (Plan.planned keeps the content);
        # a chosen one goes when the process exits (`temporary_plan`).
        remove_temporary_plan(planned_file)
    placed, unplaced = _static(trace, static_time_limit) if static else (None, "")
    return Plan(
        config=configs[guarded.key],
        result=guarded.result,
        baseline=baseline,
        derivation=guarded.derivation,
        derived_on=derived_on,
        objective=objective,
        max_storage_allocations=budget,
        replays=search.replays,
        stopped=search.stopped,
        seconds=seconds,
        finalists=tuple((describe(configs[k]), s) for k, s, _ in scores),
        pruned=tuple((describe(configs[k]), low) for k, low in pruned),
        replicas=len(replicas),
        skipped_replicas=tuple(
            (replica_words(*replicas[index - 1]), why) for index, why in skipped.items()
        ),
        passed_over=guarded.passed_over,
        default_derivation=guarded.default_derivation,
        planned=planned_content,
        candidates=width.describe(len(limits), len(derived)),
        static=placed,
        static_skipped=unplaced,
    )


def _static(trace: Trace, time_limit: float) -> tuple[StaticPlacement | None, str]:
    """The static placement of ``trace`` (:func:`static_placement`), or None and why
    it could not be made: its allocations' sizes add up to more than 2**64 bytes (the
    time limit was checked by :func:`plan`), which leaves the plan as it is."""
    try:
        return static_placement(trace, time_limit), ""
    except InvalidArgument as exc:
        return None, str(exc)

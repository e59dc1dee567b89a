"""The robustness round: the finalists on perturbed replicas of the derivation trace,
those that cannot be chosen cut short."""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

from cubepool._cubepool import (
    MemoryConfiguration,
    MemoryDeviceProperties,
    Trace,
    replay_until,
)
from cubepool._errors import InvalidArgument
from cubepool.compare import Objective
from cubepool.layouts import PRESETS
from cubepool.plan.candidates import Layout, Progress
from cubepool.plan.search import Part, SizeGroup, _Kept, _Outcome, _Search


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
) -> tuple[list[tuple[str, float, int]], list[tuple[str, float]], dict[str, int], dict[int, str]]:
    """Each finalist's mean of charged bytes (plus ``call_cost`` per storage call) /
    peak live over the ``count`` replicas that ``replica(index)`` makes (the first is
    the derivation trace; one replica in memory at a time, one per worker while the
    reference replays), and its most storage allocations, best first;
    finalists over budget or failing drop out (the presets never do, so the list is
    never empty). ``known`` holds the finalists' replays of the first replica, the
    derivation trace, made already; ``layouts`` the searched finalists, which replay
    pool by pool (their outcome is the whole replay's, and a replay stopped at the
    budget drops them as a whole one over it would).

    The last value returned holds the perturbed replicas that could not be built
    (``replica`` raised ``InvalidArgument``: their events make no trace, e.g. live
    bytes past 64 bits), by index, with why: they are left out, and every mean and
    bound is over the others (the derivation trace always among them).

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
    failed: dict[str, int] = {}
    """Reservations each finalist failed over its replicas (only presets stay in with
    any: the others drop out)."""
    skipped: dict[int, str] = {}
    """The replicas that could not be built, by index, with why (none is replayed)."""

    def build(index: int) -> Trace | None:
        """Replica ``index``, or None (its reason in ``skipped``) when its events make
        no trace. The planner makes the replicas' arguments (start, window, seed), so
        the one ``InvalidArgument`` left is the variant's own (``Trace.reordered``,
        ``Trace.with_twins``: more than 2**32 allocations, live bytes past 64 bits)."""
        try:
            return replica(index)
        except InvalidArgument as exc:
            skipped[index] = str(exc)
            return None

    def built() -> int:
        """How many replicas count: those not skipped (all of them, until one is)."""
        return count - len(skipped)

    def after(index: int) -> list[int]:
        """The replicas after ``index`` that count."""
        return [later for later in range(index + 1, count) if later not in skipped]

    def ratio(outcome: _Outcome, live: int) -> float:
        calls = outcome.storage_allocations + outcome.storage_frees
        return (outcome.charged() + call_cost * calls) / max(live, 1)

    def count_in(key: str, outcome: _Outcome, live: int) -> None:
        over = outcome.failed_reserves > 0 or outcome.storage_allocations > budget
        if over and key not in PRESETS:
            dropped.add(key)
        ratios.setdefault(key, []).append(ratio(outcome, live))
        allocs[key] = max(allocs.get(key, 0), outcome.storage_allocations)
        failed[key] = failed.get(key, 0) + outcome.failed_reserves

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
    measured: list[dict[SizeGroup, tuple[int, int]]] = [dict(search._live)]

    def least(key: str, index: int) -> float:
        """The least ratio of finalist ``key`` on replica ``index`` (:func:`_least_ratio`,
        or its pools' floors there where they are known and higher)."""
        bound = floors[index].get(key, 0.0) if index < len(floors) else 0.0
        return max(_least_ratio(key), bound)

    shared: list[dict[Part, _Outcome]] = [{}]
    with ThreadPoolExecutor(max_workers=search.workers) as pool:
        if reference is not None:
            # The reference on every replica, a few replicas at a time (one per worker).
            # Its pools' replays are kept for the others on the same replica.
            # Each worker makes its replica: a few in memory at a time, one per worker.
            # It also measures the live peaks behind the searched finalists' floors there.
            def on(index: int, ref: Layout = layouts[reference]) -> tuple[Any, ...] | None:
                trace = build(index)
                if trace is None:
                    return None
                parts = _Search(trace, properties, budget, None, 1)
                outcome = parts._evaluate(ref, None)[1]
                peaks = parts.trace.range_live_peaks([list(group.ranges) for group in groups])
                return outcome, parts.trace.peak_live, parts.replays, parts._parts, peaks

            for made in pool.map(on, range(1, count)):
                tick()
                if made is None:
                    # Skipped: placeholders keep the lists indexed by replica.
                    shared.append({})
                    measured.append({})
                    floors.append({})
                    continue
                outcome, live, replays, kept, peaks = made
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
                beat = _to_beat(sum(ratios[reference]) / built(), objective)

        for index in range(count):
            # A replica the reference pass found skipped is not built again. Without a
            # reference nothing is cut short (``beat`` is infinite), so a replica found
            # skipped only here changes no bound already used.
            trace = None if index in skipped else build(index)
            if trace is None:
                for key, _ in finalists:
                    if key != reference:
                        tick()
                continue
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
                rest = sum(least(key, later) for later in after(index))
                room = beat * built() - sum(ratios.get(key, ())) - rest
                if room < least(key, index) - _SLACK:
                    pruned[key] = (sum(ratios.get(key, ())) + least(key, index) + rest) / built()
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
            ) -> tuple[str, _Outcome, bool, _Kept | None]:
                (key, config), above = item
                layout = layouts.get(key)
                if layout is not None:
                    _, outcome, stopped, kept = parts._evaluate_apart(layout, above)
                    return key, outcome, stopped, kept
                result, at = replay_until(trace, config, properties, reserved_above=above)
                with search._lock:
                    search.replays += 1
                return key, _Outcome.of(result), at is not None, None

            # In waves, each seeing the pools' replays kept before it: the count of
            # replays does not depend on which thread finishes first.
            while jobs:
                finished = list(pool.map(one, parts.wave(jobs, lambda job: layouts.get(job[0][0]))))
                for *_, kept in finished:
                    if kept is not None:
                        parts._merge(kept)
                for key, outcome, stopped, _ in finished:
                    tick()
                    over = outcome.failed_reserves > 0 or outcome.storage_allocations > budget
                    if stopped and (not over or key in PRESETS):
                        # Stopped past its room: its mean is above ``beat``, at least this.
                        rest = sum(least(key, later) for later in after(index))
                        pruned[key] = (
                            sum(ratios.get(key, ())) + ratio(outcome, live) + rest
                        ) / built()
                        continue
                    count_in(key, outcome, live)
            search.replays += parts.replays
    scores = [
        (key, sum(values) / len(values), allocs[key])
        for key, values in ratios.items()
        if key not in dropped and key not in pruned
    ]
    # As ``compare`` ranks replays (``rank_key``): a finalist that failed reservations
    # (a preset: the others drop out) after every one that served them all, fewer
    # failed first; an incomplete replay reserves less only because it served less.
    scores.sort(key=lambda s: (failed[s[0]] > 0, failed[s[0]], s[1], s[2], s[0]))
    cut = sorted(pruned.items(), key=lambda s: (s[1], s[0]))
    return scores, cut, failed, dict(sorted(skipped.items()))


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


def _choose(
    scores: list[tuple[str, float, int]], objective: Objective, failed: dict[str, int]
) -> tuple[str, float, int]:
    """The finalist to plan with, of ``scores`` as :func:`_robustness` ranks them: the
    first, or with ``objective="storage_allocations"`` the one with fewest storage
    allocations among those within 5 % of the first's mean and ranked with it (all
    complete, or all not)."""
    if objective == "storage_allocations":
        best = scores[0][1]
        incomplete = failed.get(scores[0][0], 0) > 0
        near = [
            s for s in scores if s[1] <= best * 1.05 and (failed.get(s[0], 0) > 0) == incomplete
        ]
        return min(near, key=lambda s: (s[2], s[1]))
    return scores[0]

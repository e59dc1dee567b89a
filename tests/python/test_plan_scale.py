"""The planner at scale (issue 17): its per-event work in Rust gives what the Python
loops gave, and bounding candidates gives the plan that replaying every one to the end
gives."""

from __future__ import annotations

import bisect
import math
import random
import sys
from pathlib import Path
from typing import Any

import pytest

import cubepool
from cubepool._cubepool import replay_until
from cubepool._errors import InvalidArgument
from cubepool.layouts import describe
from cubepool.plan import candidates as plan_candidates
from cubepool.plan import derivation_trace, perturb
from cubepool.plan import planner as plan_planner
from cubepool.plan import robustness as plan_robustness
from cubepool.plan import search as plan_search

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benches" / "python"))
import synthetic_trace

Event = tuple[int, str, int, int]
TRACES = Path(__file__).resolve().parents[2] / "python" / "cubepool" / "examples" / "data"


@pytest.fixture(scope="module")
def traces() -> dict[str, cubepool.Trace]:
    found = {name: cubepool.load_trace(cubepool.examples.path(name)) for name in ["gpt2-train"]}
    found["gpt2-generate"] = cubepool.load_trace(cubepool.examples.path("gpt2-generate"))
    found["synthetic"] = synthetic_trace.trace(20_000, seed=1)
    return found


# --------------------------------------------------------------------------- references
# The Python loops the planner ran before they moved to Rust, kept as the specification.


def reference_perturb(
    trace: cubepool.Trace, start: int, window: int, seed: int, extra: float = 0.0
) -> cubepool.Trace:
    events = trace.events()
    header = trace.header
    rng = random.Random(seed)
    if extra > 0:
        twins = reference_live_at_peak(events, extra * trace.peak_live, rng)
        offset = trace.allocations
        doubled: list[Event] = []
        landed: list[int] = []  # where each event lands, then the end
        for event in events:
            landed.append(len(doubled))
            doubled.append(event)
            if event[2] in twins:
                doubled.append((event[0], event[1], event[2] + offset, event[3]))
        landed.append(len(doubled))
        events = doubled
        # Phases, and the perturbed part, start at the same events of the program.
        start = landed[min(start, len(landed) - 1)]
        header = dict(header)
        header["phases"] = [
            {**phase, "first_event": landed[phase["first_event"]]}
            for phase in header.get("phases", [])
        ]
        if header.get("recorded"):
            recorded = dict(header["recorded"])
            recorded["points"] = [
                {**point, "event": landed[point["event"]]} for point in recorded["points"]
            ]
            header["recorded"] = recorded
    head, tail = events[:start], events[start:]
    order = sorted(range(len(tail)), key=lambda k: k + rng.uniform(-window, window))
    times = [e[0] for e in tail]
    placed = {e[2] for e in head if e[1] == "alloc"}
    waiting: dict[int, Event] = {}
    moved: list[Event] = []
    for k in order:
        event = tail[k]
        if event[1] == "free" and event[2] not in placed:
            waiting[event[2]] = event
            continue
        moved.append(event)
        if event[1] == "alloc":
            placed.add(event[2])
            if event[2] in waiting:
                moved.append(waiting.pop(event[2]))
    rebuilt = [(t, op, ident, size) for t, (_, op, ident, size) in zip(times, moved, strict=True)]
    return cubepool.Trace.from_events(head + rebuilt, header)


def reference_live_at_peak(events: list[Event], goal: float, rng: random.Random) -> set[int]:
    sizes: dict[int, int] = {}
    live = peak = peak_at = 0
    for index, (_, op, ident, size) in enumerate(events):
        if op == "alloc":
            sizes[ident] = size
            live += size
            if live > peak:
                peak, peak_at = live, index
        else:
            live -= sizes[ident]
    alive: dict[int, int] = {}
    for _, op, ident, size in events[: peak_at + 1]:
        if op == "alloc":
            alive[ident] = size
        else:
            del alive[ident]
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


def reference_live_peaks(events: list[Event], limits: list[int]) -> list[int]:
    current = [0] * len(limits)
    peaks = [0] * len(limits)
    sizes: dict[int, int] = {}
    for _, op, ident, size in events:
        if op == "alloc":
            sizes[ident] = size
            sign = 1
        else:
            size = sizes.pop(ident)
            sign = -1
        for j in range(bisect.bisect_left(limits, size), len(limits)):
            current[j] += sign * size
            if current[j] > peaks[j]:
                peaks[j] = current[j]
    return peaks


def reference_step_repeated(trace: cubepool.Trace, start: int, cut: int, name: str) -> list[Event]:
    events = trace.prefix(cut).events()
    step = events[start:]
    born = {e[2] for e in step if e[1] == "alloc"}
    transient = born & {e[2] for e in step if e[1] == "free"}
    shift = (events[-1][0] - step[0][0] + 1) if step else 0
    next_id = trace.prefix(cut).allocations
    renamed: dict[int, int] = {}
    repeat: list[Event] = []
    for t, op, ident, size in step:
        if ident not in transient:
            continue
        if op == "alloc":
            renamed[ident] = next_id
            next_id += 1
        repeat.append((t + shift, op, renamed[ident], size))
    return cubepool.Trace.from_events(events + repeat).events()


# --------------------------------------------------------------------------- Rust helpers


@pytest.mark.parametrize("name", ["gpt2-train", "synthetic"])
def test_perturbed_replicas_are_those_of_the_python_loops(
    traces: dict[str, cubepool.Trace], name: str
) -> None:
    derived, start, _ = derivation_trace(traces[name])
    for window, extra, seed in plan_candidates._REPLICAS:
        fast = perturb(derived, start, window, seed, extra)
        slow = reference_perturb(derived, start, window, seed, extra)
        assert fast.events() == slow.events(), (window, extra, seed)
        assert (fast.peak_live, fast.allocations) == (slow.peak_live, slow.allocations)
        assert fast.phases == slow.phases
        if extra == 0:
            assert fast.phases == derived.phases


def test_a_repeated_step_is_that_of_the_python_loop(traces: dict[str, cubepool.Trace]) -> None:
    trace = traces["gpt2-train"]
    phases = dict(trace.phases)
    derived, start, _ = derivation_trace(trace, "one_step")
    assert start == phases["step1"]
    expected = reference_step_repeated(trace, phases["step0"], phases["step1"], "step0 (again)")
    assert derived.events() == expected
    assert derived.phases[-1] == ("step0 (again)", phases["step1"])


@pytest.mark.parametrize("name", ["gpt2-generate", "synthetic"])
def test_live_peaks_are_those_of_the_python_loop(
    traces: dict[str, cubepool.Trace], name: str
) -> None:
    trace = traces[name]
    sizes = trace.distinct_sizes()
    assert sizes == sorted({e[3] for e in trace.events() if e[1] == "alloc"})
    limits = sizes[:: max(1, len(sizes) // 16)]
    assert trace.live_peaks(limits) == reference_live_peaks(trace.events(), limits)
    assert trace.live_peaks([max(sizes)]) == [trace.peak_live]


@pytest.mark.parametrize("name", ["gpt2-generate", "synthetic"])
def test_group_live_peaks_are_those_of_the_python_loop(
    traces: dict[str, cubepool.Trace], name: str
) -> None:
    trace = traces[name]
    sizes = trace.distinct_sizes()
    groups = [sizes[::3], sizes[1::2], sizes[-5:], [sizes[0]], [], sizes]
    expected = []
    for group in groups:
        members = set(group)
        bytes_live = count_live = peak_bytes = peak_count = 0
        born: dict[int, int] = {}
        for _, op, ident, size in trace.events():
            if op == "alloc":
                born[ident] = size
                if size in members:
                    bytes_live += size
                    count_live += 1
                    peak_bytes = max(peak_bytes, bytes_live)
                    peak_count = max(peak_count, count_live)
            elif born[ident] in members:
                bytes_live -= born[ident]
                count_live -= 1
        expected.append((peak_bytes, peak_count))
    assert trace.group_live_peaks(groups) == expected
    assert expected[-1][0] == trace.peak_live


def test_draws_from_a_state_are_those_of_python_random(traces: dict[str, cubepool.Trace]) -> None:
    trace = traces["synthetic"]
    for seed, start in ((0, 0), (7, 1234), (2**40 + 3, len(trace))):
        rng = random.Random(seed)
        rng.random()  # any position of the state, not only a fresh one
        state = rng.getstate()[1]
        draws = [rng.random() for _ in range(len(trace) - start)]
        fast = trace.reordered_from_state(start, 16.0, state)
        assert fast.events() == trace.reordered(start, 16.0, draws).events()
    with pytest.raises(InvalidArgument, match="624 words"):
        trace.reordered_from_state(0, 4.0, [1, 2, 3])
    with pytest.raises(InvalidArgument, match="position"):
        trace.reordered_from_state(0, 4.0, [0] * 624 + [625])


def test_draws_outside_zero_to_one_are_refused(traces: dict[str, cubepool.Trace]) -> None:
    # A draw outside [0, 1] (or NaN) moved its event anywhere, without a word.
    trace = traces["synthetic"]
    draws = [0.5] * len(trace)
    assert len(trace.reordered(0, 4.0, draws)) == len(trace)
    for bad in (float("nan"), -0.1, 3.0, float("inf")):
        draws[7] = bad
        with pytest.raises(InvalidArgument, match=r"draws\[7\] must be a number from 0 to 1"):
            trace.reordered(0, 4.0, draws)


def test_trace_variants_refuse_bad_arguments(traces: dict[str, cubepool.Trace]) -> None:
    trace = traces["gpt2-train"]
    with pytest.raises(InvalidArgument, match="random draws"):
        trace.reordered(0, 4.0, [0.5])
    with pytest.raises(InvalidArgument, match="window"):
        trace.reordered(0, -1.0, [0.5] * len(trace))
    with pytest.raises(InvalidArgument, match="not in the trace"):
        trace.with_twins([trace.allocations])
    with pytest.raises(InvalidArgument, match="only"):
        trace.with_step_repeated(0, len(trace) + 1, "x")
    with pytest.raises(InvalidArgument, match=r"ids\[0\] must be non-negative"):
        trace.with_twins([-1])


def test_twins_move_each_phase_and_the_perturbed_part_with_the_event_they_start_at(
    traces: dict[str, cubepool.Trace],
) -> None:
    from cubepool.plan.derivation import _landing

    trace = traces["gpt2-train"]
    phases = trace.phases
    assert len(phases) >= 3
    # Twins of the first allocations: every phase after them starts later.
    twinned = trace.with_twins(list(range(40)))
    events, twin_events = trace.events(), twinned.events()
    for (name, first), (same, moved) in zip(phases, twinned.phases, strict=True):
        assert name == same
        # Each event of a twinned allocation before the phase has a twin before it too.
        before = sum(1 for _, _, ident, _ in events[:first] if ident < 40)
        assert moved == first + before
        # The phase starts at the trace's own event (time, op, size; ids are renumbered).
        t, op, _, size = events[first]
        assert (twin_events[moved][0], twin_events[moved][1], twin_events[moved][3]) == (
            t,
            op,
            size,
        )
        assert _landing(trace, twinned, first) == moved
    assert twinned.phases[-1][1] > phases[-1][1]
    assert _landing(trace, twinned, len(trace)) == len(twinned)


def test_a_bounded_replay_stops_with_lower_bounds(traces: dict[str, cubepool.Trace]) -> None:
    trace = traces["gpt2-train"]
    config = cubepool.default_configuration()
    whole = cubepool.replay(trace, config, samples=0)
    same, stopped = replay_until(trace, config)
    assert stopped is None
    assert (same.peak_reserved, same.storage_allocations) == (
        whole.peak_reserved,
        whole.storage_allocations,
    )
    half = whole.peak_reserved // 2
    part, stopped = replay_until(trace, config, reserved_above=half)
    assert stopped is not None and part.events == stopped + 1 < len(trace)
    assert half < part.peak_reserved <= whole.peak_reserved
    assert part.storage_allocations <= whole.storage_allocations
    few, stopped = replay_until(trace, config, storage_allocations_above=3)
    assert stopped is not None and few.storage_allocations == 4
    with pytest.raises(InvalidArgument, match="reserved_above"):
        replay_until(trace, config, reserved_above=-1)


# --------------------------------------------------------------------------- exactness


def exhaustive(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the planner replay every candidate whole and to the end: no stops, no
    floors, no pool-by-pool replays, and every finalist on every replica."""

    def to_the_end(trace: cubepool.Trace, config: Any, props: Any, **kw: Any) -> Any:
        assert kw.get("sizes") is None
        return replay_until(trace, config, props)

    def no_floor(*_: Any) -> Any:
        return lambda layout: plan_search._Bound(0.0, 0)

    monkeypatch.setattr(plan_search, "replay_until", to_the_end)
    monkeypatch.setattr(plan_robustness, "replay_until", to_the_end)
    monkeypatch.setattr(plan_planner, "_floor", no_floor)
    monkeypatch.setattr(plan_search._Search, "_routed", lambda self, layout: None)
    monkeypatch.setattr(plan_robustness, "_to_beat", lambda reference, objective: math.inf)


@pytest.mark.parametrize("name", ["gpt2-train", "gpt2-generate", "synthetic"])
def test_bounding_candidates_gives_the_plan_of_replaying_them_all(
    traces: dict[str, cubepool.Trace], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = traces[name]
    bounded = cubepool.plan(trace, workers=2)
    assert bounded.stopped > 0
    with monkeypatch.context() as patch:
        exhaustive(patch)
        full = cubepool.plan(trace, workers=2)
    assert full.stopped == 0
    assert full.pruned == ()
    if bounded.is_planned():
        # The planned layout follows a temporary plan file of its own in each plan.
        assert full.is_planned() and describe(bounded.config) == describe(full.config)
    else:
        assert bounded.config == full.config
    assert bounded.result.peak_reserved == full.result.peak_reserved
    # The finalists scored in full score as they do when all are; the others were cut
    # with a lower bound of their mean that holds and that puts them behind the winner
    # (or they go over the budget of storage allocations on a replica they skipped).
    cut = dict(bounded.pruned)
    assert bounded.finalists == tuple(f for f in full.finalists if f[0] not in cut)
    scores = dict(full.finalists)
    assert bounded.pruned
    for layout, low in bounded.pruned:
        # The bound is summed in another order than the mean: equal up to rounding.
        assert full.finalists[0][1] < low <= scores.get(layout, math.inf) * (1 + 1e-12)
    frugal = cubepool.plan(trace, "storage_allocations", workers=2)
    with monkeypatch.context() as patch:
        exhaustive(patch)
        assert cubepool.plan(trace, "storage_allocations", workers=2).config == frugal.config


def test_a_shape_cutoff_keeps_out_only_what_cannot_push_out_a_twin() -> None:
    one = plan_candidates.Layout(((4 << 20, 1 << 20, None),))
    two = plan_candidates.Layout(((2 << 20, 4096, None), (4 << 20, 1 << 20, None)))
    cutoffs = plan_search._Cutoffs(
        charged=200.0,
        reserved=50.0,
        open_shapes=frozenset(),
        everything=False,
        by_shape=(("one", 200.0), ("two", 120.0), ("capped", 110.0)),
        # A read one-pool layout with 2 pools serving, 150 B reserved, charged 190.
        twins=(("one", 2, 150, 190.0),),
    )
    # Above every cut: out, whatever it could be a twin of.
    assert cutoffs.excludes(two, plan_search._Bound(201.0, 150), 2)
    # Above its shape's cut but within the others': out unless it could be a twin
    # (same pools serving, same peak reserved possible, charged no higher) of a layout
    # read for another shape.
    assert not cutoffs.excludes(two, plan_search._Bound(130.0, 140), 2)
    assert not cutoffs.excludes(two, plan_search._Bound(130.0, 140), None)
    assert cutoffs.excludes(two, plan_search._Bound(130.0, 140), 3)
    assert cutoffs.excludes(two, plan_search._Bound(130.0, 151), 2)
    assert cutoffs.excludes(two, plan_search._Bound(195.0, 140), 2)
    # Within its shape's cut, or under the cut by bytes: in.
    assert not cutoffs.excludes(two, plan_search._Bound(119.0, 140), 3)
    assert not cutoffs.excludes(two, plan_search._Bound(130.0, 50), 3)
    assert not cutoffs.excludes(one, plan_search._Bound(199.0, 140), 2)
    # A replay stops past the reserved bytes that keep it out, the charge adding half
    # its largest page (64 B here): by its shape's cut when it can be no twin (3 pools
    # serving), else by the cut of every part (the twin read has 150 B reserved).
    small = plan_candidates.Layout(((64, 32, None), (128, 64, None)))
    assert plan_search._stop_reserved(small, cutoffs, 3) == 120 - 64
    assert plan_search._stop_reserved(small, cutoffs, 2) == 200 - 64


@pytest.mark.parametrize("name", ["gpt2-train", "synthetic"])
def test_pool_floors_are_lower_bounds_of_their_replays(
    traces: dict[str, cubepool.Trace], name: str
) -> None:
    trace = traces[name]
    search = plan_search._Search(trace, None, 1 << 40, None, 1)
    sizes = trace.distinct_sizes()
    checked = 0
    for limit in sizes[:: max(1, len(sizes) // 6)]:
        for page in (256 << 10, 2 << 20, 32 << 20):
            for tail in ("exclusive_pages", "direct"):
                layout = plan_candidates.Layout(((max(page, limit), limit, None),), tail)
                parts = search._routed(layout)
                assert parts is not None
                for part in parts:
                    if not part[0][1]:
                        continue
                    low = search._low(part)
                    whole, stopped = search._part(part, None, None)
                    assert not stopped
                    assert low.peak_reserved <= whole.peak_reserved, (layout, part[0][0])
                    assert low.storage_allocations <= whole.storage_allocations
                    checked += 1
    assert checked > 20


@pytest.mark.parametrize("name", ["gpt2-train", "gpt2-generate", "synthetic"])
def test_least_charges_on_a_replica_are_lower_bounds_of_its_replays(
    traces: dict[str, cubepool.Trace], name: str
) -> None:
    # The robustness round's floors of a finalist on a replica it has not replayed yet.
    trace = traces[name]
    replica = perturb(trace, 0, 16, seed=4, extra=0.03)
    search = plan_search._Search(trace, None, 1 << 40, None, 1)
    sizes = trace.distinct_sizes()
    layouts = [
        plan_candidates.Layout(tiers, tail)
        for limit in sizes[:: max(1, len(sizes) // 5)]
        for page in (256 << 10, 2 << 20, 32 << 20)
        for tiers in (
            ((max(page, limit), limit, None),),
            ((2 << 20, 4096, None), (max(page, limit), limit, None)) if limit > 4096 else (),
        )
        if tiers
        for tail in ("exclusive_pages", "direct")
    ]
    groups = sorted({sizes for lay in layouts for (_, sizes), _ in search._routed(lay) or ()})
    peaks = replica.range_live_peaks([list(group.ranges) for group in groups])
    live = {group: peak for group, (peak, _) in zip(groups, peaks, strict=True)}
    tight = 0
    for layout in layouts:
        least = search.least_charged(layout, live, replica.peak_live)
        charged = plan_search.charged(replay_until(replica, layout.config(), None)[0])
        assert replica.peak_live <= least <= charged, layout
        tight += least > replica.peak_live
    assert tight > 0  # the pools' floors say more than the peak live bytes somewhere
    # A layout replayed whole (a capped pool) has no floor of its pools.
    capped = plan_candidates.Layout(((2 << 20, 1 << 20, 64 << 20), (2 << 20, 1 << 20, None)))
    assert search.least_charged(capped, live, replica.peak_live) == 0.0


@pytest.mark.parametrize("name", ["gpt2-train", "synthetic"])
def test_a_part_replays_as_the_trace_of_its_sizes_alone(
    traces: dict[str, cubepool.Trace], name: str
) -> None:
    # `sizes=` selects through the trace's size index, made at the first such replay
    # and reused: each part is what a trace of only its allocations (and their frees)
    # replays to, whatever was asked before it.
    trace = traces[name]
    sizes = trace.distinct_sizes()
    config = cubepool.MemoryConfiguration.parse("compact")
    for chosen in (sizes[::3], sizes[-5:], sizes[:1], [*sizes[:4], 3, 3], []):
        wanted = set(chosen)
        kept: set[int] = set()
        events = []
        for t, op, ident, size in trace.events():
            if op == "alloc" and size in wanted:
                kept.add(ident)
            if ident in kept:
                events.append((t, op, ident, size))
        alone = cubepool.Trace.from_events(events)
        part, stopped = replay_until(trace, config, sizes=list(chosen))
        whole, _ = replay_until(alone, config)
        assert stopped is None
        assert part.peak_reserved == whole.peak_reserved, chosen
        assert part.peak_in_use == whole.peak_in_use, chosen
        assert part.storage_allocations == whole.storage_allocations, chosen


@pytest.mark.parametrize("name", ["gpt2-train", "synthetic"])
def test_an_exclusive_tail_in_groups_is_the_tail_replayed_whole(
    traces: dict[str, cubepool.Trace], name: str
) -> None:
    trace = traces[name]
    sizes = trace.distinct_sizes()
    grouped = plan_search._Search(trace, None, 1 << 40, None, 1)
    tail = cubepool.PoolType.exclusive_pages(1 << 62)
    config = cubepool.MemoryConfiguration.custom([cubepool.MemoryPoolOptions(tail)])
    split = 0
    for chosen in (sizes, sizes[len(sizes) // 3 :], sizes[::2], sizes[-8:]):
        group = plan_search.SizeGroup(tuple((size, size) for size in chosen), len(chosen))
        key = (("exclusive_pages",), group)
        split += len(grouped._exclusive_groups(key)) > 1
        outcome, stopped = grouped._part((key, tail), None, None)
        whole, _ = replay_until(trace, config, sizes=list(chosen))
        assert not stopped
        assert outcome.peak_reserved == whole.peak_reserved
        assert outcome.storage_allocations == whole.storage_allocations
        assert outcome.pools[0].reservations == whole.pools[0].reservations
        assert outcome.pools[0].pages_peak == whole.pools[0].pages_peak
    assert split > 0

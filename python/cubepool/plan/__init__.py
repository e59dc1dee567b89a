"""Planning a pool layout for a workload by replaying its trace.

:func:`plan` searches layouts of the seed's vocabulary — one or two sliced pools (page
size, largest slice) in front of an exclusive-pages or direct tail that takes every
larger size — by replaying a *derivation trace* through each, and keeps the layout that
reserves least (or makes fewest storage allocations) within a budget of storage
allocations, so that it stays fast as well as small. Virtual pools (granules mapped on
demand) join the finalists: alone, for each granule and release policy it tries, and
behind the sliced pool of the best one-pool layouts; ``call_cost`` weighs the finalists'
storage calls (maps and unmaps included) against their bytes.

It must generalise: a plan is derived from what a workload shows early and judged on the
whole run. For a training trace whose header names three steps or more, the derivation
trace is the setup and the first two steps as recorded, because the second step, not
the first, is where training settles and usually peaks, and because only the second step
shows which blocks the first one kept for good (optimizer state) and which each step
makes again (see :mod:`cubepool.plan.planned`). Where the header names two steps it is
the setup and the first step, with that step run once more on the state it leaves (the
optimizer state and whatever else it keeps). For other traces it is the whole trace. The best
layouts of the search are then replayed on *perturbed replicas* of the derivation trace
(events moved a few places at random, which a different batch or kernel order would do)
and the one that reserves least on average wins: a layout that is best only for one exact
order of events falls off a cliff (one more page) on the next run.

Beside the plan (what the next run would reserve with the planned layout) it reports the
static placement of the whole trace (:mod:`cubepool.plan.static`): what a runtime that
knows this exact run in advance would reserve; the two are never presented as one.

It must scale to production traces of millions of events, so it replays no more than it
must, and no event crosses into Python (and past 50,000 events of the derivation trace
it searches a reduced candidate set, :data:`cubepool.plan.candidates.SCOPES`, and says
so). Its worker threads replay in waves, each seeing only what the waves before kept,
so its result and its count of replays do not depend on the threads' timing (the
count does on their number, the waves' size: a replay may stop earlier or later):

- *Pool by pool.* A layout without capped pools routes by size alone and never gives
  storage back, so it reserves the sum of what each pool reserves on the sizes routed to
  it (``_cubepool.pool_routes``, ``replay_until(..., sizes=...)``). Each pool's replay is
  kept and shared by the layouts that have it: the tail behind a size limit is replayed
  once, not once per page size. A direct tail is replayed like the other pools: it gives
  its cache back when the cache outgrows the most it ever had in use (the cache bound of
  ``direct()``), so its figures come from a replay, not from live counts, and a layout
  with such a tail reserves at most the sum of its pools' peaks. An exclusive tail is
  replayed in groups of sizes it serves apart (a page serves only requests that waste
  at most an eighth of it), each group's replay kept: the tails behind different page
  sizes differ in the few sizes near the page that the sliced pool takes, and share
  the rest.
- *Bounds.* A candidate is replayed only as far as it takes to show that it is out of
  the running: a replay stops as soon as its reserved bytes pass those of enough better
  layouts (``_cubepool.replay_until``), and a layout whose first pool alone would reserve
  too much (the pages the live bytes under its size limit fill) is not replayed at all.
  Each pool of a layout has a floor: at least the live peak of the sizes routed to it
  (``Trace.group_live_peaks``), in whole pages for a sliced pool, and at least one
  storage allocation per page (per live allocation for a tail). A pool's replay stops
  once it passes the bound less the others' replays or floors, the tail's first (its
  floor is the loose one); a layout whose floors already pass it is not replayed.
  What was stopped is kept with its bound, and before the search reads its ranking (the
  best few, the best by bytes, the best per shape) every candidate whose bound could
  still place it there is replayed to the end: the plan is exactly the one that
  replaying every candidate to the end gives (``tests/python/test_plan_scale.py`` checks it).
  The live peaks behind the floors are measured for all of a stage's pools in one pass
  over the trace (``Trace.group_live_peaks`` takes many groups at once).
- *Finalists cut short.* The robustness round first replays the searched finalist best
  on the derivation trace (the reference) on every replica: the chosen finalist's mean
  is at most the reference's. A finalist whose ratios so far, plus the least each later
  replica can add (1.0, as a pool holds every live byte, or its pools' floors there; 0
  for a preset), pass that mean is not replayed any more, and its replay of a replica
  stops once its reserved bytes pass what it could still afford. It cannot be chosen; it is reported
  apart (``Plan.pruned``) with a lower bound of its mean, and the other finalists'
  means are exactly those of replaying every finalist on every replica.
- *Rust.* The per-event work of deriving and perturbing traces runs in Rust
  (``Trace.with_step_repeated``, ``Trace.with_twins``, ``Trace.reordered_from_state``,
  which draws Python's ``random()`` numbers from the generator's state, so a seed makes
  the same replica as before; ``Trace.live_peaks``), and the perturbed replicas are
  made one at a time.
"""

from __future__ import annotations

from cubepool.plan.candidates import Layout, Progress
from cubepool.plan.derivation import derivation_trace, perturb
from cubepool.plan.planner import default_budget, plan
from cubepool.plan.result import Plan
from cubepool.plan.search import charged, largest_page

__all__ = [
    "Layout",
    "Plan",
    "Progress",
    "charged",
    "default_budget",
    "derivation_trace",
    "largest_page",
    "perturb",
    "plan",
]

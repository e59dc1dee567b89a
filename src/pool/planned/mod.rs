//! The planned pool: a placement of a run's requests (a [`Plan`](crate::plan_file::Plan))
//! followed at run time, with a virtual pool beside it for what the plan does not cover.
//!
//! A runtime sees the size and order of requests and where steps begin, so that is what
//! a request is matched by: the `k`-th request of `size` bytes since the last step
//! boundary takes the `k`-th planned offset of that size in the plan's phase for this
//! step (phase `p` after `p` boundaries; past the plan's last phase, its last one, or
//! the phases of its `"cycle"` in turn: see [`crate::plan_file`]),
//! where the orders of all requests agree: each entry has a position among the phase's
//! requests (optional entries not counted), and the request's own position, less the
//! drift the last matched request showed, may be at most [`ALIGN_WINDOW`] from it. An
//! entry planned further before is one the run did not make (passed over); one planned
//! further after belongs to a later request, and this request is one the plan did not
//! foresee (it misses without taking the entry, so the requests of its size after it
//! still match their own entries instead of each taking the next one's). Entries the
//! plan marks optional (blocks its first step kept, which a later step may make again
//! or not) are passed over where a live block holds their bytes. The block goes to its
//! planned offset when those bytes are free.
//!
//! Where those bytes are held (a block freed later than planned, requests of a size
//! made in another order), the request may take another entry of its size, among the
//! `FIT_REACH` (32) on either side of its own that no request of the step took, whose
//! bytes no live block holds and where the plan places no block whose planned lifetime
//! (the phase's `"ends"`) meets the request's own entry's: so it takes nobody's planned
//! bytes for as long as it is planned to live, and the entry's own request, if the run
//! makes it later, looks for another the same way. (Taking the next free offset planned
//! for the size without that check was tried: on the shared training traces it
//! cascades, each block taking the next one's place, and reserved 2-17 % more; so did
//! taking the free entry of the size nearest the request's own index.) From the plan's
//! cycle on (its last phase by default), a request still unplaced may take a free kept region of its size
//! (see the plan file's `"kept"`). A request the plan does not cover, at an offset the
//! alignment does not allow, or whose planned bytes a live block still holds with no
//! entry or kept region to take instead, goes to a [`VirtualPool`] beside the planned
//! arena and counts as a miss ([`PlannedStats`]); placements off the request's own
//! entry count as hits.
//!
//! INVARIANT: the pool never hands out bytes another live block holds. The arena's live
//! blocks are kept by offset and a block is placed only where none overlaps it; the
//! virtual pool has its own address range. `check_invariants` verifies it (blocks
//! disjoint, inside the arena) along with the mapping.
//!
//! The arena is one address range of the plan's height (rounded up to the granule),
//! mapped like the virtual pool's: each run of unmapped granules a new block touches is
//! mapped as one storage call; a mapped run no live block touches is idle. Idle runs stay
//! mapped (no storage call when the next step lands on them) while they do not take the
//! bytes mapped by the arena and the virtual pool together past the most mapped at once
//! so far (the high-water mark; while no request has missed, at least the plan's own peak
//! of mapped bytes at the pool's granule where the plan file gives one, its `"peaks"`: a
//! run that follows the plan maps that much anyway, so idle runs are not unmapped and
//! mapped again while the run grows to it); where a new map of either would, idle runs
//! are unmapped first, largest first, and an explicit cleanup unmaps them all. The virtual pool beside
//! unmaps eagerly (`keep = 0`): misses are few, and what they free goes back at once.
//! A placement is thus judged by the bytes it maps. A run partly touched is not idle, so
//! the mapped bytes may exceed those live blocks touch by such runs' untouched granules.

mod arena;
mod check;
mod granules;
mod lookup;
mod memory_pool;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use super::{extent_of, Books, Slab, SlotId, VirtualPool};
use crate::plan_file::{plan_of, LoadedPlan, PlanEntry, PlanId};
use crate::storage::StorageHandle;
use crate::usage::MemoryUsage;
use granules::{Calls, Granules};
use lookup::{spans_of, Spans};

/// The most granules an arena has (4 Mi: 8 TiB of 2 MiB granules); planned offsets past
/// it, or past the pool's range, are never used (those requests miss).
const MAX_ARENA_GRANULES: u64 = 1 << 22;

/// How far (in requests of any size) the plan's position of an entry may be from where
/// the run's request is expected in the plan's order for the request to take it: the
/// local reordering a run may show (a kernel launched a little earlier, a free that
/// comes late) without its requests taking entries meant for others.
pub const ALIGN_WINDOW: usize = 16;

/// How a planned pool has fared so far: requests placed as planned, and misses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PlannedStats {
    /// Requests placed in the arena: at their planned offset, or at another entry or a
    /// kept region of their size (see the module's docs).
    pub hits: u64,
    /// Requests the plan did not cover (served by the virtual pool beside the arena).
    pub misses_unplanned: u64,
    /// Requests whose planned bytes a live block still held (served by the virtual pool).
    pub misses_held: u64,
    /// Step boundaries seen.
    pub steps: u64,
}

impl PlannedStats {
    /// Every miss.
    pub fn misses(&self) -> u64 {
        self.misses_unplanned + self.misses_held
    }
}

/// Where one reservation of the pool is.
#[derive(Debug, Clone, Copy)]
enum Home {
    /// In the planned arena.
    Arena { offset: u64, size: u64, extent: u64 },
    /// In the virtual pool beside it, under this id.
    Beside(SlotId),
}

/// A pool that follows a [`Plan`](crate::plan_file::Plan) at run time, with a virtual
/// pool beside it for what the plan does not cover.
///
/// The `k`-th request of a size after `p` step boundaries ([`PlannedPool::step`]) takes
/// the `k`-th offset the plan's phase `p` (past its last, its last or the phases of its
/// cycle in turn) has for that size, when the
/// request's position in the step agrees with the entry's (within `ALIGN_WINDOW` (16),
/// see the module's docs) and no live block holds those bytes; otherwise it goes to the
/// virtual pool and counts as a miss.
/// It never hands out bytes a live block holds. The arena maps granules where live
/// blocks are, keeping idle ones under the high-water mark of the pool's mapped bytes.
#[derive(Debug, Clone)]
pub struct PlannedPool {
    plan: Arc<LoadedPlan>,
    /// Each plan phase's offsets by size, in request order.
    offsets: Vec<HashMap<u64, Vec<PlanEntry>>>,
    /// Each plan phase's entries with their planned lifetimes, as `(offset, end offset,
    /// position, end)` by offset: where a request placed off its own entry checks that
    /// no planned block meets it (empty for a phase whose plan gives no lifetimes).
    spans: Vec<Spans>,
    /// The plan's kept regions' offsets by size (see [`PlannedPool::place_kept`]).
    kept: HashMap<u64, Vec<u64>>,
    /// The first phase of the plan's cycle: the phases from it on are followed in turn
    /// after the last (see [`PlannedPool::plan_phase`]). Invariant: below the number of
    /// phases where there are any.
    cycle_start: usize,
    alignment: u64,
    /// The arena's bytes: the plan's furthest planned extent, rounded up to the granule.
    arena_size: u64,
    /// The arena's address range, reserved at its first block.
    range: Option<StorageHandle>,
    granules: Granules,
    /// The step boundaries seen, and how many requests of each size this step made.
    phase: usize,
    taken: HashMap<u64, usize>,
    /// The entries (size, index among the phase's entries of that size) a request of
    /// this step was placed at.
    used: HashSet<(u64, usize)>,
    /// Requests this step made, of every size.
    requests: usize,
    /// How many places the run's requests are behind (negative: ahead of) the plan's
    /// order: the position of the last request placed from the plan less its entry's.
    drift: i64,
    /// The arena's live blocks: offset -> end. Invariant: disjoint.
    live: BTreeMap<u64, u64>,
    homes: Slab<Home>,
    beside: VirtualPool,
    /// The most bytes mapped at once, arena and virtual pool together, since the last
    /// explicit cleanup: idle arena runs are kept only while they do not raise it (or
    /// the plan's peak, while the run follows the plan: see [`PlannedPool::water`]).
    high_water: u64,
    /// The bytes of granules the plan's blocks touch at once at this pool's granule
    /// (the plan file's `"peaks"`; 0 where it does not say).
    plan_peak: u64,
    /// The arena's own usage (mapped bytes as reserved).
    arena_usage: MemoryUsage,
    arena_calls: Calls,
    stats: PlannedStats,
    books: Books,
}

impl PlannedPool {
    /// A pool following plan `plan` in an arena of `granule`-byte granules (a power of
    /// two, a multiple of the storage's granularity: a granule of 0 books no arena, and
    /// the virtual pool beside refuses any granule but a power of two with
    /// [`PoolError::InvalidArgument`](crate::PoolError::InvalidArgument)), with a virtual pool of the same
    /// granule beside it (eager unmapping, every size in one range of `range` bytes of
    /// address space). Offsets the `alignment` does not allow, and blocks ending past
    /// `range` or 4 Mi granules, are never used (those requests miss).
    pub fn new(plan: PlanId, granule: u64, range: u64, alignment: u64) -> Self {
        Self::following(plan_of(plan), granule, range, alignment)
    }

    /// [`PlannedPool::new`] for a plan that is not interned (one read to test, say).
    pub fn following(plan: Arc<LoadedPlan>, granule: u64, range: u64, alignment: u64) -> Self {
        let furthest = plan
            .plan
            .phases
            .iter()
            .flat_map(|phase| &phase.requests)
            .filter_map(|&(size, offset)| extent_of(size, alignment)?.checked_add(offset))
            .max()
            .unwrap_or(0);
        // Bounded, so that a plan with a huge height cannot make the granule books huge.
        // A granule of 0 books no arena: every request goes beside, whose virtual pool
        // refuses that granule with a typed error.
        let granules = match granule {
            0 => 0,
            _ => furthest
                .div_ceil(granule)
                .min(MAX_ARENA_GRANULES)
                .min(range / granule),
        };
        let arena_size = granules * granule;
        let offsets = plan.plan.offsets_by_size();
        let spans = offsets
            .iter()
            .map(|entries| spans_of(entries, alignment))
            .collect();
        let plan_peak = plan
            .plan
            .peaks
            .iter()
            .find(|&&(of, _)| of == granule)
            .map_or(0, |&(_, bytes)| bytes.min(arena_size));
        let mut kept: HashMap<u64, Vec<u64>> = HashMap::new();
        for &(size, offset) in &plan.plan.kept {
            kept.entry(size).or_default().push(offset);
        }
        // A plan read from a file has 1 <= cycle <= phases; one built otherwise is
        // clamped into that range.
        let phases = plan.plan.phases.len();
        let cycle_start = phases.saturating_sub(plan.plan.cycle.clamp(1, phases.max(1)));
        Self {
            offsets,
            spans,
            kept,
            cycle_start,
            plan,
            alignment,
            arena_size,
            range: None,
            granules: Granules::new(granule, granules),
            phase: 0,
            taken: HashMap::new(),
            used: HashSet::new(),
            requests: 0,
            drift: 0,
            live: BTreeMap::new(),
            homes: Slab::default(),
            // Eager unmapping beside: misses are few, and what they free goes back at
            // once rather than sitting on top of the arena's kept runs.
            beside: VirtualPool::new(granule, range, 0, Some(0), alignment),
            high_water: 0,
            plan_peak,
            arena_usage: MemoryUsage::default(),
            arena_calls: Calls::default(),
            stats: PlannedStats::default(),
            books: Books::default(),
        }
    }

    /// The plan file this pool follows.
    pub fn plan_file(&self) -> &str {
        &self.plan.file
    }

    /// Hits and misses so far.
    pub fn planned_stats(&self) -> PlannedStats {
        self.stats
    }

    /// Marks a step boundary: the requests after it follow the plan's next phase.
    pub fn step(&mut self) {
        self.phase = self.phase.saturating_add(1);
        self.stats.steps += 1;
        self.taken.clear();
        self.used.clear();
        self.requests = 0;
        self.drift = 0;
    }
}

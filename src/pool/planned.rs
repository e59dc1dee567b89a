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

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use super::{
    ensure, extent_of, AcceptRule, Books, MemoryPool, Placement, Released, Slab, SlotId,
    VirtualPool,
};
use crate::error::PoolError;
use crate::plan_file::{plan_of, LoadedPlan, PlanEntry, PlanId};
use crate::storage::{ComputeStorage, MappingError, StorageHandle, VirtualMemory};
use crate::usage::MemoryUsage;

/// The most granules an arena has (4 Mi: 8 TiB of 2 MiB granules); planned offsets past
/// it, or past the pool's range, are never used (those requests miss).
const MAX_ARENA_GRANULES: u64 = 1 << 22;

/// How far (in requests of any size) the plan's position of an entry may be from where
/// the run's request is expected in the plan's order for the request to take it: the
/// local reordering a run may show (a kernel launched a little earlier, a free that
/// comes late) without its requests taking entries meant for others.
pub const ALIGN_WINDOW: usize = 16;

/// How many entries of its size on either side of its own a request whose own entry is
/// held looks through for one whose planned lifetime fits (bounds the work per miss).
const FIT_REACH: usize = 32;

/// A request placed off its own entry: its size and extent, where it is expected in
/// the plan's order, the entry it was planned at, and the plan phase it follows.
#[derive(Debug, Clone, Copy)]
struct Fit {
    size: u64,
    extent: u64,
    expected: i64,
    own: PlanEntry,
    phase: usize,
}

/// One planned block of a phase: `(offset, end offset, position, end)` (see
/// [`PlanEntry`]).
type Span = (u64, u64, usize, usize);

/// A phase's planned blocks (its entries, by size: [`Plan::offsets_by_size`]) by offset,
/// with the longest extent among them; none where the phase gives no lifetimes (or a
/// size the alignment cannot pad).
///
/// [`Plan::offsets_by_size`]: crate::plan_file::Plan::offsets_by_size
fn spans_of(entries: &HashMap<u64, Vec<PlanEntry>>, alignment: u64) -> (Vec<Span>, u64) {
    let mut spans = Vec::with_capacity(entries.values().map(Vec::len).sum());
    for (&size, entries) in entries {
        let Some(extent) = extent_of(size, alignment) else {
            return (Vec::new(), 0);
        };
        for entry in entries {
            // A plan gives an end for every request of a phase or for none.
            let Some(end) = entry.end else {
                return (Vec::new(), 0);
            };
            spans.push((
                entry.offset,
                entry.offset.saturating_add(extent),
                entry.position,
                end,
            ));
        }
    }
    spans.sort_unstable();
    let longest = spans.iter().map(|span| span.1 - span.0).max().unwrap_or(0);
    (spans, longest)
}

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

/// One mapped run of the arena's granules.
#[derive(Debug, Clone, Copy)]
struct Run {
    /// Its granules.
    len: u64,
    /// How many of them a live block touches.
    live: u64,
}

/// The arena's mapping, in granules: which a live block touches and which are mapped.
/// Invariants (checked by `check`): `touches[g]` counts the live blocks touching
/// granule `g`; every touched granule is mapped; the runs do not overlap and `mapped[g]`
/// says whether a run holds `g`; a run's `live` counts its touched granules; `idle`
/// holds exactly the runs with `live == 0`.
#[derive(Debug, Clone, Default)]
struct Granules {
    granule: u64,
    touches: Vec<u32>,
    mapped: Vec<bool>,
    /// Runs by first granule.
    runs: BTreeMap<u64, Run>,
    idle: BTreeSet<u64>,
    mapped_bytes: u64,
}

/// Storage calls made by one change of the mapping.
#[derive(Debug, Clone, Copy, Default)]
struct Calls {
    maps: u64,
    unmaps: u64,
}

impl Granules {
    fn new(granule: u64, count: u64) -> Self {
        Self {
            granule,
            touches: vec![0; count as usize],
            mapped: vec![false; count as usize],
            ..Self::default()
        }
    }

    /// The granules `offset..offset + extent` touches.
    fn span(&self, offset: u64, extent: u64) -> std::ops::Range<u64> {
        offset / self.granule..(offset + extent).div_ceil(self.granule)
    }

    /// The first granule of the run holding mapped granule `g`.
    fn run_start(&self, g: u64) -> u64 {
        *self
            .runs
            .range(..=g)
            .next_back()
            .expect("a mapped granule is in a run")
            .0
    }

    /// Touches the granules of a block; returns the unmapped granules it needs, as
    /// runs `(first, len)`.
    fn touch(&mut self, offset: u64, extent: u64) -> Vec<(u64, u64)> {
        let mut missing: Vec<(u64, u64)> = Vec::new();
        for g in self.span(offset, extent) {
            let i = g as usize;
            self.touches[i] += 1;
            if self.touches[i] > 1 {
                continue;
            }
            if self.mapped[i] {
                let start = self.run_start(g);
                let run = self.runs.get_mut(&start).expect("found");
                if run.live == 0 {
                    self.idle.remove(&start);
                }
                run.live += 1;
            } else {
                match missing.last_mut() {
                    Some((first, len)) if *first + *len == g => *len += 1,
                    _ => missing.push((g, 1)),
                }
            }
        }
        missing
    }

    /// Undoes [`Granules::touch`] for a block that was not placed after all (the
    /// missing runs were not mapped).
    fn untouch(&mut self, offset: u64, extent: u64) {
        for g in self.span(offset, extent) {
            let i = g as usize;
            self.touches[i] -= 1;
            if self.touches[i] == 0 && self.mapped[i] {
                let start = self.run_start(g);
                let run = self.runs.get_mut(&start).expect("found");
                run.live -= 1;
                if run.live == 0 {
                    self.idle.insert(start);
                }
            }
        }
    }

    /// Unmaps idle runs, largest first, until the mapped bytes are at most `goal` or
    /// none is left.
    fn unmap_idle(
        &mut self,
        memory: &mut dyn VirtualMemory,
        range: StorageHandle,
        goal: u64,
    ) -> Calls {
        let mut calls = Calls::default();
        let mut idle: Vec<(u64, u64)> = self.idle.iter().map(|&s| (self.runs[&s].len, s)).collect();
        idle.sort_unstable_by(|a, b| b.cmp(a));
        for (len, start) in idle {
            if self.mapped_bytes <= goal {
                break;
            }
            // An unmap of a run that one map made is never refused by a sound storage;
            // if it is, the run stays mapped and booked.
            if memory
                .unmap(range.id, start * self.granule, len * self.granule)
                .is_err()
            {
                continue;
            }
            self.idle.remove(&start);
            self.runs.remove(&start);
            for g in start..start + len {
                self.mapped[g as usize] = false;
            }
            self.mapped_bytes -= len * self.granule;
            calls.unmaps += 1;
        }
        calls
    }

    /// Maps the `missing` runs a touched block needs, unmapping idle runs first where
    /// the mapped bytes would pass `limit`; on a lack of memory, unmaps every idle run
    /// and tries once more. The storage calls made, failed or not, are added to `calls`.
    fn map(
        &mut self,
        memory: &mut dyn VirtualMemory,
        range: StorageHandle,
        missing: &[(u64, u64)],
        limit: u64,
        calls: &mut Calls,
    ) -> Result<(), MappingError> {
        let wanted: u64 = missing.iter().map(|run| run.1).sum::<u64>() * self.granule;
        if self.mapped_bytes + wanted > limit {
            let goal = limit.saturating_sub(wanted);
            calls.unmaps += self.unmap_idle(memory, range, goal).unmaps;
        }
        for (index, &(first, len)) in missing.iter().enumerate() {
            let mut result = memory.map(range.id, first * self.granule, len * self.granule);
            if matches!(result, Err(MappingError::OutOfMemory { .. })) && !self.idle.is_empty() {
                calls.unmaps += self.unmap_idle(memory, range, 0).unmaps;
                result = memory.map(range.id, first * self.granule, len * self.granule);
            }
            if let Err(error) = result {
                // Give back what this block mapped so far: its runs hold no other block.
                for &(done, done_len) in &missing[..index] {
                    let _ = memory.unmap(range.id, done * self.granule, done_len * self.granule);
                    self.runs.remove(&done);
                    for g in done..done + done_len {
                        self.mapped[g as usize] = false;
                    }
                    self.mapped_bytes -= done_len * self.granule;
                    calls.unmaps += 1;
                }
                return Err(error);
            }
            self.runs.insert(first, Run { len, live: len });
            for g in first..first + len {
                self.mapped[g as usize] = true;
            }
            self.mapped_bytes += len * self.granule;
            calls.maps += 1;
        }
        Ok(())
    }

    /// Checks the invariants against the live blocks `(offset, extent)`.
    fn check(&self, blocks: &[(u64, u64)]) -> Result<(), String> {
        let mut touches = vec![0u32; self.touches.len()];
        for &(offset, extent) in blocks {
            for g in self.span(offset, extent) {
                touches[g as usize] += 1;
            }
        }
        ensure(touches == self.touches, || {
            "granule touch counts drifted".into()
        })?;
        let mut mapped = vec![false; self.mapped.len()];
        let mut bytes = 0;
        for (&start, run) in &self.runs {
            let mut live = 0;
            for g in start..start + run.len {
                ensure(!mapped[g as usize], || {
                    format!("runs overlap at granule {g}")
                })?;
                mapped[g as usize] = true;
                live += u64::from(touches[g as usize] > 0);
            }
            ensure(live == run.live, || {
                format!("run at granule {start}: live count drifted")
            })?;
            ensure((run.live == 0) == self.idle.contains(&start), || {
                format!("run at granule {start}: idle set drifted")
            })?;
            bytes += run.len * self.granule;
        }
        ensure(mapped == self.mapped, || "mapped granules drifted".into())?;
        ensure(bytes == self.mapped_bytes, || "mapped bytes drifted".into())?;
        ensure(
            touches.iter().zip(&mapped).all(|(&t, &m)| t == 0 || m),
            || "a live block touches an unmapped granule".into(),
        )
    }
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
    /// position, end)` by offset, and the longest extent among them: where a request
    /// placed off its own entry checks that no planned block meets it (empty for a
    /// phase whose plan gives no lifetimes).
    spans: Vec<(Vec<Span>, u64)>,
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
    /// two, a multiple of the storage's granularity), with a virtual pool of the same
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
        let granules = furthest
            .div_ceil(granule)
            .min(MAX_ARENA_GRANULES)
            .min(range / granule);
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
            granules: Granules::new(granule, arena_size / granule),
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

    /// Places a request of `size` bytes (`extent` with padding) at its planned offset:
    /// the `k`-th of that size in this step's phase, where entries planned more than
    /// [`ALIGN_WINDOW`] before where the request is expected in the plan's order, and
    /// optional entries a live block holds, are passed over (the run did not make
    /// them); an entry planned more than that after it is left for a later request.
    /// Where that entry's bytes are held, or another request took it, tries another
    /// entry whose planned lifetime fits ([`PlannedPool::place_fitting`]), then a kept
    /// region ([`PlannedPool::place_kept`]). Counts the request and books a hit or a miss.
    fn place_planned(
        &mut self,
        storage: &mut dyn ComputeStorage,
        size: u64,
        extent: Option<u64>,
    ) -> Result<Option<Placement>, PoolError> {
        let mut k = self.taken.get(&size).copied().unwrap_or(0);
        let position = i64::try_from(self.requests).unwrap_or(i64::MAX);
        self.requests = self.requests.saturating_add(1);
        let window = ALIGN_WINDOW as i64;
        // Where in the plan's order this request is expected: its own position, less
        // the drift the last request placed from the plan showed.
        let expected = position.saturating_sub(self.drift);
        let (Some(last), Some(extent)) = (self.offsets.len().checked_sub(1), extent) else {
            self.stats.misses_unplanned += 1;
            return Ok(None);
        };
        let phase = self.plan_phase(last);
        let entries = self.offsets[phase]
            .get(&size)
            .map_or(&[][..], Vec::as_slice);
        let first = k;
        let mut chosen = None;
        while let Some(entry) = entries.get(k) {
            let at = i64::try_from(entry.position).unwrap_or(i64::MAX);
            // An entry planned well before this request is one the run did not
            // make: passed over. One planned well after it belongs to a later
            // request: this one is a request the plan did not foresee.
            if at < expected.saturating_sub(window)
                || entry.optional && self.held(entry.offset, entry.offset.saturating_add(extent))
            {
                k += 1;
                continue;
            }
            if at <= expected.saturating_add(window) {
                chosen = Some((k, *entry));
                k += 1;
            }
            break;
        }
        // The entries a request whose own entry is held may take instead.
        let around =
            first.saturating_sub(FIT_REACH)..entries.len().min(k.saturating_add(FIT_REACH));
        if let Some((_, entry)) = chosen {
            self.drift = position.saturating_sub(entry.position as i64);
        }
        self.taken.insert(size, k);
        let mut placed = None;
        if let Some((index, entry)) = chosen {
            if entry.offset % self.alignment == 0 && self.used.insert((size, index)) {
                placed = self.place_in_arena(storage, entry.offset, size, extent)?;
                if placed.is_none() {
                    self.used.remove(&(size, index));
                }
            }
            if placed.is_none() {
                let fit = Fit {
                    size,
                    extent,
                    expected,
                    own: entry,
                    phase,
                };
                placed = self.place_fitting(storage, fit, around)?;
            }
        }
        if placed.is_none() {
            placed = self.place_kept(storage, size, extent)?;
        }
        match (placed, chosen) {
            (Some(_), _) => self.stats.hits += 1,
            (None, None) => self.stats.misses_unplanned += 1,
            (None, Some(_)) => self.stats.misses_held += 1,
        }
        Ok(placed)
    }

    /// The plan phase the run's current phase follows, given the plan's `last` phase:
    /// the run's own where the plan has it, else the phases from `cycle_start` on in
    /// turn (the last one alone where the plan gives no cycle).
    fn plan_phase(&self, last: usize) -> usize {
        if self.phase <= last {
            return self.phase;
        }
        let start = self.cycle_start.min(last);
        start + (self.phase - start) % (last + 1 - start)
    }

    /// Places a request whose own entry (`fit.own`) is held, or was taken by another
    /// request out of order, at another entry of its size (among the phase's entries
    /// of that size with indices `around`, in plan order) that no request of this step
    /// took, whose bytes no live block holds, and where the plan places no block whose
    /// planned lifetime meets the request's (taken to be its own entry's, from
    /// `fit.expected` to `fit.own.end`). That entry's request, if the run makes it
    /// later, then finds it taken and looks for another the same way. `Ok(None)` where
    /// none fits or the plan gives no lifetimes.
    fn place_fitting(
        &mut self,
        storage: &mut dyn ComputeStorage,
        fit: Fit,
        around: std::ops::Range<usize>,
    ) -> Result<Option<Placement>, PoolError> {
        let Some(own_end) = fit.own.end else {
            return Ok(None);
        };
        let from = usize::try_from(fit.expected.max(0)).unwrap_or(usize::MAX);
        for index in around {
            let Some(&entry) = self.offsets[fit.phase]
                .get(&fit.size)
                .and_then(|entries| entries.get(index))
            else {
                break;
            };
            if entry.optional
                || entry.offset % self.alignment != 0
                || self.used.contains(&(fit.size, index))
                || self.held(entry.offset, entry.offset.saturating_add(fit.extent))
                || !self.free_in_plan(fit.phase, entry.offset, fit.extent, from, own_end)
            {
                continue;
            }
            if let Some(placed) =
                self.place_in_arena(storage, entry.offset, fit.size, fit.extent)?
            {
                self.used.insert((fit.size, index));
                return Ok(Some(placed));
            }
        }
        Ok(None)
    }

    /// Whether no block plan phase `phase` places in `offset..offset + extent` has a
    /// planned lifetime that meets `from..to` (positions in the phase's order); false
    /// where the plan gives no lifetimes.
    fn free_in_plan(&self, phase: usize, offset: u64, extent: u64, from: usize, to: usize) -> bool {
        let Some((spans, longest)) = self.spans.get(phase) else {
            return false;
        };
        if spans.is_empty() {
            return false;
        }
        let end = offset.saturating_add(extent);
        let low = spans.partition_point(|span| span.0.saturating_add(*longest) <= offset);
        spans[low..]
            .iter()
            .take_while(|span| span.0 < end)
            .all(|&(_, stop, position, finish)| stop <= offset || position >= to || finish <= from)
    }

    /// Places a request its own entry could not serve in a kept region of its size
    /// (the first, in the plan's order, that no live block holds), from the plan's
    /// cycle on (its last phase where it gives no cycle): the plan holds a kept region from its block's request to the end of
    /// the run, so no planned block of a later step lands on it, and a block there
    /// takes no one's planned bytes. Such a request is a later step making again a
    /// block the first step kept (the gradients), or one of a step run in another
    /// order. `Ok(None)` when no kept region of the size is free.
    fn place_kept(
        &mut self,
        storage: &mut dyn ComputeStorage,
        size: u64,
        extent: u64,
    ) -> Result<Option<Placement>, PoolError> {
        if self.phase < self.cycle_start {
            return Ok(None);
        }
        let Some(regions) = self.kept.get(&size) else {
            return Ok(None);
        };
        let free = regions.iter().copied().find(|&offset| {
            offset % self.alignment == 0 && !self.held(offset, offset.saturating_add(extent))
        });
        match free {
            Some(offset) => self.place_in_arena(storage, offset, size, extent),
            None => Ok(None),
        }
    }

    /// Whether a live arena block overlaps `offset..end`.
    fn held(&self, offset: u64, end: u64) -> bool {
        self.live
            .range(..end)
            .next_back()
            .is_some_and(|(_, &live_end)| live_end > offset)
    }

    /// Places a block of `size` bytes at `offset` of the arena, mapping what it
    /// touches; `Ok(None)` when the bytes are held or the mapping cannot be made for
    /// memory (the request then goes beside).
    fn place_in_arena(
        &mut self,
        storage: &mut dyn ComputeStorage,
        offset: u64,
        size: u64,
        extent: u64,
    ) -> Result<Option<Placement>, PoolError> {
        // A plan file's offset near u64::MAX (a crafted file) overflows: it goes beside.
        let Some(end) = offset.checked_add(extent) else {
            return Ok(None);
        };
        if end > self.arena_size || self.held(offset, end) {
            return Ok(None);
        }
        let Some(memory) = storage.virtual_memory() else {
            return Ok(None);
        };
        let range = match self.range {
            Some(range) => range,
            None => {
                let granularity = memory.granularity();
                if granularity == 0 || self.granules.granule % granularity != 0 {
                    return Err(PoolError::Storage {
                        reason: format!(
                            "the planned pool's granule ({} bytes) is not a multiple of the \
                             storage's granularity ({granularity} bytes)",
                            self.granules.granule
                        ),
                    });
                }
                match memory.reserve_range(self.arena_size, self.granules.granule) {
                    Ok(range) => *self.range.insert(range),
                    Err(_) => return Ok(None),
                }
            }
        };
        let missing = self.granules.touch(offset, extent);
        if !missing.is_empty() {
            let mut calls = Calls::default();
            let limit = self
                .water()
                .saturating_sub(self.beside.usage().bytes_reserved);
            let mapped = self
                .granules
                .map(memory, range, &missing, limit, &mut calls);
            self.booked(calls);
            if mapped.is_err() {
                self.granules.untouch(offset, extent);
                return Ok(None);
            }
        }
        self.live.insert(offset, end);
        self.arena_usage.add(size, extent);
        let slot = self.homes.insert(Home::Arena {
            offset,
            size,
            extent,
        });
        Ok(Some(Placement {
            slot,
            storage: range,
            offset,
            size,
        }))
    }

    /// Books the storage calls of a change of the arena's mapping.
    fn booked(&mut self, calls: Calls) {
        self.arena_calls.maps += calls.maps;
        self.arena_calls.unmaps += calls.unmaps;
        self.arena_usage.bytes_reserved = self.granules.mapped_bytes;
    }

    /// Unmaps idle arena runs where a block of `size` bytes mapped beside would take
    /// the mapped bytes past the high-water mark.
    fn make_room_beside(&mut self, storage: &mut dyn ComputeStorage, size: u64) {
        if self.granules.idle.is_empty() {
            return;
        }
        let granule = self.granules.granule;
        let wanted = size.div_ceil(granule).saturating_mul(granule);
        let beside = self.beside.usage().bytes_reserved;
        if self.granules.mapped_bytes + beside + wanted > self.water() {
            if let Some(memory) = storage.virtual_memory() {
                let goal = self.water().saturating_sub(beside + wanted);
                self.unmap_idle(memory, goal);
            }
        }
    }

    /// What idle arena runs are kept under: the high-water mark, or the plan's own peak
    /// while the run has followed the plan without a miss (it maps that much anyway, so
    /// idle runs are not unmapped and mapped again as it grows). Once a request misses,
    /// the run has left the plan, and granules kept for planned blocks could end up
    /// partly touched by others (a run partly touched is not idle): the mark alone.
    fn water(&self) -> u64 {
        if self.stats.misses() == 0 {
            self.high_water.max(self.plan_peak)
        } else {
            self.high_water
        }
    }

    /// Recomputes the pool's books from the arena's and the virtual pool's.
    fn rebook(&mut self) {
        let beside = self.beside.books();
        let usage = self.arena_usage.combine(beside.usage);
        self.high_water = self.high_water.max(usage.bytes_reserved);
        let stats = &mut self.books.stats;
        stats.pages = self.arena_calls.maps - self.arena_calls.unmaps + beside.stats.pages;
        stats.pages_peak = stats.pages_peak.max(stats.pages);
        stats.pages_unmapped = self.arena_calls.unmaps + beside.stats.pages_unmapped;
        stats.bytes_reserved_peak = stats.bytes_reserved_peak.max(usage.bytes_reserved);
        stats.bytes_in_use_peak = stats.bytes_in_use_peak.max(usage.bytes_in_use);
        self.books.usage = usage;
    }

    /// Unmaps every idle run of the arena.
    fn unmap_idle(&mut self, memory: &mut dyn VirtualMemory, goal: u64) {
        if let Some(range) = self.range {
            let calls = self.granules.unmap_idle(memory, range, goal);
            self.booked(calls);
        }
    }
}

impl MemoryPool for PlannedPool {
    fn accept_rule(&self) -> AcceptRule {
        self.beside.accept_rule()
    }

    fn reserve(
        &mut self,
        storage: &mut dyn ComputeStorage,
        size: u64,
    ) -> Result<Placement, PoolError> {
        let placed = self.place_planned(storage, size, extent_of(size, self.alignment))?;
        let placement = match placed {
            Some(placement) => placement,
            None => {
                self.make_room_beside(storage, size);
                let inner = self.beside.reserve(storage, size);
                let inner = match inner {
                    Ok(inner) => inner,
                    Err(error) => {
                        self.rebook();
                        return Err(error);
                    }
                };
                Placement {
                    slot: self.homes.insert(Home::Beside(inner.slot)),
                    ..inner
                }
            }
        };
        self.rebook();
        self.books.stats.largest_alloc = self.books.stats.largest_alloc.max(size);
        Ok(placement)
    }

    fn release(&mut self, slot: SlotId) -> Result<Released, PoolError> {
        let home = self.homes.remove(slot).ok_or_else(|| PoolError::NotFound {
            reason: format!("block {} is not reserved in this planned pool", slot.index),
        })?;
        let released = match home {
            Home::Arena {
                offset,
                size,
                extent,
            } => {
                self.live.remove(&offset);
                self.granules.untouch(offset, extent);
                self.arena_usage.remove(size, extent);
                Released { size, extent }
            }
            Home::Beside(inner) => self.beside.release(inner)?,
        };
        self.rebook();
        Ok(released)
    }

    fn release_with(
        &mut self,
        storage: &mut dyn ComputeStorage,
        slot: SlotId,
    ) -> Result<Released, PoolError> {
        match self.homes.get(slot).copied() {
            Some(Home::Beside(inner)) => {
                self.homes.remove(slot);
                let released = self.beside.release_with(storage, inner)?;
                self.rebook();
                Ok(released)
            }
            _ => self.release(slot),
        }
    }

    fn locate(&self, slot: SlotId) -> Option<Placement> {
        match *self.homes.get(slot)? {
            Home::Arena { offset, size, .. } => Some(Placement {
                slot,
                storage: self.range?,
                offset,
                size,
            }),
            Home::Beside(inner) => Some(Placement {
                slot,
                ..self.beside.locate(inner)?
            }),
        }
    }

    fn cleanup(&mut self, storage: &mut dyn ComputeStorage, reserve_count: u64, explicit: bool) {
        self.beside.cleanup(storage, reserve_count, explicit);
        if explicit {
            if let Some(memory) = storage.virtual_memory() {
                self.unmap_idle(memory, 0);
                self.high_water = self.granules.mapped_bytes + self.beside.usage().bytes_reserved;
            }
        }
        self.rebook();
    }

    fn books(&self) -> &Books {
        &self.books
    }

    fn books_mut(&mut self) -> &mut Books {
        &mut self.books
    }

    fn check_invariants(&self) -> Result<(), String> {
        self.beside.check_invariants()?;
        let mut blocks = Vec::new();
        let mut usage = MemoryUsage::default();
        for (_, home) in self.homes.iter() {
            if let Home::Arena {
                offset,
                size,
                extent,
            } = *home
            {
                ensure(self.live.get(&offset) == Some(&(offset + extent)), || {
                    format!("block at {offset} is not booked live")
                })?;
                blocks.push((offset, extent));
                usage.add(size, extent);
            }
        }
        ensure(blocks.len() == self.live.len(), || {
            "live blocks drifted".into()
        })?;
        let mut previous_end = 0;
        for (&offset, &end) in &self.live {
            ensure(offset >= previous_end, || {
                format!("two live blocks overlap at offset {offset}")
            })?;
            ensure(end <= self.arena_size, || {
                format!("block at {offset} ends past the arena")
            })?;
            previous_end = end;
        }
        self.granules.check(&blocks)?;
        usage.bytes_reserved = self.granules.mapped_bytes;
        ensure(usage == self.arena_usage, || {
            format!(
                "arena usage drifted: {:?} booked, {usage:?} found",
                self.arena_usage
            )
        })?;
        ensure(
            self.books.usage == self.arena_usage.combine(self.beside.usage()),
            || "the pool's usage is not the arena's plus the virtual pool's".into(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan_file::{intern_plan, Plan, PlanPhase};
    use crate::VirtualStorage;

    const G: u64 = 4096;

    fn pool(phases: Vec<Vec<(u64, u64)>>, height: u64) -> PlannedPool {
        let phases = phases
            .into_iter()
            .map(|requests| PlanPhase::new("p", requests));
        let plan = Plan {
            height,
            phases: phases.collect(),
            kept: Vec::new(),
            source: None,
            granule: None,
            peaks: Vec::new(),
            cycle: 1,
        };
        PlannedPool::new(intern_plan("test", plan), G, 1 << 30, 256)
    }

    #[test]
    fn requests_follow_the_plan_by_size_and_order_and_steps() {
        let mut storage = VirtualStorage::new().with_granularity(G);
        let mut pool = pool(vec![vec![(1000, 0), (2000, 4096), (1000, 8192)]], 3 * G);
        let a = pool.reserve(&mut storage, 1000).unwrap();
        let b = pool.reserve(&mut storage, 1000).unwrap();
        let c = pool.reserve(&mut storage, 2000).unwrap();
        assert_eq!((a.offset, b.offset, c.offset), (0, 8192, 4096));
        assert_eq!(pool.planned_stats().hits, 3);
        // A fourth request of 1000 bytes is not planned: it goes beside.
        let d = pool.reserve(&mut storage, 1000).unwrap();
        assert_ne!(d.storage.id, a.storage.id);
        assert_eq!(pool.planned_stats().misses_unplanned, 1);
        pool.check_invariants().unwrap();
        // Next step: `a` is still live, so the first request of 1000 bytes misses.
        pool.step();
        pool.release(b.slot).unwrap();
        let e = pool.reserve(&mut storage, 1000).unwrap();
        assert_ne!(e.storage.id, a.storage.id);
        assert_eq!(pool.planned_stats().misses_held, 1);
        let f = pool.reserve(&mut storage, 1000).unwrap();
        assert_eq!((f.storage.id, f.offset), (a.storage.id, 8192));
        pool.check_invariants().unwrap();
        for slot in [a.slot, c.slot, d.slot, e.slot, f.slot] {
            pool.release_with(&mut storage, slot).unwrap();
        }
        pool.cleanup(&mut storage, 0, true);
        pool.check_invariants().unwrap();
        assert_eq!(pool.usage().bytes_reserved, 0);
        assert_eq!(pool.usage().number_allocs, 0);
    }

    #[test]
    fn the_steps_after_the_plan_follow_its_cycle_in_turn() {
        // Each step makes a block again while the last step's copy lives, then frees
        // the old copy: the plan's last two phases place the copies in turns.
        for (cycle, misses) in [(2, 0), (1, 2)] {
            let plan = Plan {
                height: 2 * G,
                phases: vec![
                    PlanPhase::new("setup", Vec::new()),
                    PlanPhase::new("a", vec![(G, 0)]),
                    PlanPhase::new("b", vec![(G, G)]),
                ],
                kept: Vec::new(),
                source: None,
                granule: None,
                peaks: Vec::new(),
                cycle,
            };
            let mut pool = PlannedPool::new(intern_plan("cycle", plan), G, 1 << 30, 256);
            let mut storage = VirtualStorage::new().with_granularity(G);
            let mut offsets = Vec::new();
            let mut last = None;
            for _ in 0..6 {
                pool.step();
                let block = pool.reserve(&mut storage, G).unwrap();
                offsets.push(block.offset);
                if let Some(old) = last.replace(block.slot) {
                    pool.release_with(&mut storage, old).unwrap();
                }
                pool.check_invariants().unwrap();
            }
            assert_eq!(pool.planned_stats().misses(), misses, "cycle {cycle}");
            if cycle == 2 {
                assert_eq!(offsets, [0, G, 0, G, 0, G]);
                assert_eq!(pool.usage().bytes_reserved, 2 * G);
            }
        }
    }

    #[test]
    fn a_request_its_entry_cannot_serve_takes_a_free_kept_region_of_its_size() {
        let mut storage = VirtualStorage::new().with_granularity(G);
        // Setup keeps a block of 100 bytes at 0 (the plan's kept region); the steady
        // step plans one request of 100 bytes at G.
        let plan = Plan {
            height: 3 * G,
            phases: vec![
                PlanPhase::new("setup", vec![(100, 0)]),
                PlanPhase::new("step", vec![(100, G)]),
            ],
            kept: vec![(100, 0), (100, 2 * G + 1)],
            source: None,
            granule: None,
            peaks: Vec::new(),
            cycle: 1,
        };
        let mut pool = PlannedPool::new(intern_plan("kept", plan), G, 1 << 30, 256);
        let kept = pool.reserve(&mut storage, 100).unwrap();
        assert_eq!(kept.offset, 0);
        // In setup (not the last phase) a second request misses: kept regions are
        // used from the steady step on.
        let early = pool.reserve(&mut storage, 100).unwrap();
        assert_ne!(early.storage.id, kept.storage.id);
        pool.step();
        let a = pool.reserve(&mut storage, 100).unwrap();
        assert_eq!((a.storage.id, a.offset), (kept.storage.id, G));
        // Unplanned, and the kept region at 0 is held (the one at 2G + 1 is not
        // aligned): it goes beside.
        let b = pool.reserve(&mut storage, 100).unwrap();
        assert_ne!(b.storage.id, kept.storage.id);
        assert_eq!(pool.planned_stats().misses_unplanned, 2);
        // Once the kept block is released, the next unplanned request takes its region.
        pool.release(kept.slot).unwrap();
        let c = pool.reserve(&mut storage, 100).unwrap();
        assert_eq!((c.storage.id, c.offset), (a.storage.id, 0));
        assert_eq!(pool.planned_stats().hits, 3);
        pool.check_invariants().unwrap();
        for slot in [early.slot, a.slot, b.slot, c.slot] {
            pool.release_with(&mut storage, slot).unwrap();
        }
        pool.check_invariants().unwrap();
    }

    #[test]
    fn a_request_whose_entry_is_held_takes_an_entry_whose_planned_lifetime_fits() {
        let mut storage = VirtualStorage::new().with_granularity(G);
        let phase = |name, requests, ends| PlanPhase {
            ends,
            ..PlanPhase::new(name, requests)
        };
        // The step plans three requests of 100 bytes: at 0 (until position 1), at G
        // (from position 1 to 3) and at 2G (from position 2 to 3).
        let plan = Plan {
            height: 3 * G,
            phases: vec![
                phase("p0", vec![(100, 0)], vec![1]),
                phase("p1", vec![(100, 0), (100, G), (100, 2 * G)], vec![1, 3, 3]),
            ],
            kept: Vec::new(),
            source: None,
            granule: None,
            peaks: Vec::new(),
            cycle: 1,
        };
        let mut pool = PlannedPool::new(intern_plan("fit", plan), G, 1 << 30, 256);
        let late = pool.reserve(&mut storage, 100).unwrap();
        pool.step();
        // `late` still holds 0: the first request takes G, planned free until position 1.
        let a = pool.reserve(&mut storage, 100).unwrap();
        assert_eq!((a.storage.id, a.offset), (late.storage.id, G));
        // The second finds its entry (G) taken; 0 is held, and 2G is planned for a
        // block whose lifetime meets its own: it misses.
        let b = pool.reserve(&mut storage, 100).unwrap();
        assert_ne!(b.storage.id, late.storage.id);
        assert_eq!(pool.planned_stats().misses_held, 1);
        // The third takes its own entry.
        let c = pool.reserve(&mut storage, 100).unwrap();
        assert_eq!((c.storage.id, c.offset), (late.storage.id, 2 * G));
        assert_eq!(pool.planned_stats().hits, 3);
        pool.check_invariants().unwrap();
        // Without lifetimes in the plan, the first request would have missed.
        let plan = Plan {
            height: 3 * G,
            phases: vec![
                PlanPhase::new("p0", vec![(100, 0)]),
                PlanPhase::new("p1", vec![(100, 0), (100, G), (100, 2 * G)]),
            ],
            kept: Vec::new(),
            source: None,
            granule: None,
            peaks: Vec::new(),
            cycle: 1,
        };
        let mut pool = PlannedPool::new(intern_plan("no fit", plan), G, 1 << 30, 256);
        pool.reserve(&mut storage, 100).unwrap();
        pool.step();
        pool.reserve(&mut storage, 100).unwrap();
        assert_eq!(pool.planned_stats().misses_held, 1);
    }

    #[test]
    fn optional_entries_held_by_a_live_block_are_passed_over() {
        let mut storage = VirtualStorage::new().with_granularity(G);
        let plan = Plan {
            height: 3 * G,
            phases: vec![PlanPhase {
                optional: vec![0],
                ..PlanPhase::new("step", vec![(100, 0), (100, G), (100, 2 * G)])
            }],
            kept: Vec::new(),
            source: None,
            granule: None,
            peaks: Vec::new(),
            cycle: 1,
        };
        let mut pool = PlannedPool::new(intern_plan("optional", plan), G, 1 << 30, 256);
        let kept = pool.reserve(&mut storage, 100).unwrap();
        assert_eq!(kept.offset, 0);
        pool.step();
        // The optional first entry is held by `kept`: the request takes the second.
        let a = pool.reserve(&mut storage, 100).unwrap();
        let b = pool.reserve(&mut storage, 100).unwrap();
        assert_eq!((a.offset, b.offset), (G, 2 * G));
        pool.step();
        pool.release(kept.slot).unwrap();
        pool.release(a.slot).unwrap();
        // Free again, it is taken.
        let c = pool.reserve(&mut storage, 100).unwrap();
        assert_eq!(c.offset, 0);
        assert_eq!(pool.planned_stats().misses(), 0);
        pool.check_invariants().unwrap();
    }

    #[test]
    fn requests_match_where_the_orders_agree() {
        let mut storage = VirtualStorage::new().with_granularity(G);
        // Two of 100 bytes far apart in the step, with 40 of 200 bytes between them.
        let mut requests = vec![(100, 0)];
        requests.extend((1..=40).map(|i| (200, i * G)));
        requests.push((100, 41 * G));
        let mut pool = pool(vec![requests], 42 * G);
        // A request of 100 bytes the plan did not foresee, at the step's start: the
        // second entry is planned 41 requests later, so it is left for its own request.
        let first = pool.reserve(&mut storage, 100).unwrap();
        assert_eq!(first.offset, 0);
        let extra = pool.reserve(&mut storage, 100).unwrap();
        assert_ne!(extra.storage.id, first.storage.id, "beside");
        assert_eq!(pool.planned_stats().misses_unplanned, 1);
        let mut blocks = vec![first.slot, extra.slot];
        for i in 1..=40 {
            let block = pool.reserve(&mut storage, 200).unwrap();
            assert_eq!(block.offset, i * G, "the extra request shifted nothing");
            blocks.push(block.slot);
        }
        let last = pool.reserve(&mut storage, 100).unwrap();
        assert_eq!(last.offset, 41 * G);
        assert_eq!(pool.planned_stats().hits, 42);
        blocks.push(last.slot);
        pool.check_invariants().unwrap();
        // Next step: the run does not make the first request of 100 bytes. When the
        // second comes, the first entry is planned 41 requests before: passed over.
        pool.step();
        for slot in blocks {
            pool.release(slot).unwrap();
        }
        let mut blocks = Vec::new();
        for i in 1..=40 {
            let block = pool.reserve(&mut storage, 200).unwrap();
            assert_eq!(block.offset, i * G);
            blocks.push(block.slot);
        }
        let last = pool.reserve(&mut storage, 100).unwrap();
        assert_eq!(
            (last.storage.id, last.offset),
            (first.storage.id, 41 * G),
            "its own entry, not the first"
        );
        assert_eq!(pool.planned_stats().hits, 42 + 41);
        pool.check_invariants().unwrap();
    }

    #[test]
    fn a_plan_past_the_range_is_not_used_and_costs_no_books() {
        let mut storage = VirtualStorage::new().with_granularity(G);
        let far = u64::MAX / 2;
        let mut pool = pool(vec![vec![(100, far), (100, 0)]], far + 100);
        assert!(pool.granules.touches.len() <= (1 << 30) / G as usize);
        let a = pool.reserve(&mut storage, 100).unwrap();
        let b = pool.reserve(&mut storage, 100).unwrap();
        assert_eq!(
            pool.planned_stats().misses_held,
            1,
            "past the range: beside"
        );
        assert_ne!(a.storage.id, b.storage.id);
        assert_eq!(
            (b.offset, pool.planned_stats().hits),
            (0, 1),
            "the rest is followed"
        );
        pool.check_invariants().unwrap();
    }

    #[test]
    fn idle_runs_stay_mapped_for_the_next_step() {
        let mut storage = VirtualStorage::new().with_granularity(G);
        let mut pool = pool(vec![vec![(G, 0), (G, G)]], 2 * G);
        for _ in 0..3 {
            let a = pool.reserve(&mut storage, G).unwrap();
            let b = pool.reserve(&mut storage, G).unwrap();
            pool.release(a.slot).unwrap();
            pool.release(b.slot).unwrap();
            pool.step();
        }
        pool.check_invariants().unwrap();
        assert_eq!(pool.stats().pages_peak, 2, "mapped once, reused");
        assert_eq!(pool.usage().bytes_reserved, 2 * G);
    }

    #[test]
    fn idle_runs_stay_mapped_up_to_the_plans_peak() {
        // `a` at 0 is freed before `b` at G, then `c` at 0 lives beside `b`: the plan
        // touches two granules at once. Knowing that, the pool keeps `a`'s granule mapped
        // for `c` instead of unmapping it when `b` first raises the mapped bytes.
        // After a miss (a request of a size the plan does not make, first) the run has
        // left the plan: the pool goes back to its own high-water mark.
        let peaks = vec![(G, 2 * G), (4 * G, 4 * G)];
        for (peaks, miss, unmaps) in [
            (Vec::new(), false, 1),
            (peaks.clone(), false, 0),
            (peaks, true, 1),
        ] {
            let plan = Plan {
                height: 2 * G,
                phases: vec![PlanPhase::new("p", vec![(G, 0), (G, G), (G, 0)])],
                kept: Vec::new(),
                source: None,
                granule: None,
                peaks,
                cycle: 1,
            };
            let mut pool = PlannedPool::new(intern_plan("peaks", plan), G, 1 << 30, 256);
            let mut storage = VirtualStorage::new().with_granularity(G);
            if miss {
                let beside = pool.reserve(&mut storage, 256).unwrap();
                pool.release(beside.slot).unwrap();
                // The virtual pool beside unmaps what it freed (one unmap).
                pool.cleanup(&mut storage, 1, false);
            }
            let a = pool.reserve(&mut storage, G).unwrap();
            pool.release(a.slot).unwrap();
            let b = pool.reserve(&mut storage, G).unwrap();
            let c = pool.reserve(&mut storage, G).unwrap();
            assert_eq!((b.offset, c.offset), (G, 0));
            pool.check_invariants().unwrap();
            assert_eq!(pool.stats().pages_unmapped - u64::from(miss), unmaps);
            assert_eq!(pool.stats().bytes_reserved_peak, 2 * G);
            assert_eq!(pool.planned_stats().hits, 3);
            assert_eq!(pool.planned_stats().misses(), u64::from(miss));
        }
    }
}

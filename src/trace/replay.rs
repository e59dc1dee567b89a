//! Replays a trace through a pool layout on virtual storage, and measures it.
//!
//! Besides the peaks, a replay keeps a bounded time series: the events are cut into at
//! most [`ReplayOptions::samples`] runs of consecutive events, and each run records the
//! smallest, largest and last bytes in use and reserved (the extremes include the
//! state the run starts from, so consecutive runs join up), so the exact peaks survive any
//! down-sampling (the largest `reserved_max` of the series is `peak_reserved`). Each
//! run also records every pool's bytes at its end, for a per-pool picture.

use std::time::Instant;

use super::at_peak::{AtPeak, Place};
use super::torch_model::{BlockId, TorchAllocator, TorchPool, TorchSettings};
use super::{SizeIndex, Trace, TraceEvent};
use crate::config::{
    MemoryConfiguration, MemoryDeviceProperties, MemoryPoolOptions, PoolConfigError,
};
use crate::error::PoolError;
use crate::handle::{PoolRef, SlotRef};
use crate::management::MemoryManagement;
use crate::pool::PoolStats;
use crate::storage::{ComputeStorage, VirtualStorage};
use crate::usage::MemoryUsage;

/// The number of time-series samples a replay keeps unless told otherwise.
pub const DEFAULT_SAMPLES: usize = 512;

/// Options of a replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayOptions {
    /// The device's memory in bytes: storage allocations past it fail (and the
    /// reservations that needed them are counted in `failed_reserves`).
    pub limit: Option<u64>,
    /// The most samples of the time series (0 keeps none). Each sample covers a run of
    /// consecutive events of equal length (the last one may be shorter).
    pub samples: usize,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        Self {
            limit: None,
            samples: DEFAULT_SAMPLES,
        }
    }
}

/// The memory of one run of consecutive events.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Sample {
    /// The index of the run's first event.
    pub first_event: usize,
    /// The number of events in the run (at least one).
    pub events: usize,
    /// The time of the run's first event, in ns.
    pub t_start: u64,
    /// The time of the run's last event, in ns.
    pub t_end: u64,
    /// The fewest bytes in use before the run or after any of its events.
    pub in_use_min: u64,
    /// The most bytes in use before the run or after any of its events.
    pub in_use_max: u64,
    /// The bytes in use after the run's last event.
    pub in_use_end: u64,
    /// The fewest bytes reserved before the run or after any of its events.
    pub reserved_min: u64,
    /// The most bytes reserved before the run or after any of its events.
    pub reserved_max: u64,
    /// The bytes reserved after the run's last event.
    pub reserved_end: u64,
}

/// Which pool a [`PoolReplay`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayedPool {
    /// A pool of a cubepool layout, with its effective options (sizes rounded to the
    /// alignment).
    Layout(MemoryPoolOptions),
    /// A pool of the model of PyTorch's caching allocator ([`replay_torch`]).
    Torch(TorchPool),
}

/// What one pool of the layout did during a replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolReplay {
    /// The pool.
    pub pool: ReplayedPool,
    /// Reservations this pool served.
    pub reservations: u64,
    /// Its usage after the last event.
    pub final_usage: MemoryUsage,
    /// Its page counts and high-water marks over the whole replay.
    pub stats: PoolStats,
    /// Its bytes reserved at the end of each sample of [`ReplayResult::samples`].
    pub reserved_series: Vec<u64>,
    /// Its bytes in use at the end of each sample of [`ReplayResult::samples`].
    pub in_use_series: Vec<u64>,
}

/// What a layout did with a trace.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayResult {
    /// Events replayed.
    pub events: usize,
    /// The most bytes the pools held from the storage at once.
    pub peak_reserved: u64,
    /// The index of the event after which `peak_reserved` was first reached.
    pub peak_reserved_event: usize,
    /// The most bytes live reservations asked for at once.
    pub peak_in_use: u64,
    /// The index of the event after which `peak_in_use` was first reached.
    pub peak_in_use_event: usize,
    /// The trace's peak live bytes (the lower bound of `peak_reserved`).
    pub peak_live: u64,
    /// `peak_live / peak_reserved` (1.0 for an empty trace); NaN when a reservation
    /// failed: the layout did not hold the trace, so no ratio of its reservation to the
    /// trace's peak says how well it did (see [`ReplayResult::complete`]).
    pub utilization: f64,
    /// Wall-clock seconds of the replay loop.
    pub seconds: f64,
    /// The usage after the last event (never-freed allocations still live).
    pub final_usage: MemoryUsage,
    /// Reservations that failed (capacity or out of memory); their frees are skipped.
    /// Invariant: `failed_reserves == failures.total()`.
    pub failed_reserves: u64,
    /// The failed reservations by cause.
    pub failures: Failures,
    /// The index of the first event whose reservation failed, if any did.
    pub first_failed_event: Option<usize>,
    /// Storage allocations made (each a `cudaMalloc` on a GPU).
    pub storage_allocations: u64,
    /// Storage releases made (each a `cudaFree` on a GPU).
    pub storage_frees: u64,
    /// The time series, at most [`ReplayOptions::samples`] long, in event order.
    pub samples: Vec<Sample>,
    /// Every dynamic pool of the layout, in routing order (the torch model: small,
    /// then large).
    pub pools: Vec<PoolReplay>,
}

/// Why the reservations of a replay failed, counted by cause.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Failures {
    /// Requests larger than every pool of the layout accepts (no limit would help).
    pub too_big: u64,
    /// Requests whose accepting pools were all capped and full.
    pub pools_full: u64,
    /// Requests that needed storage past the memory limit.
    pub over_limit: u64,
}

impl Failures {
    /// All failed reservations.
    pub fn total(&self) -> u64 {
        self.too_big + self.pools_full + self.over_limit
    }

    fn count(&mut self, failure: Failure) {
        match failure {
            Failure::TooBig => self.too_big += 1,
            Failure::PoolsFull => self.pools_full += 1,
            Failure::OverLimit => self.over_limit += 1,
        }
    }
}

/// Why one reservation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    TooBig,
    PoolsFull,
    OverLimit,
}

impl From<PoolError> for Failure {
    fn from(error: PoolError) -> Self {
        match error {
            PoolError::BufferTooBig { .. } => Failure::TooBig,
            PoolError::PoolCapacityExceeded { .. } => Failure::PoolsFull,
            // A reservation allocates storage and nothing else; a missing handle cannot
            // come from a reservation, and a storage that refuses a call (virtual storage
            // serves every pool kind) counts with the storage failures.
            PoolError::OutOfMemory { .. }
            | PoolError::NotFound { .. }
            | PoolError::Storage { .. } => Failure::OverLimit,
        }
    }
}

impl ReplayResult {
    /// Whether every reservation of the trace was served: only then do the peaks and
    /// `utilization` describe the whole trace.
    pub fn complete(&self) -> bool {
        self.failed_reserves == 0
    }

    /// `1 - utilization`: the share of the peak reservation no allocation needed.
    pub fn fragmentation(&self) -> f64 {
        1.0 - self.utilization
    }

    /// The bytes reserved at the peak over the floor no allocator can beat (the
    /// trace's peak live bytes); None when a reservation failed, since the peaks then
    /// cover only what was served.
    pub fn reserved_over_floor(&self) -> Option<u64> {
        if self.complete() {
            Some(self.peak_reserved.saturating_sub(self.peak_live))
        } else {
            None
        }
    }

    /// Wall-clock nanoseconds per event (0 for an empty trace).
    pub fn ns_per_event(&self) -> f64 {
        if self.events == 0 {
            0.0
        } else {
            self.seconds * 1e9 / self.events as f64
        }
    }
}

/// Replays `trace` through `configuration` on a [`VirtualStorage`].
pub fn replay(
    trace: &Trace,
    configuration: &MemoryConfiguration,
    properties: MemoryDeviceProperties,
    options: ReplayOptions,
) -> Result<ReplayResult, PoolConfigError> {
    let storage = match options.limit {
        Some(limit) => VirtualStorage::with_limit(limit),
        None => VirtualStorage::new(),
    };
    let memory = MemoryManagement::from_configuration(storage, properties, configuration.clone())?;
    Ok(run(trace, memory, options.samples))
}

/// Replays `trace` through the model of PyTorch's caching allocator with `settings`
/// (see [`super::torch_model`]), measured as [`replay`] measures a layout. With
/// `options.limit`, the model maps at most that many bytes (the device's memory).
pub fn replay_torch(
    trace: &Trace,
    settings: TorchSettings,
    options: ReplayOptions,
) -> ReplayResult {
    run(
        trace,
        TorchAllocator::new(settings, options.limit),
        options.samples,
    )
}

/// Replays `trace` through `memory`, keeping at most `samples` samples.
fn run<A: Replayable>(trace: &Trace, memory: A, samples: usize) -> ReplayResult {
    let events = trace.events.len();
    // Runs of `run` events, one sample each (one run and no sample when `samples` is 0).
    let (run, sample_count) = match samples {
        0 => (events.max(1), 0),
        samples => {
            let run = events.div_ceil(samples).max(1);
            (run, events.div_ceil(run))
        }
    };
    let mut replayer = Replayer::new(trace, memory, sample_count);
    let start = Instant::now();
    for (chunk, run_events) in trace.events.chunks(run).enumerate() {
        let first_event = chunk * run;
        replayer.open_run();
        for (offset, event) in run_events.iter().enumerate() {
            replayer.step(first_event + offset, event);
        }
        if sample_count > 0 {
            replayer.close_run(first_event, run_events);
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    replayer.finish(seconds)
}

/// What a replay drives: an allocator that serves requests by size from its pools and
/// says what it holds.
trait Replayable {
    /// Where a live request is, to free it.
    type Slot: Copy;
    /// Serves `size` bytes: where, or why the request failed.
    fn reserve(&mut self, size: u64) -> Result<Self::Slot, Failure>;
    /// The index of the pool that holds a live slot (None: no pool of the breakdown).
    fn pool_of(&self, slot: Self::Slot) -> Option<u8>;
    /// Frees a slot `reserve` gave.
    fn release(&mut self, slot: Self::Slot);
    /// Bytes held from the device.
    fn bytes_reserved(&self) -> u64;
    /// Storage allocations and frees so far.
    fn storage_counts(&self) -> (u64, u64);
    /// The number of pools of the breakdown.
    fn pool_count(&self) -> usize;
    /// A step boundary of the trace (a phase starts): the planned pool's requests
    /// follow its plan's next phase. Nothing, for an allocator without steps.
    fn step_boundary(&mut self) {}
    /// Each pool's bytes reserved, into `out` (one per pool).
    fn pool_reserved(&mut self, out: &mut [u64]);
    /// Each pool with its usage and statistics, and the usage of all.
    fn pool_summaries(&mut self) -> (Vec<(ReplayedPool, MemoryUsage, PoolStats)>, MemoryUsage);
    /// What is held from the device, as `(place, size)` segments.
    fn segments(&self) -> Vec<(Place, u64)>;
    /// Where a live slot's block is and its bytes (`None`: it holds no bytes).
    fn place_of(&self, slot: Self::Slot) -> Option<(Place, u64)>;
}

impl Replayable for MemoryManagement<VirtualStorage> {
    type Slot = SlotRef;

    fn step_boundary(&mut self) {
        self.step();
    }

    #[inline(always)]
    fn reserve(&mut self, size: u64) -> Result<SlotRef, Failure> {
        self.reserve_slot(size)
            .map(|(slot_ref, _)| slot_ref)
            .map_err(Failure::from)
    }

    #[inline(always)]
    fn pool_of(&self, slot: SlotRef) -> Option<u8> {
        match slot.pool {
            PoolRef::Dynamic(pool) => Some(pool),
            PoolRef::Persistent | PoolRef::Empty => None,
        }
    }

    #[inline(always)]
    fn release(&mut self, slot: SlotRef) {
        // The slot came from this replay's reserve, so it is live.
        let _ = self.release_slot(slot);
    }

    #[inline(always)]
    fn bytes_reserved(&self) -> u64 {
        self.storage().bytes_allocated()
    }

    fn storage_counts(&self) -> (u64, u64) {
        (self.storage().allocations(), self.storage().deallocations())
    }

    fn pool_count(&self) -> usize {
        self.pool_options().len()
    }

    fn pool_reserved(&mut self, out: &mut [u64]) {
        let (pools, _) = self.pool_states();
        for (slot, (usage, _)) in out.iter_mut().zip(pools) {
            *slot = usage.bytes_reserved;
        }
    }

    fn pool_summaries(&mut self) -> (Vec<(ReplayedPool, MemoryUsage, PoolStats)>, MemoryUsage) {
        let (states, _) = self.pool_states();
        let pools = self
            .pool_options()
            .iter()
            .zip(states)
            .map(|(options, (usage, stats))| (ReplayedPool::Layout(*options), usage, stats))
            .collect();
        (pools, self.memory_usage())
    }

    fn segments(&self) -> Vec<(Place, u64)> {
        self.storage()
            .held()
            .into_iter()
            .map(|(id, offset, size)| {
                let place = Place {
                    group: id.0,
                    start: offset,
                };
                (place, size)
            })
            .collect()
    }

    fn place_of(&self, slot: SlotRef) -> Option<(Place, u64)> {
        let resource = self.locate(slot).ok()?;
        let group = resource.storage_id?;
        let place = Place {
            group,
            start: resource.offset,
        };
        Some((place, resource.size))
    }
}

impl Replayable for TorchAllocator {
    /// None for a zero-byte request, which takes no block.
    type Slot = Option<BlockId>;

    #[inline(always)]
    fn reserve(&mut self, size: u64) -> Result<Option<BlockId>, Failure> {
        // The model takes any size; it fails only when the device's memory runs out.
        self.malloc(size).map_err(|_| Failure::OverLimit)
    }

    #[inline(always)]
    fn pool_of(&self, slot: Option<BlockId>) -> Option<u8> {
        slot.and_then(|block| self.pool_of_block(block))
            .map(|pool| pool.index() as u8)
    }

    #[inline(always)]
    fn release(&mut self, slot: Option<BlockId>) {
        if let Some(block) = slot {
            // The block came from this replay's malloc, so it is live.
            let _ = self.free(block);
        }
    }

    #[inline(always)]
    fn bytes_reserved(&self) -> u64 {
        TorchAllocator::bytes_reserved(self)
    }

    fn storage_counts(&self) -> (u64, u64) {
        (self.storage_allocations(), self.storage_frees())
    }

    fn pool_count(&self) -> usize {
        TorchPool::ALL.len()
    }

    fn pool_reserved(&mut self, out: &mut [u64]) {
        for (slot, pool) in out.iter_mut().zip(TorchPool::ALL) {
            *slot = self.pool_usage(pool).bytes_reserved;
        }
    }

    fn pool_summaries(&mut self) -> (Vec<(ReplayedPool, MemoryUsage, PoolStats)>, MemoryUsage) {
        let pools: Vec<_> = TorchPool::ALL
            .iter()
            .map(|&pool| {
                (
                    ReplayedPool::Torch(pool),
                    self.pool_usage(pool),
                    self.pool_stats(pool),
                )
            })
            .collect();
        let total = pools
            .iter()
            .fold(MemoryUsage::default(), |total, (_, usage, _)| {
                total.combine(*usage)
            });
        (pools, total)
    }

    fn segments(&self) -> Vec<(Place, u64)> {
        TorchAllocator::segments(self)
            .into_iter()
            .map(|(address, size)| {
                let place = Place {
                    group: 0,
                    start: address,
                };
                (place, size)
            })
            .collect()
    }

    fn place_of(&self, slot: Option<BlockId>) -> Option<(Place, u64)> {
        let (address, size) = self.block(slot?).ok()?;
        let place = Place {
            group: 0,
            start: address,
        };
        Some((place, size))
    }
}

/// What a replay ran through, so that its peak can be looked at again ([`at_peak`]).
#[derive(Debug, Clone)]
pub enum Replayed {
    /// A pool layout on a device.
    Layout {
        /// The layout.
        configuration: MemoryConfiguration,
        /// The device.
        properties: MemoryDeviceProperties,
    },
    /// The model of PyTorch's caching allocator.
    Torch(TorchSettings),
}

/// The address space of the replay of `trace` through `replayed` (under `limit`) right
/// after event `event` (the last event when past the end; nothing for an empty trace):
/// at a result's `peak_reserved_event`, why its peak reserves more than is live.
pub fn at_peak(
    trace: &Trace,
    replayed: &Replayed,
    limit: Option<u64>,
    event: usize,
) -> Result<AtPeak, PoolConfigError> {
    let storage = || match limit {
        Some(limit) => VirtualStorage::with_limit(limit),
        None => VirtualStorage::new(),
    };
    Ok(match replayed {
        Replayed::Layout {
            configuration,
            properties,
        } => {
            let memory = MemoryManagement::from_configuration(
                storage(),
                *properties,
                configuration.clone(),
            )?;
            view_after(trace, memory, event)
        }
        Replayed::Torch(settings) => {
            view_after(trace, TorchAllocator::new(*settings, limit), event)
        }
    })
}

/// Replays `trace` through `memory` up to and with event `event`, and views it.
fn view_after<A: Replayable>(trace: &Trace, memory: A, event: usize) -> AtPeak {
    let mut replayer = Replayer::new(trace, memory, 0);
    replayer.open_run();
    let last = event.min(trace.events.len());
    for (index, step) in trace.events.iter().enumerate().take(last.saturating_add(1)) {
        replayer.step(index, step);
    }
    let blocks = replayer
        .slots
        .iter()
        .enumerate()
        .filter_map(|(id, slot)| {
            let (place, size) = replayer.memory.place_of((*slot)?)?;
            Some((id as u32, place, size, trace.sizes[id]))
        })
        .collect();
    AtPeak::build(event, replayer.memory.segments(), blocks)
}

/// When [`replay_until`] stops: as soon as a replay shows it is out of the running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StopWhen {
    /// Stop after the event that makes the bytes reserved exceed this.
    pub reserved_above: Option<u64>,
    /// Stop after the event that makes the storage allocations exceed this.
    pub storage_allocations_above: Option<u64>,
}

impl StopWhen {
    #[inline]
    fn reached<A: Replayable>(&self, replayer: &Replayer<'_, A>) -> bool {
        self.reserved_above
            .is_some_and(|bound| replayer.reserved > bound)
            || self
                .storage_allocations_above
                .is_some_and(|bound| replayer.memory.storage_counts().0 > bound)
    }
}

/// Replays `trace` through `configuration` like [`replay`] (no time series, no limit),
/// but stops after the first event where `stop` is reached, and says which.
///
/// A stopped result covers the events up to that one (`events` counts them): its peaks,
/// storage calls and per-pool high-water marks are those reached so far, so each is a
/// lower bound of the whole replay's. A planner replays a candidate layout only as far
/// as it takes to see that it reserves more than a better one.
pub fn replay_until(
    trace: &Trace,
    configuration: &MemoryConfiguration,
    properties: MemoryDeviceProperties,
    stop: StopWhen,
) -> Result<(ReplayResult, Option<usize>), PoolConfigError> {
    replay_bounded(trace, configuration, properties, None, stop)
}

/// [`replay_until`] of only the allocations whose size is one of `sizes` (and their
/// frees): what the pools of a layout do with the part of a trace that is routed to
/// them. Routing is by size, so a pool that no capacity limit makes pass requests on
/// sees exactly these events inside the whole layout too. Indexes the trace's sizes
/// first: callers that replay many parts of one trace keep a [`SizeIndex`] and call
/// [`replay_selected_until`].
pub fn replay_sizes_until(
    trace: &Trace,
    configuration: &MemoryConfiguration,
    properties: MemoryDeviceProperties,
    sizes: &[u64],
    stop: StopWhen,
) -> Result<(ReplayResult, Option<usize>), PoolConfigError> {
    let selected = SizeIndex::new(trace).select(sizes);
    replay_selected_until(trace, configuration, properties, selected, stop)
}

/// [`replay_until`] of only the allocations `selected` marks by id (and their frees),
/// as [`SizeIndex::select`] makes it. Ids past `selected` are not replayed.
pub fn replay_selected_until(
    trace: &Trace,
    configuration: &MemoryConfiguration,
    properties: MemoryDeviceProperties,
    mut selected: Vec<bool>,
    stop: StopWhen,
) -> Result<(ReplayResult, Option<usize>), PoolConfigError> {
    selected.resize(trace.sizes.len(), false);
    replay_bounded(trace, configuration, properties, Some(selected), stop)
}

/// The loop of [`replay_until`], over the allocations whose id `keep` marks (all when
/// None; one entry per allocation) and their frees.
fn replay_bounded(
    trace: &Trace,
    configuration: &MemoryConfiguration,
    properties: MemoryDeviceProperties,
    keep: Option<Vec<bool>>,
    stop: StopWhen,
) -> Result<(ReplayResult, Option<usize>), PoolConfigError> {
    let memory = MemoryManagement::from_configuration(
        VirtualStorage::new(),
        properties,
        configuration.clone(),
    )?;
    let mut replayer = Replayer::new(trace, memory, 0);
    let start = Instant::now();
    replayer.open_run();
    let mut stopped = None;
    for (index, event) in trace.events.iter().enumerate() {
        if let Some(keep) = &keep {
            // Frees too: `keep` is far smaller than the replayer's slots, so skipping
            // here saves a cache miss per event of the sizes left out.
            let (TraceEvent::Alloc { id, .. } | TraceEvent::Free { id, .. }) = *event;
            if !keep[id as usize] {
                continue;
            }
        }
        replayer.step(index, event);
        if stop.reached(&replayer) {
            stopped = Some(index);
            break;
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let mut result = replayer.finish(seconds);
    if let Some(index) = stopped {
        result.events = index + 1;
    }
    Ok((result, stopped))
}

/// Where a layout places each of `sizes`, as a fresh memory management with its pools
/// routes it: `Some(index)` of the dynamic pool that serves it, or `None` when no
/// dynamic pool does (size 0 is served without one; a size no pool takes fails). The
/// answer holds for every state of pools that no capacity limit makes pass requests on.
pub fn routes(
    configuration: &MemoryConfiguration,
    properties: MemoryDeviceProperties,
    sizes: &[u64],
) -> Result<Vec<Option<usize>>, PoolConfigError> {
    let mut memory = MemoryManagement::from_configuration(
        VirtualStorage::new(),
        properties,
        configuration.clone(),
    )?;
    Ok(sizes
        .iter()
        .map(|&size| match memory.reserve_slot(size) {
            Ok((slot_ref, _)) => {
                // Handed straight back: the next size finds the pools as they were.
                let _ = memory.release_slot(slot_ref);
                match slot_ref.pool {
                    PoolRef::Dynamic(pool) => Some(pool as usize),
                    _ => None,
                }
            }
            Err(_) => None,
        })
        .collect())
}

/// A run of consecutive entries of the sizes given to [`route_runs`] that a layout
/// routes alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteRun {
    /// Index of the run's first size.
    pub start: usize,
    /// Index one past the run's last size (`start < end`).
    pub end: usize,
    /// Where its sizes go, as [`routes`] says it.
    pub route: Option<usize>,
}

/// What [`routes`] answers for `sizes`, as maximal runs of consecutive entries routed
/// alike, with a number of routing questions that grows with the runs, not the sizes.
///
/// A planner asks where thousands of layouts route a trace's distinct sizes; asking
/// for every size costs a reservation per size and layout (60,000 events with 15,000
/// distinct sizes: 7 s of a 36 s plan). Where a fresh memory routes a size depends on
/// which side of each pool's `AcceptRule` change points it lies (and of the largest
/// page, past which no page is made); so `sizes` is cut at those points, each piece
/// is asked at its two ends, and a piece whose ends route apart is cut in two and
/// asked again, down to single sizes. Sizes that do not ascend are asked one by one.
/// Invariant (tested against [`routes`]): the runs, expanded, are what [`routes`]
/// answers.
pub fn route_runs(
    configuration: &MemoryConfiguration,
    properties: MemoryDeviceProperties,
    sizes: &[u64],
) -> Result<Vec<RouteRun>, PoolConfigError> {
    let mut memory = MemoryManagement::from_configuration(
        VirtualStorage::new(),
        properties,
        configuration.clone(),
    )?;
    // The smallest sizes at which some rule's answer may change (and size 0, served
    // apart, and the largest page's end).
    let mut changes = vec![1, properties.max_page_size.saturating_add(1)];
    for rule in memory.accept_rules() {
        changes.extend(rule.max_size.checked_add(1));
        if let Some(page) = rule.near_page.filter(|&page| page > 0) {
            changes.push(page - (page - 1) / 5);
            changes.extend(page.checked_add(1));
        }
    }
    changes.sort_unstable();
    let mut ask = |size: u64| -> Option<usize> {
        match memory.reserve_slot(size) {
            Ok((slot_ref, _)) => {
                // Handed straight back: the next size finds the pools as they were.
                let _ = memory.release_slot(slot_ref);
                match slot_ref.pool {
                    PoolRef::Dynamic(pool) => Some(pool as usize),
                    _ => None,
                }
            }
            Err(_) => None,
        }
    };
    // Pieces: ascending stretches with no change point inside.
    let mut pieces = Vec::new();
    let mut start = 0;
    for index in 1..=sizes.len() {
        let cut = index == sizes.len() || {
            let (low, high) = (sizes[index - 1], sizes[index]);
            low >= high || changes.iter().any(|&c| low < c && c <= high)
        };
        if cut {
            pieces.push((start, index));
            start = index;
        }
    }
    let mut runs: Vec<RouteRun> = Vec::new();
    let push = |runs: &mut Vec<RouteRun>, start: usize, end: usize, route: Option<usize>| match runs
        .last_mut()
    {
        Some(last) if last.end == start && last.route == route => last.end = end,
        _ => runs.push(RouteRun { start, end, route }),
    };
    for (start, end) in pieces {
        // (start, end, route of the first size, route of the last) still to settle,
        // left to right.
        let first = ask(sizes[start]);
        let last = if end - start > 1 {
            ask(sizes[end - 1])
        } else {
            first
        };
        let mut stack = vec![(start, end, first, last)];
        while let Some((low, high, first, last)) = stack.pop() {
            if first == last || high - low <= 2 {
                if first == last {
                    push(&mut runs, low, high, first);
                } else {
                    push(&mut runs, low, low + 1, first);
                    push(&mut runs, high - 1, high, last);
                }
                continue;
            }
            let mid = low + (high - low) / 2;
            let before = ask(sizes[mid - 1]);
            let after = ask(sizes[mid]);
            // Right half under the left, so the left settles first.
            stack.push((mid, high, after, last));
            stack.push((low, mid, first, before));
        }
    }
    Ok(runs)
}

/// The state of one replay: the memory, where each live allocation is, and the
/// measurements so far.
struct Replayer<'a, A: Replayable> {
    trace: &'a Trace,
    memory: A,
    /// Where each allocation of the trace lives, by dense id, while it is live.
    slots: Vec<Option<A::Slot>>,
    /// Reservations served and bytes in use per dynamic pool, indexed by the u8 of a
    /// slot's `PoolRef::Dynamic` (so the compiler drops the bounds checks).
    served: [u64; 256],
    pool_in_use: [u64; 256],
    /// Each pool's bytes reserved, and the storage's (allocations, frees) when they were
    /// read: pools only change their reservations when these counts change.
    pool_reserved: Vec<u64>,
    storage_seen: (u64, u64),
    in_use: u64,
    reserved: u64,
    /// The extremes of the current run: in use (min, max), reserved (min, max).
    run_in_use: (u64, u64),
    run_reserved: (u64, u64),
    peak: Peaks,
    failures: Failures,
    first_failed: Option<usize>,
    samples: Vec<Sample>,
    reserved_series: Vec<Vec<u64>>,
    in_use_series: Vec<Vec<u64>>,
    /// The events at which a phase other than the first starts (step boundaries), in
    /// order, and the index of the next one not yet crossed.
    boundaries: Vec<usize>,
    next_boundary: usize,
}

impl<'a, A: Replayable> Replayer<'a, A> {
    fn new(trace: &'a Trace, memory: A, samples: usize) -> Self {
        let pools = memory.pool_count();
        let series = || (0..pools).map(|_| Vec::with_capacity(samples)).collect();
        Self {
            trace,
            slots: vec![None; trace.allocations as usize],
            served: [0; 256],
            pool_in_use: [0; 256],
            pool_reserved: vec![0; pools],
            storage_seen: (0, 0),
            in_use: 0,
            reserved: 0,
            run_in_use: (0, 0),
            run_reserved: (0, 0),
            peak: Peaks::default(),
            failures: Failures::default(),
            first_failed: None,
            samples: Vec::with_capacity(samples),
            reserved_series: series(),
            in_use_series: series(),
            boundaries: {
                let mut starts: Vec<usize> = trace
                    .header
                    .phases
                    .iter()
                    .map(|phase| phase.first_event)
                    .filter(|&first| first > 0)
                    .collect();
                starts.sort_unstable();
                starts
            },
            next_boundary: 0,
            memory,
        }
    }

    /// Tells the memory of every step boundary at or before event `index` not yet told.
    #[cold]
    #[inline(never)]
    fn cross_boundaries(&mut self, index: usize) {
        while self
            .boundaries
            .get(self.next_boundary)
            .is_some_and(|&first| first <= index)
        {
            self.memory.step_boundary();
            self.next_boundary += 1;
        }
    }

    /// Starts a run: its extremes start from the current state, so runs join up.
    fn open_run(&mut self) {
        self.run_in_use = (self.in_use, self.in_use);
        self.run_reserved = (self.reserved, self.reserved);
    }

    #[inline(always)]
    fn step(&mut self, index: usize, event: &TraceEvent) {
        if self
            .boundaries
            .get(self.next_boundary)
            .is_some_and(|&first| first <= index)
        {
            self.cross_boundaries(index);
        }
        match *event {
            TraceEvent::Alloc { id, size, .. } => {
                let outcome = self.memory.reserve(size);
                // Reserving may map pages, and release some (periodic or out-of-memory
                // cleanup); most reservations do neither.
                let reserved = self.memory.bytes_reserved();
                if reserved != self.reserved {
                    self.reserved = reserved;
                    self.run_reserved.0 = self.run_reserved.0.min(reserved);
                    self.run_reserved.1 = self.run_reserved.1.max(reserved);
                }
                match outcome {
                    Ok(slot) => {
                        self.slots[id as usize] = Some(slot);
                        if let Some(pool) = self.memory.pool_of(slot) {
                            self.served[pool as usize] += 1;
                            self.pool_in_use[pool as usize] += size;
                        }
                        self.in_use += size;
                        self.run_in_use.1 = self.run_in_use.1.max(self.in_use);
                        self.peak.update(index, self.in_use, self.reserved);
                    }
                    Err(failure) => {
                        self.failures.count(failure);
                        self.first_failed.get_or_insert(index);
                    }
                }
            }
            TraceEvent::Free { id, .. } => {
                if let Some(slot) = self.slots[id as usize].take() {
                    let size = self.trace.sizes[id as usize];
                    self.in_use -= size;
                    self.run_in_use.0 = self.run_in_use.0.min(self.in_use);
                    if let Some(pool) = self.memory.pool_of(slot) {
                        self.pool_in_use[pool as usize] -= size;
                    }
                    self.memory.release(slot);
                }
            }
        }
    }

    /// Ends a run of events: records its sample and every pool's bytes.
    #[inline(never)]
    fn close_run(&mut self, first_event: usize, events: &[TraceEvent]) {
        let counts = self.memory.storage_counts();
        if counts != self.storage_seen {
            self.storage_seen = counts;
            self.memory.pool_reserved(&mut self.pool_reserved);
        }
        self.samples.push(Sample {
            first_event,
            events: events.len(),
            t_start: events.first().map_or(0, event_time),
            t_end: events.last().map_or(0, event_time),
            in_use_min: self.run_in_use.0,
            in_use_max: self.run_in_use.1,
            in_use_end: self.in_use,
            reserved_min: self.run_reserved.0,
            reserved_max: self.run_reserved.1,
            reserved_end: self.reserved,
        });
        for (pool, reserved) in self.pool_reserved.iter().enumerate() {
            self.reserved_series[pool].push(*reserved);
            self.in_use_series[pool].push(self.pool_in_use[pool]);
        }
    }

    fn finish(mut self, seconds: f64) -> ReplayResult {
        let (summaries, final_usage) = self.memory.pool_summaries();
        let pools = summaries
            .into_iter()
            .zip(self.served)
            .zip(self.reserved_series.into_iter().zip(self.in_use_series))
            .map(
                |(((pool, usage, stats), reservations), (reserved, in_use))| PoolReplay {
                    pool,
                    reservations,
                    final_usage: usage,
                    stats,
                    reserved_series: reserved,
                    in_use_series: in_use,
                },
            )
            .collect();
        let (storage_allocations, storage_frees) = self.memory.storage_counts();
        let peak = self.peak;
        ReplayResult {
            events: self.trace.events.len(),
            peak_reserved: peak.reserved,
            peak_reserved_event: peak.reserved_event,
            peak_in_use: peak.in_use,
            peak_in_use_event: peak.in_use_event,
            peak_live: self.trace.peak_live,
            utilization: if self.failures.total() > 0 {
                f64::NAN
            } else if peak.reserved == 0 {
                1.0
            } else {
                self.trace.peak_live as f64 / peak.reserved as f64
            },
            seconds,
            storage_allocations,
            storage_frees,
            final_usage,
            failed_reserves: self.failures.total(),
            failures: self.failures,
            first_failed_event: self.first_failed,
            samples: self.samples,
            pools,
        }
    }
}

/// The high-water marks of a replay and the events that first reached them.
#[derive(Debug, Default, Clone, Copy)]
struct Peaks {
    in_use: u64,
    in_use_event: usize,
    reserved: u64,
    reserved_event: usize,
}

impl Peaks {
    #[inline]
    fn update(&mut self, event: usize, in_use: u64, reserved: u64) {
        if in_use > self.in_use {
            self.in_use = in_use;
            self.in_use_event = event;
        }
        if reserved > self.reserved {
            self.reserved = reserved;
            self.reserved_event = event;
        }
    }
}

fn event_time(event: &TraceEvent) -> u64 {
    match *event {
        TraceEvent::Alloc { t, .. } | TraceEvent::Free { t, .. } => t,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PoolType;
    use crate::trace::format::TraceBuilder;
    use crate::trace::TraceHeader;

    const MIB: u64 = 1024 * 1024;

    /// A trace whose live bytes rise in a staircase to `steps` MiB, fall back, and rise
    /// once more to half of it.
    fn staircase(steps: u64) -> Trace {
        let mut b = TraceBuilder::new(TraceHeader::default());
        let mut t = 0;
        let mut tick = || {
            t += 10;
            t
        };
        for id in 0..steps {
            b.alloc(tick(), id, MIB).unwrap();
        }
        for id in 0..steps {
            b.free(tick(), id).unwrap();
        }
        for id in steps..steps + steps / 2 {
            b.alloc(tick(), id, MIB).unwrap();
        }
        b.finish()
    }

    fn custom(pools: Vec<PoolType>) -> MemoryConfiguration {
        MemoryConfiguration::Custom {
            pool_options: pools.into_iter().map(MemoryPoolOptions::new).collect(),
        }
    }

    fn run(trace: &Trace, config: &MemoryConfiguration, options: ReplayOptions) -> ReplayResult {
        replay(trace, config, MemoryDeviceProperties::default(), options).unwrap()
    }

    #[test]
    fn samples_are_bounded_and_keep_the_exact_peaks() {
        let trace = staircase(1000);
        let config = custom(vec![PoolType::Direct {
            reclaim_at: Some(0),
        }]);
        for samples in [1, 7, 64, 512, 5000] {
            let result = run(
                &trace,
                &config,
                ReplayOptions {
                    limit: None,
                    samples,
                },
            );
            assert!(result.samples.len() <= samples, "{samples}");
            assert!(!result.samples.is_empty());
            let max = |f: fn(&Sample) -> u64| result.samples.iter().map(f).max().unwrap();
            assert_eq!(max(|s| s.reserved_max), result.peak_reserved, "{samples}");
            assert_eq!(max(|s| s.in_use_max), result.peak_in_use, "{samples}");
            // The runs tile the events in order.
            let mut next = 0;
            for sample in &result.samples {
                assert_eq!(sample.first_event, next);
                assert!(sample.in_use_min <= sample.in_use_end);
                assert!(sample.in_use_end <= sample.in_use_max);
                assert!(sample.reserved_min <= sample.reserved_max);
                assert!(sample.t_start <= sample.t_end);
                next += sample.events;
            }
            assert_eq!(next, trace.len());
            let last = result.samples.last().unwrap();
            assert_eq!(last.in_use_end, result.final_usage.bytes_in_use);
            assert_eq!(last.reserved_end, result.final_usage.bytes_reserved);
        }
        let none = run(
            &trace,
            &config,
            ReplayOptions {
                limit: None,
                samples: 0,
            },
        );
        assert!(none.samples.is_empty());
        assert_eq!(none.peak_reserved, 1000 * MIB);
    }

    #[test]
    #[cfg(not(feature = "exclusive-memory-only"))]
    fn peak_events_and_the_per_pool_breakdown_add_up() {
        let trace = staircase(10);
        let config = custom(vec![
            PoolType::SlicedPages {
                page_size: 4 * MIB,
                max_slice_size: MIB / 2,
                max_pool_size: None,
            },
            PoolType::ExclusivePages {
                max_alloc_size: 64 * MIB,
            },
        ]);
        let result = run(&trace, &config, ReplayOptions::default());
        assert_eq!(result.peak_in_use, 10 * MIB);
        assert_eq!(result.peak_in_use_event, 9);
        assert_eq!(result.peak_reserved_event, 9);
        assert_eq!(result.pools.len(), 2);
        // 1 MiB does not fit half a 4 MiB page, so the exclusive pool serves all.
        assert_eq!(result.pools[0].reservations, 0);
        assert_eq!(result.pools[1].reservations, 15);
        assert_eq!(
            result.pools[1].stats.bytes_reserved_peak,
            result.peak_reserved
        );
        let reserved: u64 = result
            .pools
            .iter()
            .map(|p| p.final_usage.bytes_reserved)
            .sum();
        assert_eq!(reserved, result.final_usage.bytes_reserved);
        for (index, sample) in result.samples.iter().enumerate() {
            let reserved: u64 = result.pools.iter().map(|p| p.reserved_series[index]).sum();
            let in_use: u64 = result.pools.iter().map(|p| p.in_use_series[index]).sum();
            assert_eq!(reserved, sample.reserved_end);
            assert_eq!(in_use, sample.in_use_end);
        }
        assert!((result.fragmentation() - (1.0 - result.utilization)).abs() < 1e-12);
    }

    #[test]
    fn failures_under_a_limit_are_counted_and_located() {
        let trace = staircase(10);
        let config = custom(vec![PoolType::Direct { reclaim_at: None }]);
        let result = run(
            &trace,
            &config,
            ReplayOptions {
                limit: Some(4 * MIB),
                ..ReplayOptions::default()
            },
        );
        assert_eq!(result.failed_reserves, 6 + 1);
        assert_eq!(
            result.failures,
            Failures {
                over_limit: 7,
                ..Failures::default()
            }
        );
        assert_eq!(result.first_failed_event, Some(4));
        assert!(result.peak_reserved <= 4 * MIB);
        assert!(!result.complete());
        assert!(
            result.utilization.is_nan(),
            "no ratio for an incomplete replay"
        );
        let ok = run(&trace, &config, ReplayOptions::default());
        assert_eq!(ok.failed_reserves, 0);
        assert_eq!(ok.first_failed_event, None);
        assert!(ok.complete());
        assert!(ok.utilization <= 1.0);
    }

    #[test]
    fn requests_no_pool_takes_fail_as_too_big_without_any_limit() {
        // The staircase asks for 1 MiB at a time; the only pool takes at most 512 KiB.
        let trace = staircase(3);
        let config = custom(vec![PoolType::ExclusivePages {
            max_alloc_size: MIB / 2,
        }]);
        let result = run(&trace, &config, ReplayOptions::default());
        assert_eq!(result.failures.too_big, result.failed_reserves);
        // Three 1 MiB requests on the way up, one (half of three) on the way back.
        assert_eq!(result.failures.total(), 3 + 1);
        assert_eq!(result.peak_reserved, 0);
        assert!(result.utilization.is_nan());
    }

    #[test]
    #[cfg(not(feature = "exclusive-memory-only"))]
    fn full_capped_pools_are_their_own_cause() {
        let trace = staircase(4);
        let config = custom(vec![PoolType::SlicedPages {
            page_size: 2 * MIB,
            max_slice_size: 2 * MIB,
            max_pool_size: Some(2 * MIB),
        }]);
        let result = run(&trace, &config, ReplayOptions::default());
        assert_eq!(result.failures.pools_full, result.failed_reserves);
        assert!(result.failures.pools_full > 0);
    }

    #[test]
    fn the_torch_model_replays_with_the_same_measurements() {
        // Ten 1 MiB requests (rounded to 1 MiB, the small pool: 2 MiB segments, two
        // each), all freed, then five more served from the cache: 10 MiB in 5 segments.
        let trace = staircase(10);
        let result = replay_torch(&trace, TorchSettings::default(), ReplayOptions::default());
        assert_eq!(
            (result.peak_reserved, result.peak_in_use),
            (10 * MIB, 10 * MIB)
        );
        assert_eq!((result.storage_allocations, result.storage_frees), (5, 0));
        assert_eq!(result.pools.len(), 2);
        assert_eq!(result.pools[0].pool, ReplayedPool::Torch(TorchPool::Small));
        assert_eq!(result.pools[0].reservations, 15);
        assert_eq!(result.pools[0].stats.pages_peak, 5);
        assert_eq!(result.final_usage.bytes_in_use, 5 * MIB);
        for (index, sample) in result.samples.iter().enumerate() {
            let reserved: u64 = result.pools.iter().map(|p| p.reserved_series[index]).sum();
            let in_use: u64 = result.pools.iter().map(|p| p.in_use_series[index]).sum();
            assert_eq!((reserved, in_use), (sample.reserved_end, sample.in_use_end));
        }
        // Under a 4 MiB device, requests 5 to 10 fail (nothing is free to give back);
        // of the last five, four are served from the two cached segments and one fails.
        let limited = replay_torch(
            &trace,
            TorchSettings::default(),
            ReplayOptions {
                limit: Some(4 * MIB),
                ..ReplayOptions::default()
            },
        );
        assert_eq!(limited.failed_reserves, 6 + 1);
        assert_eq!(limited.first_failed_event, Some(4));
        assert_eq!(limited.peak_reserved, 4 * MIB);
    }

    #[test]
    fn a_bounded_replay_stops_where_it_is_out_of_the_running() {
        let trace = staircase(10);
        let config = custom(vec![PoolType::Direct { reclaim_at: None }]);
        let whole = run(&trace, &config, ReplayOptions::default());
        let props = MemoryDeviceProperties::default();
        let (same, stopped) = replay_until(&trace, &config, props, StopWhen::default()).unwrap();
        assert_eq!(stopped, None);
        assert_eq!(
            (same.peak_reserved, same.storage_allocations, same.events),
            (whole.peak_reserved, whole.storage_allocations, whole.events)
        );
        let over = |reserved_above, storage_allocations_above| {
            let stop = StopWhen {
                reserved_above,
                storage_allocations_above,
            };
            replay_until(&trace, &config, props, stop).unwrap()
        };
        // One MiB per allocation: past 3 MiB at the fourth event (index 3).
        let (part, stopped) = over(Some(3 * MIB), None);
        assert_eq!(stopped, Some(3));
        assert_eq!((part.events, part.peak_reserved), (4, 4 * MIB));
        assert!(part.peak_reserved <= whole.peak_reserved);
        let (_, stopped) = over(None, Some(5));
        assert_eq!(stopped, Some(5));
        // A bound at the whole replay's figures is never passed.
        let (_, stopped) = over(Some(whole.peak_reserved), Some(whole.storage_allocations));
        assert_eq!(stopped, None);
    }

    #[test]
    #[cfg(not(feature = "exclusive-memory-only"))]
    fn a_layout_replays_as_the_sum_of_its_pools_on_their_sizes() {
        // 1 MiB allocations, then 2 MiB ones: a sliced pool takes the first, an
        // exclusive pool the rest.
        let mut b = TraceBuilder::new(TraceHeader::default());
        for id in 0..8u64 {
            b.alloc(id, id, (1 + id % 2) * MIB).unwrap();
        }
        for id in 0..4u64 {
            b.free(10 + id, id).unwrap();
        }
        let trace = b.finish();
        let sliced = PoolType::SlicedPages {
            page_size: 4 * MIB,
            max_slice_size: MIB,
            max_pool_size: None,
        };
        let exclusive = PoolType::ExclusivePages {
            max_alloc_size: 64 * MIB,
        };
        let props = MemoryDeviceProperties::default();
        let layout = custom(vec![sliced, exclusive]);
        assert_eq!(
            routes(&layout, props, &[0, MIB, 2 * MIB, 128 * MIB]).unwrap(),
            vec![None, Some(0), Some(1), None]
        );
        let (whole, _) = replay_until(&trace, &layout, props, StopWhen::default()).unwrap();
        let part = |pool, size| {
            replay_sizes_until(
                &trace,
                &custom(vec![pool]),
                props,
                &[size],
                StopWhen::default(),
            )
            .unwrap()
            .0
        };
        let (small, large) = (part(sliced, MIB), part(exclusive, 2 * MIB));
        assert_eq!(
            small.peak_reserved + large.peak_reserved,
            whole.peak_reserved
        );
        assert_eq!(
            small.storage_allocations + large.storage_allocations,
            whole.storage_allocations
        );
        assert_eq!(small.pools[0].reservations, whole.pools[0].reservations);
        assert_eq!(large.pools[0].stats, whole.pools[1].stats);
    }

    #[test]
    fn an_empty_trace_replays_to_nothing() {
        let trace = TraceBuilder::new(TraceHeader::default()).finish();
        let result = run(
            &trace,
            &MemoryConfiguration::ExclusivePages,
            ReplayOptions::default(),
        );
        assert_eq!(result.events, 0);
        assert!(result.samples.is_empty());
        assert_eq!(result.utilization, 1.0);
        assert_eq!(result.ns_per_event(), 0.0);
    }
}

//! Bounded replays: [`replay_until`] and its variants over part of a trace, stopped
//! as soon as a replay is out of the running ([`StopWhen`]).

use std::time::Instant;

use super::memory::Replayable;
#[cfg(doc)]
use super::replay;
use super::replayer::Replayer;
use super::ReplayResult;
use crate::config::{MemoryConfiguration, MemoryDeviceProperties, PoolConfigError};
use crate::management::MemoryManagement;
use crate::storage::VirtualStorage;
use crate::trace::{SizeIndex, Trace, TraceEvent};

/// When [`replay_until`] stops: as soon as a replay shows it is out of the running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StopWhen {
    /// Stop after the event that makes the bytes reserved exceed this (within a
    /// reserve too, before a periodic cleanup gave pages back: as the peak counts them).
    pub reserved_above: Option<u64>,
    /// Stop after the event that makes the storage allocations exceed this.
    pub storage_allocations_above: Option<u64>,
}

impl StopWhen {
    #[inline]
    fn reached<A: Replayable>(&self, replayer: &Replayer<'_, A>) -> bool {
        self.reserved_above
            .is_some_and(|bound| replayer.reserved.max(replayer.peak_reserved()) > bound)
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

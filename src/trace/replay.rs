//! Replays a trace through a pool layout on virtual storage.

use std::time::Instant;

use super::{Trace, TraceEvent};
use crate::config::{MemoryConfiguration, MemoryDeviceProperties, PoolConfigError};
use crate::handle::Location;
use crate::management::MemoryManagement;
use crate::storage::{ComputeStorage, VirtualStorage};
use crate::usage::MemoryUsage;

/// Options of a replay.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplayOptions {
    /// The device's memory in bytes: storage allocations past it fail (and the
    /// reservations that needed them are counted in `failed_reserves`).
    pub limit: Option<u64>,
}

/// What a layout did with a trace.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayResult {
    /// Events replayed.
    pub events: usize,
    /// The most bytes the pools held from the storage at once.
    pub peak_reserved: u64,
    /// The most bytes live reservations asked for at once.
    pub peak_in_use: u64,
    /// The trace's peak live bytes (the lower bound of `peak_reserved`).
    pub peak_live: u64,
    /// `peak_live / peak_reserved` (1.0 for an empty trace).
    pub utilization: f64,
    /// Wall-clock seconds of the replay loop.
    pub seconds: f64,
    /// The usage after the last event (never-freed allocations still live).
    pub final_usage: MemoryUsage,
    /// Reservations that failed (capacity or out of memory); their frees are skipped.
    pub failed_reserves: u64,
    /// Storage allocations made (each a `cudaMalloc` on a GPU).
    pub storage_allocations: u64,
    /// Storage releases made (each a `cudaFree` on a GPU).
    pub storage_frees: u64,
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
    let mut memory =
        MemoryManagement::from_configuration(storage, properties, configuration.clone())?;
    let mut slots: Vec<Option<Location>> = vec![None; trace.allocations as usize];
    let (mut in_use, mut peak_in_use, mut peak_reserved, mut failed) = (0u64, 0u64, 0u64, 0u64);
    let start = Instant::now();
    for event in &trace.events {
        match *event {
            TraceEvent::Alloc { id, size, .. } => match memory.reserve_slot(size) {
                Ok((location, _)) => {
                    slots[id as usize] = Some(location);
                    in_use += size;
                    peak_in_use = peak_in_use.max(in_use);
                    peak_reserved = peak_reserved.max(memory.storage().bytes_allocated());
                }
                Err(_) => failed += 1,
            },
            TraceEvent::Free { id, .. } => {
                if let Some(location) = slots[id as usize].take() {
                    in_use -= trace.sizes[id as usize];
                    // The slot came from this replay's reserve, so it is live.
                    let _ = memory.release_slot(location);
                }
            }
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let storage = memory.storage();
    Ok(ReplayResult {
        events: trace.events.len(),
        peak_reserved,
        peak_in_use,
        peak_live: trace.peak_live,
        utilization: if peak_reserved == 0 {
            1.0
        } else {
            trace.peak_live as f64 / peak_reserved as f64
        },
        seconds,
        storage_allocations: storage.allocations(),
        storage_frees: storage.deallocations(),
        final_usage: memory.memory_usage(),
        failed_reserves: failed,
    })
}

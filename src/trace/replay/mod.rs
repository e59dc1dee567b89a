//! Replays a trace through a pool layout on virtual storage, and measures it.
//!
//! Besides the peaks, a replay keeps a bounded time series: the events are cut into at
//! most [`ReplayOptions::samples`] runs of consecutive events, and each run records the
//! smallest, largest and last bytes in use and reserved (the extremes include the
//! state the run starts from, so consecutive runs join up), so the exact peaks survive any
//! down-sampling (the largest `reserved_max` of the series is `peak_reserved`). Each
//! run also records every pool's bytes at its end, for a per-pool picture.

mod bounded;
mod failures;
mod memory;
mod replayer;
mod result;
mod routes;
mod samples;
#[cfg(test)]
mod tests;
mod view;

use std::time::Instant;

use super::torch_model::{TorchAllocator, TorchSettings};
use super::Trace;
use crate::config::{MemoryConfiguration, MemoryDeviceProperties, PoolConfigError};
use crate::management::MemoryManagement;
use crate::storage::VirtualStorage;
pub use bounded::{replay_selected_until, replay_sizes_until, replay_until, StopWhen};
pub use failures::Failures;
use memory::Replayable;
use replayer::Replayer;
pub use result::{PoolReplay, ReplayResult, ReplayedPool};
pub use routes::{route_runs, routes, RouteRun};
pub use samples::Sample;
pub use view::{at_peak, Replayed};

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

//! What a replay measured: [`ReplayResult`], with its figures, and each pool's part
//! ([`PoolReplay`]).

#[cfg(doc)]
use super::{replay_torch, ReplayOptions};
use super::{Failures, Sample};
use crate::config::MemoryPoolOptions;
use crate::pool::PoolStats;
use crate::trace::torch_model::TorchPool;
use crate::usage::MemoryUsage;

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

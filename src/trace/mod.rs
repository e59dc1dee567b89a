//! Allocation traces and their replay.
//!
//! - [`format`](mod@format): the cubepool trace v1 format (JSON Lines, optionally gzip), read into
//!   a [`Trace`] with ids made dense.
//! - [`analysis`]: what a planner asks of a trace (live peaks per size limit, the allocations
//!   live at the peak) and the variants it replays (a step repeated, twins, reordered events).
//! - [`replay`](mod@replay): runs a trace through a pool layout on [`crate::VirtualStorage`] and
//!   measures it: peaks, a bounded time series, a per-pool breakdown.

pub mod analysis;
pub mod format;
pub mod replay;

pub use analysis::VariantError;
pub use format::{Phase, Trace, TraceError, TraceEvent, TraceHeader};
pub use replay::{
    replay, replay_sizes_until, replay_until, routes, PoolReplay, ReplayOptions, ReplayResult,
    Sample, StopWhen, DEFAULT_SAMPLES,
};

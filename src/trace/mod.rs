//! Allocation traces and their replay.
//!
//! - [`format`](mod@format): the cubepool trace v1 format (JSON Lines, optionally gzip), read into
//!   a [`Trace`] with ids made dense.
//! - [`replay`](mod@replay): runs a trace through a pool layout on [`crate::VirtualStorage`] and
//!   measures it: peaks, a bounded time series, a per-pool breakdown.

pub mod format;
pub mod replay;

pub use format::{Phase, ReadLimits, Trace, TraceError, TraceEvent, TraceHeader};
pub use replay::{replay, PoolReplay, ReplayOptions, ReplayResult, Sample, DEFAULT_SAMPLES};

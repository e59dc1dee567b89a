//! Allocation traces and their replay.
//!
//! - [`format`](mod@format): the cubepool trace v1 format (JSON Lines, optionally gzip), read into
//!   a [`Trace`] with ids made dense.
//! - [`replay`](mod@replay): runs a trace through a pool layout on [`crate::VirtualStorage`] and
//!   measures it: peaks, a bounded time series, a per-pool breakdown; or through the
//!   model of PyTorch's caching allocator.
//! - [`torch_model`]: that model (`c10/cuda/CUDACachingAllocator.cpp`'s rules), for
//!   comparison.

pub mod format;
pub mod replay;
pub mod torch_model;

pub use format::{Phase, Trace, TraceError, TraceEvent, TraceHeader};
pub use replay::{
    replay, replay_torch, Failures, PoolReplay, ReplayOptions, ReplayResult, ReplayedPool, Sample,
    DEFAULT_SAMPLES,
};
pub use torch_model::{TorchAllocator, TorchPool, TorchSettings, TorchSettingsError};

//! Allocation traces and their replay.
//!
//! - [`format`](mod@format): the cubepool trace v1 format (JSON Lines, optionally gzip), read into
//!   a [`Trace`] with ids made dense.
//! - [`recording`]: what the recorded run's own allocator reserved (PyTorch's reserved
//!   bytes over time, from a snapshot's segments or a profiler's "Total Reserved").
//! - [`at_peak`](mod@at_peak): why reserved exceeds live: the segments reserved at a replay's peak,
//!   the live blocks that pin them, and what the gap is made of.
//! - [`stacks`]: the allocations' stack frames, where the source had them.
//! - [`pickle_ops`]: the opcodes of a pickle, read without running any (the reading half
//!   of the restricted unpickler of PyTorch memory snapshots).
//! - [`analysis`]: what a planner asks of a trace (live peaks per size limit, the allocations
//!   live at the peak) and the variants it replays (a step repeated, twins, reordered events).
//! - [`replay`](mod@replay): runs a trace through a pool layout on [`crate::VirtualStorage`] and
//!   measures it: peaks, a bounded time series, a per-pool breakdown; or through the
//!   model of PyTorch's caching allocator.
//! - [`torch_model`]: that model (`c10/cuda/CUDACachingAllocator.cpp`'s rules), for
//!   comparison.
//! - [`twister`]: Python's `random.random()` (MT19937) continued from a saved state, so a
//!   planner draws its random numbers here and still makes the replicas it always made.

pub mod analysis;
pub mod at_peak;
pub mod format;
pub mod pickle_ops;
pub mod recording;
pub mod replay;
pub mod size_index;
pub mod stacks;
pub mod torch_model;
pub mod twister;

pub use analysis::VariantError;
pub use at_peak::{AtPeak, PinnedBlock, Place, ReservedSegment};
pub use format::{Op, Phase, ReadLimits, Trace, TraceError, TraceEvent, TraceHeader};
pub use recording::{Coverage, Recording, ReservedPoint, MAX_RECORDED_POINTS};
pub use replay::{
    at_peak, replay, replay_selected_until, replay_sizes_until, replay_torch, replay_until,
    route_runs, routes, Failures, PoolReplay, ReplayOptions, ReplayResult, Replayed, ReplayedPool,
    Sample, StopWhen, DEFAULT_SAMPLES,
};
pub use size_index::SizeIndex;
pub use stacks::Stacks;
pub use torch_model::{
    roundup_interval, TorchAllocator, TorchPool, TorchSettings, TorchSettingsError,
    ROUNDUP_INTERVALS,
};

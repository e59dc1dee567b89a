//! Python classes for traces and replay results.
//!
//! `object` holds the `Trace` class, `load` reads one from a file, `replay` runs the
//! replays, whose `result` is a `ReplayResult` with its `pool_replay` and `timeline`
//! views.

mod load;
mod object;
mod pool_replay;
mod replay;
mod result;
mod timeline;

pub(crate) use load::load_trace_v1;
pub(crate) use object::PyTrace;
pub(crate) use pool_replay::PyPoolReplay;
pub(crate) use replay::{pool_routes, replay_trace, replay_until_bound};
pub(crate) use result::{PyReplayResult, ReplaySource};
pub(crate) use timeline::PyTimeline;

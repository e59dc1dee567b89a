//! cubepool: GPU-style memory pools (CubeCL's vocabulary) with trace replay.
//!
//! - [`storage`]: where bytes come from (host memory, or virtual address ranges), and
//!   virtual memory: address ranges with memory mapped into them in granules.
//! - [`placement`]: offline placement of buffers with lifetimes (the dynamic storage
//!   allocation problem): heuristics, exact search and an independent checker.
//! - [`pool`]: the sliced, exclusive, persistent, direct, virtual and planned pools.
//! - [`plan_file`]: plan files, the placements the planned pool follows.
//! - [`handle`]: handles and bindings that keep a reservation in use.
//! - [`management`]: [`MemoryManagement`], which routes reservations through pools.
//! - [`config`]: device properties, pool types, presets and their validation, the
//!   pools configuration language, and where a configuration is read from.
//! - [`report`]: reports of the pools, records of them, and measured plans.
//! - [`stats`]: PyTorch-style memory statistics.
//! - [`shared_bindings`]: bindings pinned for another stream until released.
//! - [`drop_queue`]: host buffers kept alive until a device fence signals.
//! - [`trace`]: allocation traces and their replay.
//! - [`torch_alloc`]: cubepool as PyTorch's CUDA allocator (C entry points, stream-safe
//!   reuse).
//! - [`blake2s`]: keyed BLAKE2s, the MAC of the Disco runtime's small frames (Python).
//!
//! Every public error enum ([`PoolError`], `TraceError`, `MappingError`, ...), and the
//! enums of reasons they carry (`PlanProblem`, `Violation`, `InfeasibleBecause`), is
//! `#[non_exhaustive]`: a release may add a variant for a failure it learns to tell
//! apart (as [`PoolError::InvalidArgument`] was), so a `match` outside the crate ends
//! with a wildcard arm, and each variant's message names what went wrong.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod atomic_file;
pub mod blake2s;
pub mod config;
pub mod drop_queue;
pub mod error;
pub mod handle;
mod host_memory;
pub mod management;
pub mod placement;
pub mod plan_file;
pub mod pool;
mod regular_file;
pub mod report;
pub mod shared_bindings;
pub mod stats;
pub mod storage;
pub mod torch_alloc;
pub mod trace;
pub mod usage;

pub mod errors;

pub mod tensor;

#[cfg(feature = "python")]
mod python;

pub use config::{
    optimal_align, ConfigLoadError, ConfigSource, ConfigTextError, MemoryConfiguration,
    MemoryDeviceProperties, MemoryPoolOptions, PoolConfigError, PoolType, EXCLUSIVE_MEMORY_ONLY,
};
pub use drop_queue::{
    Fence, FlushPolicy, HostFence, HostFenceSignal, PendingDropQueue, StagedBytes,
};
pub use error::PoolError;
pub use handle::{ManagedMemoryBinding, ManagedMemoryHandle, ManagedMemoryId, MemoryHandle};
pub use management::{InstallMemoryPoolsError, MemoryAllocationMode, MemoryManagement, Resource};
pub use report::{MemoryPoolKind, MemoryPoolReport, MemoryRecord, MemoryReport, PlanError};
pub use shared_bindings::SharedMemoryBindings;
pub use stats::{MemoryStats, Stat};
pub use storage::{ComputeStorage, HostStorage, VirtualStorage};
pub use usage::MemoryUsage;

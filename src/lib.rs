//! cubepool: GPU-style memory pools (CubeCL's vocabulary) with trace replay.
//!
//! - [`storage`]: where bytes come from (host memory, or virtual address ranges).
//! - [`pool`]: the sliced, exclusive, persistent and direct pools.
//! - [`handle`]: handles and bindings that keep a reservation in use.
//! - [`management`]: [`MemoryManagement`], which routes reservations through pools.
//! - [`config`]: device properties, pool types, presets and their validation.
//! - [`trace`]: allocation traces and their replay.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod config;
pub mod error;
pub mod handle;
pub mod management;
pub mod pool;
pub mod storage;
pub mod trace;
pub mod usage;

pub mod errors;

pub mod tensor;

#[cfg(feature = "python")]
mod python;

pub use config::{
    optimal_align, MemoryConfiguration, MemoryDeviceProperties, MemoryPoolOptions, PoolConfigError,
    PoolType, EXCLUSIVE_MEMORY_ONLY,
};
pub use error::PoolError;
pub use handle::{ManagedMemoryBinding, ManagedMemoryHandle, ManagedMemoryId, MemoryHandle};
pub use management::{MemoryAllocationMode, MemoryManagement, Resource};
pub use storage::{ComputeStorage, HostStorage, VirtualStorage};
pub use usage::MemoryUsage;

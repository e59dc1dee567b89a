//! `MemoryManagement`: routes reservations through the pools of a configuration.
//!
//! Routing follows CubeCL: the first pool (in configuration order) that accepts a size
//! serves it; a capped pool that is full passes the request on to the next accepting
//! pool; no accepting pool is [`PoolError::BufferTooBig`], and every accepting pool
//! full is [`PoolError::PoolCapacityExceeded`]. In `Persistent` mode (or when a free
//! persistent buffer of the exact padded size exists) the persistent pool serves.
//! A storage that runs out of memory gets one explicit cleanup and one retry.
//!
//! # Reserving: which method when
//!
//! - [`MemoryManagement::reserve`]: the usual way, a handle; the memory is freed when
//!   its last handle and binding are gone.
//! - [`MemoryManagement::reserve_located`]: a handle and its [`Resource`] at once, for
//!   a caller that needs the address now (it saves [`MemoryManagement::resource`]).
//! - [`MemoryManagement::bind`] and [`MemoryManagement::bind_located`]: the same two,
//!   for an id named earlier by [`MemoryManagement::handle`] (the client/server flow).
//! - [`MemoryManagement::reserve_slot`]: no handle, for a caller that keeps its own
//!   books (trace replay, benches); it gets the [`SlotRef`] and the pool's
//!   [`Placement`], and gives the slot back with [`MemoryManagement::release_slot`].
//!
//! Inside, every one of them routes (`route*`: choose the pool, count the outcome) and
//! reserves in the chosen pool (`reserve_in_pool`: one pool, one retry after a cleanup
//! when out of memory).
//!
//! Memory management also reports what its pools hold ([`MemoryManagement::memory_report`],
//! [`MemoryManagement::record_memory`]), installs a new layout of dynamic pools
//! ([`MemoryManagement::install_pools`]) and keeps PyTorch-style statistics
//! ([`MemoryManagement::memory_stats`]).

mod build;
mod locate;
mod release;
mod report;
mod reserve;
mod route;

use std::time::Instant;

use thiserror::Error;

use crate::config::{
    MemoryConfiguration, MemoryDeviceProperties, MemoryPoolOptions, PoolConfigError,
};
#[cfg(doc)]
use crate::error::PoolError;
use crate::errors::ErrorGraph;
#[cfg(doc)]
use crate::handle::PoolRef;
use crate::handle::{DescriptorTable, IdBlock, SlotRef};
use crate::pool::{DynamicPool, PersistentPool, Placement, RouteTable};
use crate::report::MemoryRecord;
use crate::stats::{Counters, CountingStorage};
use crate::storage::{ComputeStorage, StorageHandle, StorageId};

/// Why installing a layout of dynamic pools did not take effect.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum InstallMemoryPoolsError {
    /// Dynamic memory is still in use (after an explicit cleanup): pools that hold
    /// live reservations cannot be replaced.
    #[error(
        "cannot install pools: {bytes_in_use} bytes of dynamic memory are still in use; \
         release every handle and binding of the dynamic pools first"
    )]
    PoolsInUse {
        /// The bytes of live reservations in the dynamic pools.
        bytes_in_use: u64,
    },
    /// The new layout is invalid for this memory management's device.
    #[error(transparent)]
    InvalidConfiguration(#[from] PoolConfigError),
}

impl InstallMemoryPoolsError {
    /// The variant's name (`PoolsInUse`, or the configuration error's kind).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::PoolsInUse { .. } => "PoolsInUse",
            Self::InvalidConfiguration(error) => error.kind(),
        }
    }
}

/// The mode of allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MemoryAllocationMode {
    /// Route through the dynamic pools.
    #[default]
    Auto,
    /// Serve everything from the persistent pool (data that lives for the whole run).
    Persistent,
}

/// Where a reservation's bytes are, as memory management reports them to a caller (and
/// a kernel would address them): which pool, which storage buffer, the offset and the
/// address. Made from the pool's own answer, a [`Placement`] (which knows neither the
/// pool nor the address); a reservation is named by its [`SlotRef`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resource {
    /// The index of the dynamic pool holding it (the persistent pool is the index
    /// after the last dynamic pool); `None` for a zero-byte reservation.
    pub pool: Option<usize>,
    /// The storage buffer (page) holding it; `None` for a zero-byte reservation.
    pub storage_id: Option<u64>,
    /// The offset of the first byte in the storage buffer.
    pub offset: u64,
    /// The bytes reserved.
    pub size: u64,
    /// The address of the first byte (0 for a zero-byte reservation).
    pub address: u64,
}

/// Where a zero-byte reservation is: in no storage buffer ([`PoolRef::Empty`]).
const EMPTY_PLACEMENT: Placement = Placement {
    slot: SlotRef::EMPTY.slot,
    storage: StorageHandle {
        id: StorageId(u64::MAX),
        address: 0,
        size: 0,
    },
    offset: 0,
    size: 0,
};

/// Reserves and keeps track of chunks of memory in a storage, and slices upon them.
pub struct MemoryManagement<S: ComputeStorage> {
    name: String,
    /// Identity checked by lookups, so a handle of another instance is not found.
    identity: u64,
    properties: MemoryDeviceProperties,
    configuration: MemoryConfiguration,
    /// The effective options of the pools (`held.pools`), in the same order.
    pool_options: Vec<MemoryPoolOptions>,
    /// The pools, their storage, the statistics and the error graph.
    held: Held<S>,
    /// The first accepting pool of each size class, for sizes the cache misses.
    /// Invariant: built from `pools`' accept rules.
    route_table: RouteTable,
    /// `alignment - 1`, to round sizes up to the alignment.
    align_mask: u64,
    /// Open persistent windows; the mode is `Persistent` while positive.
    persistent_windows: u32,
    reserve_count: u64,
    /// Whether any pool releases pages periodically (checked after each reserve).
    periodic: bool,
    /// What the periodic cleanups after reserves left out, for a replay.
    within_reserve: WithinReserve,
    /// The descriptors of every handle issued; dropped handles wait on its release rings
    /// and list. Apart from `held`, so that it can hand out released reservations
    /// while `held` frees them.
    descriptors: DescriptorTable,
    /// This instance's block of reservation ids.
    ids: IdBlock,
    /// When this instance was made: the origin of record times.
    created: Instant,
    /// The records made so far, oldest first.
    records: Vec<MemoryRecord>,
    /// The sequence number of the next record.
    next_record: u64,
}

/// The storage a reserve held at its most, before its periodic cleanup gave pages back:
/// a replay's peak of reserved bytes counts it, as the device held those bytes for a
/// while. Written only where a pool releases pages periodically.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct WithinReserve {
    /// The storage's bytes after the last reserve's routing, before its periodic
    /// cleanup (0 without periodic pools). Invariant: at least the bytes held after it.
    pub(crate) reserved_before_cleanup: u64,
    /// While set, reserves run no periodic cleanup: the state at a reserve's most,
    /// looked at again by a replay's view at its peak.
    pub(crate) cleanup_paused: bool,
}

impl<S: ComputeStorage> std::fmt::Debug for MemoryManagement<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryManagement")
            .field("name", &self.name)
            .field("pools", &self.pool_options)
            .field("mode", &self.mode())
            .finish_non_exhaustive()
    }
}

/// What a reservation and its release change in memory management: the pools, the
/// storage they take memory from, the statistics and the error graph. One field of
/// [`MemoryManagement`], apart from the descriptor table, so the table can hand out
/// released reservations while they are freed here with one pointer at hand (six
/// borrowed fields cost the dropped-handle FIFO loop 20 instructions a step to
/// gather, `examples/peer_loops.rs` under callgrind).
struct Held<S: ComputeStorage> {
    /// The storage, counting the pages and bytes the pools take from it.
    storage: CountingStorage<S>,
    pools: Vec<DynamicPool>,
    /// Flag `i` is set when dynamic pool `i` holds one reservation per page
    /// ([`DynamicPool::holds_whole_pages`], for the statistics). Invariant: built
    /// from `pools`. Reading the kind from the pool itself (a bounds check and the
    /// enum's tag, on the pool's own cache line) cost the default layout's reserve +
    /// release 22 instructions of about 750 in the FIFO loop
    /// (`examples/peer_loops.rs` under callgrind).
    whole_pages: WholePages,
    persistent: PersistentPool,
    /// Failures whose bytes some reservation still carries. Invariant: names only live
    /// reservations (a freed reservation's taints are dropped when it is freed).
    errors: ErrorGraph,
    /// PyTorch-style counters. Invariant: their live counts equal the sums of the
    /// pools' usages (checked by `check_invariants`).
    counters: Counters,
    /// The last size routed to a dynamic pool and the index of its first accepting
    /// pool: real workloads repeat sizes. [`Held::NO_ROUTE`] when empty (size 0 is
    /// never routed to a pool). Here, beside the persistent pool, so that freeing a
    /// persistent buffer empties it. Invariant: a size it holds is not 0, was routed
    /// outside persistent windows while the persistent pool had no free buffer of its
    /// padded size, and since then no window opened (`set_mode` empties it) and no
    /// persistent buffer was freed (`release_slot` empties it): so a hit routes as
    /// the route table would, without a look at the mode or the persistent pool's
    /// free buffers (2 instructions of the FIFO step of `examples/peer_loops.rs`,
    /// callgrind).
    route_cache: (u64, usize),
}

impl<S: ComputeStorage> Held<S> {
    /// The empty route cache.
    const NO_ROUTE: (u64, usize) = (0, 0);
}

/// Which dynamic pools hold one reservation per page: one flag per pool index
/// ([`PoolRef::Dynamic`] holds a `u8`, so 256 flags name every index). Bytes, not
/// bits: a flag is then one load, where a bit took five instructions on each of a
/// FIFO step's reserve and release (`examples/peer_loops.rs` under callgrind).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct WholePages([bool; 256]);

impl WholePages {
    /// The flags of `pools`.
    fn of(pools: &[DynamicPool]) -> Self {
        let mut flags = [false; 256];
        for (flag, pool) in flags.iter_mut().zip(pools) {
            *flag = pool.holds_whole_pages();
        }
        Self(flags)
    }

    /// Whether pool `index` holds one reservation per page (false past the pools).
    #[inline(always)]
    fn get(&self, index: u8) -> bool {
        self.0[usize::from(index)]
    }
}

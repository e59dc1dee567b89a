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

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use thiserror::Error;

use crate::config::{
    MemoryConfiguration, MemoryDeviceProperties, MemoryPoolOptions, PoolConfigError, PoolType,
};
use crate::error::PoolError;
use crate::errors::{AllocId, ErrorGraph};
use crate::handle::{
    DescriptorTable, IdBlock, ManagedMemoryHandle, ManagedMemoryId, MemoryHandle, PoolRef, SlotRef,
};
use crate::pool::{
    AcceptRule, DirectPool, DynamicPool, ExclusivePool, MemoryPool, PersistentPool, Placement,
    PlannedPool, PlannedStats, PoolStats, Route, RouteTable, SlicedPool, SlotId, VirtualPool,
};
use crate::report::{MemoryPoolKind, MemoryPoolReport, MemoryRecord, MemoryReport};
use crate::stats::{Counters, CountingStorage, MemoryStats};
use crate::storage::{ComputeStorage, StorageHandle, StorageId};
use crate::usage::MemoryUsage;

/// Why installing a layout of dynamic pools did not take effect.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
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

impl<S: ComputeStorage> std::fmt::Debug for MemoryManagement<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryManagement")
            .field("name", &self.name)
            .field("pools", &self.pool_options)
            .field("mode", &self.mode())
            .finish_non_exhaustive()
    }
}

/// The route table of `pools`.
fn route_table(pools: &[DynamicPool]) -> RouteTable {
    let rules: Vec<_> = pools.iter().map(MemoryPool::accept_rule).collect();
    RouteTable::new(&rules)
}

fn build_pool(options: &MemoryPoolOptions, properties: &MemoryDeviceProperties) -> DynamicPool {
    let align = properties.alignment;
    match options.pool_type {
        PoolType::SlicedPages {
            page_size,
            max_slice_size,
            max_pool_size,
        } => DynamicPool::Sliced(SlicedPool::new(
            page_size,
            max_slice_size,
            max_pool_size,
            align,
        )),
        PoolType::ExclusivePages { max_alloc_size } => DynamicPool::Exclusive(ExclusivePool::new(
            max_alloc_size,
            align,
            options.dealloc_period,
        )),
        PoolType::Direct { reclaim_at } => {
            DynamicPool::Direct(DirectPool::new(properties.max_page_size, align, reclaim_at))
        }
        PoolType::VirtualPages {
            granule,
            keep,
            small,
            range,
        } => DynamicPool::Virtual(VirtualPool::new(granule, range, small, keep, align)),
        PoolType::Planned { plan, granule } => DynamicPool::Planned(PlannedPool::new(
            plan,
            granule,
            PoolType::VIRTUAL_RANGE,
            align,
        )),
    }
}

/// Checks the effective pools against what `storage` can do, so that a layout it
/// cannot serve is refused when memory management is built, not at the first
/// reservation: a virtual pool's granule must be a multiple of the storage's mapping
/// granularity (a storage without virtual memory fails a virtual pool's reservations
/// with a storage error instead, since the default falls back before this).
fn check_against_storage<S: ComputeStorage>(
    pool_options: &[MemoryPoolOptions],
    storage: &S,
) -> Result<(), PoolConfigError> {
    let Some(memory) = storage.virtual_memory_ref() else {
        return Ok(());
    };
    let granularity = memory.granularity();
    for options in pool_options {
        if let PoolType::VirtualPages { granule, .. } | PoolType::Planned { granule, .. } =
            options.pool_type
        {
            if granularity == 0 || granule % granularity != 0 {
                return Err(PoolConfigError::GranuleNotOfStorage {
                    granule,
                    granularity,
                });
            }
        }
    }
    Ok(())
}

impl<S: ComputeStorage> MemoryManagement<S> {
    /// Memory management over `storage` with the pools of `configuration`.
    pub fn from_configuration(
        storage: S,
        properties: MemoryDeviceProperties,
        configuration: MemoryConfiguration,
    ) -> Result<Self, PoolConfigError> {
        static IDENTITY: AtomicU64 = AtomicU64::new(1);
        let virtual_memory = storage.virtual_memory_ref().is_some();
        let pool_options = configuration.resolve_for(&properties, virtual_memory)?;
        check_against_storage(&pool_options, &storage)?;
        let pools: Vec<_> = pool_options
            .iter()
            .map(|options| build_pool(options, &properties))
            .collect();
        let identity = IDENTITY.fetch_add(1, Ordering::Relaxed);
        Ok(Self {
            name: "default".to_string(),
            identity,
            periodic: pool_options.iter().any(is_periodic),
            align_mask: properties.alignment - 1,
            pool_options,
            route_table: route_table(&pools),
            held: Held {
                storage: CountingStorage::new(storage),
                whole_pages: WholePages::of(&pools),
                pools,
                persistent: PersistentPool::new(properties.max_page_size, properties.alignment),
                errors: ErrorGraph::new(),
                counters: Counters::default(),
                route_cache: Held::<S>::NO_ROUTE,
            },
            properties,
            configuration,
            persistent_windows: 0,
            reserve_count: 0,
            descriptors: DescriptorTable::new(identity),
            ids: IdBlock::default(),
            created: Instant::now(),
            records: Vec::new(),
            next_record: 0,
        })
    }

    /// Names this instance (for reports and logs).
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// This instance's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The device properties the pools were built for.
    pub fn properties(&self) -> &MemoryDeviceProperties {
        &self.properties
    }

    /// The configuration the pools were built from.
    pub fn configuration(&self) -> &MemoryConfiguration {
        &self.configuration
    }

    /// The accept rule of each dynamic pool, in routing order: which sizes each serves
    /// (routing takes the first pool whose rule serves a size).
    pub fn accept_rules(&self) -> Vec<AcceptRule> {
        self.held
            .pools
            .iter()
            .map(MemoryPool::accept_rule)
            .collect()
    }

    /// The effective options of the dynamic pools, in routing order.
    pub fn pool_options(&self) -> &[MemoryPoolOptions] {
        &self.pool_options
    }

    /// The storage.
    pub fn storage(&self) -> &S {
        &self.held.storage.inner
    }

    /// The current allocation mode.
    pub fn mode(&self) -> MemoryAllocationMode {
        if self.persistent_windows > 0 {
            MemoryAllocationMode::Persistent
        } else {
            MemoryAllocationMode::Auto
        }
    }

    /// Sets the mode: `Persistent` opens a persistent window, `Auto` closes one
    /// (windows nest; the mode is `Persistent` while any is open).
    pub fn set_mode(&mut self, mode: MemoryAllocationMode) {
        // A window may open (see `Held::route_cache`).
        self.held.route_cache = Held::<S>::NO_ROUTE;
        match mode {
            MemoryAllocationMode::Persistent => {
                self.persistent_windows = self.persistent_windows.saturating_add(1)
            }
            MemoryAllocationMode::Auto => {
                self.persistent_windows = self.persistent_windows.saturating_sub(1)
            }
        }
    }

    /// Reserves `size` bytes and returns a handle; the memory is freed when the last
    /// handle and binding are dropped.
    ///
    /// A failure is not recorded in the error graph, unlike a failed
    /// [`bind`](Self::bind): the id was never handed out, so no launch can name it, and
    /// a record nobody can reach would never leave the graph (each failed reserve kept
    /// about 200 bytes for good before).
    pub fn reserve(&mut self, size: u64) -> Result<ManagedMemoryHandle, PoolError> {
        let id = self.ids.take();
        self.issue(id, size)
    }

    /// [`MemoryManagement::reserve`], also returning where the bytes are (saving the
    /// lookup of [`MemoryManagement::resource`]).
    #[inline(always)]
    pub fn reserve_located(
        &mut self,
        size: u64,
    ) -> Result<(ManagedMemoryHandle, Resource), PoolError> {
        let id = self.ids.take();
        // As in `reserve`: a failure names no id anyone holds, so it is not recorded.
        self.issue_located(id, size)
    }

    /// Reserves `size` bytes for a handle id made earlier (the client/server flow: a
    /// client names a buffer before the server binds memory to it). When the
    /// reservation fails, the error graph records the id as unallocated, so launches
    /// that read it are skipped with a claim naming the failed reservation.
    pub fn bind(
        &mut self,
        id: ManagedMemoryId,
        size: u64,
    ) -> Result<ManagedMemoryHandle, PoolError> {
        self.issue(id, size)
            .map_err(|error| self.bind_failed(id, size, error))
    }

    /// [`MemoryManagement::bind`], also returning where the bytes are.
    ///
    /// Inlined, as [`MemoryManagement::reserve_located`], so that a caller reads the
    /// handle and its `Resource` from registers, not from a returned copy (see
    /// `PyMemoryManagement::reserve`).
    #[inline(always)]
    pub fn bind_located(
        &mut self,
        id: ManagedMemoryId,
        size: u64,
    ) -> Result<(ManagedMemoryHandle, Resource), PoolError> {
        self.issue_located(id, size)
            .map_err(|error| self.bind_failed(id, size, error))
    }

    /// Reserves `size` bytes for a handle of id `id` (the step `reserve` and `bind`
    /// share; only `bind` records a failure).
    fn issue(&mut self, id: ManagedMemoryId, size: u64) -> Result<ManagedMemoryHandle, PoolError> {
        let slot_ref = self.reserve_for_handle(size)?;
        Ok(self.descriptors.issue(id, slot_ref, size))
    }

    /// [`MemoryManagement::issue`], also returning where the bytes are (inlined, as
    /// its callers).
    #[inline(always)]
    fn issue_located(
        &mut self,
        id: ManagedMemoryId,
        size: u64,
    ) -> Result<(ManagedMemoryHandle, Resource), PoolError> {
        let (slot_ref, resource) = self.reserve_mapped(size, Self::resource_at)?;
        Ok((self.descriptors.issue(id, slot_ref, size), resource))
    }

    /// Records a failed bind in the error graph (the id is unallocated), and passes
    /// the error on.
    #[cold]
    fn bind_failed(&mut self, id: ManagedMemoryId, size: u64, error: PoolError) -> PoolError {
        // A second failed bind of the same id keeps the first record.
        let _ = self
            .held
            .errors
            .mark_unallocated(AllocId(id.0), size, error.to_string());
        error
    }

    /// The error/taint graph of this memory management's reservations.
    pub fn error_graph(&self) -> &ErrorGraph {
        &self.held.errors
    }

    /// The error/taint graph, to record launches and writes (after freeing dropped
    /// handles, so no released reservation is named).
    pub fn error_graph_mut(&mut self) -> &mut ErrorGraph {
        self.flush_releases();
        &mut self.held.errors
    }

    /// A handle that names a buffer before any memory is bound to it (the
    /// client/server flow): it holds no bytes; [`MemoryManagement::bind`] reserves
    /// memory under its id. Dropping it lets the error graph forget the id.
    pub fn handle(&mut self) -> ManagedMemoryHandle {
        let id = self.ids.take();
        self.descriptors.issue(id, SlotRef::EMPTY, 0)
    }

    /// Reserves `size` bytes without a handle: the caller owns the reservation and
    /// must give it back with [`MemoryManagement::release_slot`] (used by replay).
    pub fn reserve_slot(&mut self, size: u64) -> Result<(SlotRef, Placement), PoolError> {
        self.reserve_mapped(size, |_, _, placement| *placement)
    }

    /// [`MemoryManagement::reserve_slot`] for a handle, which needs only the [`SlotRef`].
    #[inline]
    fn reserve_for_handle(&mut self, size: u64) -> Result<SlotRef, PoolError> {
        self.reserve_mapped(size, |_, _, _| ())
            .map(|(slot_ref, ())| slot_ref)
    }

    /// [`MemoryManagement::reserve_slot`], returning what `read` takes from the
    /// placement (with the pool that made it) instead of the placement itself.
    ///
    /// Whenever the route cache or table names the pool (every size outside
    /// persistent windows, without periodic pools), `read` reads the fields it needs
    /// from the pool's placement in place: building the `(SlotRef, Placement)` of
    /// `reserve_slot` copies the placement 16 bytes at a time right after the pool
    /// wrote it field by field, and the copy waits for those stores to drain (a
    /// store-forwarding stall, about 5 ns here).
    #[inline]
    fn reserve_mapped<T>(
        &mut self,
        size: u64,
        read: impl FnOnce(&Self, PoolRef, &Placement) -> T,
    ) -> Result<(SlotRef, T), PoolError> {
        self.flush_releases();
        // Wrapping: a count of reserves does not reach 2^64.
        self.reserve_count = self.reserve_count.wrapping_add(1);
        let routed = if self.periodic {
            self.route_and_clean(size)
        } else if let Some(first) = self.dynamic_route(size) {
            // The virtual pool (the default's) apart: its placement then stays in
            // registers. With one call for every kind, the other kinds' reserves (out of
            // line) wrote their results where the virtual pool's went, so its
            // placement was stored and read back (about 10 instructions of the FIFO
            // step in `examples/peer_loops.rs`, callgrind).
            // Its pages are not whole ones (`DynamicPool::holds_whole_pages`), which
            // the statistics then need not look up.
            let reserved = match &mut self.held.pools[first] {
                DynamicPool::Virtual(pool) => {
                    let reserved = pool.reserve(&mut self.held.storage, size);
                    return self.placed_in(first, false, size, reserved, read);
                }
                pool => pool.reserve(&mut self.held.storage, size),
            };
            let whole_page = self.held.whole_pages.get(first as u8);
            return self.placed_in(first, whole_page, size, reserved, read);
        } else {
            self.route_general(size)
        };
        routed.map(|(slot_ref, placement)| {
            let value = read(self, slot_ref.pool, &placement);
            (slot_ref, value)
        })
    }

    /// What [`MemoryManagement::reserve_mapped`] returns for dynamic pool `first`'s
    /// attempt to reserve `size` bytes: the counted placement read by `read`, or the
    /// routing after its failure. `whole_page`: the pool's flag in `whole_pages`.
    #[inline(always)]
    fn placed_in<T>(
        &mut self,
        first: usize,
        whole_page: bool,
        size: u64,
        reserved: Result<Placement, PoolError>,
        read: impl FnOnce(&Self, PoolRef, &Placement) -> T,
    ) -> Result<(SlotRef, T), PoolError> {
        match reserved {
            Ok(placement) => {
                let pool = PoolRef::Dynamic(first as u8);
                let value = read(self, pool, &placement);
                self.count_reserved(whole_page, placement.size);
                let slot_ref = SlotRef {
                    pool,
                    slot: placement.slot,
                };
                Ok((slot_ref, value))
            }
            Err(error) => {
                self.route_after_failure(first, size, error)
                    .map(|(slot_ref, placement)| {
                        let value = read(self, slot_ref.pool, &placement);
                        (slot_ref, value)
                    })
            }
        }
    }

    /// Routes a counted reserve, then lets periodic pools clean up.
    #[inline]
    fn route_and_clean(&mut self, size: u64) -> Result<(SlotRef, Placement), PoolError> {
        if self.periodic {
            let result = self.route(size);
            for pool in &mut self.held.pools {
                pool.cleanup(&mut self.held.storage, self.reserve_count, false);
            }
            return result;
        }
        self.route(size)
    }

    /// Counts a placement `pool` made in the statistics, and names its slot: every
    /// successful route ends here.
    #[inline]
    fn count_placed(&mut self, pool: PoolRef, placement: &Placement) -> SlotRef {
        let whole_page = match pool {
            PoolRef::Dynamic(index) => self.held.whole_pages.get(index),
            _ => true,
        };
        self.count_reserved(whole_page, placement.size);
        SlotRef {
            pool,
            slot: placement.slot,
        }
    }

    /// The statistics of [`MemoryManagement::count_placed`]: `size` bytes placed by a pool
    /// whose flag in `whole_pages` is `whole_page`. A function of its own, as the compiler
    /// keeps it out of line: inlined into every route, it saved 4 instructions per step of
    /// the FIFO bench but cost about 13 per reserve of a trace replay (counted with
    /// `valgrind --tool=cachegrind` on `examples/replay_ab` with N = 0).
    fn count_reserved(&mut self, whole_page: bool, size: u64) {
        // The alignment is a power of two: round up with a mask, not a division
        // (a placed size is at most a page, so the sum does not wrap). Every pool
        // pads to the same alignment, so this is the extent the pool books.
        // `pool::extent_of` would also check the alignment and the overflow, which
        // this hot path need not (with it, the FIFO bench ran 2-5 % slower).
        let mask = self.align_mask;
        let extent = size.wrapping_add(mask) & !mask;
        self.held
            .counters
            .reserved(size, extent, whole_page, &mut self.held.storage.counters);
    }

    /// Counts a failed reservation in the statistics, and passes the error on.
    #[cold]
    fn count_failure(&mut self, error: PoolError) -> PoolError {
        if matches!(
            error,
            PoolError::OutOfMemory { .. } | PoolError::PoolCapacityExceeded { .. }
        ) {
            self.held.counters.num_ooms += 1;
        }
        error
    }

    /// Places `size` bytes in the first accepting pool and counts the outcome in the
    /// statistics.
    #[inline]
    fn route(&mut self, size: u64) -> Result<(SlotRef, Placement), PoolError> {
        match self.dynamic_route(size) {
            Some(first) => self.route_to(first, size),
            None => self.route_general(size),
        }
    }

    /// The dynamic pool that takes `size`, when the route cache or the route table
    /// decides: a size other than 0, outside a persistent window, with no cached
    /// persistent buffer to reuse, that some dynamic pool accepts. Fills the route
    /// cache. `None` leaves the size to [`MemoryManagement::route_general`].
    #[inline(always)]
    fn dynamic_route(&mut self, size: u64) -> Option<usize> {
        let (cached, first) = self.held.route_cache;
        // Size 0 matches the empty cache, but is served by `route_general`. A hit
        // needs no look at the mode or the persistent pool (`Held::route_cache`).
        if cached == size && size != 0 {
            return Some(first);
        }
        self.dynamic_route_uncached(size)
    }

    /// [`MemoryManagement::dynamic_route`] for a size the route cache does not hold:
    /// out of line, so the cache's hit costs no call (24 instructions of a FIFO step
    /// with the lookup inlined, `examples/peer_loops.rs` under callgrind).
    #[inline(never)]
    fn dynamic_route_uncached(&mut self, size: u64) -> Option<usize> {
        if size == 0 || self.persistent_windows > 0 || self.held.persistent.has_free(size) {
            return None;
        }
        let first = match self.route_table.lookup(size) {
            Route::Pool(first) => first,
            Route::Refused => return None,
            Route::Ask => self.held.pools.iter().position(|pool| pool.accept(size))?,
        };
        // Only sizes some pool accepts are cached.
        self.held.route_cache = (size, first);
        Some(first)
    }

    /// [`MemoryManagement::route`] for what the route table does not decide: size 0,
    /// persistent reserves, and sizes no pool accepts.
    #[cold]
    fn route_general(&mut self, size: u64) -> Result<(SlotRef, Placement), PoolError> {
        if size == 0 {
            return Ok((SlotRef::EMPTY, EMPTY_PLACEMENT));
        }
        let persistent = self.mode() == MemoryAllocationMode::Persistent;
        if persistent || self.held.persistent.has_free(size) {
            if !self.held.persistent.accept(size) {
                return Err(PoolError::BufferTooBig {
                    size,
                    max_accepted: self.properties.max_page_size,
                });
            }
            return match self.reserve_in_pool(PoolRef::Persistent, size) {
                Ok(placement) => Ok((
                    self.count_placed(PoolRef::Persistent, &placement),
                    placement,
                )),
                Err(error) => Err(self.count_failure(error)),
            };
        }
        Err(PoolError::BufferTooBig {
            size,
            max_accepted: self.max_accepted(),
        })
    }

    /// Routes `size` bytes to dynamic pool `first`, the first that accepts it (and on,
    /// when it fails).
    #[inline]
    fn route_to(&mut self, first: usize, size: u64) -> Result<(SlotRef, Placement), PoolError> {
        match self.held.pools[first].reserve(&mut self.held.storage, size) {
            Ok(placement) => Ok((
                self.count_placed(PoolRef::Dynamic(first as u8), &placement),
                placement,
            )),
            Err(error) => self.route_after_failure(first, size, error),
        }
    }

    /// Routing after a failed reserve in dynamic pool `first`: one retry after a
    /// cleanup when out of memory, the next pools when it is full.
    #[cold]
    fn route_after_failure(
        &mut self,
        first: usize,
        size: u64,
        error: PoolError,
    ) -> Result<(SlotRef, Placement), PoolError> {
        match self.retry_if_out_of_memory(PoolRef::Dynamic(first as u8), size, error) {
            Ok(placement) => Ok((
                self.count_placed(PoolRef::Dynamic(first as u8), &placement),
                placement,
            )),
            Err(PoolError::PoolCapacityExceeded {
                capacity, in_use, ..
            }) => self.route_past_full(first, size, capacity, in_use),
            Err(other) => Err(self.count_failure(other)),
        }
    }

    /// Routing past pool `full`, a capped pool that is full (holding `capacity`
    /// bytes, `in_use` of them in use): the next accepting pools are tried in turn.
    #[cold]
    fn route_past_full(
        &mut self,
        full: usize,
        size: u64,
        mut capacity: u64,
        mut in_use: u64,
    ) -> Result<(SlotRef, Placement), PoolError> {
        for index in full + 1..self.held.pools.len() {
            if !self.held.pools[index].accept(size) {
                continue;
            }
            match self.reserve_in_pool(PoolRef::Dynamic(index as u8), size) {
                Ok(placement) => {
                    return Ok((
                        self.count_placed(PoolRef::Dynamic(index as u8), &placement),
                        placement,
                    ))
                }
                Err(PoolError::PoolCapacityExceeded {
                    capacity: c,
                    in_use: u,
                    ..
                }) => {
                    capacity += c;
                    in_use += u;
                }
                Err(other) => return Err(self.count_failure(other)),
            }
        }
        Err(self.count_failure(PoolError::PoolCapacityExceeded {
            size,
            capacity,
            in_use,
        }))
    }

    /// Reserves from one pool, no routing: on out-of-memory, frees every fully free
    /// page of every pool and tries once more.
    #[inline]
    fn reserve_in_pool(&mut self, pool: PoolRef, size: u64) -> Result<Placement, PoolError> {
        self.try_pool(pool, size)
            .or_else(|error| self.retry_if_out_of_memory(pool, size, error))
    }

    /// After a reserve in one pool failed with `error`: when out of memory, frees
    /// every fully free page of every pool and tries once more; else passes `error`
    /// on.
    #[cold]
    fn retry_if_out_of_memory(
        &mut self,
        pool: PoolRef,
        size: u64,
        error: PoolError,
    ) -> Result<Placement, PoolError> {
        if !matches!(error, PoolError::OutOfMemory { .. }) {
            return Err(error);
        }
        self.held.counters.num_alloc_retries += 1;
        self.cleanup_pools(true);
        self.try_pool(pool, size)
    }

    /// One attempt at reserving `size` bytes in `pool`, with no retry and no counting.
    /// [`PoolRef::Empty`] holds zero-byte reservations only.
    #[inline]
    fn try_pool(&mut self, pool: PoolRef, size: u64) -> Result<Placement, PoolError> {
        match pool {
            PoolRef::Dynamic(index) => {
                self.held.pools[index as usize].reserve(&mut self.held.storage, size)
            }
            PoolRef::Persistent => self.held.persistent.reserve(&mut self.held.storage, size),
            PoolRef::Empty if size == 0 => Ok(EMPTY_PLACEMENT),
            PoolRef::Empty => Err(PoolError::BufferTooBig {
                size,
                max_accepted: 0,
            }),
        }
    }

    fn max_accepted(&self) -> u64 {
        self.pool_options
            .iter()
            .map(|options| match options.pool_type {
                PoolType::SlicedPages {
                    page_size,
                    max_slice_size,
                    max_pool_size,
                } => {
                    if max_pool_size.is_none() {
                        page_size
                    } else {
                        max_slice_size
                    }
                }
                PoolType::ExclusivePages { max_alloc_size } => max_alloc_size,
                PoolType::Direct { .. } => self.properties.max_page_size,
                PoolType::VirtualPages { range, .. } => range,
                PoolType::Planned { .. } => PoolType::VIRTUAL_RANGE,
            })
            .max()
            .unwrap_or(0)
    }

    /// Frees a reservation made by [`MemoryManagement::reserve_slot`].
    #[inline]
    pub fn release_slot(&mut self, slot_ref: SlotRef) -> Result<(), PoolError> {
        self.held.release_slot(slot_ref)
    }

    /// Gives a handle back. When it is the last handle or binding of its reservation,
    /// the reservation is freed now, without the atomic operations of a drop (which
    /// frees it at the next operation); otherwise this is the same as dropping it.
    /// A handle of another memory management is dropped.
    pub fn release(&mut self, handle: ManagedMemoryHandle) {
        // A match, not `if let`: the compiler then drops only the `Err` arm's handle,
        // instead of calling the whole `Result`'s drop glue on every release.
        match self.descriptors.retire(handle) {
            Ok((slot_ref, id)) => self.free_reservation(slot_ref, id),
            Err(handle) => drop(handle),
        }
    }

    /// Frees the reservation of a handle that is gone.
    #[inline]
    fn free_reservation(&mut self, slot_ref: SlotRef, id: ManagedMemoryId) {
        self.held.free_reservation(slot_ref, id);
    }

    /// Frees every reservation whose last handle or binding was dropped.
    #[inline(always)]
    fn flush_releases(&mut self) {
        let held = &mut self.held;
        self.descriptors
            .drain_released(|slot_ref, id| held.free_reservation(slot_ref, id));
    }

    /// The id the [error graph](Self::error_graph) knows the reservation of a handle or
    /// binding by. A handle of another memory management is refused: its id would name
    /// an unrelated allocation here, or one this graph never sees released (so a failure
    /// tainting it would stay in the graph for good). Use this, not the handle's raw id,
    /// to build the graph's [`AllocId`]s.
    pub fn alloc_id(&self, handle: &impl MemoryHandle) -> Result<AllocId, PoolError> {
        let (owner, _) = handle.address_of();
        if owner != self.identity {
            return Err(PoolError::NotFound {
                reason: "the handle belongs to another MemoryManagement".to_string(),
            });
        }
        Ok(AllocId(handle.memory_id().0))
    }

    /// Where the reservation of a handle or binding is.
    pub fn resource(&mut self, handle: &impl MemoryHandle) -> Result<Resource, PoolError> {
        let (owner, slot_ref) = handle.address_of();
        if owner != self.identity {
            return Err(PoolError::NotFound {
                reason: "the handle belongs to another MemoryManagement".to_string(),
            });
        }
        self.locate(slot_ref)
    }

    /// The index [`Resource::pool`] gives `pool`: dynamic pools by their index, the
    /// persistent pool next after them, and `None` for no pool.
    fn pool_index(&self, pool: PoolRef) -> Option<usize> {
        match pool {
            PoolRef::Empty => None,
            PoolRef::Persistent => Some(self.held.pools.len()),
            PoolRef::Dynamic(index) => Some(index as usize),
        }
    }

    /// The resource of `placement`, made by `pool`.
    fn resource_at(&self, pool: PoolRef, placement: &Placement) -> Resource {
        match self.pool_index(pool) {
            None => Resource {
                pool: None,
                storage_id: None,
                offset: 0,
                size: 0,
                address: 0,
            },
            Some(index) => Resource {
                pool: Some(index),
                storage_id: Some(placement.storage.id.0),
                offset: placement.offset,
                size: placement.size,
                address: placement.storage.address + placement.offset,
            },
        }
    }

    /// Where the reservation in slot `slot_ref` is.
    pub fn locate(&self, slot_ref: SlotRef) -> Result<Resource, PoolError> {
        let placement = match slot_ref.pool {
            PoolRef::Empty => Some(EMPTY_PLACEMENT),
            PoolRef::Persistent => self.held.persistent.locate(slot_ref.slot),
            PoolRef::Dynamic(index) => self
                .held
                .pools
                .get(index as usize)
                .and_then(|pool| pool.locate(slot_ref.slot)),
        };
        match placement {
            Some(placement) => Ok(self.resource_at(slot_ref.pool, &placement)),
            None => Err(PoolError::NotFound {
                reason: format!(
                    "slot {} of pool {} is not reserved",
                    slot_ref.slot.index,
                    self.pool_index(slot_ref.pool).unwrap_or_default()
                ),
            }),
        }
    }

    /// The usage of every pool together (after freeing dropped handles).
    pub fn memory_usage(&mut self) -> MemoryUsage {
        self.flush_releases();
        self.current_usage()
    }

    /// The usage of every pool together, without freeing dropped handles first.
    pub fn current_usage(&self) -> MemoryUsage {
        self.held
            .pools
            .iter()
            .fold(self.held.persistent.usage(), |total, pool| {
                total.combine(pool.usage())
            })
    }

    /// The usage and statistics of each dynamic pool, in routing order, then the
    /// persistent pool's.
    pub fn pool_states(&mut self) -> (Vec<(MemoryUsage, PoolStats)>, (MemoryUsage, PoolStats)) {
        self.flush_releases();
        let dynamic = self
            .held
            .pools
            .iter()
            .map(|p| (p.usage(), p.stats()))
            .collect();
        (
            dynamic,
            (self.held.persistent.usage(), self.held.persistent.stats()),
        )
    }

    /// Marks a step boundary (the start of a training step, say): a planned pool's
    /// requests after it follow its plan's next phase. Other pools ignore it. Releases
    /// of dropped handles land first, so they count in the step they were made in.
    pub fn step(&mut self) {
        self.flush_releases();
        for pool in &mut self.held.pools {
            pool.step();
        }
    }

    /// The hits and misses of the planned pools, summed; `None` when there is none.
    pub fn planned_stats(&self) -> Option<PlannedStats> {
        self.held
            .pools
            .iter()
            .filter_map(DynamicPool::planned_stats)
            .reduce(|a, b| PlannedStats {
                hits: a.hits + b.hits,
                misses_unplanned: a.misses_unplanned + b.misses_unplanned,
                misses_held: a.misses_held + b.misses_held,
                steps: a.steps.max(b.steps),
            })
    }

    /// Releases pages: with `explicit`, every fully free page of every pool (the
    /// persistent pool's free buffers too); otherwise what the pools' periodic
    /// policies say.
    pub fn cleanup(&mut self, explicit: bool) {
        self.flush_releases();
        self.cleanup_pools(explicit);
    }

    fn cleanup_pools(&mut self, explicit: bool) {
        self.held
            .persistent
            .cleanup(&mut self.held.storage, self.reserve_count, explicit);
        for pool in &mut self.held.pools {
            pool.cleanup(&mut self.held.storage, self.reserve_count, explicit);
        }
    }

    /// A report of every pool: its shape, usage, and high-water marks since the
    /// peaks were last reset (after freeing dropped handles).
    pub fn memory_report(&mut self) -> MemoryReport {
        self.flush_releases();
        let dynamic = self
            .held
            .pools
            .iter()
            .zip(&self.pool_options)
            .map(|(pool, options)| {
                MemoryPoolReport::new(
                    MemoryPoolKind::of(options),
                    options.dealloc_period,
                    pool.usage(),
                    pool.stats(),
                )
            })
            .collect();
        let persistent = MemoryPoolReport::new(
            MemoryPoolKind::Persistent,
            None,
            self.held.persistent.usage(),
            self.held.persistent.stats(),
        );
        MemoryReport {
            dynamic,
            persistent,
        }
    }

    /// Records a report under `label`, with the next sequence number and the time
    /// since this instance was made; returns it. Records survive
    /// [`MemoryManagement::install_pools`].
    pub fn record_memory(&mut self, label: impl Into<String>) -> MemoryRecord {
        let record = MemoryRecord {
            label: label.into(),
            sequence: self.next_record,
            time: self.created.elapsed(),
            report: self.memory_report(),
        };
        self.next_record += 1;
        self.records.push(record.clone());
        record
    }

    /// The records made so far, oldest first.
    pub fn records(&self) -> &[MemoryRecord] {
        &self.records
    }

    /// Takes the records made so far, oldest first (sequence numbers keep counting).
    pub fn take_records(&mut self) -> Vec<MemoryRecord> {
        std::mem::take(&mut self.records)
    }

    /// Replaces the dynamic pools with those of `configuration`.
    ///
    /// Runs an explicit cleanup first; then, while any reservation of the dynamic
    /// pools is live, refuses with [`InstallMemoryPoolsError::PoolsInUse`] and changes
    /// nothing more. Otherwise builds the new pools (the old ones hold no page after
    /// the cleanup), resets the high-water marks and restarts the count of
    /// reservations that paces periodic releases, so the new layout behaves as in a
    /// fresh memory management. The persistent pool, its reservations and the records
    /// are untouched. An invalid configuration is refused before anything happens.
    pub fn install_pools(
        &mut self,
        configuration: MemoryConfiguration,
    ) -> Result<(), InstallMemoryPoolsError> {
        let virtual_memory = self.held.storage.virtual_memory_ref().is_some();
        let pool_options = configuration.resolve_for(&self.properties, virtual_memory)?;
        check_against_storage(&pool_options, &self.held.storage.inner)?;
        self.flush_releases();
        for pool in &mut self.held.pools {
            pool.cleanup(&mut self.held.storage, self.reserve_count, true);
        }
        let in_use = self
            .held
            .pools
            .iter()
            .fold(MemoryUsage::default(), |total, pool| {
                total.combine(pool.usage())
            });
        if in_use.number_allocs > 0 || in_use.bytes_reserved > 0 {
            return Err(InstallMemoryPoolsError::PoolsInUse {
                bytes_in_use: in_use.bytes_in_use,
            });
        }
        self.held.pools = pool_options
            .iter()
            .map(|options| build_pool(options, &self.properties))
            .collect();
        self.held.route_cache = Held::<S>::NO_ROUTE;
        self.route_table = route_table(&self.held.pools);
        self.held.whole_pages = WholePages::of(&self.held.pools);
        self.periodic = pool_options.iter().any(is_periodic);
        self.pool_options = pool_options;
        self.configuration = configuration;
        self.held.persistent.reset_peaks();
        // The new pools' periodic releases count reservations from zero, as in a
        // fresh memory management: the same workload then meets the same releases.
        self.reserve_count = 0;
        Ok(())
    }

    /// PyTorch-style statistics (see [`crate::stats`]), after freeing dropped handles.
    pub fn memory_stats(&mut self) -> MemoryStats {
        self.flush_releases();
        self.held.counters.snapshot(&self.held.storage.counters)
    }

    /// Restarts the peaks of [`MemoryManagement::memory_stats`] from the current
    /// values (`torch.cuda.reset_peak_memory_stats`). The pools' own high-water marks
    /// (reports) restart with [`MemoryManagement::reset_peaks`].
    pub fn reset_peak_memory_stats(&mut self) {
        self.flush_releases();
        self.held
            .counters
            .reset_peaks(&mut self.held.storage.counters);
    }

    /// Restarts the cumulative counts of [`MemoryManagement::memory_stats`]
    /// (`allocated`, `freed`, and the `num_*` counters).
    pub fn reset_accumulated_memory_stats(&mut self) {
        self.flush_releases();
        self.held
            .counters
            .reset_accumulated(&mut self.held.storage.counters);
    }

    /// Restarts the high-water marks of every pool.
    pub fn reset_peaks(&mut self) {
        self.flush_releases();
        self.held.persistent.reset_peaks();
        for pool in &mut self.held.pools {
            pool.reset_peaks();
        }
    }

    /// Checks the invariants of every pool, and that the storage holds exactly the
    /// bytes the pools reserved.
    pub fn check_invariants(&self) -> Result<(), String> {
        for (index, pool) in self.held.pools.iter().enumerate() {
            pool.check_invariants()
                .map_err(|problem| format!("pool {index}: {problem}"))?;
        }
        self.held
            .persistent
            .check_invariants()
            .map_err(|problem| format!("persistent pool: {problem}"))?;
        if self.held.whole_pages != WholePages::of(&self.held.pools) {
            return Err("the whole-page flags do not match the pools".into());
        }
        let usage = self.current_usage();
        let allocated = self.held.storage.bytes_allocated();
        if usage.bytes_reserved != allocated {
            return Err(format!(
                "pools reserve {} bytes but the storage holds {allocated}",
                usage.bytes_reserved
            ));
        }
        let counted = self.held.counters.live();
        let pooled = (
            usage.number_allocs,
            usage.bytes_in_use,
            usage.bytes_in_use + usage.bytes_padding,
        );
        if counted != pooled {
            return Err(format!(
                "statistics drifted: they count (allocations, requested, padded) = \
                 {counted:?}, the pools hold {pooled:?}"
            ));
        }
        let stats = self.held.counters.snapshot(&self.held.storage.counters);
        if stats.reserved_bytes.current != allocated {
            return Err(format!(
                "statistics count {} reserved bytes but the storage holds {allocated}",
                stats.reserved_bytes.current
            ));
        }
        Ok(())
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

    /// [`MemoryManagement::release_slot`].
    #[inline(always)]
    fn release_slot(&mut self, slot_ref: SlotRef) -> Result<(), PoolError> {
        let books = (&mut self.counters, &mut self.storage);
        match slot_ref.pool {
            PoolRef::Empty => Ok(()),
            PoolRef::Persistent => {
                // The buffer freed may serve the next reserve of its size.
                self.route_cache = Self::NO_ROUTE;
                release_in(&mut self.persistent, true, books, slot_ref.slot)
            }
            PoolRef::Dynamic(index) => match self.pools.get_mut(index as usize) {
                // The virtual pool (the default's) apart, as in `reserve_mapped`: one
                // compare of the kind instead of the jump table over every kind, and
                // its pages are not whole ones (no flag to look up).
                Some(DynamicPool::Virtual(pool)) => release_in(pool, false, books, slot_ref.slot),
                Some(pool) => {
                    let whole_page = self.whole_pages.get(index);
                    release_in(pool, whole_page, books, slot_ref.slot)
                }
                None => Err(PoolError::NotFound {
                    reason: format!("pool {index} does not exist"),
                }),
            },
        }
    }

    /// Frees the reservation of a handle that is gone (slot `slot_ref`, id `id`).
    #[inline(always)]
    fn free_reservation(&mut self, slot_ref: SlotRef, id: ManagedMemoryId) {
        // The error (which cannot happen) is dropped out of line, so the common path
        // does not look at which error it was (for the string some variants own).
        if let Err(error) = self.release_slot(slot_ref) {
            unreleased(error);
        }
        if !self.errors.is_empty() {
            self.errors.release(AllocId(id.0));
        }
    }
}

/// A released handle's slot that its pool did not hold: never, as a handle names a
/// live slot until its reservation is freed (a debug build asserts it).
#[cold]
#[inline(never)]
fn unreleased(error: PoolError) {
    debug_assert!(false, "a released handle names a live slot: {error}");
}

/// Frees `slot` in `pool` (with the storage at hand, for pools that give memory
/// back at once) and counts the bytes it freed in the statistics.
#[inline(always)]
fn release_in<S: ComputeStorage>(
    pool: &mut impl MemoryPool,
    whole_page: bool,
    (counters, storage): (&mut Counters, &mut CountingStorage<S>),
    slot: SlotId,
) -> Result<(), PoolError> {
    let released = pool.release_with(storage, slot)?;
    counters.released(
        released.size,
        released.extent,
        whole_page,
        &mut storage.counters,
    );
    Ok(())
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

fn is_periodic(options: &MemoryPoolOptions) -> bool {
    match options.pool_type {
        PoolType::ExclusivePages { .. } => options.dealloc_period.is_some(),
        PoolType::Direct { reclaim_at } => reclaim_at.is_some(),
        PoolType::SlicedPages { .. } | PoolType::VirtualPages { .. } | PoolType::Planned { .. } => {
            false
        }
    }
}

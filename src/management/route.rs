//! Routing a reservation to its pool, with the retry after a cleanup, and counting
//! the outcome in the statistics.

use super::{MemoryAllocationMode, MemoryManagement, EMPTY_PLACEMENT};
use crate::config::PoolType;
use crate::error::PoolError;
use crate::handle::{PoolRef, SlotRef};
use crate::pool::{MemoryPool, Placement, Route};
use crate::storage::ComputeStorage;

impl<S: ComputeStorage> MemoryManagement<S> {
    /// Routes a counted reserve, then lets periodic pools clean up (unless paused),
    /// noting what the storage held in between (`within_reserve`).
    #[inline]
    pub(super) fn route_and_clean(&mut self, size: u64) -> Result<(SlotRef, Placement), PoolError> {
        if self.periodic {
            let result = self.route(size);
            self.within_reserve.reserved_before_cleanup = self.held.storage.bytes_allocated();
            if !self.within_reserve.cleanup_paused {
                for pool in &mut self.held.pools {
                    pool.cleanup(&mut self.held.storage, self.reserve_count, false);
                }
            }
            return result;
        }
        self.route(size)
    }

    /// Whether any pool releases pages periodically, after each reserve (so that a
    /// reserve may hold more than it leaves: [`Self::reserved_within_reserve`]).
    pub(crate) fn periodic(&self) -> bool {
        self.periodic
    }

    /// The storage's bytes the last reserve held at its most: before its periodic
    /// cleanup gave pages back (0 without periodic pools).
    #[inline(always)]
    pub(crate) fn reserved_within_reserve(&self) -> u64 {
        self.within_reserve.reserved_before_cleanup
    }

    /// Stops the periodic cleanups after reserves, so that the state a reserve held at
    /// its most can be looked at (a replay's view at its peak, the last thing it does).
    pub(crate) fn pause_periodic_cleanup(&mut self) {
        self.within_reserve.cleanup_paused = true;
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
    pub(super) fn count_reserved(&mut self, whole_page: bool, size: u64) {
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
    pub(super) fn dynamic_route(&mut self, size: u64) -> Option<usize> {
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
    pub(super) fn route_general(&mut self, size: u64) -> Result<(SlotRef, Placement), PoolError> {
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
    pub(super) fn route_after_failure(
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
                    // Saturating: capacities of pools a storage granted may sum past
                    // `u64::MAX` (two full pools of 2^63 bytes).
                    capacity = capacity.saturating_add(c);
                    in_use = in_use.saturating_add(u);
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
}

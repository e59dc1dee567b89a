//! The reservation entry points: reserve, bind and issue a handle, or reserve a slot.

use super::{MemoryManagement, Resource};
use crate::error::PoolError;
use crate::errors::AllocId;
use crate::handle::{ManagedMemoryHandle, ManagedMemoryId, PoolRef, SlotRef};
use crate::pool::{DynamicPool, MemoryPool, Placement};
use crate::storage::ComputeStorage;

impl<S: ComputeStorage> MemoryManagement<S> {
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
        let slot_ref = self.reserve_slot_ref(size)?;
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

    /// [`MemoryManagement::reserve_slot`] for a caller that needs only the [`SlotRef`]
    /// (a handle, a replay): the pool's placement is read in place, not copied into a
    /// returned pair. A replay that took `reserve_slot`'s `(SlotRef, Placement)` and
    /// kept the slot read it back from memory the callee had just written field by
    /// field, a load no store could forward, on every reserve (`examples/replay_ab.rs`
    /// under valgrind's lackey, `benches/forwarding.py`).
    #[inline]
    pub(crate) fn reserve_slot_ref(&mut self, size: u64) -> Result<SlotRef, PoolError> {
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
}

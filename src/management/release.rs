//! Releases: slots and handles given back, dropped handles freed, cleanup and step
//! boundaries.

use super::{Held, MemoryManagement};
use crate::error::PoolError;
use crate::errors::AllocId;
use crate::handle::{ManagedMemoryHandle, ManagedMemoryId, PoolRef, SlotRef};
use crate::pool::{DynamicPool, MemoryPool, SlotId};
use crate::stats::{Counters, CountingStorage};
use crate::storage::ComputeStorage;

impl<S: ComputeStorage> MemoryManagement<S> {
    /// Frees a reservation made by [`MemoryManagement::reserve_slot`].
    ///
    /// A slot this memory management released already is refused
    /// ([`PoolError::NotFound`]), also where a later reservation took its place: each
    /// reservation of a pool's place gets a new generation of its id. What the id
    /// cannot tell is whose it is: a [`SlotRef`] is a key, not a capability, so one of
    /// another memory management, of the pools an [`install_pools`] replaced, or of a
    /// live handle's reservation ([`MemoryHandle::address_of`]) may name a live
    /// reservation here, which this frees (a live handle's own release then frees
    /// nothing, and is no error; but after an [`install_pools`] in between, the new
    /// pools may have given its id to a new reservation, which that release then
    /// frees). Handles carry their owner and are checked;
    /// slots are for callers that keep their own books (a replay, a bench loop).
    ///
    /// [`install_pools`]: MemoryManagement::install_pools
    /// [`MemoryHandle::address_of`]: crate::handle::MemoryHandle::address_of
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
    pub(super) fn flush_releases(&mut self) {
        let held = &mut self.held;
        self.descriptors
            .drain_released(|slot_ref, id| held.free_reservation(slot_ref, id));
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

    /// Releases pages: with `explicit`, every fully free page of every pool (the
    /// persistent pool's free buffers too); otherwise what the pools' periodic
    /// policies say.
    pub fn cleanup(&mut self, explicit: bool) {
        self.flush_releases();
        self.cleanup_pools(explicit);
    }

    pub(super) fn cleanup_pools(&mut self, explicit: bool) {
        self.held
            .persistent
            .cleanup(&mut self.held.storage, self.reserve_count, explicit);
        for pool in &mut self.held.pools {
            pool.cleanup(&mut self.held.storage, self.reserve_count, explicit);
        }
    }
}

impl<S: ComputeStorage> Held<S> {
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

/// A released handle's slot that its pool did not hold. The handle path never makes
/// one: a handle names a live slot until its reservation is freed, and the crate's own
/// unit tests assert it. A caller can: [`MemoryManagement::release_slot`] of a live
/// handle's [`SlotRef`] (see its doc) frees the slot first, and the handle's release
/// then finds nothing. That misuse is the caller's, through public calls, so outside
/// the crate's unit tests it is dropped, not asserted: a debug build of a user's
/// program must not panic on it (`tests/management.rs`,
/// `a_handle_whose_slot_was_released_by_slot_then_drops_without_a_panic`).
#[cold]
#[inline(never)]
fn unreleased(error: PoolError) {
    #[cfg(test)]
    panic!("a released handle names a live slot: {error}");
    #[cfg(not(test))]
    drop(error);
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

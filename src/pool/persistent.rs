//! The persistent pool: exact-size reuse for memory that lives for the whole run.

use super::{AcceptRule, Books, DirectPool, MemoryPool, Placement, Released, SlotId};
use crate::error::PoolError;
use crate::storage::ComputeStorage;

/// The pool of the `Persistent` allocation mode: each allocation its own buffer,
/// reused by exact padded size, released only on explicit cleanup.
#[derive(Debug, Clone)]
pub struct PersistentPool {
    buffers: DirectPool,
}

impl PersistentPool {
    /// A persistent pool for sizes up to `max_alloc_size`.
    pub fn new(max_alloc_size: u64, alignment: u64) -> Self {
        Self {
            buffers: DirectPool::new(max_alloc_size, alignment, None),
        }
    }

    /// Whether a free buffer of exactly `size`'s padded size is cached.
    #[inline]
    pub fn has_free(&self, size: u64) -> bool {
        self.buffers.has_free(size)
    }
}

impl MemoryPool for PersistentPool {
    fn accept_rule(&self) -> AcceptRule {
        self.buffers.accept_rule()
    }

    fn reserve(
        &mut self,
        storage: &mut dyn ComputeStorage,
        size: u64,
    ) -> Result<Placement, PoolError> {
        self.buffers.reserve(storage, size)
    }

    fn release(&mut self, slot: SlotId) -> Result<Released, PoolError> {
        self.buffers.release(slot)
    }

    fn locate(&self, slot: SlotId) -> Option<Placement> {
        self.buffers.locate(slot)
    }

    fn extent_of(&self, slot: SlotId) -> Option<u64> {
        self.buffers.extent_of(slot)
    }

    fn cleanup(&mut self, storage: &mut dyn ComputeStorage, reserve_count: u64, explicit: bool) {
        if explicit {
            self.buffers.cleanup(storage, reserve_count, true);
        }
    }

    fn books(&self) -> &Books {
        self.buffers.books()
    }

    fn books_mut(&mut self) -> &mut Books {
        self.buffers.books_mut()
    }

    fn check_invariants(&self) -> Result<(), String> {
        self.buffers.check_invariants()
    }
}

//! Address ranges without bytes, for replaying traces of any size anywhere.

use super::{ComputeStorage, StorageHandle, StorageId};
use crate::error::PoolError;

/// Hands out aligned, never-overlapping address ranges without allocating memory.
///
/// An optional `limit` makes it behave like a device of that many bytes: an
/// allocation that would take the allocated bytes past it fails with
/// [`PoolError::OutOfMemory`].
#[derive(Debug, Default, Clone)]
pub struct VirtualStorage {
    /// The next free address; addresses are never reused, so ranges never overlap.
    next_address: u64,
    next_id: u64,
    /// Sizes of live buffers, indexed by id.
    live: std::collections::HashMap<StorageId, u64>,
    bytes: u64,
    limit: Option<u64>,
    allocations: u64,
    deallocations: u64,
}

impl VirtualStorage {
    /// An unlimited virtual storage.
    pub fn new() -> Self {
        Self::default()
    }

    /// A virtual storage that refuses to hold more than `limit` bytes at once.
    pub fn with_limit(limit: u64) -> Self {
        Self {
            limit: Some(limit),
            ..Self::default()
        }
    }
}

impl ComputeStorage for VirtualStorage {
    fn alloc(&mut self, size: u64, alignment: u64) -> Result<StorageHandle, PoolError> {
        let oom = PoolError::OutOfMemory { size };
        let total = self.bytes.checked_add(size).ok_or(oom.clone())?;
        if self.limit.is_some_and(|limit| total > limit) {
            return Err(oom);
        }
        let align = alignment.max(1);
        // Start at one alignment unit so that no address is zero.
        let address = self
            .next_address
            .max(align)
            .checked_next_multiple_of(align)
            .ok_or(oom.clone())?;
        self.next_address = address.checked_add(size.max(1)).ok_or(oom)?;
        let id = StorageId(self.next_id);
        self.next_id += 1;
        self.live.insert(id, size);
        self.bytes = total;
        self.allocations += 1;
        Ok(StorageHandle { id, address, size })
    }

    fn dealloc(&mut self, id: StorageId) {
        if let Some(size) = self.live.remove(&id) {
            self.bytes -= size;
            self.deallocations += 1;
        }
    }

    fn bytes_allocated(&self) -> u64 {
        self.bytes
    }

    fn allocations(&self) -> u64 {
        self.allocations
    }

    fn deallocations(&self) -> u64 {
        self.deallocations
    }
}

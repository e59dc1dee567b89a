//! Address ranges without bytes, for replaying traces of any size anywhere.

use super::virtual_memory::{MappedRuns, MappingError, VirtualMemory};
use super::{ComputeStorage, StorageHandle, StorageId};
use crate::error::PoolError;

/// Hands out aligned, never-overlapping address ranges without allocating memory.
///
/// An optional `limit` makes it behave like a device of that many bytes: an
/// allocation that would take the allocated bytes past it fails with
/// [`PoolError::OutOfMemory`], and so does a map past it (mapped bytes count as
/// allocated ones).
///
/// Address ranges ([`VirtualMemory`]) are synthetic too: reserving one takes
/// addresses and no bytes; mapping counts bytes and calls, and checks each call
/// against the interface's rules (aligned runs, no double map, unmaps of whole runs),
/// so replays catch a pool that breaks them. Its granularity is one byte unless set
/// with [`VirtualStorage::with_granularity`].
#[derive(Debug, Default, Clone)]
pub struct VirtualStorage {
    /// The next free address. Addresses are handed out upward and taken back only
    /// when nothing is held (no buffer, no range: [`VirtualStorage::forget_addresses`]),
    /// so live buffers and ranges never overlap, and a storage that is emptied now and
    /// then never runs out of addresses (it ran out once 2^64 bytes had been handed out
    /// over its life, however few were held: helper-141's find). Invariant: every live
    /// buffer and range lies below it.
    next_address: u64,
    next_id: u64,
    /// Sizes of live buffers, indexed by id.
    live: std::collections::HashMap<StorageId, u64>,
    bytes: u64,
    limit: Option<u64>,
    allocations: u64,
    deallocations: u64,
    /// The address ranges and the runs mapped in them.
    runs: MappedRuns,
    /// The granule of maps (0 is read as 1).
    granularity: u64,
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

    /// This storage with maps and unmaps in multiples of `granularity` bytes (as a
    /// GPU's 2 MiB); 0 is read as 1.
    pub fn with_granularity(mut self, granularity: u64) -> Self {
        self.granularity = granularity;
        self
    }

    /// What is held from the device: every live buffer as `(id, 0, size)` and every
    /// mapped run of a range as `(range, offset, size)`; their sizes add up to
    /// [`ComputeStorage::bytes_allocated`].
    pub fn held(&self) -> Vec<(StorageId, u64, u64)> {
        let mut held: Vec<_> = self.live.iter().map(|(&id, &size)| (id, 0, size)).collect();
        held.extend(self.runs.runs());
        held
    }

    /// Takes every address back once nothing is held: no live buffer or range lies
    /// above the start, so the next one may begin there again.
    fn forget_addresses(&mut self) {
        if self.live.is_empty() && self.runs.no_ranges() {
            self.next_address = 0;
        }
    }

    /// Takes `size` bytes of fresh addresses aligned to `alignment`.
    fn take_addresses(&mut self, size: u64, alignment: u64) -> Option<u64> {
        // Start at one alignment unit so that no address is zero.
        let address = self
            .next_address
            .max(alignment)
            .checked_next_multiple_of(alignment)?;
        self.next_address = address.checked_add(size.max(1))?;
        Some(address)
    }

    /// The bytes held after `size` more, if within the limit.
    fn grow(&self, size: u64) -> Option<u64> {
        let total = self.bytes.checked_add(size)?;
        match self.limit {
            Some(limit) if total > limit => None,
            _ => Some(total),
        }
    }
}

impl ComputeStorage for VirtualStorage {
    fn alloc(&mut self, size: u64, alignment: u64) -> Result<StorageHandle, PoolError> {
        let oom = PoolError::OutOfMemory { size };
        let total = self.grow(size).ok_or(oom.clone())?;
        let address = self.take_addresses(size, alignment.max(1)).ok_or(oom)?;
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
            self.forget_addresses();
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

    fn virtual_memory(&mut self) -> Option<&mut dyn VirtualMemory> {
        Some(self)
    }

    fn virtual_memory_ref(&self) -> Option<&dyn VirtualMemory> {
        Some(self)
    }
}

impl VirtualMemory for VirtualStorage {
    fn granularity(&self) -> u64 {
        self.granularity.max(1)
    }

    fn reserve_range(&mut self, size: u64, alignment: u64) -> Result<StorageHandle, MappingError> {
        if !alignment.is_power_of_two() {
            return Err(MappingError::BadAlignment { alignment });
        }
        let oom = MappingError::OutOfMemory { size };
        let size = size
            .checked_next_multiple_of(self.granularity())
            .ok_or(oom.clone())?;
        let address = self.take_addresses(size, alignment).ok_or(oom)?;
        let id = StorageId(self.next_id);
        self.next_id += 1;
        self.runs.add_range(id, size);
        Ok(StorageHandle { id, address, size })
    }

    fn free_range(&mut self, id: StorageId) {
        if let Some((_, runs)) = self.runs.remove_range(id) {
            for (_, size) in runs {
                self.bytes -= size;
                self.deallocations += 1;
            }
            self.forget_addresses();
        }
    }

    fn map(&mut self, id: StorageId, offset: u64, size: u64) -> Result<(), MappingError> {
        let granularity = self.granularity();
        let Some(bytes) = self.grow(size) else {
            // A bad run is told before the lack of memory.
            self.runs.check_map(id, offset, size, granularity)?;
            return Err(MappingError::OutOfMemory { size });
        };
        self.runs.map_run(id, offset, size, granularity)?;
        self.bytes = bytes;
        self.allocations += 1;
        Ok(())
    }

    fn unmap(&mut self, id: StorageId, offset: u64, size: u64) -> Result<(), MappingError> {
        self.runs.unmap_run(id, offset, size)?;
        self.bytes -= size;
        self.deallocations += 1;
        Ok(())
    }

    fn bytes_mapped(&self) -> u64 {
        self.runs.bytes()
    }

    fn ranges_reserved(&self) -> u64 {
        self.runs.reserved
    }
}

//! Host memory from the global allocator.
#![allow(unsafe_code)]

use std::alloc::{alloc, dealloc, Layout};
use std::collections::HashMap;
use std::ptr::NonNull;

use super::{ComputeStorage, StorageHandle, StorageId};
use crate::error::PoolError;

/// One live host buffer.
struct HostBuffer {
    ptr: NonNull<u8>,
    layout: Layout,
    /// The size the caller asked for (the layout holds at least one byte).
    size: u64,
}

// SAFETY: a HostBuffer is a uniquely owned heap allocation; nothing in it is tied to
// the thread that made it.
unsafe impl Send for HostBuffer {}

/// Real host memory, allocated with the alignment each page asks for (the device
/// properties' alignment, 64 by default).
///
/// Buffers live until [`ComputeStorage::dealloc`] or until the storage is dropped;
/// their addresses never move.
#[derive(Default)]
pub struct HostStorage {
    /// Invariant: every entry is a live allocation made with its layout.
    buffers: HashMap<StorageId, HostBuffer>,
    next_id: u64,
    bytes: u64,
    allocations: u64,
    deallocations: u64,
}

impl HostStorage {
    /// An empty storage.
    pub fn new() -> Self {
        Self::default()
    }
}

impl ComputeStorage for HostStorage {
    fn alloc(&mut self, size: u64, alignment: u64) -> Result<StorageHandle, PoolError> {
        let oom = PoolError::OutOfMemory { size };
        let align = usize::try_from(alignment.max(1)).map_err(|_| oom.clone())?;
        let bytes = usize::try_from(size.max(1)).map_err(|_| oom.clone())?;
        let layout = Layout::from_size_align(bytes, align).map_err(|_| oom.clone())?;
        // SAFETY: the layout has a non-zero size (at least one byte is asked for).
        let ptr = NonNull::new(unsafe { alloc(layout) }).ok_or(oom)?;
        let id = StorageId(self.next_id);
        self.next_id += 1;
        self.buffers.insert(id, HostBuffer { ptr, layout, size });
        self.bytes += size;
        self.allocations += 1;
        Ok(StorageHandle {
            id,
            address: ptr.as_ptr() as u64,
            size,
        })
    }

    fn dealloc(&mut self, id: StorageId) {
        if let Some(buffer) = self.buffers.remove(&id) {
            // SAFETY: the buffer was allocated by `alloc` with this layout and is
            // removed from the map, so it is freed exactly once.
            unsafe { dealloc(buffer.ptr.as_ptr(), buffer.layout) };
            self.bytes -= buffer.size;
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

impl Drop for HostStorage {
    fn drop(&mut self) {
        for (_, buffer) in self.buffers.drain() {
            // SAFETY: each buffer was allocated with its layout and is freed once here.
            unsafe { dealloc(buffer.ptr.as_ptr(), buffer.layout) };
        }
    }
}

//! Helpers shared by the integration test binaries (each compiles this module on its
//! own).

// Each test binary compiles this module and uses only some of it.
#![allow(dead_code)]

use cubepool::storage::{StorageHandle, StorageId};
use cubepool::{
    ComputeStorage, HostStorage, MemoryConfiguration, MemoryDeviceProperties, MemoryManagement,
    PoolError, VirtualStorage,
};

/// Memory management with the default layout and device properties over host memory.
pub fn host_memory() -> MemoryManagement<HostStorage> {
    MemoryManagement::from_configuration(
        HostStorage::new(),
        MemoryDeviceProperties::default(),
        MemoryConfiguration::default(),
    )
    .unwrap()
}

/// A storage with plain buffers only: no virtual memory (what `HostStorage` is off
/// Linux), for the paths that must do without it.
pub struct Buffers(pub VirtualStorage);

impl ComputeStorage for Buffers {
    fn alloc(&mut self, size: u64, alignment: u64) -> Result<StorageHandle, PoolError> {
        self.0.alloc(size, alignment)
    }
    fn dealloc(&mut self, id: StorageId) {
        self.0.dealloc(id)
    }
    fn bytes_allocated(&self) -> u64 {
        self.0.bytes_allocated()
    }
    fn allocations(&self) -> u64 {
        self.0.allocations()
    }
    fn deallocations(&self) -> u64 {
        self.0.deallocations()
    }
}
